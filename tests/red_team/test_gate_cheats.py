"""Cheating candidates against the gate, through a real sandboxed child: each is caught, with the
category (and the words) its trick calls for. They cover KernelBench's list of exploits and the ones a
hostile user found against kb: torch doing the work under other names, the reference sabotaged or
called, lazy or aliased outputs, state across calls, threads, processes, signal timers and gc callbacks
left to run later, timers, the problem's own values, kb's own checking code replaced.

Each cheat is a softmax (or LayerNorm) candidate: a real Triton kernel where it needs one, and the trick."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernelbrain.core.protocol import GateRequest

HERE = Path(__file__).resolve().parents[1]
SOFTMAX = (HERE / "problems" / "softmax_small.py").read_text()
LAYERNORM = (HERE / "problems" / "layernorm_small.py").read_text()

HEAD = """
import gc, sys, threading, time
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr, HALF: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    if HALF:
        x = x.to(tl.float16)
    e = tl.exp((x - tl.max(x, axis=0)).to(tl.float32))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def fill(y_ptr, n, value, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, value, mask=offs < n)


def kernel_softmax(x, y, half=False):
    softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=triton.next_power_of_2(x.shape[1]), HALF=half)
    return y


def token_launch(y):
    fill[(1,)](y, 1, 0.0, BLOCK=16)

"""


def softmax_cheat(forward: str, init: str = "pass", top: str = "") -> str:
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


def layernorm_cheat(init: str, forward: str) -> str:
    ini = "\n".join("        " + line for line in init.strip().splitlines())
    body = "\n".join("        " + line for line in forward.strip().splitlines())
    return (
        HEAD
        + f"""

class ModelNew(nn.Module):
    def __init__(self, normalized_shape: tuple):
        super().__init__()
        self.ln = nn.LayerNorm(normalized_shape=normalized_shape)
{ini}

    def forward(self, x):
{body}
"""
    )


ZEROS = (
    "y = torch.empty_like(x)\nfill[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), 0.0, BLOCK=1024)\nreturn y"
)

# name: (problem, candidate source, category, words the detail must hold)
CHEATS = {
    "torch softmax behind a token launch": (
        SOFTMAX,
        softmax_cheat("y = torch.empty_like(x)\ntoken_launch(y)\nreturn torch.softmax(x, dim=1)"),
        "policy",
        "computes with torch",
    ),
    "torch._softmax, a private name": (
        SOFTMAX,
        softmax_cheat("y = torch.empty_like(x)\ntoken_launch(y)\nreturn torch._softmax(x, 1, False)"),
        "policy",
        "ATen _softmax",
    ),
    "torch.ops.aten._softmax.default": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\ntoken_launch(y)\nreturn torch.ops.aten._softmax.default(x, 1, False)"
        ),
        "policy",
        "ATen _softmax",
    ),
    "softmax rebuilt from amax, exp and sum": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\ntoken_launch(y)\ne = (x - x.amax(1, keepdim=True)).exp()\n"
            "return e / e.sum(1, keepdim=True)"
        ),
        "policy",
        "ATen",
    ),
    "a try/except fallback to torch": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\ntry:\n"
            "    softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=7, HALF=False)\n"
            "except Exception:\n    y = torch.nn.functional.softmax(x, dim=1)\nreturn y"
        ),
        "policy",
        "computes with torch",
    ),
    "numpy doing the work": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\ntoken_launch(y)\na = x.numpy()\n"
            "e = __import__('numpy').exp(a - a.max(1, keepdims=True))\n"
            "return torch.from_numpy(e / e.sum(1, keepdims=True))"
        ),
        "policy",
        "numpy",
    ),
    "calling the reference Model it finds": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\ntoken_launch(y)\n"
            "ref = next(o for o in gc.get_objects() if type(o).__name__ == 'Model')\nreturn ref(x)"
        ),
        # the candidate's child holds no Model (the judge's child does): there is none to find
        "runtime",
        "StopIteration",
    ),
    "the reference's weights zeroed through gc": (
        LAYERNORM,
        layernorm_cheat(
            "for o in gc.get_objects():\n    if type(o).__name__ == 'Model':\n        with torch.no_grad():\n"
            "            o.ln.weight.zero_()\n            o.ln.bias.zero_()",
            ZEROS,
        ),
        # no reference to zero in the candidate's child: its zeros are judged against the truth
        "mismatch",
        "differs from the reference",
    ),
    "Model.forward replaced from __init__": (
        SOFTMAX,
        softmax_cheat(
            ZEROS,
            init="for m in list(sys.modules.values()):\n"
            "    if hasattr(m, 'Model') and hasattr(m, 'get_inputs'):\n"
            "        m.Model.forward = lambda self, x: torch.zeros_like(x)",
        ),
        "mismatch",  # no problem module in the candidate's child: nothing replaced
        "differs from the reference",
    ),
    "torch.softmax replaced at import": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\nreturn kernel_softmax(x, y)", top="torch.softmax = lambda x, dim: x\n"
        ),
        "policy",
        "torch.softmax",
    ),
    "a lazy tensor subclass as the output": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\nkernel_softmax(x, y)\nreturn y.as_subclass(Lazy)",
            top="class Lazy(torch.Tensor):\n    pass\n",
        ),
        "policy",
        "not a plain dense torch.Tensor",
    ),
    "an output that views the input": (
        SOFTMAX,
        softmax_cheat("kernel_softmax(x, x)\nreturn x.view(x.shape)"),
        "policy",
        "mutated its inputs",
    ),
    "results cached across calls": (
        SOFTMAX,
        softmax_cheat(
            "if self.cache is None:\n    self.cache = kernel_softmax(x, torch.empty_like(x))\n"
            "token_launch(torch.empty_like(x))\nreturn self.cache",
            init="self.cache = None",
        ),
        "policy",
        "cached across calls",
    ),
    "work on a thread left running": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\n"
            "t = threading.Thread(target=lambda: (time.sleep(0.5), kernel_softmax(x, y)))\n"
            "t.start()\ntoken_launch(torch.empty_like(x))\nreturn y"
        ),
        "policy",
        "thread",
    ),
    "the clock replaced": (
        SOFTMAX,
        softmax_cheat(
            "time.perf_counter = lambda: 0.0\ny = torch.empty_like(x)\nreturn kernel_softmax(x, y)"
        ),
        "policy",
        "time.perf_counter",
    ),
    "stale memory from torch.empty": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\nhalf = x[: x.shape[0] // 2]\n"
            "softmax_rows[(half.shape[0],)](half, y, x.shape[1], "
            "BLOCK=triton.next_power_of_2(x.shape[1]), HALF=False)\n"
            "return y"
        ),
        "nan",
        "never",
    ),
    "a constant output": (
        SOFTMAX,
        softmax_cheat(
            "y = torch.empty_like(x)\n"
            "fill[(triton.cdiv(y.numel(), 1024),)](y, y.numel(), 1.0 / x.shape[1], BLOCK=1024)\n"
            "return y"
        ),
        "mismatch",
        "differs",
    ),
    "the input handed back": (
        SOFTMAX,
        softmax_cheat("token_launch(torch.empty(1))\nreturn x"),
        "policy",
        "input",
    ),
    "half precision inside": (
        SOFTMAX,
        softmax_cheat("y = torch.empty_like(x)\nreturn kernel_softmax(x, y, half=True)"),
        "nan",  # the wide draw reaches float32's range, where float16 holds only inf
        "seed 2",
    ),
    "kb's own check replaced (Watch.check)": (
        SOFTMAX,
        softmax_cheat(
            "token_launch(torch.empty(16))\nreturn torch.softmax(x, dim=1)",
            top="sys.modules['kernelbrain.child.guard'].Watch.check = lambda self: None\n",
        ),
        "policy",
        "kernelbrain.child.guard.Watch.check",
    ),
    "kb's own check given another function's code": (
        SOFTMAX,
        softmax_cheat(
            "token_launch(torch.empty(16))\nreturn torch.softmax(x, dim=1)",
            top="_watch = sys.modules['kernelbrain.child.guard'].Watch\n"
            "_watch.check.__code__ = (lambda self: None).__code__\n",
        ),
        "policy",
        "Watch.check.__code__",
    ),
    "a policy set emptied": (
        SOFTMAX,
        softmax_cheat(
            "token_launch(torch.empty(16))\nreturn torch.from_numpy(torch.softmax(x, dim=1).numpy())",
            top="sys.modules['kernelbrain.child.guard'].HOST_ESCAPES.clear()\n",
        ),
        "policy",
        "HOST_ESCAPES",
    ),
    "builtins.sorted made to find nothing": (
        SOFTMAX,
        softmax_cheat(
            "token_launch(torch.empty(16))\nreturn torch.softmax(x, dim=1)",
            top="import builtins\nbuiltins.sorted = lambda *a, **k: []\n",
        ),
        "policy",
        "builtins.sorted",
    ),
    "a process forked to outlive its call": (
        SOFTMAX,
        softmax_cheat(
            "import os\n"
            "if os.fork() == 0:\n"
            "    time.sleep(30)  # free to rewrite the outputs file before the judge reads it\n"
            "    os._exit(0)\n"
            "return kernel_softmax(x, torch.empty_like(x))"
        ),
        "policy",
        "a process it started",
    ),
    "an interval timer left to fire later": (
        SOFTMAX,
        softmax_cheat(
            "import signal\n"
            "signal.signal(signal.SIGALRM, lambda *a: None)\n"
            "signal.setitimer(signal.ITIMER_REAL, 60.0)\n"
            "return kernel_softmax(x, torch.empty_like(x))"
        ),
        "policy",
        "an interval timer (real)",
    ),
    "a garbage-collector callback": (
        SOFTMAX,
        softmax_cheat(
            "if not gc.callbacks or gc.callbacks[-1] is not self.hook:\n"
            "    gc.callbacks.append(self.hook)\n"
            "return kernel_softmax(x, torch.empty_like(x))",
            init="self.hook = lambda phase, info: None",
        ),
        "policy",
        "garbage-collector callback",
    ),
    "no Triton kernel at all": (
        SOFTMAX,
        softmax_cheat("y = torch.empty_like(x)\ny.copy_(x)\nreturn y"),
        "policy",
        "no Triton kernel",
    ),
}


@pytest.mark.parametrize("name", sorted(CHEATS))
def test_a_cheat_is_caught_with_its_category(box, name: str) -> None:
    problem, source, category, words = CHEATS[name]
    args = {"problem_source": problem, "cand_source": source, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0]
    assert r.passed is False and r.category == category, (name, r)
    assert words in (r.detail or ""), (name, r.detail)


def test_the_cheats_tricks_are_real_an_honest_twin_passes(box) -> None:
    """The harness itself passes an honest kernel written the same way: the cheats fail for their tricks."""
    honest = softmax_cheat("y = torch.empty_like(x)\nreturn kernel_softmax(x, y)")
    args = {"problem_source": SOFTMAX, "cand_source": honest, "device": "cpu", "seeds": 3}
    r = box.call(GateRequest(**args), timeout_s=300)[0]
    assert r.passed is True, r
