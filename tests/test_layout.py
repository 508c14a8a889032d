"""The tree's layers, read from the imports of every module, those inside functions included: kb's
layers import downwards only (commands -> views -> runtime -> generators -> templates -> core -> store;
the code beside untrusted candidates, `kernelbrain.child`, imports only the core and the store, and no
other part of kb imports it); no modules import each other in a cycle; the core starts no processes; no
module reaches into another's private names; nothing depends on experiments/; no module grows past
MAX_LINES. And the wheel installs kb under its own name only."""

from __future__ import annotations

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the installed package's folders: store/ and migrations/ sit at the top of the tree, installed under
# kernelbrain.store (pyproject's package-dir)
PACKAGES = {
    "kernelbrain": ROOT / "kernelbrain",
    "kernelbrain.store": ROOT / "store",
    "kernelbrain.store.migrations": ROOT / "migrations",
}
CHECKED = [ROOT / d for d in ("kernelbrain", "store", "migrations", "tools", "benchmarks", "tests")]
MAX_LINES = 600
SIZED = [ROOT / "kernelbrain", ROOT / "store", ROOT / "tools", ROOT / "benchmarks"]
PRODUCT = [ROOT / "kernelbrain", ROOT / "store", ROOT / "migrations"]
# kb's layers, top to bottom: a module imports its own layer and those below it. The `kb` entry points
# (TOP) sit above them all; the child, beside candidate code, imports only the core and the store
LAYERS = (
    "kernelbrain.commands",
    "kernelbrain.views",
    "kernelbrain.runtime",
    "kernelbrain.generators",
    "kernelbrain.templates",
    "kernelbrain.core",
    "kernelbrain.store",
    "kernelbrain.candidate",  # kb's candidate API: imported by candidates (and the templates' parts)
)
TOP = ("kernelbrain", "kernelbrain.cli", "kernelbrain.__main__")
# what each layer may import of kb (a prefix of the imported module's name)
ALLOWED = {layer: LAYERS[i:] for i, layer in enumerate(LAYERS)} | {
    "kernelbrain.child": ("kernelbrain.child", "kernelbrain.core", "kernelbrain.store"),
}
# import cycles among the templates' modules, left to the templates' move to one folder per family
# (issue 33): the test below expects exactly these. Empty it when that work merges
KNOWN_TEMPLATE_CYCLES: list[tuple[str, ...]] = []
PROCESS_MODULES = {"subprocess", "multiprocessing", "threading", "signal"}
RESULTS = ROOT / "benchmarks" / "results"
RESULTS_LIMIT = 5_000_000  # bytes: the current result set only; older sets stay in git history


def module_name(path: Path) -> str:
    for name, folder in sorted(PACKAGES.items(), key=lambda kv: -len(str(kv[1]))):
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join((name, *parts)).removesuffix(".__init__")
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def python_files(folders: list[Path]) -> list[Path]:
    return sorted(p for d in folders for p in d.rglob("*.py") if "results" not in p.parts)


class Imports(ast.NodeVisitor):
    """What one module imports, anywhere in it: (line, module) pairs; `executed`, the imports that run
    (all but those under `if TYPE_CHECKING:`), each as the module or name imported (`a.b.name` for
    `from a.b import name`); and the private names it takes from another module."""

    def __init__(self, here: str) -> None:
        self.here = here
        self.modules: list[tuple[int, str]] = []
        self.executed: list[tuple[int, str]] = []
        self.private: list[tuple[int, str]] = []
        self.aliases: dict[str, str] = {}
        self.typing_only = 0  # inside `if TYPE_CHECKING:`

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            self.typing_only += 1
            for child in node.body:
                self.visit(child)
            self.typing_only -= 1
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    @staticmethod
    def ours(name: str) -> bool:
        return name == "kernelbrain" or name.startswith("kernelbrain.")

    @staticmethod
    def is_private(part: str) -> bool:
        return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.modules.append((node.lineno, a.name))
            if not self.typing_only:
                self.executed.append((node.lineno, a.name))
            if self.ours(a.name):
                if a.asname:
                    self.aliases[a.asname] = a.name
                else:
                    self.aliases[a.name.split(".")[0]] = a.name.split(".")[0]
                if any(self.is_private(p) for p in a.name.split(".")):
                    self.private.append((node.lineno, a.name))

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module is None or node.level:
            return
        self.modules.append((node.lineno, node.module))
        if not self.typing_only:
            self.executed += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        if not self.ours(node.module):
            return
        if any(self.is_private(p) for p in node.module.split(".")):
            self.private.append((node.lineno, node.module))
        for a in node.names:
            target = f"{node.module}.{a.name}"
            if self.is_private(a.name) and node.module != self.here:
                self.private.append((node.lineno, target))
            self.aliases[a.asname or a.name] = target

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.aliases and self.is_private(node.attr):
            self.private.append((node.lineno, f"{self.aliases[node.value.id]}.{node.attr}"))
        self.generic_visit(node)


def imports_of(path: Path) -> Imports:
    found = Imports(module_name(path))
    found.visit(ast.parse(path.read_text(encoding="utf-8"), str(path)))
    return found


def layer_of(module: str) -> str | None:
    return next((layer for layer in ALLOWED if module == layer or module.startswith(layer + ".")), None)


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for p in python_files(PRODUCT)}


def resolve(name: str, known: set[str] | dict[str, Path]) -> str:
    """The module an import names: the longest known module `name` starts with (`kernelbrain.store` for
    `kernelbrain.store.NewEvent`), or name itself when it is none of kb's."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in known:
            return ".".join(parts[:n])
    return name


def modules_path(module: str) -> str:
    return str(product_modules()[module].relative_to(ROOT))


def import_graph(modules: dict[str, Path]) -> dict[str, dict[str, int]]:
    """module -> {module of kb it imports when it runs: the first line that does}."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        edges = graph.setdefault(name, {})
        for line, target in imports_of(path).executed:
            target = resolve(target, modules)
            if target in modules and target != name:
                edges.setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[tuple[str, ...]]:
    """The graph's strongly connected components of more than one module, each sorted: every module of
    one imports every other, through the rest."""

    def reach(start: str, edges: dict[str, set[str]]) -> set[str]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in edges.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    forward = {m: set(e) for m, e in graph.items()}
    backward: dict[str, set[str]] = {}
    for m, targets in forward.items():
        for t in targets:
            backward.setdefault(t, set()).add(m)
    found: set[tuple[str, ...]] = set()
    for m in graph:
        component = reach(m, forward) & reach(m, backward)
        if len(component) > 1:
            found.add(tuple(sorted(component)))
    return sorted(found)


def test_no_module_takes_another_modules_private_names() -> None:
    bad = [
        f"{p.relative_to(ROOT)}:{line}: {name}"
        for p in python_files(CHECKED)
        for line, name in imports_of(p).private
    ]
    assert not bad, "private names used across modules (make them public):\n" + "\n".join(bad)


def test_the_child_is_imported_by_nothing_else_in_kb() -> None:
    """Only the child's own modules import it: the worker starts it as `python -m kernelbrain.child`."""
    bad = [
        f"{p.relative_to(ROOT)}:{line}: imports {name}"
        for p in python_files([ROOT / "kernelbrain", ROOT / "store"])
        if layer_of(module_name(p)) != "kernelbrain.child"
        for line, name in imports_of(p).modules
        if name == "kernelbrain.child" or name.startswith("kernelbrain.child.")
    ]
    assert not bad, "\n".join(bad)


def test_nothing_depends_on_the_experiments() -> None:
    """experiments/ holds one-off probes: the product, its tests and its tools never import one (as
    `experiments.x`, or by its script's name on sys.path, or as the tool it once was), and no tool runs
    one."""
    probes = {p.stem for p in (ROOT / "experiments").glob("*.py")}
    bad = [
        f"{p.relative_to(ROOT)}:{line}: imports {name}"
        for p in python_files(CHECKED)
        for line, name in imports_of(p).executed + imports_of(p).modules
        if (parts := name.split("."))[0] in ("experiments", *probes)
        or (parts[0] == "tools" and len(parts) > 1 and parts[1] in probes)
    ]
    bad += [
        f"{p.relative_to(ROOT)}: names experiments/"
        for p in sorted((ROOT / "tools").rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and "experiments/" in p.read_text(encoding="utf-8")
    ]
    assert not bad, "\n".join(bad)


def test_every_tool_imported_is_in_tools() -> None:
    """A tool moved or removed leaves no import of it behind, in the tree or in experiments/."""
    tools = {p.stem for p in (ROOT / "tools").glob("*.py")}
    bad = [
        f"{p.relative_to(ROOT)}:{line}: imports {name}"
        for p in python_files([*CHECKED, ROOT / "experiments"])
        for line, name in imports_of(p).executed
        if (parts := name.split("."))[0] == "tools" and len(parts) > 1 and parts[1] not in tools
    ]
    assert not bad, "\n".join(bad)


def test_every_module_is_in_a_layer() -> None:
    """A new folder of kernelbrain/ takes its place in LAYERS (and docs/architecture.md) first."""
    loose = [m for m in product_modules() if m not in TOP and layer_of(m) is None]
    assert not loose, f"modules in no layer of LAYERS: {loose}"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    """commands -> views -> runtime -> generators -> templates -> core -> store, each importing its own
    layer and those below it; child -> core, store. Imports inside functions count; those under
    `if TYPE_CHECKING:` do not run and may name any layer. The core imports nothing that runs processes.
    """
    modules = product_modules()
    bad = []
    for name, p in modules.items():
        if layer_of(name) != layer:
            continue
        found = imports_of(p)
        for line, imported in found.executed:
            target = resolve(imported, modules)
            if Imports.ours(target) and target != "kernelbrain" and not target.startswith(ALLOWED[layer]):
                bad.append(f"{p.relative_to(ROOT)}:{line}: imports {target}")
        for line, imported in found.modules:
            if layer == "kernelbrain.core" and imported.split(".")[0] in PROCESS_MODULES:
                bad.append(f"{p.relative_to(ROOT)}:{line}: imports {imported} (the core starts no processes)")
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_no_modules_import_each_other_in_a_cycle() -> None:
    """No chain of imports leads from a module back to itself, counting imports inside functions (a lazy
    import hides a cycle; it does not remove it). The templates' known cycles are expected, exactly."""
    graph = import_graph(product_modules())
    found = cycles(graph)
    assert all(m.startswith("kernelbrain.templates.") for c in KNOWN_TEMPLATE_CYCLES for m in c)
    new = [c for c in found if c not in KNOWN_TEMPLATE_CYCLES]
    gone = [c for c in KNOWN_TEMPLATE_CYCLES if c not in found]
    lines = [
        f"  {a} -> {b} ({modules_path(a)}:{graph[a][b]})" for c in new for a in c for b in graph[a] if b in c
    ]
    assert not new, "import cycles (the edges within each):\n" + "\n".join(lines)
    assert not gone, f"no longer cycles: take them out of KNOWN_TEMPLATE_CYCLES: {gone}"


def test_the_checks_see_a_violation() -> None:
    """The reader above catches each kind of breach it is there for (a check that cannot fail is none)."""
    tree = ast.parse(
        "from kernelbrain.child.loading import _x\nimport kernelbrain.store.driver as d\n"
        "from kernelbrain.child import gate\nd._private\ngate._Memo\n"
    )
    found = Imports("kernelbrain.runtime.example")
    found.visit(tree)
    assert [n for _, n in found.private] == [
        "kernelbrain.child.loading._x",
        "kernelbrain.store.driver._private",
        "kernelbrain.child.gate._Memo",
    ]
    assert layer_of("kernelbrain.child.gate") == "kernelbrain.child"
    assert layer_of("kernelbrain.runtime.worker") == "kernelbrain.runtime"
    assert layer_of("kernelbrain.cli") is None  # the entry points may import every layer
    assert "kernelbrain.views" not in ALLOWED["kernelbrain.runtime"]
    assert "kernelbrain.views" in ALLOWED["kernelbrain.commands"]
    lazy = Imports("kernelbrain.core.example")
    lazy.visit(
        ast.parse(
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kernelbrain.views import audit\n"
            "else:\n    import json\ndef f():\n    from kernelbrain.store import NewEvent\n"
        )
    )
    assert lazy.executed == [(1, "typing.TYPE_CHECKING"), (5, "json"), (7, "kernelbrain.store.NewEvent")]
    assert (3, "kernelbrain.views") in lazy.modules
    known = {"kernelbrain.store", "kernelbrain.child", "kernelbrain.child.guard"}
    assert resolve("kernelbrain.store.NewEvent", known) == "kernelbrain.store"
    assert resolve("kernelbrain.child.guard", known) == "kernelbrain.child.guard"
    graph = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "d": 4}, "d": {}, "e": {"e": 5}}
    assert cycles(graph) == [("a", "b", "c")]
    assert module_name(ROOT / "store" / "driver.py") == "kernelbrain.store.driver"
    assert module_name(ROOT / "migrations" / "__init__.py") == "kernelbrain.store.migrations"


def test_the_results_hold_one_result_set() -> None:
    """benchmarks/results/ holds the current result set only (RESULTS.md says where the older ones are
    in git history), and no file there is also a test fixture: a recorded database is tracked once."""
    files = [p for p in RESULTS.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in files)
    assert size < RESULTS_LIMIT, f"benchmarks/results holds {size} bytes: move superseded sets out"

    def digests(paths: list[Path]) -> dict[str, Path]:
        return {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in paths}

    fixtures = digests([p for p in (ROOT / "tests" / "fixtures").rglob("*") if p.is_file()])
    twice = [
        f"{p.relative_to(ROOT)} = {fixtures[h].relative_to(ROOT)}"
        for h, p in digests(files).items()
        if h in fixtures
    ]
    assert not twice, "tracked twice (keep the fixture, point at it):\n" + "\n".join(twice)


def test_no_module_is_past_the_size_limit() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in python_files(SIZED)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines (split them by what they hold): {big}"


# declared dependencies kb's code uses without importing them, and how
USED_WITHOUT_IMPORT = {"numpy": "torch's Tensor.numpy() (child/tensorfile.py) and Triton's interpreter"}


def requirements() -> dict[str, list[tuple[str, bool]]]:
    """pyproject's `dependencies` and `dev` extra: (distribution name, whether a comment states its
    reason, on its line or the ones just above it)."""
    lines = (ROOT / "pyproject.toml").read_text(encoding="utf-8").splitlines()
    found: dict[str, list[tuple[str, bool]]] = {"dependencies": [], "dev": []}
    section = None
    for i, line in enumerate(lines):
        head = line.split("=")[0].strip()
        if head in found and line.rstrip().endswith("["):
            section = head
        elif section and line.strip() == "]":
            section = None
        elif section and (m := re.match(r'\s*"([A-Za-z0-9_.-]+)', line)):
            reason = "#" in line.split('",')[-1] or lines[i - 1].strip().startswith("#")
            found[section].append((m.group(1), reason))
    return found


def test_every_dependency_has_a_reason_and_a_use() -> None:
    """Every declared dependency says why kb has it, and each of `dependencies` is imported by kb's code
    (or named in USED_WITHOUT_IMPORT): one never imported is removed."""
    declared = requirements()
    assert declared["dependencies"] and declared["dev"]
    silent = [name for names in declared.values() for name, reason in names if not reason]
    assert not silent, f"dependencies with no comment saying why: {silent}"
    imported = {name.split(".")[0] for p in python_files(PRODUCT) for _, name in imports_of(p).executed}
    unused = [
        name
        for name, _ in declared["dependencies"]
        if name.lower().replace("-", "_") not in imported and name not in USED_WITHOUT_IMPORT
    ]
    assert not unused, f"declared but never imported by kernelbrain/ or store/: {unused}"


def test_the_wheel_installs_nothing_but_kernelbrain(tmp_path: Path) -> None:
    """`pip install .` puts one top-level package in site-packages: no generic `store` or `migrations`;
    the migrations travel inside it and are found from an installed copy."""
    try:  # build with this venv's setuptools where it is recent enough, saving a download
        import setuptools

        recent = tuple(int(x) for x in setuptools.__version__.split(".")[:2]) >= (68, 0)
    except ImportError:
        recent = False
    flags = ["--no-build-isolation"] if recent else []
    source = tmp_path / "source"  # setuptools builds in the source folder: a copy keeps the tree clean
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("kernelbrain", "store", "migrations"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *flags, "-w", str(tmp_path), str(source)],
        check=True,
        capture_output=True,
        cwd=tmp_path,
    )
    (wheel,) = tmp_path.glob("kernelbrain-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"kernelbrain"}, top
    assert "kernelbrain/store/migrations/0001_events.sql" in names
    missing = [
        str(init.relative_to(ROOT))
        for init in (ROOT / "kernelbrain").rglob("__init__.py")
        if str(init.relative_to(ROOT)) not in names
    ]
    assert not missing, f"packages the wheel leaves out (pyproject's packages list): {missing}"
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    probe = (
        "from kernelbrain.store.migrate import discover; import kernelbrain, kernelbrain.cli; "
        "print(kernelbrain.__file__); print(' '.join(m.name for m in discover()))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    out = subprocess.run(
        [sys.executable, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path, env=env
    ).stdout.split("\n")
    assert out[0].startswith(str(site)), out
    assert "0001_events" in out[1]
