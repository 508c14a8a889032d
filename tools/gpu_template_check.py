"""Gate and time expert-template candidates of one or more problems on a GPU, outside a kb run.

The CPU tests run the kernels only through the Triton interpreter; this compiles them for the device,
gates each (3 seeds, every dtype group's smallest shape) and benchmarks the passing ones at one rung
(the primary shape by default) against the eager reference, each in a sandboxed child. Candidates:
every round-0 knob set the expert generator proposes, and any --knobs sets (tuning variants: a JSON
object of overrides on the family's first round-0 set of the same strategy). On the device machine:

    python3 tools/gpu_template_check.py [--out $OUT/check.json] [--device cuda] [PROBLEM ...]
    python3 tools/gpu_template_check.py benchmarks/problems/rmsnorm.py --no-round0 \
        --knobs '{"strategy": "registers", "block_s": 512, "num_warps": 8}'

Default problems: tests/problems/{layernorm_small,layernorm_functional,layernorm_decomposed,
l2norm_small,l2norm_normalize,bmv_small}.py (the families the seed problems do not exercise). Prints
one line per candidate; writes the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # for tools.*; appended, so an installed kb (tools/device_env.sh) comes first
    sys.path.append(str(ROOT))

from kernelbrain.core.events import ProblemAnalysed  # noqa: E402
from kernelbrain.core.protocol import AnalyseRequest, BenchRequest, GateRequest  # noqa: E402
from kernelbrain.generators.expert import ExpertGenerator  # noqa: E402
from kernelbrain.runtime.sandbox import Sandbox, SandboxFault  # noqa: E402
from kernelbrain.templates import knobs_with  # noqa: E402

DEFAULT = [
    ROOT / "tests" / "problems" / f"{name}.py"
    for name in (
        "layernorm_small",
        "layernorm_functional",
        "layernorm_decomposed",
        "l2norm_small",
        "l2norm_normalize",
        "bmv_small",
    )
]


def _verdict(row: dict) -> str:
    """PASS; REFUSED: a registers strategy refusing rows longer than it holds (F.layer_norm's and
    nn.LayerNorm's row length is not in the trace, so such candidates are proposed); else FAIL."""
    gate = row.get("gate", {})
    if gate.get("passed"):
        return "PASS"
    if gate.get("category") == "runtime" and "registers holds whole rows" in gate.get("detail", ""):
        return "REFUSED"
    return "FAIL"


def _candidates(source: str, analysis: dict, extra: list[dict], round0: bool) -> list[tuple[str, dict, str]]:
    """(family, knobs, source) for the round-0 proposals (if round0) and the extra knob sets."""
    gen = ExpertGenerator()
    analysed = ProblemAnalysed(**analysis, families=[])
    out = (
        [(p.family, p.knobs, p.source) for p in gen.first_round(analysed, problem_source=source)]
        if round0
        else []
    )
    if extra:
        family, spec = gen.match_family(analysed, problem_source=source)
        for over in extra:
            knobs = knobs_with(family, over)
            if not family.feasible(spec, knobs):
                print(f"skipped (infeasible at the traced shape): {json.dumps(knobs)}", flush=True)
                continue
            out.append((family.FAMILY, knobs, family.render(spec, knobs, analysis["signature"])))
    return out


def check(box: Sandbox, path: Path, device: str, extra: list[dict], round0: bool, which: str) -> list[dict]:
    source = path.read_text()
    analysis = box.call(AnalyseRequest(problem_source=source, device=device), timeout_s=300)[0].model_dump()
    rows = []
    for family, knobs, cand in _candidates(source, analysis, extra, round0):
        row = {"problem": path.name, "family": family, "knobs": knobs}
        try:
            request = GateRequest(problem_source=source, cand_source=cand, device=device, seeds=3)
            gate = box.call(request, timeout_s=300)[0]
            row["gate"] = gate.model_dump()
            if gate.passed:
                bench, _ = box.call(
                    BenchRequest(
                        problem_source=source,
                        cand_source=cand,
                        device=device,
                        which=which,
                        repeats=20,
                        warmup=5,
                    ),
                    timeout_s=300,
                )
                row["speedup"] = [s.speedup for s in bench.shapes]
        except SandboxFault as e:
            row["fault"] = str(e)
        verdict = _verdict(row)
        detail = row.get("speedup") or row.get("fault") or row.get("gate", {}).get("detail")
        print(f"{path.name:28s} {family:10s} {verdict} {json.dumps(knobs)} {detail}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the same through the interpreter")
    ap.add_argument(
        "--knobs", action="append", default=[], metavar="JSON", help="extra knob set (repeatable)"
    )
    ap.add_argument("--no-round0", action="store_true", help="only the --knobs sets")
    ap.add_argument("--which", default="primary", help="the ladder rung benchmarked (default primary)")
    args = ap.parse_args()
    extra = [json.loads(k) for k in args.knobs]
    box = Sandbox(args.device)
    try:
        results = [
            row
            for path in args.problems
            for row in check(box, path, args.device, extra, not args.no_round0, args.which)
        ]
    finally:
        box.close()
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    failed = [r for r in results if _verdict(r) == "FAIL"]
    passed = sum(_verdict(r) == "PASS" for r in results)
    print(f"{passed} of {len(results)} candidates passed the gate, {len(failed)} failed it")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
