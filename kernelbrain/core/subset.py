"""kb's candidate subset: the Python a candidate kb's own templates did not write may be written in,
checked on the host from the source alone (`ast`), before any child starts.

The runtime guard (child/guard.py) watches what a candidate's forward runs; what runs where it cannot
look (a launch's grid callable, a @triton.jit body under the interpreter, another thread, ctypes on a
`data_ptr`, a patched dunder or timer, a stack frame's locals) is refused here instead, by making it
impossible to write. The subset is an allowlist (names in core/subset_names.py):

- imports of torch, torch.nn, torch.nn.functional, triton, triton.language, math and kb's candidate
  API (kernelbrain.candidate), under any names;
- at module level: imports, constants, @triton.jit kernels (optionally @triton.autotune'd with literal
  configurations), plain host helpers, and `class ModelNew(nn.Module)`;
- host code: arithmetic on numbers, tuples and lists; tensor metadata; allocation, views, copies and
  casts; launches `kernel[grid](...)` with a grid of numbers; the torch ops of the classes the user
  allowed (`--allow-torch`); calls of the module's own helpers and ModelNew's own methods;
- @triton.jit bodies: `tl.*`, arithmetic, control flow and calls of the module's other kernels.

No dunders, no names outside the module and the allowed builtins, no getattr/setattr/eval/exec/open/
globals/vars, no lambdas, nested functions, classes other than ModelNew, try/with/del/global/yield/await
/walrus, no assignments to attributes but `self.x`, nor into the module's own objects.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import NamedTuple

from kernelbrain.core import subset_names as names
from kernelbrain.core.subset_scope import BUILTINS, Host, Jit, dunder, params_of


class Refusal(NamedTuple):
    line: int
    what: str
    instead: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.what} is outside kb's candidate subset; {self.instead}"


def refusals(source: str, torch_classes: Iterable[str] = ()) -> list[Refusal]:
    """Every construct of `source` outside the subset, in line order; [] for a source within it, or one
    that does not parse (the gate's child says `compile` for that)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    classes = list(torch_classes)
    checker = ModuleCheck(tree, names.torch_functions(classes), names.aten_calls(classes))
    checker.run()
    return sorted(checker.found, key=lambda r: r.line)


def check(source: str, torch_classes: Iterable[str] = ()) -> str | None:
    """The first refusal as one line (`line N: ... is outside kb's candidate subset; ...`), or None."""
    found = refusals(source, torch_classes)
    return str(found[0]) if found else None


class ModuleCheck:
    """One candidate module's check: the module level, then each function in the scope it runs in."""

    def __init__(self, tree: ast.Module, torch_functions: frozenset[str], aten: frozenset[str]) -> None:
        self.tree = tree
        self.torch_functions = torch_functions
        self.aten = aten
        self.found: list[Refusal] = []
        self.aliases: dict[str, str] = {}  # local name -> canonical path it binds
        self.jit: dict[str, ast.FunctionDef] = {}  # kernels (and names bound to them)
        self.helpers: dict[str, ast.FunctionDef] = {}
        self.constants: set[str] = set()
        self.model: ast.ClassDef | None = None
        self._self_attrs: set[str] | None = None

    def self_attributes(self) -> set[str]:
        if self._self_attrs is None:
            self._self_attrs = self_attributes_of(self.model) if self.model is not None else set()
        return self._self_attrs

    def refuse(self, node: ast.AST, what: str, instead: str) -> None:
        self.found.append(Refusal(getattr(node, "lineno", 0), what, instead))

    # --- the module level -------------------------------------------------------------------------

    def run(self) -> None:
        body = self.tree.body
        for i, node in enumerate(body):
            if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
                continue  # the docstring
            if isinstance(node, ast.Import | ast.ImportFrom):
                self.imports(node)
            elif isinstance(node, ast.FunctionDef):
                self.bind(node, node.name)
                jit = self.decorators(node)
                (self.jit if jit else self.helpers)[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.bind(node, node.name)
                self.model_class(node)
            elif isinstance(node, ast.Assign | ast.AnnAssign):
                self.constant(node)
            else:
                self.refuse(
                    node,
                    f"a module-level {type(node).__name__.lower()} statement",
                    "keep the module level to imports, constants, kernels, helpers and class ModelNew",
                )
        if self.model is None:
            self.found.append(Refusal(1, "a module without class ModelNew", "define ModelNew(nn.Module)"))
        for fn in self.jit.values():
            if isinstance(fn, ast.FunctionDef):
                Jit(self, fn).run()
        for fn in self.helpers.values():
            Host(self, fn).run()
        if self.model is not None:
            for item in self.model.body:
                if isinstance(item, ast.FunctionDef):
                    Host(self, item, model=self.model).run()

    def bound(self) -> set[str]:
        return {*self.aliases, *self.jit, *self.helpers, *self.constants, "ModelNew"}

    def bind(self, node: ast.AST, name: str) -> None:
        if name in self.bound() - ({"ModelNew"} if self.model is None else set()):
            self.refuse(node, f"a second binding of the module-level name {name!r}", "give each its own name")
        elif name in BUILTINS | {"self"}:
            self.refuse(node, f"a module-level name {name!r} that hides a builtin", "choose another name")

    def imports(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.ImportFrom):
            if node.module == names.FUTURE:
                return
            if node.level or node.module is None:
                self.refuse(node, "a relative import", "import torch, triton, math or kernelbrain.candidate")
                return
        for a in node.names:
            if a.name == "*":
                self.refuse(node, "a star import", "import the module and name what you use")
                continue
            if isinstance(node, ast.Import):
                path = a.name if a.asname else a.name.split(".")[0]
                local = a.asname or path
                checked = a.name
            else:
                path = checked = f"{node.module}.{a.name}"
                local = a.asname or a.name
            if not self.importable(checked):
                self.refuse(
                    node,
                    f"importing {checked}",
                    "import only torch, torch.nn, torch.nn.functional, triton, triton.language, math and "
                    "kernelbrain.candidate",
                )
                continue
            self.bind(node, local)
            self.aliases[local] = path

    def importable(self, path: str) -> bool:
        return (
            path in names.MODULES
            or path in names.TORCH_HOST | names.TORCH_VALUES | names.TRITON_HOST | names.CANDIDATE_API
            or path in {"torch.nn.Module", names.TRITON_CONFIG} | names.TRITON_DECORATORS
            or path.startswith("triton.language.")
            or (path.startswith("math.") and not dunder(path.split(".")[-1]))
        )

    def path(self, node: ast.expr) -> str | None:
        """The canonical dotted path of an attribute chain rooted at an import (`F.conv2d`), else None."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id in self.aliases:
            return ".".join([self.aliases[node.id], *reversed(parts)])
        return None

    def decorators(self, fn: ast.FunctionDef) -> bool:
        """Whether `fn` is a kernel: decorated @triton.jit last (below an optional @triton.autotune with
        literal configurations); any other decorator is refused."""
        paths = [self.path(d.func if isinstance(d, ast.Call) else d) for d in fn.decorator_list]
        if not paths:
            return False
        if paths[-1] != "triton.jit" or any(p not in names.TRITON_DECORATORS for p in paths):
            self.refuse(
                fn,
                f"the decorators of {fn.name}",
                "decorate kernels with @triton.jit (under @triton.autotune)",
            )
            return True
        for d in fn.decorator_list:
            if isinstance(d, ast.Call):
                for arg in [*d.args, *(k.value for k in d.keywords)]:
                    if not self.literal(arg, configs=True):
                        self.refuse(
                            arg,
                            "a decorator argument that is not literal data",
                            "give triton.autotune literal triton.Config(...) lists and key names, no hooks",
                        )
        return True

    def literal(self, node: ast.expr, configs: bool = False) -> bool:
        """Constants, containers of them, tl/torch dtypes and (for autotune) triton.Config(...) calls."""
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.UnaryOp):
            return self.literal(node.operand)
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return all(self.literal(e, configs) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(k is not None and self.literal(k) for k in node.keys) and all(
                self.literal(v, configs) for v in node.values
            )
        if isinstance(node, ast.Name):
            return node.id in self.constants
        if configs and isinstance(node, ast.Call) and self.path(node.func) == names.TRITON_CONFIG:
            return all(self.literal(a) for a in [*node.args, *(k.value for k in node.keywords)])
        path = self.path(node)
        return path is not None and (path in names.TORCH_VALUES or path.startswith("triton.language."))

    def model_class(self, node: ast.ClassDef) -> None:
        if node.name != "ModelNew":
            self.refuse(
                node, f"class {node.name}", "define one class, ModelNew(nn.Module), and plain functions"
            )
            return
        self.model = node
        bases = [self.path(b) for b in node.bases]
        if bases != ["torch.nn.Module"] or node.keywords or node.decorator_list:
            self.refuse(node, "ModelNew's bases, metaclass or decorators", "write class ModelNew(nn.Module):")
        for i, item in enumerate(node.body):
            if i == 0 and isinstance(item, ast.Expr) and isinstance(item.value, ast.Constant):
                continue
            if not isinstance(item, ast.FunctionDef):
                self.refuse(item, "a ModelNew class attribute", "set attributes on self in __init__")
            elif item.decorator_list:
                self.refuse(item, f"a decorator on ModelNew.{item.name}", "write plain methods")
            elif dunder(item.name) and item.name != "__init__":
                self.refuse(
                    item, f"the method ModelNew.{item.name}", "define __init__, forward and plain methods"
                )
            elif not params_of(item) or item.args.posonlyargs:
                self.refuse(item, f"ModelNew.{item.name} without self", "take self first")

    def constant(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        if len(targets) == 1 and isinstance(targets[0], ast.Attribute | ast.Subscript):
            Host(self, None).target(targets[0])  # a patch: `torch.Tensor.__add__ = ...`
            return
        if len(targets) != 1 or not isinstance(targets[0], ast.Name) or node.value is None:
            self.refuse(node, "a module-level assignment to anything but one name", "write NAME = value")
            return
        name = targets[0].id
        value = node.value
        self.bind(node, name)
        if isinstance(value, ast.Name) and value.id in self.jit:
            self.jit[name] = self.jit[value.id]  # another name for a kernel
            return
        if isinstance(node, ast.AnnAssign):
            Host(self, None).expr(node.annotation, annotation=True)
        Host(self, None).expr(value)
        self.constants.add(name)


def self_attributes_of(model: ast.ClassDef) -> set[str]:
    """The attributes ModelNew's methods set on self: assigned, or registered by name."""
    out: set[str] = set()
    for n in ast.walk(model):
        targets = n.targets if isinstance(n, ast.Assign) else [getattr(n, "target", None)]
        out |= {t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)}
        if (
            isinstance(n, ast.Call)
            and isinstance(n.func, ast.Attribute)
            and n.func.attr in names.INIT_SELF_METHODS
            and n.args
            and isinstance(n.args[0], ast.Constant)
            and isinstance(n.args[0].value, str)
        ):
            out.add(n.args[0].value)
    return out
