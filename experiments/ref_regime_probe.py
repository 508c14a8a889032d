"""Which precision the user's reference runs in, per problem file, at the file's own (primary) shape and
at the gate's fitted shapes (issue 37's question): each file's Model, as constructed (training mode),
run in fp32 with PyTorch's default backend flags and again with TF32 off everywhere, both compared with
a float64 run of the same module and inputs. An error with the defaults far above the IEEE run's means
the reference the user runs is TF32 there (cuDNN's algorithm choice depends on the shape).

    python3 experiments/ref_regime_probe.py --out OUT.json [--match conv] FILE.py ...

Writes OUT.json (one row per file and shape) after every file, and prints a Markdown table.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import torch

from kernelbrain.child.loading import Problem, outputs
from kernelbrain.core.problem import shape_label


def _errors(got: list[torch.Tensor], truth: list[torch.Tensor]) -> dict[str, float]:
    """The largest error over the largest true magnitude, and the median error over the median one."""
    err = torch.cat([(g.double() - t).abs().flatten() for g, t in zip(got, truth, strict=True)])
    mag = torch.cat([t.abs().flatten() for t in truth])
    sample = torch.randperm(err.numel(), device=err.device)[: 1 << 20]
    return {
        "max_rel": float(err.max() / mag.max().clamp_min(1e-300)),
        "med_rel": float(err[sample].median() / mag[sample].median().clamp_min(1e-300)),
    }


def _time_ms(model: torch.nn.Module, xs: list, reps: int = 5) -> float:
    if not torch.cuda.is_available():
        return float("nan")  # a dry run on CPU checks the probe, not the times
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(reps):
        start.record()
        model(*xs)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def _flags(tf32: bool) -> None:
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # PyTorch's default for matmuls, both runs


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def probe(problem: Problem, shape: dict) -> dict:
    init = problem.init_inputs(shape)
    torch.manual_seed(1234)
    with torch.device(DEVICE):
        model = problem.module.Model(*init)  # as constructed: training mode, as KernelBench runs it
    xs = problem.inputs(shape, 0, DEVICE)
    row: dict = {"shape": shape_label(shape), "training": model.training}
    with torch.no_grad():
        model64 = copy.deepcopy(model).double()
        xs64 = [x.double() if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in xs]
        truth = outputs(model64(*xs64))
        del model64, xs64
        for name, tf32 in (("default", True), ("ieee", False)):
            _flags(tf32)
            got = outputs(model(*xs))
            row[name] = _errors(got, truth)
            row[f"{name}_ms"] = _time_ms(model, xs)
            del got
        _flags(True)
    row["ratio"] = row["default"]["max_rel"] / max(row["ieee"]["max_rel"], 1e-300)
    row["regime"] = "tf32" if row["ratio"] > 8 else "ieee"
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--match", default="", help="only files whose name contains this (any case)")
    args = ap.parse_args()
    rows = []
    for f in args.files:
        path = Path(f)
        if args.match.lower() not in path.name.lower():
            continue
        t0 = time.time()
        try:
            problem = Problem(path.read_text())
            shapes = [("primary", problem.shapes[0])] + [("gate", s) for s in problem.gate_shapes("cuda")]
            if DEVICE == "cpu":  # a dry run: the CPU shape only
                shapes = [("cpu", problem.ladder_shapes("cpu", "primary")[0])]
        except Exception as e:
            rows.append({"file": path.name, "error": f"{type(e).__name__}: {e}"[:200]})
            continue
        for which, shape in shapes:
            try:
                rows.append({"file": path.name, "which": which, **probe(problem, shape)})
            except Exception as e:
                rows.append({"file": path.name, "which": which, "error": f"{type(e).__name__}: {e}"[:200]})
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        print(f"{path.name}: {time.time() - t0:.1f} s", file=sys.stderr, flush=True)
        gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu"
        Path(args.out).write_text(json.dumps({"gpu": gpu, "rows": rows}, indent=1))
    print("| file | which | shape | default max/med rel err | IEEE max/med rel err | ratio | regime", end="")
    print(" | ms TF32/IEEE |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['file']} | {r.get('which', '')} | | {r['error']} | | | | |")
            continue
        d, i = r["default"], r["ieee"]
        print(
            f"| {r['file'][:40]} | {r['which']} | {r['shape'][:40]} "
            f"| {d['max_rel']:.2e} / {d['med_rel']:.2e} "
            f"| {i['max_rel']:.2e} / {i['med_rel']:.2e} | {r['ratio']:.1f} | {r['regime']} "
            f"| {r['default_ms']:.3f} / {r['ieee_ms']:.3f} |"
        )


if __name__ == "__main__":
    main()
