"""`kb run --generator llm` end to end against a real OpenAI-protocol server on 127.0.0.1: proposals,
a repaired reply, a retried 429, token budget charged, and a mutation prompt that carries the parent's
diagnosis, source and numbers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kernelbrain.store import EventStore

from kernelbrain.core.events import decode
from kernelbrain.core.state import RunState
from tests.invariants import check_run
from tests.kbcli import SOFTMAX, kb, kb_env
from tests.llm_server import LLMServer, raw, reply, status

REPLIES = Path(__file__).parent / "llm_replies"


def _prompt_text(body: dict) -> str:
    return "\n".join(m.get("content", "") for m in body.get("messages", []))


def test_an_llm_run_goes_end_to_end(tmp_path):
    good = (REPLIES / "good.md").read_text()
    renamed = (REPLIES / "wrong_class_name.md").read_text()
    # variety keeps every proposal distinct: a comment naming the request number
    counter = iter(range(10_000))

    def answer(body: dict):
        return reply(good.replace("```python\n", f"```python\n# variant {next(counter)}\n", 1))

    script = [status(429, {"Retry-After": "0"}), reply(renamed)]
    db = tmp_path / "kb.db"
    with LLMServer(script, default=answer) as server:
        r = kb(
            "run",
            str(SOFTMAX),
            "--db",
            str(db),
            "--generator",
            "llm",
            "--llm-base-url",
            server.base_url,
            "--llm-model",
            "test-model",
            "--llm-concurrency",
            "1",
            "--max-candidates",
            "6",
            "--inprocess",
            "--device",
            "cpu",
            "--quiet",
            env=kb_env(KB_LLM_API_KEY="sk-test-not-a-secret"),
        )
        requests = list(server.requests)
    assert r.returncode == 0, r.stderr
    run_id = r.stdout.split()[1]
    check_run(db, run_id)
    with EventStore(db, create=False) as store:
        state = store.fold(RunState(run_id), run_id=run_id)
        proposals = [c.proposal for c in state.candidates.values()]
        assert proposals and all(p.generator == "llm" for p in proposals)
        assert any("[repaired:" in p.hint for p in proposals), [p.hint for p in proposals]
        assert all(p.prompt and p.reply for p in proposals)
        assert "class Model" in store.get_blob(proposals[0].prompt).decode()  # the problem source
        tokens = sum(decode(e).tokens for e in store.read(run_id=run_id, types=["BudgetCharged"]))
        assert tokens >= 150 * len(proposals)
        raw_log = b"".join(raw.key.encode() + json.dumps(raw.payload).encode() for raw in store.read())
    assert b"sk-test-not-a-secret" not in raw_log, "the API key must never reach the log"
    assert requests[0].action == "status" and requests[1].action == "reply"  # the 429 was retried
    assert all(req.headers.get("authorization") == "Bearer sk-test-not-a-secret" for req in requests)
    mutated = [c for c in state.candidates.values() if c.proposal.parent]
    assert mutated, "a profiled finalist was mutated"
    label = mutated[0].proposal.diagnosis[0]
    parent = state.candidates[mutated[0].proposal.parent]
    mutation_prompts = [_prompt_text(req.body) for req in requests if label in _prompt_text(req.body)]
    assert mutation_prompts, f"no prompt carried the diagnosis {label!r}"
    assert "_softmax_kernel" in mutation_prompts[0]  # the parent's source
    top = max(parent.results)
    assert f"rung {top} score: {parent.results[top].score:.3f}" in mutation_prompts[0]  # the parent's numbers


def _llm_run(db: Path, url: str, *resume: str) -> subprocess.CompletedProcess:
    """`kb run --generator llm` on the small softmax, or, given `resume RUN_ID`, that instead."""
    run = ["run", str(SOFTMAX), "--generator", "llm", "--llm-base-url", url, "--llm-model", "m"]
    run += ["--device", "cpu", "--max-candidates", "3"]
    args = [*(resume or run), "--db", str(db), "--inprocess", "--quiet"]
    # every retry still made, 50 ms apart rather than 1, 2, 4, 8 s
    return kb(*args, env=kb_env(KB_LLM_API_KEY="k", KB_LLM_BACKOFF_S="0.05"), timeout=300)


def _workers_of(pid: int) -> list[str]:
    """The roles (or crews) of the `kb worker` processes whose parent is `pid`."""
    roles = []
    for entry in Path("/proc").iterdir():
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (entry / "cmdline").read_bytes().decode().split("\0")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid and "worker" in argv:
            roles.append(argv[argv.index("worker") + 1])
    return roles


def _types(db: Path) -> list[str]:
    with EventStore(db, create=False) as store:
        return [raw.type for raw in store.read()]


def test_a_dead_endpoint_leaves_the_run_waiting_and_resume_finishes_it(tmp_path):
    """Refused connections after every retry: no RunFinished, exit 5 with one line naming the endpoint;
    `kb resume` once a server answers on that address proposes, gates and finishes the run."""
    from tests.llm_server import closed_port

    db = tmp_path / "kb.db"
    port = closed_port()
    url = f"http://127.0.0.1:{port}/v1"
    r = _llm_run(db, url)
    assert r.returncode == 5, (r.stdout, r.stderr)
    last = r.stdout.strip().splitlines()[-1]
    assert "waiting for its generator" in last and url in last and "kb resume" in last, last
    run_id = r.stdout.split()[1]
    types = _types(db)
    assert "GenerationFailed" in types and "RunFinished" not in types and "GenerationDone" not in types
    good = (REPLIES / "good.md").read_text()
    counter = iter(range(10_000))

    def answer(body: dict):
        return reply(good.replace("```python\n", f"```python\n# variant {next(counter)}\n", 1))

    with LLMServer(default=answer, port=port):
        r = _llm_run(db, url, "resume", run_id)
    assert r.returncode == 0, (r.stdout, r.stderr)
    types = _types(db)
    assert types.count("RunFinished") == 1 and "CandidateProposed" in types and "GatePassed" in types
    check_run(db, run_id)


def test_garbage_replies_leave_the_run_waiting(tmp_path):
    """A server that answers 200 with no chat completion at all is down as far as kb is concerned."""
    db = tmp_path / "kb.db"
    with LLMServer(default=raw("<html>upstream error</html>")) as server:
        r = _llm_run(db, server.base_url)
    assert r.returncode == 5, (r.stdout, r.stderr)
    assert "no chat completion" in r.stdout.strip().splitlines()[-1]
    assert "RunFinished" not in _types(db)


def test_no_model_configured_fails_before_anything_is_written(tmp_path):
    """A usage error (exit 2): the command line, or KB_LLM_MODEL, lacks what --generator llm needs."""
    db = tmp_path / "kb.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--generator", "llm", env=kb_env(KB_LLM_MODEL=""))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "Error: --generator llm needs a model: pass --llm-model or set KB_LLM_MODEL (see `kb run --help`)"
    )
    assert not db.exists()


def test_ctrl_c_during_a_hung_request_exits_at_once_and_the_run_resumes(tmp_path):
    """A request the endpoint never answers: SIGINT to kb's process group (a terminal's Ctrl-C) ends kb
    within 2 s with 130, nothing of the request recorded; the run is still resumable."""
    import os
    import signal
    import time

    from tests.kbcli import kb_start
    from tests.llm_server import slow

    db = tmp_path / "kb.db"
    with LLMServer(default=slow(120)) as server:
        args = ["run", str(SOFTMAX), "--generator", "llm", "--llm-base-url", server.base_url]
        args += ["--llm-model", "m", "--device", "cpu", "--db", str(db), "--quiet"]
        proc, run_id = kb_start(args, env=kb_env(KB_LLM_API_KEY="k"))
        deadline = time.monotonic() + 120
        while server.count() == 0 and time.monotonic() < deadline:  # a request is in flight
            time.sleep(0.1)
        assert server.count() > 0, "the generator never asked the endpoint"
        # on a CPU, the LLM's generator is a worker process of its own: the only one given the key
        assert sorted(_workers_of(proc.pid)) == ["candidates", "generator", "scheduler"]
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        sent = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - sent
    assert code == 130, (code, proc.stderr.read() if proc.stderr else "")
    assert took < 2.0, took
    types = _types(db)
    assert "GenerationDone" not in types and "RunFinished" not in types, types
    assert f"kb resume {run_id}" in (proc.stderr.read() if proc.stderr else "")
