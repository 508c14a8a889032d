"""Builders for synthetic runs: real events in a real store, folded the way workers fold them; an
in-process run of the expert generator; and a script run in a fresh Triton-interpreter process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from kernelbrain.store import EventStore

from kernelbrain.core.events import (
    Adjudicated,
    BudgetCharged,
    CandidateProposed,
    Event,
    GateFailed,
    GatePassed,
    GenerationDone,
    ProblemAnalysed,
    ProfileCaptured,
    RunConfig,
    RungBenchmarked,
    RungSpec,
    RunStarted,
    ShapeTiming,
)
from kernelbrain.core.policy import decision_key, policy_for
from kernelbrain.core.state import RunState
from kernelbrain.runtime.runner import DEFAULT_RUNGS

RUN = "r-test"
ROOT = Path(__file__).resolve().parents[1]


def verdict(rung: int, a: str, b: str, outcome: str) -> Adjudicated:
    """A duel's recorded result with the given outcome ("a", "b" or "tie")."""
    ratio = {"a": 0.8, "b": 1.25, "tie": 1.0}[outcome]
    return Adjudicated(
        rung=rung,
        a=a,
        b=b,
        pairs=20,
        ratio_median=ratio,
        ratio_q1=ratio * 0.98,
        ratio_q3=ratio * 1.02,
        outcome=outcome,
        timer="test",
    )


class SyntheticRun:
    def __init__(self, store: EventStore, **config) -> None:
        self.store = store
        cfg = RunConfig(rungs=DEFAULT_RUNGS["cpu"], **config)
        self.add(
            RunStarted(
                problem_path="p.py",
                problem_name="p",
                problem_hash=store.put_blob("x"),
                config=cfg,
                hardware={},
                versions={},
            ),
            "started",
        )
        self.add(
            ProblemAnalysed(
                ops=[{"op": "softmax"}], families=["row_softmax"], flops=1, bytes=1, shapes=["default"]
            ),
            "analysis",
        )
        self.n = 0

    def add(self, event: Event, key: str) -> None:
        self.store.append([event.to_new(RUN, f"{RUN}/{key}", "test")])

    def propose(self, cid: str, parent: str | None = None) -> str:
        self.add(
            CandidateProposed(
                candidate=cid,
                source=self.store.put_blob(cid),
                parent=parent,
                generator="test",
                family="row_softmax",
                strategy="s",
                knobs={"i": self.n},
                round=0,
                hint="h",
            ),
            f"propose/{cid}",
        )
        self.n += 1
        return cid

    def gen_done(self, task: str = "round0", proposed: tuple[str, ...] = ()) -> None:
        self.add(GenerationDone(task=task, proposed=list(proposed), duplicates=0), f"gen/{task}/done")

    def gate(self, cid: str, ok: bool = True) -> None:
        e = (
            GatePassed(candidate=cid, seeds=3, max_abs_err=0, max_rel_err=0, tolerance=1e-4)
            if ok
            else GateFailed(candidate=cid, category="mismatch", detail="wrong")
        )
        self.add(e, f"gate/{cid}")

    def bench(self, cid: str, rung: int, speedup: float, iqr: float = 0.0) -> None:
        s = ShapeTiming(
            shape="default",
            cand_median_s=1 / speedup,
            cand_iqr_s=iqr / speedup,
            ref_median_s=1.0,
            ref_iqr_s=0,
            repeats=3,
            speedup=speedup,
        )
        from kernelbrain.core.scoring import score

        self.add(
            RungBenchmarked(candidate=cid, rung=rung, shapes=[s], score=score([s]), timer="test"),
            f"bench/{cid}/{rung}",
        )

    def profile(self, cid: str, labels: tuple[str, ...] = ("launch-bound",)) -> None:
        self.add(
            ProfileCaptured(candidate=cid, source="roofline", metrics={}, labels=list(labels)),
            f"profile/{cid}",
        )

    def charge(self, gpu_s: float, action: str = "x", alone: bool = True) -> None:
        """A task's cost: `gpu_s` of a child's busy time, held the device alone for as long (a timed
        task's) where `alone`."""
        self.n += 1
        span = {"device": "0", "alone_from": 1000.0, "alone_to": 1000.0 + gpu_s} if alone else {}
        cost = BudgetCharged(action=f"{RUN}/{action}", role="test", gpu_s=gpu_s, **span)
        self.add(cost, f"budget/{self.n}")

    def state(self) -> RunState:
        return self.store.fold(RunState(RUN), run_id=RUN)

    def decide(self) -> list[Event]:
        state = self.state()
        return policy_for(state.config.policy_version).decide(state)

    def schedule(self) -> list[Event]:
        """Decide and record, as the scheduler worker does."""
        state = self.state()
        out = policy_for(state.config.policy_version).decide(state)
        self.store.append([d.to_new(RUN, decision_key(RUN, d), "scheduler") for d in out])
        return out


# a ladder of two samples a rung: for runs that show a family's kernel winning end to end, where the
# numbers are the interpreter's and every rung's checks run all the same
QUICK_RUNGS = tuple(RungSpec(shapes=s.shapes, repeats=2, warmup=0) for s in DEFAULT_RUNGS["cpu"])


def run_inprocess(
    problem: str | Path, db: Path, max_candidates: int, rungs: tuple[RungSpec, ...] = DEFAULT_RUNGS["cpu"]
) -> RunState:
    """A real expert-generator run on CPU, its workers stepped in this process; its folded state."""
    from kernelbrain.runtime.runner import start_run, supervise

    config = RunConfig(device="cpu", max_candidates=max_candidates, rungs=rungs)
    with EventStore(db, create=True) as store:
        run_id = start_run(store, str(problem), config)
    assert supervise(str(db), run_id, inprocess=True) is not None
    with EventStore(db, create=False) as store:
        return store.fold(RunState(run_id), run_id=run_id)


def interpreter_env() -> dict[str, str]:
    """The environment of a child that runs Triton kernels through the interpreter, the repository
    importable. A child: Triton reads TRITON_INTERPRET when it is first imported, too late to set here."""
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}


# what kb's sandboxed child runs candidates with (kernelbrain/child/interpreted.py), first in every script
_PRELUDE = "from kernelbrain.child.interpreted import fast_interpreter\nfast_interpreter()\n"


def run_interpreted(script: str, *args: str, timeout: float = 300) -> Any:
    """Run the Python source `script` with `args` (its sys.argv[1:]) in a fresh interpreter under
    interpreter_env(), Triton's interpreter as kb's child has it; assert it exits 0 and return the JSON
    its last stdout line holds."""
    proc = subprocess.run(
        [sys.executable, "-c", _PRELUDE + script, *args],
        env=interpreter_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


_CHECKS = """
import importlib, json, sys, tempfile, traceback
from pathlib import Path
found = {}
for name, check in importlib.import_module(sys.argv[1]).checks().items():
    try:
        check(Path(tempfile.mkdtemp()))
        found[name] = None
    except Exception:
        found[name] = traceback.format_exc()[-2000:]
print(json.dumps(found))
"""


def run_checks(module: str, timeout: float = 900) -> dict[str, str | None]:
    """Every check `module.checks()` names, run in one fresh interpreter process (Triton reads
    TRITON_INTERPRET when it is first imported, so a test process cannot run candidates itself): its
    traceback by name, None where it held."""
    return run_interpreted(_CHECKS, module, timeout=timeout)
