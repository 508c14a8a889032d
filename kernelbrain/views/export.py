"""`kb export`: a run's winner as a file that needs torch and triton, never kernelbrain.

Two formats:

- standalone (default): the candidate's source, then the reference problem it was measured against
  (kept as a string and loaded into a module of its own, so its globals never clash with ModelNew's),
  then a harness (kernelbrain/export_harness.py, copied in) that `python kernel.py` runs: it checks
  ModelNew against the reference at the problem's tolerance and prints the speedup.
- kernelbench: the file KernelBench's evaluator takes as its custom model: ModelNew and its imports.

A candidate that uses kb's candidate API (`from kernelbrain import candidate`) gets the API's source in
place of that import, loaded into a module of its own: both formats need torch and triton only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Literal

from kernelbrain.core import torch_ops
from kernelbrain.core.errors import RunError
from kernelbrain.core.events import GatePassed
from kernelbrain.core.problem import DEFAULT_TOLERANCE, REFERENCE_MULTIPLE, in_eval_mode
from kernelbrain.core.state import Candidate, RunState
from kernelbrain.store import Store

Format = Literal["standalone", "kernelbench"]
FORMATS: tuple[Format, ...] = ("standalone", "kernelbench")
KB_PACKAGES = {"kernelbrain"}  # what kb installs (its store included); an exported file imports none
HARNESS = Path(__file__).with_name("export_harness.py")
API = Path(__file__).resolve().parents[1] / "candidate.py"  # kb's candidate API, copied into exports
API_MODULE = "kernelbrain.candidate"
HARNESS_START = "# --- HARNESS_START ---\n"

# What KernelBench expects (ScalingIntelligence/KernelBench, src/kernelbench/eval.py):
# eval_kernel_against_ref(original_model_src, custom_model_src, ..., backend="triton") gets the
# reference problem's source and this file's text separately. For Triton it writes custom_model_src to
# a temporary .py file and imports it (load_custom_model_with_tempfile: @triton.jit reads kernel source
# through inspect), takes the module's ModelNew and builds it as ModelNew(*get_init_inputs()) with the
# reference's init inputs, then compares forward() outputs with Model's at the precision's tolerance.
# So the file holds ModelNew and the imports it needs, and neither the reference Model nor a harness.
# KernelBench's static checker (src/kernelbench/kernel_static_checker.py, check_code_bypass) rejects a
# custom model whose text, '#' comments removed but docstrings kept, has a try/except or the word pass.
KERNELBENCH_BYPASS = {
    "try/except": re.compile(r"\btry\s*:|\bexcept\b"),
    "the word 'pass'": re.compile(r"\bpass\b"),
}

KERNELBENCH_NOTE = """\
# Format: a KernelBench custom model (ScalingIntelligence/KernelBench, src/kernelbench/eval.py,
# eval_kernel_against_ref(original_model_src, custom_model_src, backend="triton")). KernelBench imports
# this file from a temporary .py file, takes ModelNew and builds it as ModelNew(*get_init_inputs()) of
# the reference problem, which it is given separately; so this file holds ModelNew and its imports only.
# It has no harness: `python` on it runs nothing. Check it with KernelBench's evaluator, or with
# `kb check PROBLEM.py <this file> --bench` (and --device cuda on a GPU).
"""


def pick(state: RunState, candidate: str | None = None) -> Candidate:
    """The candidate to export: the one asked for, else the winner, else the leader so far."""
    leader = state.leader()
    cid = candidate or (state.finished.winner if state.finished else None) or (leader.id if leader else None)
    if cid is None:
        raise RunError(f"run {state.run_id} has no measured candidate to export yet")
    if cid not in state.candidates:
        raise RunError(f"run {state.run_id} has no candidate {cid!r}; `kb status {state.run_id}` lists them")
    return state.candidates[cid]


def _api_binding(node: ast.stmt) -> str | None:
    """The name an import of kb's candidate API binds (`from kernelbrain import candidate as c`: c)."""
    if isinstance(node, ast.ImportFrom) and node.module == "kernelbrain" and not node.level:
        found = [a.asname or a.name for a in node.names if a.name == "candidate"]
        return found[0] if len(found) == len(node.names) == 1 else None
    if isinstance(node, ast.Import) and len(node.names) == 1 and node.names[0].name == API_MODULE:
        return node.names[0].asname
    return None


def inline_api(source: str) -> str:
    """source with each module-level import of kb's candidate API replaced by the API itself: its source
    as text, run into a module of its own under the name the import bound."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        name = _api_binding(node)
        if name is None:
            continue
        assert node.end_lineno is not None
        lines[node.lineno - 1 : node.end_lineno] = [
            "# kernelbrain.candidate, kb's candidate API, copied in: this file needs torch and triton only\n",
            "import types as _kb_types\n\n",
            f"_KB_CANDIDATE_API = {string_literal(API.read_text(encoding='utf-8'))}\n",
            f"{name} = _kb_types.ModuleType({API_MODULE!r})\n",
            f"exec(compile(_KB_CANDIDATE_API, {API_MODULE!r}, 'exec'), {name}.__dict__)\n",
        ]
    return "".join(lines)


def _check_standalone(source: str, cid: str) -> None:
    """The candidate must stand alone: it may import torch, triton and kb's candidate API (copied in),
    never kb's other packages."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:  # the gate compiled it, so the blob itself is damaged
        raise RunError(
            f"candidate {cid}'s source does not parse (line {e.lineno}): the log is damaged"
        ) from e
    for node in ast.walk(tree):
        if isinstance(node, ast.stmt) and node in tree.body and _api_binding(node) is not None:
            continue
        names = (
            [a.name for a in node.names]
            if isinstance(node, ast.Import)
            else [node.module or ""]
            if isinstance(node, ast.ImportFrom) and node.level == 0
            else []
        )
        for name in names:
            if name.split(".")[0] in KB_PACKAGES:
                raise RunError(
                    f"candidate {cid} imports {name} (line {node.lineno}), so it cannot run without "
                    "kernelbrain; export another with --candidate"
                )


def string_literal(text: str) -> str:
    """text as a Python literal a reader can read: a raw triple-quoted block where that is exact."""
    for quote in ('"""', "'''"):
        literal = f"r{quote}{text}{quote}"
        try:
            if ast.literal_eval(literal) == text:
                return literal
        except (SyntaxError, ValueError):
            pass
    return repr(text)


def _harness() -> str:
    text = HARNESS.read_text(encoding="utf-8")
    return text[text.index(HARNESS_START) + len(HARNESS_START) :].strip("\n")


def _header(state: RunState, c: Candidate, fmt: Format) -> str:
    assert state.started is not None
    top = c.top_result
    numbers = (
        "; ".join(
            f"{s.shape}: {s.speedup:.3g}x ({s.cand_median_s:.3g} s vs {s.ref_median_s:.3g} s)"
            for s in top.shapes
        )
        if top
        else "not measured"
    )
    return (
        f"# Exported by kernelbrain from run {state.run_id}, problem {state.started.problem_name}.\n"
        f"# Candidate {c.id} ({c.proposal.family}/{c.proposal.strategy}); best rung "
        f"{max(c.results) if c.results else '-'}: {numbers} [{top.timer if top else '-'}]\n"
        + _mode(state)
        + _accuracy(state)
        + _partial(c)
        + _checked_at(state, c, fmt)
    )


def _mode(state: RunState) -> str:
    """The mode the reference and this kernel were compared in: a kernel for a batch norm in training mode
    computes batch statistics, one in eval mode reads the running ones."""
    a = state.analysis
    if a is None:
        return ""
    if a.mode == "training":
        return "# Mode: training, as Model(*get_init_inputs()) leaves it; checked against it so.\n"
    why = (
        " (kb run --eval)"
        if state.config.eval_mode
        else " (a run from before kb ran modules as built)"
        if a.mode is None
        else ""
    )
    return f"# Mode: eval{why}; checked against the reference in eval mode.\n"


def _accuracy(state: RunState) -> str:
    """The accuracy contract the kernel was held to (core/accuracy.py): the reference's regime, measured."""
    a = state.analysis
    if a is None or a.accuracy is None:
        return ""
    return f"# Accuracy: {a.accuracy.summary()}.\n"


def _partial(c: Candidate) -> str:
    """The label of a candidate that keeps ops in PyTorch (`kb run --allow-torch`): not all Triton."""
    if not c.proposal.torch_ops:
        return ""
    ops = ", ".join(c.proposal.torch_ops)
    return (
        f"# PARTIAL KERNEL: keeps {ops} in PyTorch (allowed by --allow-torch); the rest is its Triton\n"
        f"# kernels. The gate admitted exactly those torch ops ({torch_ops.label(c.proposal.torch_ops)}).\n"
    )


def _checked_at(state: RunState, c: Candidate, fmt: Format) -> str:
    """Where kb checked and timed it, when that is not the file's own shapes: sizes fitted from the
    file's on a CPU run (a strategy chosen there may not serve the real size), and how to check it at
    the file's own in this format (only the standalone file checks itself)."""
    assert state.started is not None
    gate = c.gate.shapes if isinstance(c.gate, GatePassed) else []
    timed = state.analysis.rung_shapes if state.analysis is not None else []
    own = state.analysis.shapes if state.analysis is not None else []
    if not gate and not timed:
        return ""
    line = f"# Checked by kb's gate at {' | '.join(gate) or '-'}; timed at {' | '.join(timed) or '-'}"
    line += f" ({state.started.config.device}).\n"
    if state.started.config.device == "cpu" and timed and timed != own[: len(timed)]:
        sizes = "its module constants" if own == ["default"] else " | ".join(own)
        how = (
            "# a GPU (`python kernel.py --device cuda`) before relying on it.\n"
            if fmt == "standalone"
            else "# a GPU before relying on it: `kb check PROBLEM.py <this file> --device cuda --bench`\n"
            "# (or KernelBench's evaluator).\n"
        )
        line += f"# Those are sizes fitted for the CPU from the file's own ({sizes}): check it at those on\n"
        line += how
    return line


def _cpu_shape(state: RunState) -> dict[str, int] | None:
    assert state.started is not None
    if state.started.config.device != "cpu" or state.analysis is None or len(state.analysis.rung_shapes) != 1:
        return None
    return _fitted_shape(state.analysis.rung_shapes[0])


def _fitted_shape(label: str) -> dict[str, int] | None:
    """A shape label of integer sizes (`batch_size=2,dim=12288`, `default`) as the dict it names; None
    where a value is not an integer (a dtype)."""
    if label == "default":
        return {}
    out: dict[str, int] = {}
    for part in label.split(","):
        name, _, value = part.partition("=")
        if not value.lstrip("-").isdigit():
            return None
        out[name] = int(value)
    return out


def export_source(
    store: Store, state: RunState, candidate: str | None = None, fmt: Format = "standalone"
) -> str:
    c = pick(state, candidate)
    source = store.get_blob(c.proposal.source).decode()
    _check_standalone(source, c.id)
    source = inline_api(source).rstrip("\n") + "\n"
    if fmt == "kernelbench":
        return _header(state, c, fmt) + KERNELBENCH_NOTE + "\n" + source
    assert state.started is not None
    problem = store.get_blob(state.started.problem_hash).decode()
    problem = in_eval_mode(problem) if state.eval_mode else problem  # as its run checked it
    return (
        _header(state, c, fmt)
        + "# `python kernel.py` checks ModelNew against the reference below and prints the speedup\n"
        + "# (without a GPU: TRITON_INTERPRET=1 python kernel.py). It needs torch and triton only.\n\n"
        + source
        + "\n\n# --- the reference kb measured against (problem "
        + f"{state.started.problem_name}, source hash {state.started.problem_hash[:16]}) ---\n"
        + "# Kept as text and loaded into a module of its own, so its names never clash with ModelNew's.\n"
        + f"_KB_REFERENCE_SOURCE = {string_literal(problem)}\n"
        + f"_KB_DEFAULT_TOLERANCE = {dict(DEFAULT_TOLERANCE)!r}\n"
        + f"_KB_REFERENCE_MULTIPLE = {REFERENCE_MULTIPLE}\n"
        + "# the shape kb's CPU run checked and timed (used on the CPU where the file names none)\n"
        + f"_KB_CPU_SHAPE = {_cpu_shape(state)!r}\n\n\n"
        + "# --- check and time: python kernel.py [--device cpu|cuda] [--all-shapes] [--repeats N] ---\n\n\n"
        + _harness()
        + '\n\n\nif __name__ == "__main__":\n'
        + "    raise SystemExit(\n"
        + "        _kb_main(\n"
        + "            ModelNew, _KB_REFERENCE_SOURCE, _KB_DEFAULT_TOLERANCE, _KB_REFERENCE_MULTIPLE,\n"
        + "            cpu_shape=_KB_CPU_SHAPE,\n"
        + "        )\n"
        + "    )\n"
    )


def kernelbench_flags(source: str) -> list[str]:
    """What KernelBench's static bypass check would flag in source, as 'what (line n)'."""
    flags = []
    for n, line in enumerate(source.splitlines(), 1):
        code = line.split("#")[0]
        flags += [
            f"{what} (line {n})" for what, pattern in KERNELBENCH_BYPASS.items() if pattern.search(code)
        ]
    return flags


def export(
    store: Store,
    state: RunState,
    out: str | Path,
    candidate: str | None = None,
    fmt: Format = "standalone",
) -> Path:
    path = Path(out)
    text = export_source(store, state, candidate, fmt)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise RunError(
            f"cannot write {path}: {e.strerror}; pass -o a path in an existing, writable folder"
        ) from e
    return path
