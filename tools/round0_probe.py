"""Round-0 candidates of problem files timed against eager in this process, quickly: no sandbox, no gate,
for a first look on the GPU at a template change (kb's own bench is the measurement that counts).

    python3 tools/round0_probe.py [--max N] [--reps R] [--compile] [--knobs FILE.json] [--out FILE.json]
                                  PROBLEM.py ...

Per problem: the expert generator's round-0 proposals for the file's own shape; each candidate's
output checked against eager's on one random input set (max abs error printed); then eager and the
candidates timed interleaved with CUDA events on that set, medians of R samples. --compile times
torch.compile of the reference too; --knobs names knob sets to time instead of round 0, per problem
({"48_Mean_reduction_over_a_dimension": [{"strategy": ...}, ...]}), rendered by the matched family.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from kernelbrain.child.analysis import analyse  # noqa: E402
from kernelbrain.child.loading import Problem, in_mode  # noqa: E402
from kernelbrain.core.events import ProblemAnalysed  # noqa: E402
from kernelbrain.generators.base import Proposal  # noqa: E402
from kernelbrain.generators.expert import ExpertGenerator  # noqa: E402


def _load(source: str, folder: Path, name: str):
    path = folder / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def probe(
    path: Path, max_candidates: int, reps: int, folder: Path, knobs: list | None, compiled: bool
) -> dict:
    source = path.read_text()
    analysed = ProblemAnalysed(**analyse(source, "cuda"), families=[])
    generator = ExpertGenerator()
    if knobs is None:
        proposals = generator.first_round(analysed, problem_source=source)[:max_candidates]
    else:
        family, spec = generator.match_family(analysed, problem_source=source)
        proposals = [
            Proposal(source=family.render(spec, k, analysed.signature), family=family.FAMILY,
                     strategy=k["strategy"], knobs=k, hint="--knobs")
            for k in knobs
        ]  # fmt: skip
    problem = Problem(source)
    shape = problem.ladder_shapes("cuda", "primary")[0]
    inputs = problem.inputs(shape, 0, "cuda")
    # as kb's judge builds it: in the mode its constructor leaves it (KB_EVAL: eval)
    ref = in_mode(problem.module.Model(*problem.module.get_init_inputs()).cuda(), problem.eval_mode)
    with torch.no_grad():
        expected = ref(*inputs)
        rows = []
        failed = []
        for i, p in enumerate(proposals):
            try:  # a probe reports a candidate that does not compile or run, and goes on
                cand = _load(p.source, folder, f"{path.stem}_{i}")
                new = cand.ModelNew(*problem.module.get_init_inputs()).cuda()
                # the reference's parameters and buffers, where the names agree: errors then mean something
                mine = new.state_dict()
                same = {k: v for k, v in ref.state_dict().items() if k in mine and mine[k].shape == v.shape}
                new.load_state_dict(same, strict=False)
                got = new(*inputs)
                err = (got.float() - expected.float()).abs().max().item()
            except Exception as exc:
                failed.append({"family": p.family, "knobs": p.knobs, "error": _first_line(exc)})
                continue
            rows.append({"family": p.family, "knobs": p.knobs, "model": new, "max_abs_err": err})
            del got
        eager = [_median_ms(lambda: ref(*inputs), reps)]
        for row in rows:  # interleaved: eager again after each candidate
            model = row.pop("model")
            row["ms"] = _median_ms(lambda m=model: m(*inputs), reps)
            eager.append(_median_ms(lambda: ref(*inputs), reps))
            row["vs_eager"] = statistics.median(eager) / row["ms"]
        out = {
            "problem": path.name,
            "eager_ms": statistics.median(eager),
            "candidates": rows,
            "failed": failed,
        }
        if compiled:
            fast = torch.compile(ref)
            fast(*inputs)
            out["compile_ms"] = _median_ms(lambda: fast(*inputs), reps)
            out["eager_vs_compile"] = out["eager_ms"] / out["compile_ms"]
    return out


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1] if lines else ''}"[:300]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("problems", nargs="+", type=Path)
    parser.add_argument("--max", type=int, default=4)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--compile", action="store_true", help="time torch.compile of the reference too")
    parser.add_argument(
        "--knobs", type=Path, help="JSON: problem stem -> knob sets to time instead of round 0"
    )
    args = parser.parse_args()
    knob_sets = json.loads(args.knobs.read_text()) if args.knobs else {}
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in args.problems:
            try:
                result = probe(path, args.max, args.reps, Path(tmp), knob_sets.get(path.stem), args.compile)
            except Exception as exc:  # one problem failing must not lose the others
                result = {"problem": path.name, "error": _first_line(exc)}
                print(f"{path.name}: {result['error']}", flush=True)
            else:
                line = f"{result['problem']}: eager {result['eager_ms']:.3f} ms"
                if "compile_ms" in result:
                    line += f", torch.compile {result['compile_ms']:.3f} ms"
                print(line, flush=True)
                for row in result["candidates"]:
                    speed = f"{row['vs_eager']:.3f}x  {row['ms']:.3f} ms"
                    what = f"{row['family']} {row['knobs']}"
                    print(f"  {speed}  err {row['max_abs_err']:.2e}  {what}", flush=True)
                for row in result["failed"]:
                    print(f"  FAILED {row['family']} {row['knobs']}: {row['error']}", flush=True)
            results.append(result)
            torch.cuda.empty_cache()
            if args.out:  # written after each problem: a call cut off by its time limit keeps the rest
                args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
