"""The compare phase of issue 5's measurement (tools/h200_measure.py compare): in one process and on the
same fresh inputs, per shape, the ladder winner, the flat winner, eager PyTorch, torch.compile (default)
and torch.compile(mode="max-autotune-no-cudagraphs"), timed interleaved (CUDA events, L2 flushed before
each sample), medians with their interquartile range; plus the physical floor of the shape."""

from __future__ import annotations

import gc
import math
import time
from pathlib import Path
from typing import Any

from tools.h200_records import ROOT, dump, load, run_of


def _winner_source(db: Path) -> tuple[str | None, str | None]:
    """The run's winner (or, unfinished, its leader) as the candidate source the run measured."""
    from kernelbrain.core.errors import RunError
    from kernelbrain.views.export import pick

    store, state = run_of(db)
    with store:
        try:
            c = pick(state)
        except RunError:  # nothing measured yet
            return None, None
        return store.get_blob(c.proposal.source).decode(), c.id


def _max_err(a: list, b: list) -> float:
    return (
        max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))
        if a
        else math.inf
    )


def _floor_s(problem, shape: dict, ceil: dict, device: str) -> dict:
    from kernelbrain.child.analysis import flops_and_bytes

    flops, nbytes = flops_and_bytes(problem, shape, device)
    dtype = next(
        (
            str(x.dtype).removeprefix("torch.")
            for x in problem.inputs(shape, 0, "meta")
            if hasattr(x, "dtype") and x.is_floating_point()
        ),
        "float32",
    )
    mem_s = nbytes / ceil["copy_bandwidth_Bps"]
    rate = ceil["matmul_flops"].get(dtype, ceil["matmul_flops"]["float32"])
    # FlopCounterMode counts only matmul-like ops; for the rest the flops estimate is an element
    # count, which no matmul rate bounds: those floors are the memory floor
    comp_s = flops / rate if flops > 4 * nbytes else 0.0
    return {
        "bytes": nbytes,
        "flops": flops,
        "dtype": dtype,
        "memory_s": mem_s,
        "compute_s": comp_s,
        "floor_s": max(mem_s, comp_s),
        "bound": "compute" if comp_s > mem_s else "memory",
    }


def _nbytes(values: list) -> int:
    return sum(x.numel() * x.element_size() for x in values if hasattr(x, "element_size"))


def input_sets(device: str, set_bytes: int, out_bytes: int, most: int = 3) -> int:
    """How many distinct input draws to time on (2 to `most`): as many as fit in half the device's free
    memory beside two outputs (the check holds eager's and a contender's at once), two at the least (one
    repeated draw is never timed). An 80 GB card takes fewer of a 6 GB problem's draws than a 141 GB
    one, rather than running out of memory."""
    import torch

    if device != "cuda":
        return most
    free, _ = torch.cuda.mem_get_info()
    room = free // 2 - 2 * out_bytes
    return max(2, min(most, room // max(1, set_bytes) + 1))  # +1: the first set is already held


def side_by_side(problem, shape: dict, device: str, fns: dict[str, Any], repeats: int, name: str) -> tuple:
    """`fns` (eager first) called on the same fresh, distinct input draws (as many as the device's memory
    holds, up to three: `input_sets`) and checked against eager one draw at a time, then timed
    interleaved (who goes first rotating, CUDA events, L2 flushed): per key its median, IQR, error
    against eager and first-calls time, or the error that stopped it; the calls per sample; the draws
    used."""
    import torch

    from kernelbrain.child.loading import outputs
    from kernelbrain.child.timing import Timer, quartiles

    timer = Timer(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    fns = dict(fns)
    sets = [problem.inputs(shape, 500, device)]
    with torch.no_grad():
        out_bytes = _nbytes(outputs(fns["eager"](*sets[0])))
    sync()
    n = input_sets(device, _nbytes(list(sets[0])), out_bytes)
    sets += [problem.inputs(shape, 500 + i, device) for i in range(1, n)]
    # never time on zeros or on one repeated draw: the sets must be distinct random data
    first = next(x for x in sets[0] if isinstance(x, torch.Tensor) and x.is_floating_point())
    second = next(x for x in sets[1] if isinstance(x, torch.Tensor) and x.is_floating_point())
    assert first.abs().sum() > 0 and not torch.equal(first, second), f"{name}: degenerate inputs"
    errs: dict[str, float] = {}
    compile_s: dict[str, float] = {}
    rows: dict[str, dict] = {}
    with torch.no_grad():
        for key, fn in list(fns.items()):
            t0 = time.perf_counter()
            err = 0.0
            try:
                for s in sets:  # one draw at a time: two outputs held, never 2 x len(sets)
                    got = outputs(fn(*s))
                    if key != "eager":
                        err = max(err, _max_err(got, outputs(fns["eager"](*s))))
                    del got
                sync()
            except torch.OutOfMemoryError:
                raise  # the device's, not the contender's: the caller decides (the sweep tries again)
            except Exception as e:  # a compile mode that fails is reported, not fatal
                rows[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                del fns[key]
                continue
            compile_s[key] = time.perf_counter() - t0
            errs[key] = err
        for _ in range(3):
            for fn in fns.values():
                fn(*sets[0])
        calls = timer.calls_for(*(lambda f=f, a=sets[0]: f(*a) for f in fns.values()))
        times: dict[str, list[float]] = {k: [] for k in fns}
        gc.collect()
        gc.disable()
        try:
            keys = list(fns)
            for i in range(repeats):
                order = keys[i % len(keys) :] + keys[: i % len(keys)]  # rotate who goes first
                draw = sets[i % len(sets)]
                for k in order:
                    times[k].append(timer(lambda f=fns[k], a=draw: f(*a), calls))
        finally:
            gc.enable()
    for k, ts in times.items():
        med, iqr = quartiles(ts)
        rows[k] = {
            "median_s": med,
            "iqr_s": iqr,
            "max_abs_err_vs_eager": errs[k],
            "first_calls_s": compile_s[k],
        }
    return rows, calls, len(sets)


def compare(device: str, problems: list[str], outdir: Path, ceil_path: Path, repeats: int) -> None:
    import torch

    from kernelbrain.child.loading import Problem, build, load_module
    from kernelbrain.core.problem import shape_label

    ceil = load(ceil_path)
    for name in problems:
        path = ROOT / "benchmarks" / "problems" / f"{name}.py"
        problem = Problem(path.read_text())
        contenders_src = {}
        for arm in ("ladder", "flat"):
            db = outdir / arm / f"{name}.db"
            if db.exists():
                src, cid = _winner_source(db)
                if src is not None:
                    contenders_src[arm] = (src, cid)
        result: dict[str, Any] = {
            "problem": name,
            "winners": {a: c for a, (_, c) in contenders_src.items()},
            "shapes": [],
        }
        shapes = problem.ladder_shapes(device, "all")
        for shape in shapes:
            torch.compiler.reset()
            label = shape_label(shape)
            ref, _ = build(problem, None, shape, device)
            fns: dict[str, Any] = {"eager": ref}
            for arm, (src, _) in contenders_src.items():
                cand = load_module(src, f"winner_{arm}")
                _, new = build(problem, cand, shape, device)
                fns[f"kb_{arm}"] = new
            for mode in ("default", "max-autotune-no-cudagraphs"):
                fns[f"compile_{mode}"] = torch.compile(
                    build(problem, None, shape, device)[0], **({} if mode == "default" else {"mode": mode})
                )
            rows, calls, _ = side_by_side(problem, shape, device, fns, repeats, name)
            eager = rows["eager"]["median_s"]
            timed = [k for k, r in rows.items() if "median_s" in r]
            for k in timed:
                rows[k]["speedup_vs_eager"] = eager / rows[k]["median_s"]
            floor = _floor_s(problem, shape, ceil, device)
            for k in timed:
                rows[k]["floor_fraction"] = floor["floor_s"] / rows[k]["median_s"]
            result["shapes"].append(
                {
                    "shape": label,
                    "primary": shape is shapes[0],
                    "calls": calls,
                    "repeats": repeats,
                    "floor": floor,
                    "times": rows,
                }
            )
            del fns
            if device == "cuda":
                torch.cuda.empty_cache()
            print(
                f"{name} {label}: "
                + ", ".join(
                    f"{k} {v['median_s'] * 1e3:.3f} ms" if "median_s" in v else f"{k} {v['error']}"
                    for k, v in rows.items()
                )
                + f"; floor {floor['floor_s'] * 1e3:.3f} ms",
                flush=True,
            )
        dump(outdir / "compare" / f"{name}.json", result)
