"""Gate and time every round-0 candidate of the layernorm, l2norm and batched-gemv templates on a GPU.

The CPU tests run these kernels only through the Triton interpreter; this compiles them for the
device, gates each (3 seeds, every dtype group's smallest shape) and benchmarks the passing ones at
the primary shape against the eager reference, each in a sandboxed child. On the device machine:

    python3 tools/gpu_row_norm_check.py [--out $OUT/row_norm_check.json] [--device cuda] [PROBLEM ...]

Default problems: tests/problems/{layernorm_small,layernorm_functional,layernorm_decomposed,
l2norm_small,l2norm_normalize,bmv_small}.py. Prints one line per candidate; writes the results as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kernelbrain.events import ProblemAnalysed  # noqa: E402
from kernelbrain.generators.expert import ExpertGenerator  # noqa: E402
from kernelbrain.sandbox import Sandbox, SandboxFault  # noqa: E402

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


def check(box: Sandbox, path: Path, device: str) -> list[dict]:
    source = path.read_text()
    analysis, _ = box.call("analyse", {"problem_source": source, "device": device}, timeout_s=300)
    proposals = ExpertGenerator().first_round(ProblemAnalysed(**analysis, families=[]), problem_source=source)
    rows = []
    for p in proposals:
        row = {"problem": path.name, "family": p.family, "knobs": p.knobs}
        try:
            gate, _ = box.call(
                "gate",
                {"problem_source": source, "cand_source": p.source, "device": device, "seeds": 3},
                timeout_s=300,
            )
            row["gate"] = gate
            if gate["passed"]:
                bench, _ = box.call(
                    "bench",
                    {
                        "problem_source": source,
                        "cand_source": p.source,
                        "device": device,
                        "which": "primary",
                        "repeats": 20,
                        "warmup": 5,
                    },
                    timeout_s=300,
                )
                row["speedup"] = [s["speedup"] for s in bench["shapes"]]
        except SandboxFault as e:
            row["fault"] = str(e)
        verdict = _verdict(row)
        detail = row.get("speedup") or row.get("fault") or row.get("gate", {}).get("detail")
        print(f"{path.name:28s} {p.family:10s} {verdict} {json.dumps(p.knobs)} {detail}", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--out", type=Path, default=None, help="write the results here as JSON")
    ap.add_argument("--device", default="cuda", help="cuda; cpu runs the same through the interpreter")
    args = ap.parse_args()
    box = Sandbox(args.device)
    try:
        results = [row for path in args.problems for row in check(box, path, args.device)]
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
