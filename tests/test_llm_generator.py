"""The `llm` generator against a real OpenAI-compatible HTTP server on 127.0.0.1 (tests/llm_server.py).

No mocking of httpx: every request crosses a socket. Reply fixtures (tests/llm_replies/) cover the
malformed answers models give; the repaired candidates go through the real gate.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from llm_server import LLMServer, closed_port, drop, raw, reply, slow, status

from kernelbrain import generators
from kernelbrain.core.events import ProblemAnalysed, RungBenchmarked, ShapeTiming
from kernelbrain.core.protocol import GateRequest
from kernelbrain.generators import GenerationError, prompt
from kernelbrain.generators.llm import LLMGenerator
from kernelbrain.generators.repair import repair
from kernelbrain.runtime.sandbox import Sandbox

HERE = Path(__file__).resolve().parent
PROBLEM = (HERE / "problems" / "softmax_small.py").read_text()
REPLIES = HERE / "llm_replies"
KEY = "sk-test-secret-0123456789"
ANALYSIS = ProblemAnalysed(
    ops=[{"op": "softmax", "dim": 1}],
    families=["row_reduction"],
    flops=1.0e6,
    bytes=2.0e6,
    shapes=["batch_size=16,dim=16384"],
    signature={"init": [], "forward": ["x"]},
)


def fixture(name: str) -> str:
    return (REPLIES / f"{name}.md").read_text()


def make(server: LLMServer | None = None, base_url: str | None = None, **kw) -> LLMGenerator:
    options = {
        "timeout_s": 5.0,
        "backoff_s": 0.05,
        "max_backoff_s": 0.2,
        "max_retry_after_s": 0.5,
        "concurrency": 4,
        "problem_source": PROBLEM,
        **kw,
    }
    env = {"KB_LLM_MODEL": "test-model", "KB_LLM_API_KEY": KEY, "KB_LLM_TEMPERATURE": "0.5"}
    return LLMGenerator(base_url=base_url or (server.base_url if server else None), env=env, **options)


def gate(box: Sandbox, source: str) -> dict:
    args = {"problem_source": PROBLEM, "cand_source": source, "device": "cpu", "seeds": 2}
    return box.call(GateRequest(**args), timeout_s=120.0)[0].model_dump()


# --- round 0 ---------------------------------------------------------------------------------------

# one malformed-but-repairable reply per strategy hint: which one the server sends depends on the prompt
BY_HINT = {
    "decomposition": "wrong_class_name",
    "tiling": "missing_imports",
    "memory-layout": "wrong_forward_param",
    "fusion": "two_blocks",
}


def by_hint(body: dict):
    user = body["messages"][-1]["content"]
    for hint in prompt.STRATEGY_HINTS:
        if f"## Strategy for this attempt ({hint.axis})" in user:
            return reply(
                fixture(BY_HINT[hint.name]), prompt_tokens=1000, completion_tokens=200 + len(hint.name)
            )
    return status(400, body="unexpected prompt")


def test_round0_sends_one_prompt_per_strategy_axis_and_sums_usage(box: Sandbox) -> None:
    with LLMServer(default=by_hint) as server:
        gen = make(server)
        proposals = gen.first_round(ANALYSIS)
    assert [p.strategy for p in proposals] == [h.name for h in prompt.STRATEGY_HINTS[:4]]
    assert len({tuple(sorted(p.knobs.items())) for p in proposals}) == 4
    assert all(p.family == "llm" and p.knobs["temperature"] == 0.5 for p in proposals)
    assert server.count() == 4
    for r in server.requests:
        assert r.body["model"] == "test-model" and r.body["temperature"] == 0.5
        assert r.headers["authorization"] == f"Bearer {KEY}"
    expected = sum(1200 + len(h) for h in BY_HINT)
    assert sum(p.tokens for p in proposals) == expected
    for p in proposals:
        assert PROBLEM.strip() in p.prompt
        for rule in (
            "class ModelNew(nn.Module)",
            "@triton.jit",
            "Do not call, import or instantiate",
            "Do not cache",
            "side CUDA streams",
            "Do not modify the input",
            "timers",
            "Write every element",
            "atol = rtol = 0.0001",
        ):
            assert rule in p.prompt, rule
        assert "Model.forward(self, x)" in p.prompt and "softmax" in p.prompt
        assert p.reply == fixture(BY_HINT[p.strategy])
        assert "[repaired:" in p.hint
        assert KEY not in p.prompt and KEY not in repr(gen)
        # the repaired candidate really passes the gate
        result = gate(box, p.source)
        assert result["passed"] is True, (p.strategy, result)


def test_prompts_are_deterministic() -> None:
    hint = prompt.STRATEGY_HINTS[1]
    a = prompt.render(prompt.build_messages(PROBLEM, ANALYSIS, hint))
    b = prompt.render(prompt.build_messages(PROBLEM, ANALYSIS, hint))
    assert a == b and hint.text in a


def test_the_prompt_says_which_mode_the_modules_are_called_in() -> None:
    """A batch norm kernel for training mode updates the running statistics; one for eval mode reads them."""
    training = prompt.render(prompt.build_messages(PROBLEM, ANALYSIS.model_copy(update={"mode": "training"})))
    assert "## Mode\nModel and ModelNew are called in training mode" in training
    assert "compared with the reference's after each call" in training
    assert "## Mode\nModel and ModelNew are called in eval mode" in prompt.render(
        prompt.build_messages(PROBLEM, ANALYSIS)
    )


# --- repair of the reply corpus ----------------------------------------------------------------------

REPAIRABLE = {
    "good": [],
    "prose_around": [],
    "unterminated_fence": [],
    "no_fence": ["fence-less"],
    "no_fence_prose": ["prose"],
    "wrong_class_name": ["renamed class TritonSoftmax to ModelNew"],
    "model_class": ["renamed class Model to ModelNew"],
    "missing_imports": ["import torch", "import torch.nn as nn", "import triton", "triton.language as tl"],
    "wrong_forward_param": ["forward(inp) to (x)"],
    "missing_init": ["added ModelNew.__init__(self)"],
    "two_blocks": ["picked code block 2 of 2", "joined"],
    "block_and_usage": ["picked code block 1 of 2"],
}
UNREPAIRABLE = {
    "unrepairable_prose": "no code",
    "syntax_error": "syntax error at line 22",
    "no_module_class": "nn.Module",
}


def test_the_corpus_is_covered() -> None:
    assert {p.stem for p in REPLIES.glob("*.md")} == set(REPAIRABLE) | set(UNREPAIRABLE)


@pytest.mark.parametrize("name", sorted(REPAIRABLE))
def test_repairable_replies_are_repaired_and_pass_the_gate(name: str, box: Sandbox) -> None:
    r = repair(fixture(name), [], ["x"])
    assert r.ok and r.reason is None, r
    joined = "; ".join(r.repairs)
    for needle in REPAIRABLE[name]:
        assert needle in joined, (needle, r.repairs)
    if not REPAIRABLE[name]:
        assert r.repairs == []
    assert "class ModelNew(nn.Module)" in r.source
    assert repair(fixture(name), [], ["x"]) == r  # deterministic
    result = gate(box, r.source)
    assert result["passed"] is True, (name, result)


@pytest.mark.parametrize("name", sorted(UNREPAIRABLE))
def test_unrepairable_replies_say_why(name: str) -> None:
    r = repair(fixture(name), [], ["x"])
    assert not r.ok and r.source is None
    assert UNREPAIRABLE[name] in r.reason


def test_signature_repair_renames_init_parameters_and_keeps_locals_apart() -> None:
    code = (
        "import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n"
        "    def __init__(self, d):\n        super().__init__()\n        self.d = d\n\n"
        "    def forward(self, a, b):\n        return a + b\n"
    )
    r = repair(code, ["dim"], ["x", "y"])
    assert r.ok and "def __init__(self, dim):" in r.source and "self.d = dim" in r.source
    assert "def forward(self, x, y):" in r.source and "return x + y" in r.source
    clash = code.replace("return a + b", "x = a\n        return x + b")
    r = repair(clash, ["dim"], ["x", "y"])
    assert r.ok and "def forward(self, a, b):" in r.source
    assert any("left forward" in note for note in r.repairs)


def test_unusable_replies_are_discarded_with_their_tokens() -> None:
    script = [reply(fixture("unrepairable_prose"), 10, 20), raw("<html>bad gateway page</html>")]
    with LLMServer(script, default=reply(fixture("syntax_error"), 7, 3, finish="length")) as server:
        gen = make(server, round0=3, concurrency=1)
        proposals = gen.first_round(ANALYSIS)
    assert proposals == []
    reasons = [d.reason for d in gen.discarded]
    assert "no code" in reasons[0] and gen.discarded[0].tokens == 30
    assert "sent no chat completion" in reasons[1]
    assert "syntax error" in reasons[2] and "KB_LLM_MAX_TOKENS" in reasons[2]
    assert gen.discarded[2].tokens == 10 and gen.discarded[2].reply == fixture("syntax_error")


# --- transient failures are retried --------------------------------------------------------------------


def one(server: LLMServer, **kw) -> list:
    return make(server, round0=1, **kw).first_round(ANALYSIS)


def test_429_is_retried_after_retry_after() -> None:
    with LLMServer([status(429, {"Retry-After": "0.3"})], default=reply(fixture("good"))) as server:
        proposals = one(server)
    assert len(proposals) == 1 and server.count() == 2
    assert [r.action for r in server.requests] == ["status", "reply"]
    assert server.requests[1].at - server.requests[0].at >= 0.25


def test_a_long_retry_after_is_capped() -> None:
    with LLMServer([status(429, {"Retry-After": "3600"})], default=reply(fixture("good"))) as server:
        t0 = time.monotonic()
        proposals = one(server, max_retry_after_s=0.2)
    assert len(proposals) == 1 and server.count() == 2 and time.monotonic() - t0 < 5


def test_500_twice_then_success() -> None:
    with LLMServer([status(500), status(502)], default=reply(fixture("good"))) as server:
        proposals = one(server)
    assert len(proposals) == 1 and server.count() == 3


def test_a_timeout_is_retried() -> None:
    with LLMServer([slow(1.5, fixture("good"))], default=reply(fixture("good"))) as server:
        t0 = time.monotonic()
        proposals = one(server, timeout_s=0.4)
    assert len(proposals) == 1 and server.count() == 2
    assert time.monotonic() - t0 < 1.5


def test_a_dropped_connection_is_retried() -> None:
    with LLMServer([drop()], default=reply(fixture("good"))) as server:
        proposals = one(server)
    assert len(proposals) == 1 and server.count() == 2


def test_persistent_503_gives_up_after_the_attempts() -> None:
    with LLMServer(default=status(503)) as server, pytest.raises(GenerationError) as e:
        one(server, attempts=3)
    assert server.count() == 3
    assert "503" in str(e.value) and "3 attempts" in str(e.value) and server.base_url in str(e.value)


def test_the_attempts_and_the_backoff_come_from_the_environment() -> None:
    env = {"KB_LLM_ATTEMPTS": "2", "KB_LLM_BACKOFF_S": "0.01"}
    with LLMServer(default=status(503)) as server, pytest.raises(GenerationError) as e:
        gen = LLMGenerator(base_url=server.base_url, model="m", env=env, problem_source=PROBLEM, round0=1)
        gen.first_round(ANALYSIS)
    assert server.count() == 2 and "2 attempts" in str(e.value)


# --- permanent failures are not ---------------------------------------------------------------------


def test_401_fails_at_once_with_one_line() -> None:
    with LLMServer(default=status(401, body='{"error": "bad key"}')) as server:
        gen = make(server, concurrency=1)
        with pytest.raises(GenerationError) as e:
            gen.first_round(ANALYSIS)
    message = str(e.value)
    assert server.count() == 1
    assert "\n" not in message and KEY not in message
    assert message.startswith(f"the LLM endpoint {server.base_url} answered 401 Unauthorized")
    assert "KB_LLM_API_KEY" in message


def test_401_without_a_key_says_to_set_one() -> None:
    with LLMServer(default=status(401)) as server:
        gen = LLMGenerator(
            base_url=server.base_url, env={"KB_LLM_MODEL": "m"}, problem_source=PROBLEM, round0=1
        )
        with pytest.raises(GenerationError, match="set KB_LLM_API_KEY"):
            gen.first_round(ANALYSIS)
        assert "authorization" not in server.requests[0].headers


def test_404_names_the_url_and_model() -> None:
    with LLMServer(default=status(404)) as server, pytest.raises(GenerationError) as e:
        one(server)
    assert server.count() == 1
    assert f"{server.base_url}/chat/completions answered 404" in str(e.value)
    assert "KB_LLM_BASE_URL" in str(e.value) and "test-model" in str(e.value)


def test_a_dead_endpoint_names_the_url() -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    with pytest.raises(GenerationError) as e:
        make(base_url=url, attempts=2).first_round(ANALYSIS)
    assert url in str(e.value) and "\n" not in str(e.value)
    assert "2 attempts" in str(e.value)


# --- mutation ----------------------------------------------------------------------------------------


def test_mutation_prompt_carries_the_parent_its_numbers_and_its_diagnosis() -> None:
    parent_source = repair(fixture("good"), [], ["x"]).source
    timing = ShapeTiming(
        shape="batch_size=16,dim=16384",
        cand_median_s=42e-6,
        cand_iqr_s=1e-6,
        ref_median_s=84e-6,
        ref_iqr_s=2e-6,
        repeats=30,
        speedup=2.0,
    )
    numbers = prompt.describe_numbers(
        {0: RungBenchmarked(candidate="c", rung=0, shapes=[timing], score=2.0, timer="cuda-events")}
    )
    labels = ["register spills", "launch-bound"]
    with LLMServer(default=reply(fixture("good"), 300, 100)) as server:
        gen = make(server)
        proposals = gen.mutate(
            ANALYSIS,
            {"hint": "tiling", "temperature": 0.5},
            "llm",
            labels,
            parent_source=parent_source,
            numbers=numbers,
        )
    assert server.count() == 2
    assert [p.diagnosis for p in proposals] == [[label] for label in labels]
    assert [p.strategy for p in proposals] == ["register-spills", "launch-bound"]
    for p, label in zip(proposals, labels, strict=True):
        assert label in p.prompt and prompt.DIAGNOSIS_HINTS[label] in p.prompt
        assert parent_source.strip() in p.prompt
        assert "42.0 us" in p.prompt and "speedup 2.000x" in p.prompt
        assert PROBLEM.strip() in p.prompt
        assert p.tokens == 400


# --- configuration -------------------------------------------------------------------------------------


def test_configuration_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_LLM_MODEL", raising=False)
    with pytest.raises(GenerationError, match="KB_LLM_MODEL"):
        generators.get("llm")
    monkeypatch.setenv("KB_LLM_MODEL", "qwen")
    monkeypatch.setenv("KB_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("KB_LLM_CONCURRENCY", "2")
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    gen = generators.get("llm")
    assert isinstance(gen, LLMGenerator) and gen.name == "llm"
    assert gen.url == "http://127.0.0.1:9/v1/chat/completions" and gen.concurrency == 2
    assert KEY not in repr(gen)
    monkeypatch.setenv("KB_LLM_TEMPERATURE", "hot")
    with pytest.raises(GenerationError, match="KB_LLM_TEMPERATURE"):
        generators.get("llm")
    with pytest.raises(GenerationError, match="problem's source"):
        LLMGenerator(env={"KB_LLM_MODEL": "m"}).first_round(ANALYSIS)
