"""Shapes that fit (kernelbrain/child/shapes.py): an unchanged KernelBench file's sizes scaled down for the
CPU and for the GPU gate, batch-like sizes first, and a full-size file run end to end on CPU."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from kernelbrain.child import shapes
from kernelbrain.child.analysis import analyse
from kernelbrain.child.loading import Problem, give_fits
from kernelbrain.core.problem import shape_label
from kernelbrain.core.protocol import Fit
from tests.kbcli import kb

# KernelBench's 24_LogSoftmax as it is: 4096 rows of 393216, no kb extras (6.4 GB of inputs and outputs)
LOG_SOFTMAX = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, dim: int = 1):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.log_softmax(x, dim=self.dim)

batch_size = 4096
dim = 393216

def get_inputs():
    return [torch.rand(batch_size, dim)]

def get_init_inputs():
    return []
"""

LINEAR = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.fc(x)) * scale

batch_size = 8192
in_features = 4096
out_features = 2048
scale = 3
seed = 7

def get_inputs():
    torch.manual_seed(seed)
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]
"""

# a problem that refuses sizes its kernels were not written for: channels must stay a multiple of 96
GROUPED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return x.reshape(x.shape[0], 96, -1).sum(-1)

batch_size = 64
channels = 3 * 96 * 1024

def get_inputs():
    assert channels % 96 == 0, "channels must be a multiple of 96"
    return [torch.rand(batch_size, channels)]

def get_init_inputs():
    return []
"""

NCHW = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.norm = nn.GroupNorm(8, features)

    def forward(self, x):
        return self.norm(x)

batch_size = 64
features = 64
height = 512
width = 384

def get_inputs():
    return [torch.rand(batch_size, features, height, width)]

def get_init_inputs():
    return [features]
"""

# KernelBench level2/34's pattern: a LayerNorm over the last output dimension, whose width is a model
# constant that equals that dimension only at the declared sizes (here the input's width, doubled)
LAST_DIM_NORM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x.repeat_interleave(2, dim=-1))

batch_size = 4096
channels = 64
half = 512
width = 1024

def get_inputs():
    return [torch.rand(batch_size, channels, half)]

def get_init_inputs():
    return [width]
"""

# KernelBench's matrix-vector product: a 128 MiB matrix, one column out
MATVEC = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, A, B):
        return torch.matmul(A, B)

M = 256
K = 131072

def get_inputs():
    return [torch.rand(M, K), torch.rand(K, 1)]

def get_init_inputs():
    return []
"""


def test_size_constants_are_classed_by_what_halving_them_moves() -> None:
    problem = Problem(LINEAR)
    found = {k.name: k.kind for k in shapes.knobs(problem, {})}
    # scale and seed are read by the problem but size no input: they are never changed
    assert found == {"batch_size": "batch", "in_features": "model"}
    problem = Problem(NCHW)
    found = {k.name: k.kind for k in shapes.knobs(problem, {})}
    assert found == {"batch_size": "batch", "features": "model", "height": "free", "width": "free"}


def test_a_full_size_file_is_fitted_rows_first_keeping_the_row() -> None:
    problem = Problem(LOG_SOFTMAX)
    assert shapes.footprint(problem, {}) == 2 * 4096 * 393216 * 4
    gate = problem.gate_shapes("cuda")
    # the gate keeps the whole row and sixteen of the rows: 16 x 393216 x 4 B x 2 = 48 MiB
    assert gate == [{"batch_size": 16}]
    assert shapes.footprint(problem, gate[0]) <= shapes.GATE_BYTES
    cpu = problem.ladder_shapes("cpu", "smallest")
    assert cpu == problem.gate_shapes("cpu") == [{"batch_size": 2, "dim": 12288}]
    assert shapes.footprint(problem, cpu[0]) <= shapes.CPU_BYTES
    assert 393216 % cpu[0]["dim"] == 0  # halved: a block size dividing the row divides the fitted one


def test_the_model_is_changed_last_and_only_sizes_change() -> None:
    problem = Problem(NCHW)
    (gate,) = problem.gate_shapes("cuda")
    # 64 x 64 x 512 x 384 floats in and out: rows go to 16 first, then the image, never the features
    assert gate["batch_size"] == 16 and "features" not in gate
    assert shapes.footprint(problem, gate) <= shapes.GATE_BYTES
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert "features" not in cpu and cpu["height"] >= 8 and cpu["width"] >= 8
    assert shapes.footprint(problem, cpu) <= shapes.CPU_BYTES
    linear = Problem(LINEAR)
    (fitted,) = linear.gate_shapes("cuda")
    assert set(fitted) <= {"batch_size", "in_features"} and "scale" not in fitted


def test_a_size_the_problem_refuses_is_not_used() -> None:
    problem = Problem(GROUPED)
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert cpu["channels"] % 96 == 0
    assert shapes.footprint(problem, cpu) <= shapes.CPU_BYTES


def test_a_size_the_reference_refuses_is_not_used_where_it_can_run() -> None:
    problem = Problem(LAST_DIM_NORM)
    # estimated from the inputs alone, the fit halves the width the norm needs: the problem then fails
    blind = shapes.fit(problem, {}, shapes.CPU_BYTES, shapes.CPU_ROWS)
    assert blind["half"] < 512
    with pytest.raises(RuntimeError):
        problem.meta_outputs(blind)
    # checked against the reference on the meta device (the analysis), it keeps the width
    problem.fit_outputs = problem.meta_outputs
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert "half" not in cpu and "width" not in cpu and cpu["batch_size"] < 4096
    assert problem.meta_outputs(cpu)[0].shape[-1] == 1024
    assert shapes.footprint(problem, cpu, problem.meta_outputs) <= shapes.CPU_BYTES


def test_outputs_are_sized_by_the_reference_where_it_runs() -> None:
    problem = Problem(MATVEC)
    # outputs taken as large as the inputs: 32 rows; one column out, as the reference says: 64 rows
    assert shapes.fit(problem, {}, shapes.GATE_BYTES, shapes.GATE_ROWS) == {"M": 32}
    assert shapes.fit(problem, {}, shapes.GATE_BYTES, shapes.GATE_ROWS, problem.meta_outputs) == {"M": 64}


def test_the_analysis_records_its_fits_and_later_children_use_them() -> None:
    analysed = analyse(LAST_DIM_NORM, "cpu")
    (fitted,) = analysed["fits"]
    assert fitted["shape"] == "default" and fitted["budget"] == shapes.CPU_BYTES
    assert "half" not in fitted["sizes"] and analysed["rung_shapes"] == [shape_label(fitted["sizes"])]
    # a child handed the analysis's fits (the gate's, the bench's) takes them as they are, without fitting
    given = Fit(shape="default", budget=shapes.CPU_BYTES, rows=shapes.CPU_ROWS, sizes={"batch_size": 3})
    try:
        give_fits(LAST_DIM_NORM, [given])
        assert Problem(LAST_DIM_NORM).ladder_shapes("cpu", "all") == [{"batch_size": 3}]
    finally:
        give_fits(LAST_DIM_NORM, [])
    assert Problem(LAST_DIM_NORM).ladder_shapes("cpu", "all") != [{"batch_size": 3}]


def test_declared_shapes_win(tmp_path: Path) -> None:
    declared = LOG_SOFTMAX + '\nKB_SMOKE_SHAPE = {"batch_size": 3, "dim": 100}\n'
    declared += 'KB_GATE_SHAPES = [{"batch_size": 4096, "dim": 393216}]\n'
    problem = Problem(declared)
    assert problem.ladder_shapes("cpu", "all") == [{"batch_size": 3, "dim": 100}]
    assert problem.gate_shapes("cuda") == [{"batch_size": 4096, "dim": 393216}]
    small = Problem(LOG_SOFTMAX.replace("4096", "4").replace("393216", "1000"))
    assert small.ladder_shapes("cpu", "all") == [{}]  # it fits as it is


@pytest.mark.long
def test_kb_run_on_a_full_size_file_checks_and_times_the_fitted_shape(tmp_path: Path) -> None:
    problem = tmp_path / "24_LogSoftmax.py"
    problem.write_text(LOG_SOFTMAX)
    db = tmp_path / "kb.db"
    r = kb(
        "run", str(problem), "--db", str(db), "--max-candidates", "2", "--quiet", "--inprocess", timeout=600
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
        rows = [(t, json.loads(p)) for t, p in con.execute("SELECT type, payload FROM events ORDER BY seq")]
    label = shape_label({"batch_size": 2, "dim": 12288})
    analysed = next(p for t, p in rows if t == "ProblemAnalysed")
    assert analysed["rung_shapes"] == [label]
    sizes = {"batch_size": 2, "dim": 12288}
    fit = {"shape": "default", "budget": shapes.CPU_BYTES, "rows": shapes.CPU_ROWS, "sizes": sizes}
    fit["note"] = ""  # it fits: nothing to say
    assert analysed["fits"] == [fit]
    passed = [p for t, p in rows if t == "GatePassed"]
    assert passed and all(p["shapes"] == [label] for p in passed)
    timed = [p for t, p in rows if t == "RungBenchmarked"]
    assert timed and all(s["shape"] == label for p in timed for s in p["shapes"])
    # the export says where it was checked, and checks itself there on the CPU (not at 6.4 GB)
    run_id = r.stdout.split()[1]
    kernel = tmp_path / "kernel.py"
    assert kb("export", run_id, "--db", str(db), "-o", str(kernel)).returncode == 0
    text = kernel.read_text()
    assert f"# Checked by kb's gate at {label}; timed at {label} (cpu)." in text
    assert "sizes fitted for the CPU" in text
    checked = subprocess.run(
        [sys.executable, str(kernel), "--device", "cpu", "--repeats", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TRITON_INTERPRET": "1"},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"PASS {label}" in checked.stdout, checked.stdout


ROOT = Path(__file__).resolve().parent.parent
WIDE_WEIGHT = ROOT / "tests" / "problems" / "gemm_wide_weight.py"
ASSERTS = ROOT / "tests" / "problems" / "asserts_own_size.py"

# a convolution whose window, stride, group and GroupNorm counts are sizes a fit could halve, were it
# not for what they decide; its bias's shape derives from out_channels, as KernelBench's files write it
CONV = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, groups, num_groups, bias_shape):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=stride, groups=groups)
        self.norm = nn.GroupNorm(num_groups, out_channels)
        self.bias = nn.Parameter(torch.zeros(bias_shape))

    def forward(self, x):
        return self.norm(self.conv(x)) + self.bias

batch_size = 32
in_channels = 256
out_channels = 512
height = 96
width = 96
kernel_size = 9
stride = 16
groups = 16
num_groups = 32
bias_shape = (out_channels, 1, 1)

def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]

def get_init_inputs():
    return [in_channels, out_channels, kernel_size, stride, groups, num_groups, bias_shape]
"""

# KernelBench level2/34's tie without its convolution: the norm's width is twice the input's last size,
# so neither halves alone; the rows are literal, so only the two halved together fit
TIED = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x.repeat_interleave(2, dim=-1))

half = 512
width = 1024

def get_inputs():
    return [torch.rand(64, half)]

def get_init_inputs():
    return [width]
"""

# KernelBench level2/88's pattern: a GEMM whose 8192 features a GroupNorm splits into 256 groups
GROUP_NORM = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, in_features, out_features, num_groups):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.norm = nn.GroupNorm(num_groups, out_features)

    def forward(self, x):
        return torch.sigmoid(self.norm(self.gemm(x)))

batch_size = 1024
in_features = 512
out_features = 8192
num_groups = 256

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, num_groups]
"""


def test_the_cpu_fit_counts_the_weights_and_halves_the_models_features() -> None:
    problem = Problem(WIDE_WEIGHT.read_text())
    problem.fit_outputs = problem.meta_outputs
    # the GPU gate's fit, and the CPU's before, left the 256 MiB weight whole: only the rows shrank
    assert shapes.fit(problem, {}, shapes.CPU_BYTES, shapes.CPU_ROWS, problem.meta_outputs) == {
        "batch_size": 4
    }
    assert shapes.weights(problem, {}).nbytes == (8192 * 8192 + 8192) * 4
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert shapes.footprint(problem, cpu, problem.meta_outputs, with_weights=True) <= shapes.CPU_BYTES
    # the weights first, to half the budget, then the rows: a GEMM of several tiles each way
    assert cpu == {"batch_size": 128, "in_features": 128, "out_features": 128}
    assert shape_label(cpu) == "batch_size=128,in_features=128,out_features=128"  # as the file lists them
    assert problem.fits()[0].note == ""


def test_the_cpu_fit_keeps_what_decides_a_strategy() -> None:
    problem = Problem(CONV)
    # a window, a stride and group counts shrink no weight's size (or only a window's): never halved
    found = {k.name: k.kind for k in shapes.knobs(problem, {}, cpu=True)}
    assert found == {
        "batch_size": "batch",
        "height": "free",
        "width": "free",
        "in_channels": "model",
        "out_channels": "model",
    }
    # the GPU's fit reads get_inputs' sizes only, as before
    assert {k.name for k in shapes.knobs(problem, {})} == {"batch_size", "in_channels", "height", "width"}
    problem.fit_outputs = problem.meta_outputs
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert shapes.footprint(problem, cpu, problem.meta_outputs, with_weights=True) <= shapes.CPU_BYTES
    assert cpu["out_channels"] < 512 and cpu["in_channels"] < 256
    assert cpu["in_channels"] % 16 == cpu["out_channels"] % 32 == 0  # the groups still divide them
    assert not {"kernel_size", "stride", "groups", "num_groups"} & set(cpu)
    problem.use(cpu)  # the bias's shape follows out_channels, as the file computes it
    assert problem.module.bias_shape == (cpu["out_channels"], 1, 1)
    problem.use({})
    assert problem.module.bias_shape == (512, 1, 1)


def test_a_group_count_stays_as_the_file_has_it() -> None:
    # a template bakes the group count into its kernel: one rendered for fewer groups than the file's
    # would be wrong at its size (and the families see a count that moves between the two)
    problem = Problem(GROUP_NORM)
    problem.fit_outputs = problem.meta_outputs
    (cpu,) = problem.ladder_shapes("cpu", "all")
    assert "num_groups" not in cpu and 256 <= cpu["out_features"] < 8192
    assert cpu["out_features"] % 256 == 0
    # never one channel a group: its norm is its bias whatever the input (a gate that tests nothing, and
    # whose fp32 reference is its worst), but the input's width, which no group divides, still shrinks
    assert cpu["out_features"] >= 2 * 256 and cpu["in_features"] < 512


def test_odd_sizes_stay_odd_and_tied_sizes_halve_together() -> None:
    assert [shapes.half(n, cpu=True) for n in (8205, 4096, 96, 3)] == [4103, 2048, 48, 1]
    assert shapes.half(8205) == 4102  # the GPU's fit, as before
    odd = Problem(LINEAR.replace("4096", "4095"))
    (cpu,) = odd.ladder_shapes("cpu", "all")
    assert cpu["in_features"] % 2 == 1
    tied = Problem(TIED)
    tied.fit_outputs = tied.meta_outputs
    (cpu,) = tied.ladder_shapes("cpu", "all")
    assert cpu == {"half": 256, "width": 512}
    assert tied.fits()[0].note == ""


def test_a_reference_that_asserts_its_size_runs_at_it_and_says_so() -> None:
    analysed = analyse(ASSERTS.read_text(), "cpu")
    assert analysed["rung_shapes"] == ["default"]
    (fitted,) = analysed["fits"]
    assert fitted["sizes"] == {}
    note = fitted["note"]
    assert note.startswith(
        "runs at the file's own size: the problem refuses a smaller batch_size (AssertionError"
    )
    assert "expected 128 x 1024 inputs" in note
    # kb run's line for the analysis says so
    from kernelbrain.core.events import ProblemAnalysed
    from kernelbrain.views.describe import summary

    assert summary(ProblemAnalysed(**analysed, families=[])).endswith(f"timed at default; {note}")
    # a fit over its budget for want of sizes says that instead
    literal = Problem(LOG_SOFTMAX.replace("batch_size, dim", "4096, 393216"))
    assert literal.ladder_shapes("cpu", "all") == [{}]
    assert literal.fits()[0].note == (
        "runs at the file's own size: get_inputs and get_init_inputs read no size constant kb can halve"
    )


@pytest.mark.long
def test_a_wide_weight_gets_its_first_cpu_gate_verdict_within_a_minute(tmp_path: Path) -> None:
    db = tmp_path / "kb.db"
    r = kb("run", str(WIDE_WEIGHT), "--db", str(db), "--device", "cpu", "--max-candidates", "1", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
        rows = list(con.execute("SELECT type, ts, payload FROM events ORDER BY seq"))
    started = next(ts for t, ts, _ in rows if t == "RunStarted")
    verdict = next((ts, t) for t, ts, _ in rows if t in ("GatePassed", "GateFailed"))
    assert verdict[1] == "GatePassed"
    assert verdict[0] - started < 60, f"first gate verdict after {verdict[0] - started:.0f} s"
    analysed = json.loads(next(p for t, _, p in rows if t == "ProblemAnalysed"))
    assert analysed["rung_shapes"] == ["batch_size=128,in_features=128,out_features=128"]


def test_an_export_sets_derived_constants_as_the_child_does() -> None:
    """A CPU export checks itself at the fitted sizes: its harness derives `bias_shape` from them too."""
    from kernelbrain.views.export import HARNESS, HARNESS_START

    text = HARNESS.read_text()
    kb: dict = {}
    exec(compile(text[text.index(HARNESS_START) :], "<harness>", "exec"), kb)  # as the exported file holds it
    child = Problem(CONV)
    module = kb["_kb_load_reference"](CONV, "kb_reference_conv")
    harness = kb["_KbProblem"](module, {}, 16.0, kb["_kb_derived"](CONV))
    assert [d.name for d in child.derived] == [name for name, _, _ in harness.derived] == ["bias_shape"]
    for shape in ({"out_channels": 64}, {}):
        child.use(shape)
        harness.use(shape)
        assert harness.module.bias_shape == child.module.bias_shape == (shape.get("out_channels", 512), 1, 1)
