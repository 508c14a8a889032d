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
from kernelbrain.child.loading import Problem
from kernelbrain.core.problem import shape_label
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
    r = kb("run", str(problem), "--db", str(db), "--max-candidates", "2", "--quiet", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    with sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True) as con:
        rows = [(t, json.loads(p)) for t, p in con.execute("SELECT type, payload FROM events ORDER BY seq")]
    label = shape_label({"batch_size": 2, "dim": 12288})
    analysed = next(p for t, p in rows if t == "ProblemAnalysed")
    assert analysed["rung_shapes"] == [label]
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
