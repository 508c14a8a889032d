"""The six seed problems in benchmarks/problems: KernelBench files kb reads as they are.

Each passes the static check, declares well-formed shape extras (dicts of its own module globals),
draws the specified inputs at every shape (sized on the meta device, no memory touched) and runs its
reference at its smoke shape in a fresh interpreter (one for the six), loaded the way the sandboxed
child loads it.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbrain.core.problem import read_problem

ROOT = Path(__file__).resolve().parents[1]
PROBLEMS = ROOT / "benchmarks" / "problems"
SEEDS = ("softmax", "matvec", "rmsnorm", "linear_relu_div", "sdp_attn", "group_conv")

# run in a fresh interpreter: argv[1:] are the problem files; prints a JSON document a file, a line each
PROBE = r"""
import json, math, sys, time
import torch
from kernelbrain.child.loading import Problem


def describe(xs):
    return [[list(x.shape), str(x.dtype).removeprefix("torch.")] for x in xs if isinstance(x, torch.Tensor)]


def probe(path):
    source = open(path, encoding="utf-8").read()
    p = Problem(source)
    m = p.module
    extras = {k: getattr(m, k, None) for k in ("KB_SHAPES", "KB_SMOKE_SHAPE")}
    shapes = extras["KB_SHAPES"] or [{}]
    bad = []
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        bad.append("KB_SHAPES is not a list of dicts")
    elif not isinstance(extras["KB_SMOKE_SHAPE"], dict):
        bad.append("KB_SMOKE_SHAPE is not a dict")
    else:
        for s in [*shapes, extras["KB_SMOKE_SHAPE"]]:
            bad += [f"{k} is not a module global" for k in s if k.startswith("_") or k not in p.base_globals]
    drawn = [describe(p.inputs(s, 0, "meta")) for s in p.shapes]
    smallest = p.shapes.index(p.smallest())
    smoke = p.ladder_shapes("cpu", "smallest")[0]
    inputs = p.inputs(smoke, 0, "cpu")
    torch.manual_seed(0)
    model = m.Model(*p.init_inputs(smoke)).eval()
    t = time.perf_counter()
    with torch.no_grad():
        out = model(*inputs)
    ref_s = time.perf_counter() - t
    outs = [out] if isinstance(out, torch.Tensor) else list(out)
    return {
        "bad": bad,
        "drawn": drawn,
        "smallest": smallest,
        "smoke_inputs": describe(inputs),
        "smoke_numel": sum(x.numel() for x in inputs if isinstance(x, torch.Tensor)),
        "outputs": describe(outs),
        "finite": all(bool(torch.isfinite(o).all()) for o in outs),
        "ref_s": ref_s,
    }


for path in sys.argv[1:]:
    print(json.dumps(probe(path)))
"""


@functools.cache
def probed() -> dict[str, dict]:
    """Every seed problem through PROBE, in one interpreter (torch imports once)."""
    r = subprocess.run(
        [sys.executable, "-c", PROBE, *(str(PROBLEMS / f"{name}.py") for name in SEEDS)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode == 0, r.stderr
    return dict(zip(SEEDS, (json.loads(line) for line in r.stdout.splitlines()[-len(SEEDS) :]), strict=True))


def probe(name: str) -> dict:
    return probed()[name]


def test_the_six_seed_problems_are_there():
    assert {p.stem for p in PROBLEMS.glob("*.py")} == set(SEEDS)


@pytest.mark.parametrize("name", SEEDS)
def test_static_check_passes(name):
    source = read_problem(PROBLEMS / f"{name}.py")
    assert "class Model(nn.Module)" in source and "KB_SHAPES" in source and "KB_SMOKE_SHAPE" in source


@pytest.mark.parametrize("name", SEEDS)
def test_reference_runs_at_its_smoke_shape(name):
    r = probe(name)
    assert r["bad"] == []
    assert r["outputs"] and r["finite"]
    # small enough for the Triton interpreter: a gate and a few timed calls take well under seconds
    assert r["smoke_numel"] <= 1 << 20
    assert r["ref_s"] < 2.0
    # the smoke shape is a real shrink of the primary one, with the same dtypes
    primary = r["drawn"][0]
    assert [d for _, d in r["smoke_inputs"]] == [d for _, d in primary]
    assert [len(s) for s, _ in r["smoke_inputs"]] == [len(s) for s, _ in primary]


# the input shapes and dtypes every declared shape draws, primary first
EXPECTED = {
    "matvec": [
        [[[2048, 1048576], "float32"], [[1048576, 1], "float32"]],
        [[[256, 131072], "float32"], [[131072, 1], "float32"]],
    ],
    "rmsnorm": [[[[112, 64, 512, 512], "float32"]], [[[16, 64, 256, 256], "float32"]]],
    "linear_relu_div": [[[[1024, 8192], "float32"]], [[[128, 1024], "float32"]]],
    "sdp_attn": [
        [[[32, 32, 512, 1024], "float32"]] * 3,
        [[[2, 32, 256, 1024], "float16"]] * 3,
        [[[4, 32, 4096, 128], "bfloat16"]] * 3,
    ],
    "group_conv": [[[[16, 32, 128, 256], "float32"]], [[[8, 32, 64, 128], "float32"]]],
    "softmax": [[[[4096, 393216], "float32"]], [[[16, 16384], "float32"]]],
}


@pytest.mark.parametrize("name", SEEDS)
def test_shapes_draw_the_specified_inputs(name):
    r = probe(name)
    assert r["drawn"] == EXPECTED[name]
    assert r["smallest"] != 0  # the primary shape is the large one


def test_sdp_attn_dtype_follows_the_shape():
    r = probe("sdp_attn")
    assert [[d for _, d in shape] for shape in r["drawn"]] == [
        ["float32"] * 3,
        ["float16"] * 3,
        ["bfloat16"] * 3,
    ]
    assert r["outputs"] == [[[1, 2, 32, 16], "float32"]]


def load(name: str, **overrides) -> dict:
    """The problem's module namespace (exec'd here: these are our own files), globals overridden."""
    ns: dict = {}
    exec(compile(read_problem(PROBLEMS / f"{name}.py"), f"{name}.py", "exec"), ns)
    ns.update(overrides)
    return ns


def test_model_constructors_take_kernelbench_arguments():
    ns = load("group_conv")
    assert ns["get_init_inputs"]() == [32, 64, (3, 5), (2, 3), (1, 2), (2, 1), 4, False]
    conv = ns["Model"](*ns["get_init_inputs"]()).conv_transpose2d
    assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (32, 64, (3, 5))
    assert (conv.stride, conv.padding, conv.dilation, conv.groups, conv.bias) == (
        (2, 3),
        (1, 2),
        (2, 1),
        4,
        None,
    )
    ns = load("rmsnorm")
    norm = ns["Model"](*ns["get_init_inputs"]())
    assert (norm.num_features, norm.eps) == (64, 1e-5)
    ns = load("linear_relu_div", **load("linear_relu_div")["KB_SMOKE_SHAPE"])
    lin = ns["Model"](*ns["get_init_inputs"]())
    assert lin.linear.bias is not None and lin.divisor == 2.0
    assert (lin.linear.in_features, lin.linear.out_features) == (64, 32)
    assert load("linear_relu_div")["get_init_inputs"]() == [8192, 8192, 2.0]


def test_the_gate_checks_every_dtype_a_problem_uses():
    """On GPU the gate runs the smallest shape of each input-dtype group, fitted to 64 MiB: SDPAttn's
    fp32, fp16 and bf16 paths are all gated, a one-dtype problem only at its smallest shape (matvec's
    256 x 131072 matrix with its rows halved to 32); on CPU, the smoke shape."""
    import subprocess
    import sys

    code = """
import json, sys
from kernelbrain.child.loading import Problem
out = {}
for name in ("sdp_attn", "matvec"):
    p = Problem(open(f"benchmarks/problems/{name}.py").read())
    out[name] = {"cuda": p.gate_shapes("cuda"), "cpu": p.gate_shapes("cpu")}
# a problem that names its gate shapes gets exactly those on GPU (and still its smoke shape on CPU)
named = open("benchmarks/problems/matvec.py").read() + chr(10) + "KB_GATE_SHAPES = [{'M': 64, 'K': 4096}]"
p = Problem(named)
out["named"] = {"cuda": p.gate_shapes("cuda"), "cpu": p.gate_shapes("cpu")}
print(json.dumps(out, default=str))
"""
    root = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(root), "TRITON_INTERPRET": "1"},
    )
    assert r.returncode == 0, r.stderr
    shapes = json.loads(r.stdout)
    assert sorted(str(s["dtype"]) for s in shapes["sdp_attn"]["cuda"]) == [
        "torch.bfloat16",
        "torch.float16",
        "torch.float32",
    ]
    assert shapes["matvec"]["cuda"] == [{"M": 32, "K": 131072}]
    assert shapes["named"]["cuda"] == [{"M": 64, "K": 4096}]
    assert shapes["named"]["cpu"] == shapes["matvec"]["cpu"]
    assert len(shapes["sdp_attn"]["cpu"]) == 1
