"""The `llm` generator: an OpenAI-compatible chat endpoint writes candidates, repair.py cleans them up.

Works with any server speaking `POST {base}/chat/completions` (OpenAI, vLLM, SGLang, Ollama,
llama.cpp). Configuration comes from the environment, constructor arguments override it:

    KB_LLM_BASE_URL     default https://api.openai.com/v1
    KB_LLM_MODEL        required
    KB_LLM_API_KEY      or OPENAI_API_KEY; environment only, never logged or recorded
    KB_LLM_TEMPERATURE  default 0.8
    KB_LLM_MAX_TOKENS   default 4096
    KB_LLM_TIMEOUT_S    default 180 (per request)
    KB_LLM_CONCURRENCY  default 4 (requests of one round in flight at once)
    KB_LLM_ATTEMPTS     default 5 (tries of one request through transient failures)
    KB_LLM_BACKOFF_S    default 1 (the first retry's wait; doubled each retry up to 30 s)

Transient failures (429, 5xx, timeouts, refused or dropped connections) are retried with
exponential backoff, honouring Retry-After up to a cap; 401/403/404 and other 4xx are not retried
and raise GenerationError with one line saying what to fix.
"""

from __future__ import annotations

import email.utils
import os
import re
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_attempt

from kernelbrain.core.events import ProblemAnalysed
from kernelbrain.generators import prompt as prompts
from kernelbrain.generators.base import GenerationError, Generator, Proposal, Unavailable
from kernelbrain.generators.repair import repair

FAMILY = "llm"
DEFAULT_BASE_URL = "https://api.openai.com/v1"
ROUND0_MAX = 4


@dataclass(frozen=True)
class Reply:
    """One completed request: what was asked, what came back, what it cost."""

    prompt: str
    content: str
    tokens: int
    finish_reason: str | None


@dataclass(frozen=True)
class Discarded:
    """A request whose reply gave no candidate; its tokens were still spent."""

    hint: str
    reason: str
    tokens: int = 0
    prompt: str | None = None
    reply: str | None = None


class _Fatal(GenerationError):
    """A failure no retry can fix (bad key, wrong URL or model): the round stops."""


class EndpointError(GenerationError):
    """`GET {base}/models` gave no model list. `status` is the HTTP status, None when nothing answered;
    the message says what to fix."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _Transient(Exception):
    """A failure worth retrying; `retry_after` is the server's Retry-After in seconds, if any."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def _env_number(env: Mapping[str, str], key: str, kind: Callable[[str], Any], default: Any) -> Any:
    raw = env.get(key)
    if raw is None or raw.strip() == "":
        return default
    try:
        return kind(raw)
    except ValueError:
        raise GenerationError(f"{key}={raw!r} is not a valid {kind.__name__}") from None


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "improve"


class LLMGenerator(Generator):
    name = "llm"

    def __init__(
        self,
        *,
        base_url: str | None = None,
        model: str | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        timeout_s: float | None = None,
        concurrency: int | None = None,
        problem_source: str | None = None,
        attempts: int | None = None,
        backoff_s: float | None = None,
        max_backoff_s: float = 30.0,
        max_retry_after_s: float = 60.0,
        round0: int = ROUND0_MAX,
        env: Mapping[str, str] | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.base_url = (base_url or env.get("KB_LLM_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.model = model or env.get("KB_LLM_MODEL") or ""
        if not self.model:
            raise GenerationError("no LLM model configured: set KB_LLM_MODEL (or pass --llm-model)")
        self._api_key = env.get("KB_LLM_API_KEY") or env.get("OPENAI_API_KEY") or None
        self.temperature = (
            temperature if temperature is not None else _env_number(env, "KB_LLM_TEMPERATURE", float, 0.8)
        )
        self.max_tokens = (
            max_tokens if max_tokens is not None else _env_number(env, "KB_LLM_MAX_TOKENS", int, 4096)
        )
        self.timeout_s = (
            timeout_s if timeout_s is not None else _env_number(env, "KB_LLM_TIMEOUT_S", float, 180.0)
        )
        self.concurrency = max(
            1, concurrency if concurrency is not None else _env_number(env, "KB_LLM_CONCURRENCY", int, 4)
        )
        self.problem_source = problem_source
        self.attempts = max(
            1, attempts if attempts is not None else _env_number(env, "KB_LLM_ATTEMPTS", int, 5)
        )
        self.backoff_s = (
            backoff_s if backoff_s is not None else _env_number(env, "KB_LLM_BACKOFF_S", float, 1.0)
        )
        self.max_backoff_s = max_backoff_s
        self.max_retry_after_s = max_retry_after_s
        self.round0 = max(1, min(round0, ROUND0_MAX, len(prompts.STRATEGY_HINTS)))
        self.discarded: list[Discarded] = []  # of the last first_round/mutate call

    def __repr__(self) -> str:  # never the key
        return f"LLMGenerator(base_url={self.base_url!r}, model={self.model!r})"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    # --- the protocol ----------------------------------------------------------------------------

    def _wait(self, state: RetryCallState) -> float:
        exc = state.outcome.exception() if state.outcome else None
        if isinstance(exc, _Transient) and exc.retry_after is not None:
            return min(exc.retry_after, self.max_retry_after_s)
        return min(self.backoff_s * 2 ** (state.attempt_number - 1), self.max_backoff_s)

    def _post(self, client: httpx.Client, messages: list[dict[str, str]]) -> httpx.Response:
        body = {
            "model": self.model,
            "messages": messages,
            "temperature": self.temperature,
            "max_tokens": self.max_tokens,
        }
        try:
            response = client.post(self.url, json=body)
        except httpx.TimeoutException as e:
            raise _Transient(
                f"the LLM endpoint {self.base_url} did not answer within {self.timeout_s:g} s "
                f"({type(e).__name__}): raise KB_LLM_TIMEOUT_S or check the server"
            ) from e
        except httpx.ConnectError as e:
            raise _Transient(
                f"cannot connect to the LLM endpoint {self.base_url} ({e}): is the server running? "
                "check KB_LLM_BASE_URL"
            ) from e
        except httpx.TransportError as e:
            raise _Transient(
                f"the LLM endpoint {self.base_url} dropped the connection ({type(e).__name__}: {e})"
            ) from e
        status = response.status_code
        if status == 429 or status >= 500:
            raise _Transient(
                f"the LLM endpoint {self.base_url} answered {status} {response.reason_phrase}",
                _retry_after(response.headers.get("retry-after")),
            )
        if status in (401, 403):
            what = (
                "set KB_LLM_API_KEY (or OPENAI_API_KEY)"
                if self._api_key is None
                else f"check KB_LLM_API_KEY and that it may use model {self.model!r}"
            )
            raise _Fatal(
                f"the LLM endpoint {self.base_url} answered {status} {response.reason_phrase}: {what}"
            )
        if status == 404:
            raise _Fatal(
                f"the LLM endpoint {self.url} answered 404 Not Found: check KB_LLM_BASE_URL "
                f"(usually ending in /v1) and KB_LLM_MODEL={self.model!r}"
            )
        if status >= 400:
            detail = " ".join(response.text.split())[:200]
            raise _Fatal(
                f"the LLM endpoint {self.base_url} answered {status} {response.reason_phrase}: {detail}"
            )
        return response

    def complete(self, client: httpx.Client, messages: list[dict[str, str]]) -> Reply:
        """One chat completion with retries; GenerationError when it cannot be had."""
        retrying = Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=self._wait,
            retry=retry_if_exception_type(_Transient),
            reraise=True,
        )
        try:
            response = retrying(self._post, client, messages)
        except _Transient as e:
            raise Unavailable(f"{e} (gave up after {self.attempts} attempts)") from None
        text = prompts.render(messages)
        try:
            data = response.json()
            choice = data["choices"][0]
            content = choice["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            snippet = " ".join(response.text.split())[:120]
            raise _BadReply(
                f"the LLM endpoint {self.base_url} sent no chat completion: {snippet!r}", text, response.text
            ) from None
        if isinstance(content, list):  # content parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        usage = data.get("usage") or {}
        tokens = usage.get("total_tokens")
        if not isinstance(tokens, int):
            tokens = int(usage.get("prompt_tokens") or 0) + int(usage.get("completion_tokens") or 0)
        return Reply(text, content or "", tokens, choice.get("finish_reason"))

    def list_models(self) -> list[str]:
        """The model ids `GET {base}/models` lists: one request with this generator's key, headers and
        timeout, not retried (a probe, as `kb doctor` makes). EndpointError when there is no list."""
        url = f"{self.base_url}/models"
        try:
            with self._client() as client:
                r = client.get(url)
        except httpx.TimeoutException:
            raise EndpointError(f"{url} did not answer within {self.timeout_s:g} s") from None
        except httpx.TransportError as e:
            raise EndpointError(
                f"cannot reach {url} ({type(e).__name__}: {e}): is the server running? check KB_LLM_BASE_URL"
            ) from None
        status = r.status_code
        if status in (401, 403):
            what = "check KB_LLM_API_KEY" if self._api_key else "set KB_LLM_API_KEY (or OPENAI_API_KEY)"
            raise EndpointError(f"{url} answered {status}: {what}", status)
        if status == 404:
            raise EndpointError(
                f"{url} answered 404: check KB_LLM_BASE_URL (an OpenAI-compatible base usually ends in /v1)",
                status,
            )
        if status != 200:
            raise EndpointError(f"{url} answered {status} {r.reason_phrase}", status)
        try:
            return [str(m["id"]) for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise EndpointError(f"{url} answered 200 but not a model list", status) from None

    def _client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        return httpx.Client(timeout=httpx.Timeout(self.timeout_s), headers=headers)

    # --- proposals -------------------------------------------------------------------------------

    def _run(
        self, analysis: ProblemAnalysed, jobs: list[tuple[list[dict[str, str]], str, str, str, list[str]]]
    ) -> list[Proposal]:
        """jobs: (messages, short name, hint text, diagnosis) -> proposals, in job order."""
        self.discarded = []
        sig = analysis.signature or {}
        init_params, forward_params = sig.get("init"), sig.get("forward")

        def one(client: httpx.Client, messages: list[dict[str, str]]) -> Reply | Exception:
            try:
                return self.complete(client, messages)
            except (GenerationError, _BadReply) as e:
                return e

        with self._client() as client:
            if len(jobs) == 1 or self.concurrency == 1:
                results: list[Reply | Exception] = []
                for job in jobs:
                    results.append(one(client, job[0]))
                    if isinstance(results[-1], _Fatal):
                        raise results[-1]
            else:
                with ThreadPoolExecutor(max_workers=min(self.concurrency, len(jobs))) as pool:
                    results = list(pool.map(lambda j: one(client, j[0]), jobs))
        fatal = next((r for r in results if isinstance(r, _Fatal)), None)
        if fatal is not None:
            raise fatal
        out: list[Proposal] = []
        errors: list[str] = []
        for (messages, short, hint, _, diagnosis), result in zip(jobs, results, strict=True):
            if isinstance(result, GenerationError):
                errors.append(str(result))
                self.discarded.append(Discarded(short, str(result), 0, prompts.render(messages)))
                continue
            if isinstance(result, _BadReply):
                self.discarded.append(Discarded(short, str(result), 0, result.prompt, result.raw))
                continue
            fixed = repair(result.content, init_params, forward_params)
            if not fixed.ok:
                reason = fixed.reason or "unusable reply"
                if result.finish_reason == "length":
                    reason += f" (the reply was cut at max_tokens={self.max_tokens}: raise KB_LLM_MAX_TOKENS)"
                self.discarded.append(Discarded(short, reason, result.tokens, result.prompt, result.content))
                continue
            if fixed.repairs:
                hint = f"{hint} [repaired: {'; '.join(fixed.repairs)}]"
            out.append(
                Proposal(
                    source=fixed.source or "",
                    family=FAMILY,
                    strategy=short,
                    knobs={"hint": short, "temperature": self.temperature},
                    hint=hint,
                    diagnosis=diagnosis,
                    prompt=result.prompt,
                    reply=result.content,
                    tokens=result.tokens,
                )
            )
        if results and all(isinstance(r, Unavailable | _BadReply) for r in results):
            # nothing the endpoint sent was a completion: it is down or broken, not this problem's
            raise Unavailable(str(results[0]))
        if errors and len(errors) == len(jobs):
            raise GenerationError(errors[0])
        return out

    def _source(self, problem_source: str | None) -> str:
        source = problem_source if problem_source is not None else self.problem_source
        if not source:
            raise GenerationError("the llm generator needs the problem's source (problem_source)")
        return source

    def first_round(self, analysis: ProblemAnalysed, *, problem_source: str | None = None) -> list[Proposal]:
        source = self._source(problem_source)
        jobs = []
        for hint in prompts.STRATEGY_HINTS[: self.round0]:
            messages = prompts.build_messages(source, analysis, hint)
            jobs.append((messages, hint.name, f"strategy axis {hint.axis}", hint.name, []))
        return self._run(analysis, jobs)

    def mutate(
        self,
        analysis: ProblemAnalysed,
        parent_knobs: dict[str, Any],
        family: str,
        labels: list[str],
        *,
        parent_source: str | None = None,
        numbers: str | None = None,
        problem_source: str | None = None,
    ) -> list[Proposal]:
        source = self._source(problem_source)
        jobs = []
        for label in labels or ["improve"]:
            diagnosis = [label] if labels else []
            messages = prompts.build_messages(
                source, analysis, None, parent_source=parent_source, numbers=numbers, labels=diagnosis
            )
            parent = parent_knobs.get("hint", family)
            jobs.append((messages, _slug(label), f"{label} -> rewrite of {parent}", label, diagnosis))
        return self._run(analysis, jobs)


class _BadReply(Exception):
    """A 200 answer that is not a chat completion (per request: the other requests may be fine)."""

    def __init__(self, message: str, prompt: str, raw: str) -> None:
        super().__init__(message)
        self.prompt = prompt
        self.raw = raw
