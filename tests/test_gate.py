"""The gate V(p) through a real sandboxed child, and the gatekeeper worker carrying on after a fault.

One deliberately bad candidate per category the gate implements (tests/candidates/), each rejected
with its category; a correct Triton candidate passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kernelbrain.store import EventStore

from kernelbrain.child.draws import UPWARD
from kernelbrain.child.judge import NUDGES
from kernelbrain.core.events import CandidateProposed, GateFailed, GatePassed, RunConfig, decode
from kernelbrain.core.protocol import GateRequest
from kernelbrain.runtime import gate as gate_host
from kernelbrain.runtime.runner import DEFAULT_RUNGS, start_run
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault
from kernelbrain.runtime.worker import Worker

HERE = Path(__file__).resolve().parent
PROBLEM_PATH = HERE / "problems" / "softmax_small.py"
PROBLEM = PROBLEM_PATH.read_text()
GOOD = (HERE / "candidates" / "good_softmax.py").read_text()
# kept inline: a .py file with a syntax error would trip ruff
FORWARD = "def forward(self, x: torch.Tensor) -> torch.Tensor:"
SYNTAX_ERROR = GOOD.replace(FORWARD, "def forward(self, x:")
SYNTAX_LINE = next(i for i, line in enumerate(GOOD.splitlines(), 1) if FORWARD in line)

# float64 reference runs the judge's span search makes for a one-input problem finite at every step: the
# base span, then each step up (kernelbrain/child/judge.py)
SEARCH = 1 + len(UPWARD)


def candidate(name: str) -> str:
    return (HERE / "candidates" / f"{name}.py").read_text()


def gate(box: Sandbox, source: str, timeout_s: float = 120.0) -> dict:
    args = {"problem_source": PROBLEM, "cand_source": source, "device": "cpu", "seeds": 3}
    return box.call(GateRequest(**args), timeout_s=timeout_s)[0].model_dump()


def test_a_correct_triton_candidate_passes(box: Sandbox) -> None:
    r = gate(box, GOOD)
    assert r["passed"] is True, r
    assert r["seeds"] == 3
    assert 0.0 <= r["max_abs_err"] < 1e-5
    assert 0.0 <= r["max_rel_err"] < 1e-4
    assert r["tolerance"] == pytest.approx(1e-4)


@pytest.mark.parametrize(
    ("name", "category", "detail"),
    [
        ("syntax_error", "compile", f"line {SYNTAX_LINE}:"),
        ("import_error", "compile", "kb_no_such_module_anywhere"),
        ("no_modelnew", "signature", "no class ModelNew"),
        ("wrong_param", "signature", "ModelNew.forward(inp) differs from Model.forward(x)"),
        ("runtime_error", "runtime", "RuntimeError: boom from the candidate"),
        ("exp_only", "mismatch", "differs from the reference"),
        ("wrong_shape", "mismatch", "shape (1, 8, 200), expected (8, 200)"),
        ("returns_none", "mismatch", "NoneType"),
        ("nan_output", "nan", "NaN/Inf"),
        ("torch_only", "policy", "no @triton.jit kernel"),
        ("mutates_input", "policy", "mutated its inputs"),
        ("decoy_kernel", "policy", "forward computes with torch (softmax)"),
        ("unwritten_tail", "nan", "never written"),
        ("caches_output", "policy", "results cached across calls"),
        ("thread_worker", "policy", "thread(s) running"),
        ("python_scalars", "policy", "read tensor values into Python"),
    ],
)
def test_a_bad_candidate_is_rejected_with_its_category(
    box: Sandbox, name: str, category: str, detail: str
) -> None:
    source = SYNTAX_ERROR if name == "syntax_error" else candidate(name)
    pid = box.proc.pid if box.proc else None
    r = gate(box, source)
    assert r["passed"] is False, r
    assert r["category"] == category, r
    assert detail in r["detail"], r
    GateFailed(
        candidate="c",
        category=r["category"],
        detail=r["detail"],
        max_abs_err=r.get("max_abs_err"),
        max_rel_err=r.get("max_rel_err"),
    )  # what the worker records
    if pid is not None and name == "thread_worker":
        # its thread still runs after the verdict, and would run inside the next candidate's gate
        assert box.proc is None, "a child left with a candidate's thread running is not reused"
    elif pid is not None:
        assert box.proc is not None and box.proc.pid == pid, (
            "a rejection is not a fault: the child stays warm"
        )


def test_a_mismatch_reports_its_error_figures(box: Sandbox) -> None:
    r = gate(box, candidate("exp_only"))
    assert r["category"] == "mismatch"
    assert r["max_abs_err"] > 1.0  # exp(x) of values in [0, 1) vs a softmax over 200 columns
    assert r["max_rel_err"] > r["max_abs_err"]


def test_an_unused_triton_kernel_does_not_hide_torch_doing_the_work(box: Sandbox) -> None:
    r = gate(box, candidate("decoy_kernel"))
    assert r["passed"] is False and r["category"] == "policy", r


def test_a_patched_timer_is_rejected_and_the_child_replaced(box: Sandbox) -> None:
    gate(box, GOOD)
    pid = box.proc.pid if box.proc else None
    r = gate(box, candidate("patches_timer"))
    assert r["passed"] is False and r["category"] == "policy" and "time.perf_counter" in r["detail"], r
    assert box.proc is None or box.proc.pid != pid, "a child whose clocks were replaced must not be reused"
    assert gate(box, GOOD)["passed"] is True


def test_a_hang_is_rejected_as_timeout(box: Sandbox) -> None:
    gate(box, GOOD)  # warm: torch is imported before the clock starts
    with pytest.raises(SandboxFault) as fault:
        gate(box, candidate("hang"), timeout_s=3.0)
    assert fault.value.category == "timeout"
    assert gate(box, GOOD)["passed"] is True


def test_a_segfault_is_rejected_as_crash(box: Sandbox) -> None:
    with pytest.raises(SandboxFault) as fault:
        gate(box, candidate("segfault"))
    assert fault.value.category == "crash"
    assert "SIGSEGV" in fault.value.detail
    assert gate(box, GOOD)["passed"] is True


# --- the gatekeeper worker -------------------------------------------------------------------------


def new_run(db: Path) -> str:
    config = RunConfig(
        generator="expert", device="cpu", max_candidates=8, rungs=DEFAULT_RUNGS["cpu"], gate_timeout_s=20.0
    )
    with EventStore(db, create=True) as store:
        return start_run(store, str(PROBLEM_PATH), config)


def propose(db: Path, run_id: str, name: str, generator: str = "test") -> str:
    """Append a CandidateProposed for a candidate file, as the generator would; returns its id. A
    generator of kb's own ("expert") marks text kb wrote, which the gatekeeper does not check against the
    candidate subset: the way to reach the sandbox beneath it with a file outside the subset."""
    with EventStore(db, create=False) as store:
        source_hash = store.put_blob(candidate(name))
        cid = source_hash[:16]
        event = CandidateProposed(
            candidate=cid,
            source=source_hash,
            parent=None,
            generator=generator,
            family="row_softmax",
            strategy=name,
            knobs={},
            round=0,
            hint=f"test: {name}",
        )
        store.append([event.to_new(run_id, f"{run_id}/propose/{cid}", "test", subject=cid)])
    return cid


def verdicts(db: Path, run_id: str) -> dict[str, GatePassed | GateFailed]:
    with EventStore(db, create=False) as store:
        events = [decode(e) for e in store.read(run_id=run_id, types=["GatePassed", "GateFailed"])]
    return {e.candidate: e for e in events}  # type: ignore[attr-defined]


def step_until(worker: Worker, db: Path, run_id: str, want: set[str], max_steps: int = 10) -> None:
    for _ in range(max_steps):
        if want <= set(verdicts(db, run_id)):
            return
        worker.step()
    assert want <= set(verdicts(db, run_id)), f"no verdict for {want - set(verdicts(db, run_id))}"


def test_the_gatekeeper_carries_on_after_a_crashing_candidate(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    run_id = new_run(db)
    bad = propose(db, run_id, "segfault", generator="expert")  # ctypes: outside the subset
    good = propose(db, run_id, "good_softmax")
    worker = Worker(str(db), "gatekeeper", run_id)
    try:
        step_until(worker, db, run_id, {bad, good})
        got = verdicts(db, run_id)
        assert isinstance(got[bad], GateFailed) and got[bad].category == "crash"
        assert "SIGSEGV" in got[bad].detail
        assert isinstance(got[good], GatePassed) and got[good].max_abs_err < 1e-5

        # the same worker object serves a later candidate
        later = propose(db, run_id, "exp_only")
        step_until(worker, db, run_id, {later})
        assert isinstance(verdicts(db, run_id)[later], GateFailed)
        assert verdicts(db, run_id)[later].category == "mismatch"
        assert worker.step() is False, "nothing left to gate"
    finally:
        worker.close()
    with EventStore(db, create=False) as store:
        assert store.count(run_id=run_id, type="GatePassed") == 1
        assert store.count(run_id=run_id, type="GateFailed") == 2
        assert store.count(run_id=run_id, type="TaskClaimed") == 3
        assert store.count(run_id=run_id, type="BudgetCharged") == 3
        assert all(store.is_done(f"{run_id}/gate/{c}") for c in (bad, good, later))


def test_the_gatekeeper_survives_a_candidate_that_garbles_the_protocol(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    run_id = new_run(db)
    bad = propose(db, run_id, "protocol_garbage", generator="expert")  # os: outside the subset
    good = propose(db, run_id, "good_softmax")
    worker = Worker(str(db), "gatekeeper", run_id)
    try:
        step_until(worker, db, run_id, {bad, good})
        got = verdicts(db, run_id)
        assert isinstance(got[bad], GateFailed)
        assert isinstance(got[good], GatePassed)
    finally:
        worker.close()


# --- the child's memo of reference draws -----------------------------------------------------------


def counting_problem(log: Path, dim: int = 200) -> str:
    """softmax_small whose reference logs each float64 forward (the gate's reference runs) to `log`."""
    logged = (
        "        if x.dtype == torch.float64:\n"
        f"            open({str(log)!r}, 'a').write('ref64\\n')\n"
        "        return torch.softmax(x, dim=1)"
    )
    source = PROBLEM.replace("        return torch.softmax(x, dim=1)", logged)
    return source.replace('"dim": 200}', f'"dim": {dim}}}')


@pytest.fixture
def counting_box(tmp_path: Path):
    """A sandbox whose child may write tmp_path, where counting_problem logs each reference run."""
    sb = Sandbox("cpu", writable=(str(tmp_path),), fresh_untrusted=False)
    try:
        yield sb
    finally:
        sb.close()


def test_the_reference_runs_once_a_draw_for_all_of_a_problems_candidates(
    counting_box: Sandbox, tmp_path: Path
) -> None:
    box = counting_box
    log = tmp_path / "ref64.log"

    def gate_on(problem: str, source: str) -> dict:
        args = {"problem_source": problem, "cand_source": source, "device": "cpu", "seeds": 3}
        return box.call(GateRequest(**args), timeout_s=120.0)[0].model_dump()

    def runs() -> int:
        return log.read_text().count("ref64") if log.exists() else 0

    problem = counting_problem(log)
    assert gate_on(problem, GOOD)["passed"] is True
    assert runs() == 3 + SEARCH  # one float64 reference run a seed, and the wide draw's span searched
    # a candidate that mutates its inputs mutates copies: the memo's draws stay as drawn
    r = gate_on(problem, candidate("mutates_input"))
    assert r["category"] == "policy" and "mutated its inputs" in r["detail"], r
    assert gate_on(problem, candidate("exp_only"))["category"] == "mismatch"
    assert gate_on(problem, GOOD)["passed"] is True
    # the wrong one's first failing draw got its spread (NUDGES runs), kept with it
    assert runs() == 3 + SEARCH + NUDGES
    # another problem is drawn and run anew
    assert gate_on(counting_problem(log, dim=136), GOOD)["passed"] is True
    assert runs() == 2 * (3 + SEARCH) + NUDGES


def test_truth_past_the_judges_budget_is_recomputed_for_each_candidate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A problem too large to hold its truth between candidates (a full-size KernelBench shape) holds
    none: each candidate's judging runs the reference again on the inputs' files, with the same
    verdicts."""
    monkeypatch.setattr(gate_host, "JUDGE_KEEP_BYTES", {"cpu": 0})
    log = tmp_path / "ref64.log"
    problem = counting_problem(log)
    box = Sandbox("cpu", writable=(str(tmp_path),), fresh_untrusted=False)

    def gate_on(source: str) -> dict:
        args = {"problem_source": problem, "cand_source": source, "device": "cpu", "seeds": 3}
        return box.call(GateRequest(**args), timeout_s=120.0)[0].model_dump()

    try:
        assert gate_on(GOOD)["passed"] is True
        assert log.read_text().count("ref64") == SEARCH + 6  # the span searched, 3 seeds drawn, 3 judged
        assert gate_on(candidate("exp_only"))["category"] == "mismatch"
        # judged up to its first wrong seed, whose spread (NUDGES runs) it then needed
        assert log.read_text().count("ref64") == SEARCH + 7 + NUDGES
        assert gate_on(GOOD)["passed"] is True
        assert log.read_text().count("ref64") == SEARCH + 10 + NUDGES
    finally:
        box.close()


def test_an_inputs_file_changed_under_the_judge_is_the_candidates_fault(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a read-only folder (KB_SANDBOX=none) a candidate can rewrite the judge's inputs files, to
    be judged on zeros; the judge reads back a file whose fingerprints moved and fails it (`policy`), and
    draws afresh for the next candidate."""
    monkeypatch.setattr(gate_host, "JUDGE_KEEP_BYTES", {"cpu": 0})
    monkeypatch.setenv("KB_SANDBOX", "none")
    spoils = GOOD.replace(
        FORWARD,
        FORWARD
        + "\n        import glob, sys\n"
        + "        frame = sys._getframe()\n"  # its own gate's folder, from the trial's frame
        + "        while 'draws' not in frame.f_locals:\n"
        + "            frame = frame.f_back\n"
        + "        for path in glob.glob(frame.f_locals['draws'].folder + '/*-inputs.pt'):\n"
        + "            torch.save([torch.zeros_like(x)], path)\n",
    )
    garbles = spoils.replace("torch.save([torch.zeros_like(x)], path)", "open(path, 'r+b').write(b'spoilt')")
    box = Sandbox("cpu", fresh_untrusted=False)
    try:
        r = gate(box, spoils)
        assert (r["passed"], r["category"]) == (False, "policy"), r
        assert "changed after the judge wrote it" in r["detail"], r
        assert gate(box, GOOD)["passed"] is True  # drawn afresh
        r = gate(box, garbles)  # its own next seed's file no longer reads
        assert (r["passed"], r["category"]) == (False, "policy"), r
        assert "no longer reads" in r["detail"], r
        assert gate(box, GOOD)["passed"] is True  # the judge saw its files written since: drawn afresh
    finally:
        box.close()


def test_a_resumed_run_starts_no_child_it_will_not_use(tmp_path: Path) -> None:
    """The analysis is the generator's only use of a sandbox child: with it recorded (a resumed run),
    warming one would cost a torch import (and on a GPU a CUDA context) for nothing. Nor does the
    gatekeeper warm its judge and child while no candidate can come to the gate; a proposal warms them."""
    from kernelbrain.core.events import GenerationDone, ProblemAnalysed

    db = tmp_path / "kb.db"
    run_id = new_run(db)
    with EventStore(db, create=False) as store:
        analysed = ProblemAnalysed(ops=[], families=["row_softmax"], flops=1, bytes=1, shapes=["s"])
        done = GenerationDone(task="round0", proposed=[], duplicates=0)
        store.append(
            [
                analysed.to_new(run_id, f"{run_id}/analysis", "test"),
                done.to_new(run_id, f"{run_id}/gen/round0/done", "test"),
            ]
        )
    worker = Worker(str(db), "generator", run_id)
    gatekeeper = Worker(str(db), "gatekeeper", run_id)
    try:
        assert worker.step() is False  # nothing to generate
        assert all(box.proc is None for box in worker.role.sandboxes.values())
        assert gatekeeper.step() is False  # round 0 proposed nothing, and nothing more will come
        assert all(box.proc is None for box in gatekeeper.role.sandboxes.values())
        propose(db, run_id, "good_softmax")
        gatekeeper.warm(gatekeeper.refresh()[0])
        assert gatekeeper.role.sandboxes["cpu"].proc is not None
        assert gatekeeper.role.sandboxes["cpu"].judge is not None
    finally:
        worker.close()
        gatekeeper.close()


# a problem whose input is a strided view: the gate must hand the candidate that layout, not a copy
STRIDED_PROBLEM = """
import torch
import torch.nn as nn

KB_SHAPES = [{"n": 64}]
n = 64


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn(n, 2 * n)[:, ::2]]


def get_init_inputs():
    return []
"""
# reads its input as if it were contiguous; CONTIGUOUS makes it so first
FLAT_DOUBLE = """
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0, mask=m)


class ModelNew(nn.Module):
    def forward(self, x):
        PREPARE
        y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        _double[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


def test_the_candidate_gets_the_problems_own_input_layout(box: Sandbox) -> None:
    def gate_on(source: str) -> dict:
        args = {"problem_source": STRIDED_PROBLEM, "cand_source": source, "device": "cpu", "seeds": 3}
        return box.call(GateRequest(**args), timeout_s=120.0)[0].model_dump()

    ignores_strides = gate_on(FLAT_DOUBLE.replace("PREPARE", "pass"))
    assert ignores_strides["passed"] is False and ignores_strides["category"] == "mismatch", ignores_strides
    assert "seed 0" in ignores_strides["detail"]  # the problem's own draw is the strided one
    assert gate_on(FLAT_DOUBLE.replace("PREPARE", "x = x.contiguous()"))["passed"] is True


def test_the_candidates_process_holds_no_reference_output_to_change_or_return(
    counting_box: Sandbox, tmp_path: Path
) -> None:
    """The truth lives in the judge's child: a candidate that walks gc for float64 tensors (to corrupt
    the kept reference, or to hand one back as its output) finds none, and the judge's draws stay."""
    box = counting_box
    log = tmp_path / "ref64.log"
    problem = counting_problem(log)

    def gate_on(source: str) -> dict:
        args = {"problem_source": problem, "cand_source": source, "device": "cpu", "seeds": 3}
        return box.call(GateRequest(**args), timeout_s=120.0)[0].model_dump()

    def runs() -> int:
        return log.read_text().count("ref64")

    found = (
        "\n        import gc\n"
        + "        wide = [o for o in gc.get_objects()\n"
        + "                if isinstance(o, torch.Tensor) and o.dtype == torch.float64]\n"
    )
    corrupting = GOOD.replace(FORWARD, FORWARD + found + "        [o.add_(1.0) for o in wide]\n")
    # its kernel runs, then it hands back a float64 tensor of the output's shape if it finds one, else
    # zeros
    returning = GOOD.replace(FORWARD, FORWARD + found).replace(
        "        return y",
        "        same = [o for o in wide if o.shape == x.shape]\n"
        + "        return same[-1].to(x.dtype) if same else y.zero_()",
    )
    assert gate_on(GOOD)["passed"] is True and runs() == 3 + SEARCH  # a seed each, and the span search
    assert gate_on(corrupting)["passed"] is True  # nothing to corrupt: it is an honest kernel
    r = gate_on(returning)
    assert (r["passed"], r["category"]) == (False, "mismatch"), r  # nothing to return but its zeros
    assert gate_on(GOOD)["passed"] is True
    assert runs() == 3 + SEARCH + NUDGES  # the judge's draws were never touched (the spread: its own)


def test_a_fingerprint_tells_every_bit() -> None:
    import torch

    from kernelbrain.child import loading

    a = torch.tensor([1.0, float("nan")])
    assert loading.fingerprint(a) == loading.fingerprint(a.clone())  # NaN bits compare equal
    assert loading.fingerprint(torch.tensor([1, 2])) != loading.fingerprint(torch.tensor([2, 2]))
    assert loading.fingerprint(torch.tensor([True])) != loading.fingerprint(torch.tensor([False]))
