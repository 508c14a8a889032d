"""A whole `kb run --generator llm` whose model only ever proposes cheats: the run ends with no winner,
and each cheat's GateFailed names its category. The endpoint is a real OpenAI-protocol server on
127.0.0.1, the workers real processes."""

from __future__ import annotations

from kernelbrain.store import EventStore

from kernelbrain.core.events import GateFailed, decode
from tests.kbcli import SOFTMAX, kb, kb_env
from tests.llm_server import LLMServer, reply
from tests.red_team.test_gate_cheats import CHEATS

# the reference sabotaged at import, and torch under a private name: each must fail as `policy`. The
# cheats' shared head imports gc, sys, threading and time, which these two do not use and which kb's
# candidate subset would refuse first: without them, the refusal names each one's own trick
PROPOSED = ("torch.softmax replaced at import", "torch._softmax, a private name")


def source(name: str) -> str:
    return CHEATS[name][1].replace("import gc, sys, threading, time\n", "", 1)


def test_a_run_of_cheats_has_no_winner(tmp_path) -> None:
    sources = iter(source(name) for name in PROPOSED)

    def answer(body: dict):
        source_ = next(sources, source(PROPOSED[0]))
        return reply(f"```python\n{source_}\n```")

    db = tmp_path / "kb.db"
    with LLMServer([], default=answer) as server:
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
            "cheater",
            "--llm-concurrency",
            "1",
            "--max-candidates",
            "2",
            "--device",
            "cpu",
            "--quiet",
            env=kb_env(KB_LLM_API_KEY="sk-test-not-a-secret"),
        )
    assert r.returncode == 3, r.stderr  # no kernel: EXIT_NO_KERNEL
    assert "no candidate passed the gate and the ladder" in r.stdout, r.stdout
    run_id = r.stdout.split()[1]
    with EventStore(db, create=False) as store:
        events = [decode(e) for e in store.read(run_id=run_id)]
    failed = [e for e in events if isinstance(e, GateFailed)]
    assert len(failed) == 2 and {e.category for e in failed} == {"policy"}, failed
    assert any("torch.softmax" in e.detail for e in failed) and any("_softmax" in e.detail for e in failed)
    finished = next(e for e in events if e.TYPE == "RunFinished")
    assert finished.winner is None
