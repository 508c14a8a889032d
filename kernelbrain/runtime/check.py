"""`kb check`: the gate (and with --bench the ladder) on one hand-written candidate, outside any run."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kernelbrain.core import subset
from kernelbrain.core.accuracy import Accuracy
from kernelbrain.core.events import RungSpec, ShapeTiming
from kernelbrain.core.problem import ProblemError, in_eval_mode, in_strict_fp32, read_problem
from kernelbrain.core.protocol import AnalyseRequest, BenchRequest, Device, Fit, GateReply, GateRequest
from kernelbrain.core.scoring import score
from kernelbrain.runtime.sandbox import ProblemFault, Sandbox, SandboxError, SandboxFault

GATE_TIMEOUT_S = 300.0
BENCH_TIMEOUT_S = 600.0


class RungResult(BaseModel):
    rung: int
    shapes: list[ShapeTiming]
    score: float
    timer: str


class CheckResult(GateReply):
    """The gate's verdict, then each rung's numbers while it passes."""

    model_config = ConfigDict(frozen=False)
    rungs: list[RungResult] = []


class CandidateFileError(Exception):
    """The candidate file given to `kb check` cannot be read."""


def read_candidate(path: str | Path) -> str:
    p = Path(path)
    if not p.is_file():
        raise CandidateFileError(f"candidate file {p} does not exist; pass a .py file defining ModelNew")
    try:
        return p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CandidateFileError(f"candidate file {p} cannot be read: {e}") from e


def check(
    problem: str | Path,
    candidate: str | Path,
    device: Device,
    rungs: tuple[RungSpec, ...] | None = None,
    seeds: int = 3,
    torch_ops: tuple[str, ...] = (),
    trusted: bool = False,
    eval_mode: bool = False,
    strict_fp32: bool = False,
) -> CheckResult:
    """The gate, then each rung while it passes; `torch_ops`: the classes of torch ops the candidate may
    keep in PyTorch (core/torch_ops.py), none by default. The file is first held to kb's candidate
    subset (core/subset.py), before any child starts; `trusted` skips that, for code kb wrote itself and
    for the sandbox's own tests, which reach the layers beneath it (`kb check` never passes it);
    `eval_mode`, `strict_fp32`: the problem as `kb run --eval`, `--strict-fp32` record it."""
    problem_source, cand_source = read_problem(problem), read_candidate(candidate)
    problem_source = in_eval_mode(problem_source) if eval_mode else problem_source
    problem_source = in_strict_fp32(problem_source) if strict_fp32 else problem_source
    refused = None if trusted else subset.check(cand_source, torch_ops)
    if refused is not None:
        return CheckResult(passed=False, category="policy", detail=refused)
    sandbox = Sandbox(device)
    try:
        fits, accuracy = _fits(sandbox, problem_source, device)
        try:
            gate = GateRequest(
                problem_source=problem_source,
                device=device,
                fits=fits,
                accuracy=accuracy,
                cand_source=cand_source,
                seeds=seeds,
                torch_ops=list(torch_ops),
            )
            r, _ = sandbox.call(gate, timeout_s=GATE_TIMEOUT_S, task="check/gate", spare=bool(rungs))
        except SandboxFault as f:
            return CheckResult(passed=False, category=f.category, detail=f.detail)
        except ProblemFault as e:  # the problem, not the candidate, failed
            raise ProblemError(f"problem file {problem} cannot be evaluated as it is: {e}") from None
        except SandboxError as e:
            return CheckResult(passed=False, category="runtime", detail=str(e).splitlines()[0])
        result = CheckResult.model_validate(r, from_attributes=True)
        ladder = rungs if result.passed and rungs else ()
        for i, rung in enumerate(ladder):
            try:
                b, _ = sandbox.call(
                    BenchRequest(
                        problem_source=problem_source,
                        device=device,
                        fits=fits,
                        accuracy=accuracy,
                        cand_source=cand_source,
                        which=rung.shapes,
                        repeats=rung.repeats,
                        warmup=rung.warmup,
                        torch_ops=list(torch_ops),
                    ),
                    timeout_s=BENCH_TIMEOUT_S,
                    task=f"check/{i}",
                    spare=i < len(ladder) - 1,
                )
            except (SandboxFault, SandboxError) as e:
                return result.model_copy(
                    update={
                        "passed": False,
                        "category": getattr(e, "category", "runtime"),
                        "detail": f"rung {i}: {str(e).splitlines()[0]}",
                    }
                )
            result.rungs.append(RungResult(rung=i, shapes=b.shapes, score=score(b.shapes), timer=b.timer))
        return result
    finally:
        sandbox.close()


def _fits(sandbox: Sandbox, problem_source: str, device: Device) -> tuple[list[Fit], Accuracy | None]:
    """The shapes a run's analysis would fit (checked on the reference) and the accuracy regime it would
    measure, made in the gate's judge, where no candidate code ever runs, while the candidate's child
    starts beside it (after the judge: it sees the judge's draws); none where the analysis fails (the
    judge's draws then say what)."""
    judge = sandbox.start_judge()
    sandbox.start()
    try:
        analysed, _ = judge.call(
            AnalyseRequest(problem_source=problem_source, device=device),
            timeout_s=GATE_TIMEOUT_S,
            task="check/fit",
        )
    except (SandboxFault, SandboxError, ProblemFault):
        return [], None
    return list(analysed.fits), analysed.accuracy
