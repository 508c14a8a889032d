"""What the template package shares: the one Family contract, kernels only in the families' `parts`
modules, and the tuning-variant rule the GPU tools in tools/ apply to --knobs."""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from kernelbrain import templates
from kernelbrain.templates import FAMILIES, knobs_with
from kernelbrain.templates.base import Family, Refining
from kernelbrain.templates.families import attention, row_softmax


def test_knobs_with_lays_overrides_on_the_first_round0_set_of_that_strategy():
    mat = next(k for k in attention.ROUND0 if k["strategy"] == "materialized")
    assert knobs_with(attention, {"strategy": "materialized", "block_m": 64}) == {**mat, "block_m": 64}
    # no strategy named: the family's first round-0 strategy
    assert knobs_with(row_softmax, {"num_warps": 2}) == {**row_softmax.ROUND0[0], "num_warps": 2}
    # a new knob is kept (how prefetch was first tried)
    online = next(k for k in row_softmax.ROUND0 if k["strategy"] == "online")
    assert knobs_with(row_softmax, {"strategy": "online", "x": 1}) == {**online, "x": 1}
    # a strategy no round-0 set has, reached by a mutation of the same name: laid on that move's knobs
    deferred = knobs_with(row_softmax, {"strategy": "deferred", "depth": 2})
    assert deferred == {**row_softmax.mutate(row_softmax.ROUND0[0], "deferred"), "depth": 2}
    assert deferred["ctas_per_sm"] == row_softmax.ROUND0[0]["ctas_per_sm"]
    # a move that only turns a knob names no strategy
    with pytest.raises(ValueError, match="no round-0 strategy 'prefetch'"):
        knobs_with(row_softmax, {"strategy": "prefetch"})
    with pytest.raises(ValueError, match="no round-0 strategy 'nope'; round 0 has split_row, single_pass"):
        knobs_with(row_softmax, {"strategy": "nope"})
    for family in FAMILIES:  # a whole knob set given as overrides keeps every value it names
        for k in family.ROUND0:
            merged = knobs_with(family, dict(k))
            assert {key: merged[key] for key in k} == k, (family.FAMILY, k)


def test_every_family_keeps_the_one_contract():
    """Each module in FAMILIES has the Family protocol's names, with its methods' parameters as named
    there (the expert generator calls them by these names)."""
    contract = {
        name: list(inspect.signature(getattr(Family, name)).parameters)[1:]
        for name in ("matches", "feasible", "mutate", "render")
    }
    for family in FAMILIES:
        assert isinstance(family, Family), family.__name__
        for name, params in contract.items():
            assert list(inspect.signature(getattr(family, name)).parameters) == params, (
                family.__name__,
                name,
            )
        if hasattr(family, "refine"):
            assert isinstance(family, Refining)
        assert family.ROUND0 and all("strategy" in k for k in family.ROUND0), family.__name__


def test_no_family_keeps_kernel_text_in_strings():
    """Kernels are real functions in `parts` modules: no family module (nor a shared helper of theirs)
    holds a kernel's Triton source in a string (the one generated text is render.chain's elementwise
    function of a traced graph's ops), and every parts module defines jit functions ruff and tests see."""
    folder = Path(templates.__file__).parent
    seen = {"parts": 0, "other": 0}
    for path in folder.rglob("*.py"):
        text = path.read_text()
        name = str(path.relative_to(folder))
        if path.stem == "parts":
            assert re.search(r"^@triton\.jit\b", text, re.M), name
            seen["parts"] += 1
            continue
        seen["other"] += 1
        strings = [n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)]
        kernel = [s for s in strings if isinstance(s, str) and re.search(r"tl\.(load|store|program_id)\(", s)]
        assert not kernel, (name, kernel[0][:80])
        assert not re.search(r"@[A-Z_]{3,}@", text), name
    # every family folder's kernels were read, and every module beside them
    assert seen["parts"] >= 15 and seen["other"] >= 25, seen


def _template_imports() -> dict[str, set[str]]:
    """Each templates module -> the templates modules it imports, at the top or inside a function (a
    `from package import name` of a submodule counts as importing that submodule; an import under
    `if TYPE_CHECKING:` does not count: it never runs)."""
    folder = Path(templates.__file__).parent
    names = {
        ".".join(("kernelbrain", "templates", *p.relative_to(folder).with_suffix("").parts)).removesuffix(
            ".__init__"
        ): p
        for p in folder.rglob("*.py")
    }
    out: dict[str, set[str]] = {}
    for name, path in names.items():
        tree = ast.parse(path.read_text())
        skipped = {
            id(n)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for n in ast.walk(node)
        }
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & names.keys()
                found |= subs or {node.module}
        out[name] = {m for m in found if m in names and m != name}
    return out


def test_no_import_cycle_in_templates_function_level_imports_included():
    """The layers hold: families import the shared helpers and each other's kits, the composer imports
    the families, and nothing imports back up, not even inside a function."""
    graph = _template_imports()
    assert graph["kernelbrain.templates.families.conv"] <= {
        m for m in graph if not m.startswith("kernelbrain.templates.compose")
    }
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for dep in sorted(graph[module]):
            assert state.get(dep) != 1, "import cycle: " + " -> ".join([*path, module, dep])
            if dep not in state:
                visit(dep, [*path, module])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [])


def test_every_family_sizes_against_the_one_limits_table():
    """No family keeps a device limit of its own: shared memory and SM counts come from limits.py."""
    from kernelbrain.templates import limits

    folder = Path(templates.__file__).parent / "families"
    for path in folder.rglob("__init__.py"):
        text = path.read_text()
        numbers = {n.value for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Constant)}
        assert not numbers & {227, 228, 232448, 65535, 132}, path  # KiB of shared memory, grid, SMs
        assert "_next_pow2" not in text and "bit_length" not in text, path
    assert limits.of((9, 0)) is limits.TARGET and limits.of((8, 7)) == limits.LIMITS[(8, 6)]
    assert limits.of((12, 0)) is limits.TARGET


def test_no_family_binds_the_name_of_a_module_of_its_folder():
    """`from kernelbrain.templates.families.<f> import parts` gives the parts module only where the family
    binds no name `parts` of its own (a function of that name would be what the import returns, and
    loading the module later would replace the function under the family's feet)."""
    folder = Path(templates.__file__).parent / "families"
    for package in sorted(p for p in folder.iterdir() if (p / "__init__.py").exists()):
        modules = {p.stem for p in package.glob("*.py")} - {"__init__"}
        bound: set[str] = set()
        for node in ast.parse((package / "__init__.py").read_text()).body:
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                bound.add(node.name)
            elif isinstance(node, ast.Assign):
                bound |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            elif isinstance(node, ast.ImportFrom | ast.Import):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        assert not bound & modules, (package.name, bound & modules)
