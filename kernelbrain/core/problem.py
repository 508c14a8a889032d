"""Problems: KernelBench files, loaded unchanged, plus the optional extras kb understands.

A problem file defines `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`. It may also
declare, at module level (all optional):

    KB_SHAPES = [{"batch_size": 4096, "dim": 393216}, {"batch_size": 16, "dim": 16384}]
        Module globals to override before calling get_inputs()/get_init_inputs(); the first is the
        primary shape. Absent: the file's own globals are the one shape.
    KB_SMOKE_SHAPE = {"batch_size": 4, "dim": 256}
        A small shape for CPU runs through the Triton interpreter. Absent: the smallest shape fitted
        to a byte budget (kernelbrain/child/shapes.py).
    KB_GATE_SHAPES = [{"batch_size": 64, "dim": 393216}]
        The shapes the correctness gate checks on a GPU (each against a float64 reference, over
        three seeds). Absent: the smallest shape of each input-dtype group, fitted to a byte budget.
        Name other shapes here to check more; cover every input dtype the benchmark shapes use.
    KB_TOLERANCE = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}
        atol = rtol per output dtype. Absent: these defaults (KernelBench's).
    KB_STRICT_FP32 = True
        Float32 convolutions and matmuls held to IEEE float32 whatever the reference does (`kb run
        --strict-fp32` appends it). Absent: the reference's own accuracy at the primary shape
        (kernelbrain/core/accuracy.py).

This module does the static checks that need no torch (the CLI runs them before anything is
written); `kernelbrain.child` executes the file, in a sandboxed child only.
"""

from __future__ import annotations

import ast
import hashlib
from pathlib import Path

DEFAULT_TOLERANCE = {"float32": 1e-4, "float64": 1e-6, "float16": 1e-2, "bfloat16": 1e-2}
# an output element also passes within this many times the reference's own error against float64 truth
# (kernelbrain/child/tolerance.py states the rule)
REFERENCE_MULTIPLE = 16
# the words of admission's refusal (runtime/roles/generator.py): a problem no device of this size holds
TOO_BIG = "too big for this device even alone"
# the words of the refusal of a problem that draws random numbers in training mode (dropout): no kernel
# can match its outputs call for call; in eval mode it is the identity (`kb run --eval`)
RANDOM_IN_TRAINING = "draws random numbers in training mode"
RANDOM_IN_EVAL = "draws random numbers even in eval mode"
# what `kb run --eval` adds to the problem source it records: the reference and every candidate are then
# built and run in eval mode (kernelbrain/child/loading.py, Problem.eval_mode)
EVAL_LINE = "\n\nKB_EVAL = True  # kb run --eval: the reference and the candidates run in eval mode\n"


# what `kb run --strict-fp32` adds: every float32 contraction held to IEEE float32, whatever the reference
# does (core/accuracy.py)
STRICT_LINE = "\n\nKB_STRICT_FP32 = True  # kb run --strict-fp32: contractions held to IEEE float32\n"


def in_strict_fp32(source: str) -> str:
    """The problem's source as a run with --strict-fp32 records it."""
    return source if STRICT_LINE in source else source.rstrip("\n") + STRICT_LINE


def in_eval_mode(source: str) -> str:
    """The problem's source as a run with --eval records it."""
    return source if EVAL_LINE in source else source.rstrip("\n") + EVAL_LINE


REQUIRED = {"Model": ast.ClassDef, "get_inputs": ast.FunctionDef, "get_init_inputs": ast.FunctionDef}


class ProblemError(Exception):
    """A problem file kb cannot use; the message names the file and what to fix."""


def read_problem(path: str | Path) -> str:
    """The source of a problem file after the static checks: exists, parses, defines the three names."""
    p = Path(path)
    if not p.is_file():
        raise ProblemError(
            f"problem file {p} does not exist; pass the path of a KernelBench problem .py file"
        )
    try:
        source = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ProblemError(f"problem file {p} cannot be read: {e}") from e
    check_problem_source(source, str(p))
    return source


def check_problem_source(source: str, name: str = "<problem>") -> None:
    try:
        tree = ast.parse(source, filename=name)
    except SyntaxError as e:
        raise ProblemError(f"problem file {name}:{e.lineno}: syntax error: {e.msg}") from e
    defined = {
        node.name: type(node) for node in tree.body if isinstance(node, ast.ClassDef | ast.FunctionDef)
    }
    missing = [n for n, kind in REQUIRED.items() if defined.get(n) is not kind]
    if missing:
        what = ", ".join("class Model" if n == "Model" else f"{n}()" for n in missing)
        raise ProblemError(
            f"problem file {name} does not define {what}; a KernelBench problem defines "
            "class Model(nn.Module), get_inputs() and get_init_inputs()"
        )


def source_hash(source: str) -> str:
    return hashlib.sha256(source.encode()).hexdigest()


def shape_label(overrides: dict[str, object]) -> str:
    return ",".join(f"{k}={v}" for k, v in overrides.items()) or "default"
