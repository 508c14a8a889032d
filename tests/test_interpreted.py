"""kernelbrain/child/interpreted.py: Triton's interpreter patches triton.language once a launch, not again
at every call of a @triton.jit helper from inside a program; results and the restored modules unchanged."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.runs import interpreter_env

SCRIPT = """
import json
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

calls = []
original = interpreter._patch_lang
def counted(fn):
    calls.append(fn.__name__)
    return original(fn)
interpreter._patch_lang = counted

@triton.jit
def _twice(v):
    return v * 2

@triton.jit
def _kernel(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = _twice(tl.load(x_ptr + offs))
    tl.store(y_ptr + offs, tl.cumsum(_twice(v), 0))

def launch():
    calls.clear()
    builtin = tl.load
    x = torch.randn(4, 8)
    y = torch.empty_like(x)
    _kernel[(4,)](x, y, BLOCK=8)
    close = bool(torch.allclose(y, torch.cumsum(x * 4, dim=1), atol=1e-5))
    restored = tl.load is builtin and tl.core.is_builtin(tl.load)
    return {"close": close, "calls": list(calls), "restored": restored}

plain = launch()
from kernelbrain.child.interpreted import fast_device_calls
assert fast_device_calls() and fast_device_calls()  # a second install changes nothing
print(json.dumps({"plain": plain, "fast": launch()}))
"""


def test_a_launch_patches_once_and_its_helpers_run_as_before():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], env=interpreter_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    plain, fast = out["plain"], out["fast"]
    assert plain["close"] and fast["close"]
    assert plain["restored"] and fast["restored"]
    # per program: the launch's own patch once, then _twice twice and tl.cumsum (Triton's standard module,
    # whose globals name tl.core) once; with the skip, tl.core is patched at the first tl.cumsum only
    assert plain["calls"] == ["_kernel"] + ["_twice", "_twice", "cumsum"] * 4
    assert fast["calls"] == ["_kernel", "cumsum"]


OVERFLOW = """
import json
import torch
import triton
import triton.language as tl
from triton.language.semantic import TritonSemantic

asserts = []
original = TritonSemantic.device_assert
def counted(self, cond, msg, mask):
    asserts.append(msg)
    return original(self, cond, msg, mask)
TritonSemantic.device_assert = counted

@triton.jit
def _index(x_ptr, y_ptr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    v = tl.load(x_ptr + offs)
    tl.store(y_ptr + offs, v * 1000003 + offs - 7)  # int32 products past 2**31 wrap

def launch():
    asserts.clear()
    x = torch.arange(-2**20, 2**20, 4096, dtype=torch.int32)
    y = torch.empty_like(x)
    _index[(x.numel() // 64,)](x, y, BLOCK=64)
    wide = x.to(torch.int64) * 1000003 + torch.arange(x.numel()) - 7
    want = ((wide + 2**31) % 2**32 - 2**31).to(torch.int32)
    return {"equal": bool(torch.equal(y, want)), "asserts": len(asserts)}

from triton.runtime import interpreter
debug = interpreter.interpreter_builder.options.debug
plain = launch()
from kernelbrain.child.interpreted import no_dead_overflow_checks
assert no_dead_overflow_checks()
print(json.dumps({"debug": debug, "plain": plain, "fast": launch()}))
"""


def test_the_overflow_checks_whose_asserts_are_off_are_not_computed():
    """Triton's interpreter computes an int64 overflow check for every integer add, sub and mul, for a
    device assert that is a no-op outside debug mode, which the interpreter never is: without the check,
    the same values (int32 wrap-around included) and no assert built."""
    proc = subprocess.run(
        [sys.executable, "-c", OVERFLOW], env=interpreter_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["debug"] is False
    assert out["plain"]["equal"] and out["fast"]["equal"]
    assert out["plain"]["asserts"] > 0 and out["fast"]["asserts"] == 0, out
