"""The GPU launch check (kernelbrain.child.launches) against the profiler's real kernel records.

On the device machine, from the repository root:

    . tools/device_env.sh || exit 1
    python3 tools/gpu_launch_check.py

For each small candidate-like module below it warms the forward up (Triton compiles, autotune picks),
records one call's kernels under the profiler and prints one JSON line: the raw kernel names with how
often each ran, the candidate's own Triton kernel names, the names `classify` refuses, the verdict
(`pass`: nothing refused and one of its own kernels ran; else `flagged`) and check_launches' message.
The autotuned case also shows its first, autotuning call (`first_call`, not counted in the verdict).
Then the raw kineto records (every device type and activity kind) of two calls, so the filtering can be
checked, and a summary line. Exits 1 if any verdict differs from the expected one. No arguments.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import torch
import triton

from kernelbrain.child import launches
from kernelbrain.child.guard import Violation
from kernelbrain.child.loading import load_module

HEAD = """
import sys
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf")).to(tl.float32)
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def add_one(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)


def softmax(x):
    y = torch.empty(x.shape, device=x.device, dtype=torch.float32)
    softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]))
    return y


def plus_one(x, y):
    add_one[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
    return y

"""


def model(forward: str, top: str = "", init: str = "pass") -> str:
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    ini = "\n".join("        " + line for line in init.strip().splitlines())
    return (
        HEAD
        + top
        + f"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{ini}

    def forward(self, x):
{body}
"""
    )


HELPER = """
import triton
import triton.language as tl


@triton.jit
def foreign_scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)
"""

AUTOTUNED = """
@triton.autotune(
    configs=[triton.Config({"BLOCK": 256}, num_warps=4), triton.Config({"BLOCK": 1024}, num_warps=8)],
    key=["n"],
)
@triton.jit
def tuned_add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1.0, mask=mask)
"""

GRAPH_INIT = """
self.graph = None
"""
GRAPH_FORWARD = """
if self.graph is None:
    self.static_x = x.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        self.static_y = self.static_x @ self.static_x
    torch.cuda.current_stream().wait_stream(side)
    self.graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(self.graph):
        self.static_y = self.static_x @ self.static_x
self.static_x.copy_(x)
self.graph.replay()
plus_one(x, torch.empty_like(x))
return self.static_y
"""


DECOY = "plus_one(x, torch.empty_like(x))\n"  # a token Triton launch beside the real work
TUNED = (
    "y = torch.empty_like(x)\ntuned_add[lambda m: (triton.cdiv(x.numel(), m['BLOCK']),)](x, y, x.numel())\n"
)
STRIDED = "y = torch.empty(x.shape[0], 2 * x.shape[1], device=x.device)[:, ::2]\ny.fill_(0.5)\n"
FOREIGN = "sys.modules[{helper!r}].foreign_scale[(64,)](x, torch.empty_like(x), x.numel(), BLOCK=1024)\n"


def cases(helper: str) -> list[tuple[str, str, str]]:
    """(name, source, expected verdict): pass, or flagged by classify or for running none of its own."""
    forwards = [
        ("honest_softmax", "pass", "return softmax(x)"),
        ("honest_add", "pass", "return plus_one(x, torch.empty_like(x))"),
        ("matmul_beside_decoy", "flagged", DECOY + "return torch.matmul(x, x)"),
        ("f_softmax_beside_decoy", "flagged", DECOY + "return F.softmax(x, dim=1)"),
        ("zeros_then_kernel", "pass", "y = torch.zeros_like(x)\nreturn plus_one(x, y)"),
        ("full_then_kernel", "pass", "y = torch.full(x.shape, 3.0, device=x.device)\nreturn plus_one(x, y)"),
        ("clone_then_kernel", "pass", "return softmax(x.clone())"),
        ("to_half_then_kernel", "pass", "return softmax(x.to(torch.float16))"),
        ("half_back_to_float", "pass", "h = x.half()\nreturn softmax(h.float())"),
        ("transpose_contiguous", "pass", "return softmax(x.t().contiguous())"),
        ("strided_fill", "pass", STRIDED + "return plus_one(x, torch.empty_like(x))"),
        ("arange_then_kernel", "pass", "i = torch.arange(x.numel(), device=x.device)\nreturn softmax(x)"),
        ("item_then_kernel", "pass", "s = x[0, 0].item()\nreturn softmax(x)"),
        ("host_tensor_then_kernel", "pass", "t = torch.tensor([1.0, 2.0]).to(x.device)\nreturn softmax(x)"),
        ("foreign_triton_kernel", "flagged", FOREIGN.format(helper=helper) + "return softmax(x)"),
        ("cat_then_kernel", "flagged", "return softmax(torch.cat([x, x], dim=1))"),
        ("sum_beside_kernel", "flagged", "s = x.sum(dim=1)\nreturn softmax(x)"),
        ("no_own_kernel", "flagged", "return x.clone()"),
    ]
    return [
        *((name, model(forward), expect) for name, expect, forward in forwards),
        ("autotuned", model(TUNED + "return y", top=AUTOTUNED), "pass"),
        ("cuda_graph_replay", model(GRAPH_FORWARD, init=GRAPH_INIT), "flagged"),
    ]


def counted(names: list[str]) -> list[tuple[str, int]]:
    """Each name once, in the order it first ran, with how often it ran."""
    return list(Counter(names).items())


def run_case(name: str, source: str, expect: str, x: torch.Tensor, autotune_first: bool = False) -> dict:
    row: dict[str, Any] = {"case": name, "expect": expect}
    try:
        mod = load_module(source, f"launchcheck_{name}")
        own = launches.triton_kernel_names(mod)
        net = mod.ModelNew().cuda()
        call: Callable[[], Any] = lambda: net(x)  # noqa: E731
        if autotune_first:  # the autotuning call itself, as a first forward would be seen
            t = time.perf_counter()
            first = launches.record_kernels(call)
            row["first_call"] = {
                "names": counted(first),
                "offending": launches.classify(first, own),
                "record_s": round(time.perf_counter() - t, 3),
            }
        for _ in range(2):  # compile, autotune, capture
            call()
        torch.cuda.synchronize()
        t = time.perf_counter()
        names = launches.record_kernels(call)
        row["record_s"] = round(time.perf_counter() - t, 3)
        bad = launches.classify(names, own)
        ran_own = any(n in own for n in names)
        row.update(own=sorted(own), names=counted(names), offending=bad, ran_own=ran_own)
        row["verdict"] = "pass" if not bad and ran_own else "flagged"
        try:
            launches.check_launches(call, own)
            row["message"] = None
        except Violation as e:
            row["message"] = str(e)
        if (row["message"] is None) != (row["verdict"] == "pass"):
            row["error"] = "check_launches disagrees with classify"
    except Exception as e:  # a case that cannot run is a failure of this check, not a verdict
        row.update(verdict="error", error=f"{type(e).__name__}: {e}")
    row["ok"] = row["verdict"] == expect and "error" not in row
    print(json.dumps(row), flush=True)
    return row


def raw_records(name: str, call: Callable[[], Any]) -> None:
    """Every record kineto returns for one call, whatever its device and kind."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    out = []
    for e in prof.profiler.kineto_results.events():
        out.append(
            {
                "name": e.name(),
                "device_type": str(e.device_type()),
                "activity_type": e.activity_type() if hasattr(e, "activity_type") else None,
                "is_user_annotation": e.is_user_annotation() if hasattr(e, "is_user_annotation") else None,
            }
        )
    kept = launches.record_kernels(call)
    print(json.dumps({"raw_records": name, "records": out, "record_kernels": kept}), flush=True)


def main() -> int:
    if not torch.cuda.is_available():
        print("no GPU", file=sys.stderr)
        return 1
    event = torch._C._autograd._KinetoEvent
    print(
        json.dumps(
            {
                "torch": torch.__version__,
                "triton": triton.__version__,
                "device": torch.cuda.get_device_name(),
                "kineto_event_has_activity_type": hasattr(event, "activity_type"),
                "kineto_event_has_is_user_annotation": hasattr(event, "is_user_annotation"),
            }
        ),
        flush=True,
    )
    torch.manual_seed(0)
    x = torch.randn(256, 256, device="cuda")
    helper = load_module(HELPER, "launchcheck_helper")
    t = time.perf_counter()
    launches.record_kernels(lambda: torch.zeros(1, device="cuda"))  # CUPTI's start-up, once a process
    print(json.dumps({"profiler_first_use_s": round(time.perf_counter() - t, 3)}), flush=True)

    rows = [run_case(n, s, e, x, autotune_first=(n == "autotuned")) for n, s, e in cases(helper.__name__)]

    # a decoy Triton kernel named exactly like the cuBLAS kernel torch.matmul ran
    gemm = next((r for r in rows if r["case"] == "matmul_beside_decoy"), {})
    library = [n for n in gemm.get("offending", []) if launches.IDENTIFIER.fullmatch(n)]
    if library:
        spoof = model("plus_one(x, torch.empty_like(x))\nreturn torch.matmul(x, x)", top=f"""
@triton.jit
def {library[0]}(x_ptr, n):
    pass
""")  # fmt: skip
        rows.append(run_case("decoy_named_like_cublas", spoof, "flagged", x))
    else:
        print(json.dumps({"case": "decoy_named_like_cublas", "skipped": "no identifier-named gemm kernel"}))

    honest = load_module(cases(helper.__name__)[0][1], "launchcheck_honest_softmax").ModelNew().cuda()
    raw_records("honest_softmax", lambda: honest(x))
    raw_records("matmul", lambda: torch.matmul(x, x))

    failed = [r["case"] for r in rows if not r["ok"]]
    print(json.dumps({"cases": len(rows), "failed": failed}), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
