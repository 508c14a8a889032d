"""`kb run --generator llm` end to end against a real OpenAI-protocol server on 127.0.0.1: proposals,
a repaired reply, a retried 429, token budget charged, and a mutation prompt that carries the parent's
diagnosis, source and numbers."""

from __future__ import annotations

import json
from pathlib import Path

from kernelbrain.store import EventStore

from kernelbrain.core.events import decode
from kernelbrain.core.state import RunState
from tests.invariants import check_run
from tests.kbcli import SOFTMAX, kb, kb_env
from tests.llm_server import LLMServer, reply, status

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


def test_a_dead_endpoint_is_one_clear_line(tmp_path):
    from tests.llm_server import closed_port

    db = tmp_path / "kb.db"
    url = f"http://127.0.0.1:{closed_port()}/v1"
    r = kb(
        "run",
        str(SOFTMAX),
        "--db",
        str(db),
        "--generator",
        "llm",
        "--llm-base-url",
        url,
        "--llm-model",
        "m",
        "--inprocess",
        "--device",
        "cpu",
        "--quiet",
        env=kb_env(KB_LLM_API_KEY="k"),
        timeout=300,
    )
    assert r.returncode == 3, r.stderr  # it records why it proposed nothing, ends with no kernel (exit 3)
    assert "no candidates were proposed" in r.stdout and url in r.stdout


def test_no_model_configured_fails_before_anything_is_written(tmp_path):
    db = tmp_path / "kb.db"
    r = kb("run", str(SOFTMAX), "--db", str(db), "--generator", "llm", env=kb_env(KB_LLM_MODEL=""))
    assert r.returncode == 1
    assert r.stderr.strip() == "Error: no LLM model configured: set KB_LLM_MODEL (or pass --llm-model)"
    assert not db.exists()
