"""The tree's layers, read from the imports of every module: the code beside untrusted candidates
(`kernelbrain.child`) is imported by no other part of kb and imports only the pure core; the core starts
no processes and imports no layer above it; no module reaches into another's private names; no module
grows past MAX_LINES. And the wheel installs kb under its own name only."""

from __future__ import annotations

import ast
import os
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
# what each layer of kernelbrain may import of kb (a prefix of the imported module's name)
ALLOWED = {
    "kernelbrain.child": ("kernelbrain.child", "kernelbrain.core", "kernelbrain.store"),
    "kernelbrain.core": ("kernelbrain.core", "kernelbrain.store"),
    "kernelbrain.store": ("kernelbrain.store",),
}
PROCESS_MODULES = {"subprocess", "multiprocessing", "threading", "signal"}


def module_name(path: Path) -> str:
    for name, folder in sorted(PACKAGES.items(), key=lambda kv: -len(str(kv[1]))):
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join((name, *parts)).removesuffix(".__init__")
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def python_files(folders: list[Path]) -> list[Path]:
    return sorted(p for d in folders for p in d.rglob("*.py") if "results" not in p.parts)


class Imports(ast.NodeVisitor):
    """What one module imports of kb: (line, module) pairs, and private names it takes from another."""

    def __init__(self, here: str) -> None:
        self.here = here
        self.modules: list[tuple[int, str]] = []
        self.private: list[tuple[int, str]] = []
        self.aliases: dict[str, str] = {}

    @staticmethod
    def ours(name: str) -> bool:
        return name == "kernelbrain" or name.startswith("kernelbrain.")

    @staticmethod
    def is_private(part: str) -> bool:
        return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            self.modules.append((node.lineno, a.name))
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


def test_nothing_imports_the_experiments() -> None:
    """experiments/ holds one-off probes: the product, its tests and its tools never depend on them."""
    bad = [
        f"{p.relative_to(ROOT)}:{line}: imports {name}"
        for p in python_files(CHECKED)
        for line, name in imports_of(p).modules
        if name == "experiments" or name.startswith("experiments.")
    ]
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_lower_layer_imports_only_what_it_may(layer: str) -> None:
    """child -> core, store; core -> store; store -> nothing of kb. So the child imports nothing of the
    runtime, and the core nothing that runs processes."""
    bad = []
    for p in python_files([ROOT / "kernelbrain", ROOT / "store"]):
        if layer_of(module_name(p)) != layer:
            continue
        for line, name in imports_of(p).modules:
            if Imports.ours(name) and name != "kernelbrain" and not name.startswith(ALLOWED[layer]):
                bad.append(f"{p.relative_to(ROOT)}:{line}: imports {name}")
            if layer == "kernelbrain.core" and name.split(".")[0] in PROCESS_MODULES:
                bad.append(f"{p.relative_to(ROOT)}:{line}: imports {name} (the core starts no processes)")
    assert not bad, "\n".join(bad)


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
    assert layer_of("kernelbrain.runtime.worker") is None  # the runtime may import the layers below it
    assert module_name(ROOT / "store" / "driver.py") == "kernelbrain.store.driver"
    assert module_name(ROOT / "migrations" / "__init__.py") == "kernelbrain.store.migrations"


def test_no_module_is_past_the_size_limit() -> None:
    big = {
        str(p.relative_to(ROOT)): n
        for p in python_files(SIZED)
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    }
    assert not big, f"modules over {MAX_LINES} lines (split them by what they hold): {big}"


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
