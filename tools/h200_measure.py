"""Issue 5's measurement: kb against eager PyTorch and torch.compile on the six seed problems.

Phases, each a subcommand (tools/h200_measure.sh runs them on the device machine):

  ceilings  the two physical ceilings of this GPU: device-to-device copy bandwidth and the matmul
            rate per dtype, measured on random data
  search    `kb run` with the expert generator under a fixed GPU-time budget, one database per
            problem; `--arm ladder` uses kb's default ladder, `--arm flat` measures every candidate
            at full fidelity only (the ablation's other arm, same seed, same generator)
  compare   in one process and on the same fresh inputs, per shape: the ladder winner, the flat
            winner, eager PyTorch, torch.compile (default) and torch.compile(mode=
            "max-autotune-no-cudagraphs"), timed interleaved (CUDA events, L2 flushed before each
            sample), medians with their interquartile range; plus the physical floor of the shape
  report    benchmarks/results/h200.json and RESULTS.md from all of the above: speedups, targets
            met or missed (by how much), the ablation, the GPU's busy fraction, the winner's profile

Everything the numbers rest on is recorded: the databases hold every event of the searches.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROBLEMS = ("softmax", "rmsnorm", "matvec", "linear_relu_div", "sdp_attn", "group_conv")
# the ablation's arms: kb's default ladder (no --ladder); flat: one rung, every shape at the top
# rung's fidelity (the default ladder ends so); ladder_primary: rung 0 on the primary shape with few
# repeats instead of the smallest shape (which is launch-bound for some problems)
LADDERS = {"ladder": None, "flat": "all:100:10", "ladder_primary": "primary:5:2,primary:30:5,all:100:10"}
# issue 5, section 2: large shapes (the problem's primary shape), speedup over eager / torch.compile
TARGETS: dict[str, dict[str, float]] = {
    "group_conv": {"eager": 10.0},
    "rmsnorm": {"eager": 3.0, "compile": 1.05},
    "softmax": {"eager": 1.9, "compile": 1.4},
    "matvec": {"eager": 1.15},
    "linear_relu_div": {"eager": 1.1},
    "sdp_attn": {"eager_every_shape": 1.0},
}
GEOMEAN_TARGET = 2.3
ABLATION_TARGET = 0.5  # the ladder's GPU seconds over flat's, for a winner equal within noise
BUSY_TARGET = 0.8
GPU_ROLES = {"gatekeeper", "benchmarker", "profiler"}


def _dump(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY))


def _load(path: Path) -> Any:
    return orjson.loads(path.read_bytes())


# --- ceilings ------------------------------------------------------------------------------------


def ceilings(out: Path, device: str) -> dict:
    import torch

    from kernelbrain.evaluate import _Timer

    timer = _Timer(device)
    # 2 GiB of fp32 on the GPU: far past the L2 (a token size for a CPU dry run)
    n = (512 if device == "cuda" else 4) * 1024 * 1024
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    copy_t = statistics.median(timer(lambda d=dst, s=src: d.copy_(s)) for _ in range(20))
    del src, dst
    rates = {}
    for name, dtype in (("float32", torch.float32), ("float16", torch.float16), ("bfloat16", torch.bfloat16)):
        m = 8192 if device == "cuda" else 256
        a, b = torch.randn(m, m, device=device, dtype=dtype), torch.randn(m, m, device=device, dtype=dtype)
        a @ b
        t = statistics.median(timer(lambda a=a, b=b: a @ b) for _ in range(10))
        rates[name] = 2 * m**3 / t
    result = {
        "copy_bandwidth_Bps": 2 * n * 4 / copy_t,
        "matmul_flops": rates,
        "note": "copy counts bytes read plus written; fp32 matmul as eager runs it "
        f"(allow_tf32={torch.backends.cuda.matmul.allow_tf32})",
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu (dry run)",
        "torch": torch.__version__,
    }
    _dump(out, result)
    print(
        f"copy {result['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; matmul TFLOP/s "
        + ", ".join(f"{k} {v / 1e12:.0f}" for k, v in rates.items())
    )
    return result


# --- search --------------------------------------------------------------------------------------


def search(
    device: str,
    problems: list[str],
    arm: str,
    outdir: Path,
    budget_gpu_s: float,
    max_candidates: int,
    seed: int,
    gpu: int,
    timeout_s: float,
) -> None:
    # each arm compiles into a Triton cache of its own, cold at the start: with one shared cache the arm
    # that compiled a kernel first paid for it, and the other's gate found it compiled (session 4's
    # linear_relu_div: 0.06 s flat gates against 0.6 s ladder ones)
    cache = Path(tempfile.gettempdir()) / f"kb-triton-{arm}"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    for name in problems:
        db = outdir / arm / f"{name}.db"
        db.parent.mkdir(parents=True, exist_ok=True)
        db.unlink(missing_ok=True)
        cmd = [
            sys.executable,
            "-m",
            "kernelbrain",
            "run",
            str(ROOT / "benchmarks" / "problems" / f"{name}.py"),
            "--db",
            str(db),
            "--device",
            device,
            "--generator",
            "expert",
            "--seed",
            str(seed),
            "--budget-gpu-s",
            str(budget_gpu_s),
            "--max-candidates",
            str(max_candidates),
            "--gpu",
            str(gpu),
            "--quiet",
        ]
        if LADDERS[arm] is not None:
            cmd += ["--ladder", LADDERS[arm]]
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
            tail = (p.stdout + p.stderr).strip().splitlines()[-3:]
        except subprocess.TimeoutExpired:
            tail = [f"timed out after {timeout_s:g} s (the database keeps what was recorded)"]
        print(f"[{arm}] {name}: {time.perf_counter() - t:.0f} s wall; " + " | ".join(tail), flush=True)


def _run_of(db: Path):
    from kernelbrain.runner import load_state
    from store import EventStore

    store = EventStore(str(db), readonly=True)  # results are committed: reading must not touch them
    run_ids = store.run_ids()
    if not run_ids:
        raise SystemExit(f"{db} holds no run")
    return store, load_state(store, run_ids[-1])


def _winner_source(db: Path) -> tuple[str | None, str | None]:
    """The run's winner (or, unfinished, its leader) as the candidate source the run measured."""
    from kernelbrain.export import pick
    from kernelbrain.runner import RunError

    store, state = _run_of(db)
    with store:
        try:
            c = pick(state)
        except RunError:  # nothing measured yet
            return None, None
        return store.get_blob(c.proposal.source).decode(), c.id


# --- compare -------------------------------------------------------------------------------------


def _max_err(a: list, b: list) -> float:
    return (
        max(float((x.double() - y.double()).abs().max()) for x, y in zip(a, b, strict=True))
        if a
        else math.inf
    )


def _floor_s(problem, shape: dict, ceil: dict, device: str) -> dict:
    from kernelbrain.evaluate import _flops_and_bytes

    flops, nbytes = _flops_and_bytes(problem, shape, device)
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


def compare(device: str, problems: list[str], outdir: Path, ceil_path: Path, repeats: int) -> None:
    import torch

    from kernelbrain.evaluate import Problem, _build, _outputs, _quartiles, _Timer, load_module
    from kernelbrain.problem import shape_label

    ceil = _load(ceil_path)
    timer = _Timer(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
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
            ref, _ = _build(problem, None, shape, device)
            fns: dict[str, Any] = {"eager": ref}
            for arm, (src, _) in contenders_src.items():
                cand = load_module(src, f"winner_{arm}")
                _, new = _build(problem, cand, shape, device)
                fns[f"kb_{arm}"] = new
            compile_s = {}
            for mode in ("default", "max-autotune-no-cudagraphs"):
                fns[f"compile_{mode}"] = torch.compile(
                    _build(problem, None, shape, device)[0], **({} if mode == "default" else {"mode": mode})
                )
            sets = [problem.inputs(shape, 500 + i, device) for i in range(3)]
            # never time on zeros or on one repeated draw: the three sets must be distinct random data
            first = next(x for x in sets[0] if isinstance(x, torch.Tensor) and x.is_floating_point())
            second = next(x for x in sets[1] if isinstance(x, torch.Tensor) and x.is_floating_point())
            assert first.abs().sum() > 0 and not torch.equal(first, second), f"{name}: degenerate inputs"
            errs: dict[str, float] = {}
            rows: dict[str, dict] = {}
            with torch.no_grad():
                expect = [_outputs(ref(*s)) for s in sets]
                for key, fn in list(fns.items()):
                    t0 = time.perf_counter()
                    try:
                        got = [_outputs(fn(*s)) for s in sets]
                        sync()
                    except Exception as e:  # a compile mode that fails is reported, not fatal
                        rows[key] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
                        del fns[key]
                        continue
                    compile_s[key] = time.perf_counter() - t0
                    errs[key] = max(_max_err(g, x) for g, x in zip(got, expect, strict=True))
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
                        for k in order:
                            times[k].append(timer(lambda f=fns[k], a=sets[i % 3]: f(*a), calls))
                finally:
                    gc.enable()
            for k, ts in times.items():
                med, iqr = _quartiles(ts)
                rows[k] = {
                    "median_s": med,
                    "iqr_s": iqr,
                    "max_abs_err_vs_eager": errs[k],
                    "first_calls_s": compile_s[k],
                }
            eager = rows["eager"]["median_s"]
            for k in times:
                rows[k]["speedup_vs_eager"] = eager / rows[k]["median_s"]
            floor = _floor_s(problem, shape, ceil, device)
            for k in times:
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
            del fns, sets, expect
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
        _dump(outdir / "compare" / f"{name}.json", result)


# --- report --------------------------------------------------------------------------------------


def _busy(store, state) -> dict:
    """Fraction of the run's wall time with a GPU task in flight: the union of the GPU roles'
    charged intervals [recorded - wall_s, recorded] over the run's first to last event."""
    events = list(store.iter_events(run_id=state.run_id))
    t0, t1 = events[0].ts, events[-1].ts
    spans, by_role = [], {}
    for e in events:
        if e.type != "BudgetCharged":
            continue
        p = e.payload
        by_role[p["role"]] = by_role.get(p["role"], 0.0) + p["wall_s"]
        if p["role"] in GPU_ROLES:
            spans.append((e.ts - p["wall_s"], e.ts))
    busy, end = 0.0, -math.inf
    for a, b in sorted(spans):
        a = max(a, end)
        if b > a:
            busy += b - a
        end = max(end, b)
    wall = max(t1 - t0, 1e-9)
    # where the idle time went: before the first GPU task (workers start, the analysis, round 0's
    # proposals), between tasks, and after the last one
    start = min((a for a, _ in spans), default=t1) - t0
    after = max(t1 - end, 0.0) if spans else 0.0
    return {
        "wall_s": wall,
        "gpu_busy_s": busy,
        "busy_fraction": busy / wall,
        "idle_s": {"start": start, "between": max(wall - busy - start - after, 0.0), "end": after},
        "task_wall_s_by_role": by_role,
        "gpu_s_charged": state.gpu_s,
    }


def _ablation_arm(store, state) -> dict:
    """GPU seconds charged until the winner was first measured (any rung) and until its highest
    rung's measurement was recorded."""
    win = state.finished.winner if state.finished else None
    charged, first_any, first_top = 0.0, None, None
    top = max(state.candidates[win].results) if win and state.candidates[win].results else None
    # what the GPU seconds to the winner's first measurement paid for, by task kind (gen, gate, bench,
    # profile): the arms differ only in bench, so the rest bounds what the ladder can save
    by_task: dict[str, float] = {}
    # a measurement's own charge is recorded just after it: it is counted in
    pending_any = pending_top = False
    for e in store.iter_events(run_id=state.run_id):
        p = e.payload
        if e.type == "RungBenchmarked" and p["candidate"] == win:
            pending_any = pending_any or first_any is None
            pending_top = pending_top or (p["rung"] == top and first_top is None)
        elif e.type == "BudgetCharged":
            charged += p["gpu_s"]
            if first_any is None:
                kind = p["action"].split("/")[1] if p["action"].count("/") else p["action"]
                by_task[kind] = by_task.get(kind, 0.0) + p["gpu_s"]
            if pending_any:
                first_any, pending_any = charged, False
            if pending_top:
                first_top, pending_top = charged, False
    res = state.candidates[win].results[top] if win else None
    return {
        "run_id": state.run_id,
        "winner": win,
        "winner_rung": top,
        "candidates": len(state.candidates),
        "gpu_s_to_winner_first_measured": first_any,
        "gpu_s_to_winner_first_by_task": by_task,
        "gpu_s_to_winner_top_measured": first_top,
        "gpu_s_total": state.gpu_s,
        "winner_score": res.score if res else None,
        "finish_reason": state.finished.reason if state.finished else None,
    }


def _winner_profile(store, state) -> dict | None:
    win = state.finished.winner if state.finished else None
    for e in store.iter_events(run_id=state.run_id):
        if e.type == "ProfileCaptured":
            p = e.payload
            if p.get("candidate") == win:
                return {k: p.get(k) for k in ("source", "labels", "metrics", "note") if k in p}
    return None


def _idle(busy: dict) -> str:
    idle = busy.get("idle_s")  # absent from reports made before it was recorded
    return f" ({idle['start']:.1f} / {idle['between']:.1f} / {idle['end']:.1f})" if idle else ""


def ablation_verdict(entry: dict) -> dict | None:
    """Issue 5, section 3: the ladder's GPU seconds to its winner's first measurement over flat's, and
    whether the two winners are equal within noise at the large shape (their medians' IQR bands, from
    the compare, overlap)."""
    if "ladder" not in entry or "flat" not in entry:
        return None
    first = {arm: entry[arm]["ablation"]["gpu_s_to_winner_first_measured"] for arm in ("ladder", "flat")}
    times = entry.get("compare", {}).get("shapes", [{}])[0].get("times", {})
    lad, flat = times.get("kb_ladder"), times.get("kb_flat")
    if None in first.values() or not lad or not flat:
        return None
    lo, hi = sorted((lad, flat), key=lambda t: t["median_s"])
    equal = lo["median_s"] + lo["iqr_s"] / 2 >= hi["median_s"] - hi["iqr_s"] / 2
    ratio = first["ladder"] / first["flat"]
    same = entry["ladder"]["ablation"]["winner"] == entry["flat"]["ablation"]["winner"]
    return {
        "ratio": ratio,
        "same_winner": same,
        "equal_within_noise": same or equal,
        "met": ratio <= 0.5 and (same or equal),
    }


def _ablation_verdicts(doc: dict) -> list[str]:
    out = [
        "",
        "Target (issue 5, section 3): the ladder's GPU s to its winner's first measurement <= 50% of flat's, "
        "for a winner equal within noise: the same candidate, or two whose bands median +/- IQR/2 at the "
        "large shape overlap.",
        "",
        "| problem | ladder / flat GPU s to the winner | winners | met |",
        "| --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        v = e.get("ablation_verdict")
        if v:
            winners = (
                "same" if v["same_winner"] else "equal within noise" if v["equal_within_noise"] else "differ"
            )
            out.append(f"| {name} | {v['ratio'] * 100:.0f}% | {winners} | {'yes' if v['met'] else 'NO'} |")
    return out


def report(problems: list[str], outdir: Path, ceil_path: Path, results: Path, command: str) -> None:
    ceil = _load(ceil_path)
    doc: dict[str, Any] = {"command": command, "ceilings": ceil, "problems": {}, "targets": TARGETS}
    primaries: list[float] = []
    for name in problems:
        entry: dict[str, Any] = {}
        cmp_path = outdir / "compare" / f"{name}.json"
        if cmp_path.exists():
            entry["compare"] = _load(cmp_path)
        for arm in LADDERS:
            db = outdir / arm / f"{name}.db"
            if not db.exists():
                continue
            store, state = _run_of(db)
            with store:
                entry[arm] = {
                    "ablation": _ablation_arm(store, state),
                    "busy": _busy(store, state),
                    "winner_profile": _winner_profile(store, state),
                }
        # targets at the primary shape
        verdicts = []
        shapes = entry.get("compare", {}).get("shapes", [])
        for s in shapes:
            t = s["times"]
            if "kb_ladder" not in t or "median_s" not in t["kb_ladder"]:
                continue
            kb = t["kb_ladder"]["median_s"]
            compiled = [t[k]["median_s"] for k in t if k.startswith("compile_") and "median_s" in t[k]]
            s["kb_vs_eager"] = t["eager"]["median_s"] / kb
            s["kb_vs_best_compile"] = min(compiled) / kb if compiled else None
            default = t.get("compile_default", {}).get("median_s")
            s["kb_vs_compile_default"] = default / kb if default else None
            if s["primary"]:
                primaries.append(s["kb_vs_eager"])
                for what, need in TARGETS.get(name, {}).items():
                    if what == "eager_every_shape":
                        continue
                    # the compile target names torch.compile (default); the stricter reading,
                    # against the faster of both compile modes, is reported beside it
                    rows = (
                        [("eager", s["kb_vs_eager"])]
                        if what == "eager"
                        else [
                            ("torch.compile (default)", s["kb_vs_compile_default"]),
                            ("best compile mode (stricter, not the issue's)", s["kb_vs_best_compile"]),
                        ]
                    )
                    for label, got in rows:
                        verdicts.append(
                            {
                                "target": f">= {need}x {label} ({s['shape']})",
                                "got": got,
                                "met": got is not None and got >= need,
                            }
                        )
            if "eager_every_shape" in TARGETS.get(name, {}):
                need = TARGETS[name]["eager_every_shape"]
                verdicts.append(
                    {
                        "target": f">= {need}x eager ({s['shape']})",
                        "got": s["kb_vs_eager"],
                        "met": s["kb_vs_eager"] >= need,
                    }
                )
            if s["primary"]:
                verdicts.append(
                    {
                        "target": f"not slower than eager ({s['shape']})",
                        "got": s["kb_vs_eager"],
                        "met": s["kb_vs_eager"] >= 1.0,
                    }
                )
        entry["verdicts"] = verdicts
        entry["ablation_verdict"] = ablation_verdict(entry)
        doc["problems"][name] = entry
    geo = math.exp(statistics.fmean(math.log(x) for x in primaries)) if primaries else None
    doc["geomean_vs_eager"] = {
        "value": geo,
        "target": GEOMEAN_TARGET,
        "over": len(primaries),
        "met": geo is not None and geo >= GEOMEAN_TARGET and len(primaries) == 6,
    }
    _dump(results / "h200.json", doc)
    (results / "RESULTS.md").write_text(_markdown(doc), encoding="utf-8")
    print((results / "RESULTS.md").read_text())


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.3g}"


def _markdown(doc: dict) -> str:
    c = doc["ceilings"]
    out = [
        "# kb on the H200: the six seed problems against eager PyTorch and torch.compile",
        "",
        "Made by (on the device machine, from a clean checkout, `.whl` carried):",
        "",
        f"    {doc['command']}",
        "",
        f"Device: {c['device']}, torch {c['torch']}. Measured ceilings: copy "
        f"{c['copy_bandwidth_Bps'] / 1e12:.2f} TB/s; matmul "
        + ", ".join(f"{k} {v / 1e12:.0f} TFLOP/s" for k, v in c["matmul_flops"].items())
        + f" ({c['note']}).",
        "",
        "Times are medians (ms per call) with the interquartile range, all contenders of a shape timed "
        "interleaved in one process on the same three fresh random input sets, L2 flushed before each "
        "sample. floor: the larger of minimum bytes over copy bandwidth and matmul FLOPs over the "
        "measured matmul rate of the dtype; `of floor` is floor time over kb's time.",
        "",
        "| problem | shape | eager | compile | compile max-autotune | kb (ladder) | kb (flat) | kb vs eager "
        "| kb vs compile | kb vs best compile | of floor |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for s in e.get("compare", {}).get("shapes", []):
            t = s["times"]

            def cell(k: str, t: dict = t) -> str:
                if k not in t:
                    return "-"
                if "error" in t[k]:
                    return "failed"
                return f"{_ms(t[k]['median_s'])} ± {_ms(t[k]['iqr_s'])}"

            kbl = t.get("kb_ladder", {})
            out.append(
                f"| {name} | {s['shape']}{' (large)' if s['primary'] else ''} | {cell('eager')} | "
                f"{cell('compile_default')} | {cell('compile_max-autotune-no-cudagraphs')} | "
                f"{cell('kb_ladder')} | {cell('kb_flat')} | "
                f"{s.get('kb_vs_eager', 0):.2f}x | "
                f"{(s.get('kb_vs_compile_default') or 0):.2f}x | "
                f"{(s.get('kb_vs_best_compile') or 0):.2f}x | "
                f"{kbl.get('floor_fraction', 0) * 100:.0f}% |"
            )
    g = doc["geomean_vs_eager"]
    out += [
        "",
        "## Targets (issue 5)",
        "",
        "| problem | target | measured | met |",
        "| --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for v in e["verdicts"]:
            got = "-" if v["got"] is None else f"{v['got']:.2f}x"
            out.append(f"| {name} | {v['target']} | {got} | {'yes' if v['met'] else 'NO'} |")
    out.append(
        f"| all six | geometric mean >= {g['target']}x eager (large shapes) | "
        f"{'-' if g['value'] is None else format(g['value'], '.2f') + 'x'} over {g['over']} | "
        f"{'yes' if g['met'] else 'NO'} |"
    )
    out += [
        "",
        "## Ladder against flat full-fidelity evaluation (same generator, same seed)",
        "",
        "GPU seconds are those charged by the run's BudgetCharged events until the winner's "
        "measurement was recorded.",
        "",
        "| problem | arm | candidates | winner | GPU s to winner (first / top rung) | of the first: by task "
        "| GPU s total | winner at large shape | busy (idle s: start / between / end) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, e in doc["problems"].items():
        for arm in LADDERS:
            if arm not in e:
                continue
            a, b = e[arm]["ablation"], e[arm]["busy"]
            t = e.get("compare", {}).get("shapes", [{}])[0].get("times", {}).get(f"kb_{arm}", {})
            speed = f"{t['speedup_vs_eager']:.2f}x eager" if "speedup_vs_eager" in t else "-"
            f1, f2 = a["gpu_s_to_winner_first_measured"], a["gpu_s_to_winner_top_measured"]
            tasks = a.get("gpu_s_to_winner_first_by_task") or {}
            split = ", ".join(f"{k} {v:.1f}" for k, v in sorted(tasks.items(), key=lambda kv: -kv[1])) or "-"
            out.append(
                f"| {name} | {arm} | {a['candidates']} | {a['winner'] or '-'} | "
                f"{'-' if f1 is None else f'{f1:.1f}'} / {'-' if f2 is None else f'{f2:.1f}'} | {split} | "
                f"{a['gpu_s_total']:.1f} | {speed} | {b['busy_fraction'] * 100:.0f}%{_idle(b)} |"
            )
    out += _ablation_verdicts(doc)
    out += [
        "",
        "## The winners' profiles",
        "",
        "The ladder arm's winner under Nsight Compute at the primary shape: the bottleneck labels kb "
        "derived, then the figures they come from.",
        "",
    ]
    for name, e in doc["problems"].items():
        prof = e.get("ladder", {}).get("winner_profile")
        if prof:
            out.append(
                f"- {name}: {', '.join(prof.get('labels') or []) or 'no label'}"
                + (f" ({prof['note']})" if prof.get("note") else "")
                + _profile_figures(prof.get("metrics") or {})
            )
    return "\n".join(out) + "\n"


def _profile_figures(m: dict) -> str:
    """The ncu figures that decide a label: DRAM and compute throughput, occupancy, registers, and the
    largest warp stall."""
    parts = [
        f"{label} {m[key]:.0f}%"
        for key, label in (
            ("dram_throughput_pct", "DRAM"),
            ("compute_throughput_pct", "compute"),
            ("achieved_occupancy_pct", "occupancy"),
        )
        if m.get(key) is not None
    ]
    if m.get("registers_per_thread") is not None:
        parts.append(f"{m['registers_per_thread']:.0f} registers a thread")
    stalls = {k.removeprefix("stall_"): v for k, v in m.items() if k.startswith("stall_") and v is not None}
    if stalls:
        top = max(stalls, key=lambda k: stalls[k])
        parts.append(f"top stall {top} ({stalls[top]:.2g})")
    return f": {', '.join(parts)}" if parts else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("phase", choices=["ceilings", "search", "compare", "report"])
    ap.add_argument("--out", type=Path, required=True, help="working folder (databases, compare JSON)")
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--arm", choices=list(LADDERS), default="ladder")
    ap.add_argument("--budget-gpu-s", type=float, default=90.0)
    ap.add_argument("--max-candidates", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--gpu", type=int, default=0)
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="cpu: a dry run of the script")
    ap.add_argument("--timeout-s", type=float, default=240.0)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--command", default="bash tools/h200_measure.sh", help="recorded in RESULTS.md")
    a = ap.parse_args()
    problems = [p for p in a.problems.split(",") if p]
    ceil = a.out / "ceilings.json"
    if a.phase == "ceilings":
        ceilings(ceil, a.device)
    elif a.phase == "search":
        search(a.device, problems, a.arm, a.out, a.budget_gpu_s, a.max_candidates, a.seed, a.gpu, a.timeout_s)
    elif a.phase == "compare":
        compare(a.device, problems, a.out, ceil, a.repeats)
    else:
        report(problems, a.out, ceil, a.results, a.command)


if __name__ == "__main__":
    main()
