"""The sweep's record of itself (tools/kernelbench_sweep.py): OUT/README.md, a row per problem and
fast_0/fast_1 per level with the misses, and OUT/pieces.json, each piece's wall time and the share of it
the device was held alone for timing."""

from __future__ import annotations

import argparse
import collections
import time
from pathlib import Path

from tools.h200_records import dump, load

COMMAND = "python tools/kernelbench_sweep.py --kernelbench {dir} --levels {levels}"


def record_piece(args: argparse.Namespace, began: float, files: int) -> None:
    """Append this sweep's wall time (its device time, where the device is the sweep's alone) and the
    share of it some run held the device alone for timing, to OUT/pieces.json."""
    from kernelbrain.store import open_store

    from kernelbrain.views.batch import alone_spans, alone_within

    ended = time.time()
    busy = alone_within([(a, b, "measure") for a, b in args.measured], began, ended)
    if args.db.exists():
        with open_store(str(args.db), create=False, readonly=True) as store:
            for spans in alone_spans(store.read(types=["BudgetCharged"])).values():
                busy += alone_within(spans, began, ended)
    path = args.out / "pieces.json"
    pieces = load(path)["pieces"] if path.exists() else []
    pieces.append({"began": began, "wall_s": ended - began, "timed_alone_s": busy, "files": files})
    dump(path, {"pieces": pieces})


def pieces_line(out: Path) -> str:
    """What the sweep's pieces took: wall minutes in all, and the runs' timed share of it."""
    path = out / "pieces.json"
    pieces = load(path)["pieces"] if path.exists() else []
    wall = sum(p["wall_s"] for p in pieces)
    busy = sum(p["timed_alone_s"] for p in pieces)
    share = (
        f", the device held alone for timing (the runs' and the winners') {100 * busy / wall:.0f}% of it"
        if wall
        else ""
    )
    return f"The sweep took {wall / 60:.1f} minutes of wall time over {len(pieces)} pieces{share}."


def table(args: argparse.Namespace, total: dict[int, int]) -> None:
    """OUT/README.md from every result JSON: a row per problem, fast_0/fast_1 per level, the misses."""
    results = sorted(
        (load(p) for p in args.out.glob("level*/*.json")),
        key=lambda r: (r["level"], int(r["problem"].split("_")[0]) if r["problem"][0].isdigit() else 0),
    )
    driver = f" (driver {args.gpu['driver']})" if args.gpu["driver"] else ""
    lines = [
        "# KernelBench sweep",
        "",
        f"Command: `{COMMAND.format(dir='KERNELBENCH', levels=','.join(map(str, args.levels)))} "
        f"--budget-gpu-s {args.budget_gpu_s} --max-candidates {args.max_candidates}"
        f"{f' --allow-torch {args.allow_torch}' if args.allow_torch else ''}`, "
        "over as many device calls as it took (each resumes the last). Speedups: the winner against eager "
        'PyTorch, torch.compile (default) and torch.compile(mode="max-autotune-no-cudagraphs") (on a GPU) '
        "in one process, same fresh inputs, the file's own shape, timed interleaved, medians of "
        f"{args.repeats} samples (IQR in the JSON); `vs best` is against the fastest of them, named. "
        "`kb GPU s`: what the run's GPU budget counted (its timings and profiles, the device held alone) / "
        "its children's busy seconds (gates and analyses too, sharing the device).",
        "",
        f"Card: {args.gpu['name']}{driver}. " + pieces_line(args.out),
        "",
        "| level | fast_0 (correct) | fast_1 vs eager | fast_1 vs compile | fast_1 vs best | swept |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    partial_rows = [r for r in results if r.get("winner_torch_ops")]
    for lv in args.levels:
        rs = [r for r in results if r["level"] == lv]
        correct = [r for r in rs if r.get("winner") and "error" not in r.get("timing", {})]
        f1e = [r for r in correct if (r["speedup"]["vs_eager"] or 0) > 1]
        f1c = [r for r in correct if (r["speedup"]["vs_compile"] or 0) > 1]
        f1b = [r for r in correct if (r["speedup"].get("vs_best") or 0) > 1]
        n = total[lv]
        partial = sum(bool(r.get("winner_torch_ops")) for r in correct)
        lines.append(
            f"| {lv} | {len(correct)}/{n}{f' ({partial} partial)' if partial else ''} | {len(f1e)}/{n} | "
            f"{len(f1c)}/{n} | {len(f1b)}/{n} | {len(rs)} of {n} files |"
        )
    misses = collections.Counter(_reason_class(r["miss"]) for r in results if r.get("miss"))
    lines += [
        "",
        "Most common reasons for a miss: " + "; ".join(f"{k} ({n})" for k, n in misses.most_common()),
    ]
    if evals := sum(r.get("mode") == "eval" for r in results):
        lines += [
            "",
            f"Run with `--eval`, marked [eval] below: {evals}, whose reference draws random numbers in "
            "training mode (dropout), which kb refuses as constructed.",
        ]
    if partial_rows:
        lines += [
            "",
            f"{len(partial_rows)} winners are partial kernels (`--allow-torch`), marked [torch: ...] below: "
            "they keep those torch ops in PyTorch and fuse the rest in Triton.",
        ]
    lines += [
        "",
        "| file | family | gate passed / failed | vs eager | vs compile | vs max-autotune | vs best "
        "| kb GPU s (budget / busy) | miss |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results:
        s = r.get("speedup", {})
        failed = ", ".join(f"{k} {n}" for k, n in r["gate_failed"].items()) or "0"
        best = f" ({s['best_baseline']})" if s.get("best_baseline") else ""
        family = r["winner_family"] or ", ".join(r["families"]) or "-"
        if r.get("winner_torch_ops"):
            family += f" [torch: {', '.join(r['winner_torch_ops'])}]"
        if r.get("mode") == "eval":  # its reference draws random numbers in training mode: run with --eval
            family += " [eval]"
        lines.append(
            f"| {r['file']} | {family} | "
            f"{r['gate_passed']} / {failed} | {_x(s.get('vs_eager'))} | {_x(s.get('vs_compile'))} | "
            f"{_x(s.get('vs_compile_max'))} | {_x(s.get('vs_best'))}{best} | "
            f"{_s(r.get('device_s'))} / {r['gpu_s']:.1f} | {(r.get('miss') or '').replace('|', '/')[:140]} |"
        )
    (args.out / "README.md").write_text("\n".join(lines) + "\n")


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "-"


def _s(v: float | None) -> str:
    """Seconds, or '-' in a row recorded before they were."""
    return f"{v:.1f}" if v is not None else "-"


def _reason_class(miss: str) -> str:
    if miss.startswith("every candidate failed"):
        return (
            "every candidate failed a benchmark's checks"
            if "benchmark" in miss
            else "every candidate failed the gate"
        )
    if miss.startswith("slower than eager"):
        return "slower than eager"
    return miss.split(":")[0]
