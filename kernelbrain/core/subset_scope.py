"""kb's candidate subset, inside functions: host code (helpers, ModelNew's methods, module-level values)
and @triton.jit bodies, each checked in the scope it runs in. core/subset.py checks the module level and
hands each function here; core/subset_names.py holds the allowlists."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from kernelbrain.core import subset_names as names

if TYPE_CHECKING:
    from kernelbrain.core.subset import ModuleCheck


def dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def stores(node: ast.AST) -> set[str]:
    """The names `node` binds anywhere inside it (assignments, loop and comprehension targets)."""
    return {
        n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store | ast.Del)
    }


def params_of(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    return [*a.posonlyargs, *a.args, *a.kwonlyargs, *(x for x in (a.vararg, a.kwarg) if x is not None)]


STATEMENTS = {
    ast.Try: ("try/except", "let errors propagate: kb reports them"),
    ast.With: ("a with statement", "call what you need directly"),
    ast.Delete: ("del", "let the name go out of scope"),
    ast.Global: ("global", "pass values as arguments, or use kernelbrain.candidate.LaunchCache"),
    ast.Nonlocal: ("nonlocal", "pass values as arguments"),
    ast.Import: ("an import inside a function", "import at module level"),
    ast.ImportFrom: ("an import inside a function", "import at module level"),
    ast.ClassDef: ("a class other than ModelNew", "use functions"),
    ast.FunctionDef: ("a nested function", "define helpers at module level"),
    ast.AsyncFunctionDef: ("an async function", "use plain functions"),
    ast.AsyncFor: ("async for", "use a plain for loop"),
    ast.AsyncWith: ("async with", "call what you need directly"),
}
EXPRESSIONS = {
    ast.Lambda: ("a lambda", "define a helper function at module level; a launch's grid is a tuple of ints"),
    ast.NamedExpr: ("an assignment expression (:=)", "assign on its own line"),
    ast.Yield: ("yield", "return a value"),
    ast.YieldFrom: ("yield from", "return a value"),
    ast.Await: ("await", "use plain calls"),
}
BUILTINS = names.BUILTIN_CALLS | names.EXCEPTIONS | {"super"}
METHODS = names.TENSOR_METHODS | names.CONTAINER_METHODS
HOST_CALLS = names.TORCH_HOST | names.TRITON_HOST
TL_NAMES = names.TL_METHODS | names.TL_ATTRS

if hasattr(ast, "TryStar"):
    STATEMENTS[ast.TryStar] = STATEMENTS[ast.Try]
if hasattr(ast, "Match"):
    STATEMENTS[ast.Match] = ("a match statement", "use if/elif")


class Scope:
    """What one function's body may name: its own locals, and the module's bindings."""

    def __init__(self, module: ModuleCheck, fn: ast.FunctionDef | None) -> None:
        self.m = module
        self.fn = fn
        self.params = [a.arg for a in params_of(fn)] if fn is not None else []
        self.locals: set[str] = set(self.params) | (stores(fn) if fn is not None else set())
        self._assigned: dict[str, list[ast.expr | None]] | None = None
        if fn is not None:
            for name in self.locals & (set(module.aliases) | set(module.jit) | set(module.helpers)):
                module.refuse(
                    fn, f"rebinding the module's name {name!r} in {fn.name}", "use another local name"
                )
            for name in self.locals & BUILTINS:
                module.refuse(fn, f"rebinding the builtin {name!r} in {fn.name}", "use another local name")

    def refuse(self, node: ast.AST, what: str, instead: str) -> None:
        self.m.refuse(node, what, instead)

    @property
    def assigned(self) -> dict[str, list[ast.expr | None]]:
        """Each local's assigned values (None where bound otherwise: a loop, an augmented assignment)."""
        if self._assigned is None:
            self._assigned = {}
            for n in ast.walk(self.fn) if self.fn is not None else ():
                if isinstance(n, ast.Assign):
                    for t in n.targets:
                        if isinstance(t, ast.Name):
                            self._assigned.setdefault(t.id, []).append(n.value)
                        else:
                            for s in stores(t):
                                self._assigned.setdefault(s, []).append(None)
                elif isinstance(n, ast.AugAssign | ast.AnnAssign | ast.For | ast.comprehension):
                    for s in stores(n.target):
                        self._assigned.setdefault(s, []).append(None)
        return self._assigned

    def special(self, node: ast.AST) -> bool:
        """Refuse what no code of a candidate may hold; True when it did."""
        kind = STATEMENTS.get(type(node)) or EXPRESSIONS.get(type(node))
        if kind is not None:
            self.refuse(node, *kind)
            return True
        return False


class Host(Scope):
    """Host code: a helper, a ModelNew method, or (fn None) a module-level value."""

    def __init__(
        self, module: ModuleCheck, fn: ast.FunctionDef | None, model: ast.ClassDef | None = None
    ) -> None:
        super().__init__(module, fn)
        self.model = model
        self.self_name = self.params[0] if model is not None and self.params else None
        self.init = model is not None and fn is not None and fn.name == "__init__"
        self.methods = {f.name for f in model.body if isinstance(f, ast.FunctionDef)} if model else set()
        self.self_attrs = module.self_attributes() if model else set()

    def run(self) -> None:
        assert self.fn is not None
        self.arguments(self.fn)
        for stmt in self.fn.body:
            self.stmt(stmt)

    def arguments(self, fn: ast.FunctionDef) -> None:
        outer = Host(self.m, None)  # defaults and annotations run at module level
        for d in [*fn.args.defaults, *(d for d in fn.args.kw_defaults if d is not None)]:
            outer.expr(d)
        for a in params_of(fn):
            if a.annotation is not None:
                outer.expr(a.annotation, annotation=True)
        if fn.returns is not None:
            outer.expr(fn.returns, annotation=True)

    # --- statements ------------------------------------------------------------------------------

    def stmt(self, node: ast.stmt) -> None:
        if isinstance(node, ast.With) and self.init and self.no_grad(node):
            for s in node.body:
                self.stmt(s)
            return
        if self.special(node):
            return
        if isinstance(node, ast.Assign):
            for t in node.targets:
                self.target(t)
            self.expr(node.value)
        elif isinstance(node, ast.AugAssign):
            self.target(node.target)
            self.expr(node.value)
        elif isinstance(node, ast.AnnAssign):
            self.target(node.target)
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.Expr | ast.Return):
            if node.value is not None:
                self.expr(node.value)
        elif isinstance(node, ast.If | ast.While):
            self.expr(node.test)
            for s in [*node.body, *node.orelse]:
                self.stmt(s)
        elif isinstance(node, ast.For):
            self.target(node.target)
            self.expr(node.iter)
            for s in [*node.body, *node.orelse]:
                self.stmt(s)
        elif isinstance(node, ast.Raise):
            self.raised(node)
        elif isinstance(node, ast.Assert):
            self.expr(node.test)
            if node.msg is not None:
                self.expr(node.msg)
        elif not isinstance(node, ast.Pass | ast.Break | ast.Continue):
            self.refuse(
                node, f"a {type(node).__name__} statement", "use assignments, if, for, while and return"
            )

    def no_grad(self, node: ast.With) -> bool:
        """`with torch.no_grad():` (the problem's constructor initialising its weights in place)."""
        return len(node.items) == 1 and (
            node.items[0].optional_vars is None
            and isinstance(call := node.items[0].context_expr, ast.Call)
            and not call.args
            and not call.keywords
            and self.m.path(call.func) == "torch.no_grad"
        )

    def raised(self, node: ast.Raise) -> None:
        exc = node.exc
        func = exc.func if isinstance(exc, ast.Call) else exc
        if exc is None or not (isinstance(func, ast.Name) and func.id in names.EXCEPTIONS) or node.cause:
            self.refuse(
                node,
                "raising anything but a builtin error",
                f"raise one of {', '.join(sorted(names.EXCEPTIONS))}",
            )
            return
        if isinstance(exc, ast.Call):
            for a in [*exc.args, *(k.value for k in exc.keywords)]:
                self.expr(a)

    def target(self, node: ast.expr) -> None:
        if isinstance(node, ast.Name):
            return
        if isinstance(node, ast.Tuple | ast.List):
            for e in node.elts:
                self.target(e)
        elif isinstance(node, ast.Starred):
            self.target(node.value)
        elif isinstance(node, ast.Attribute):
            if not (
                self.self_name is not None
                and isinstance(node.value, ast.Name)
                and node.value.id == self.self_name
                and not dunder(node.attr)
            ):
                self.refuse(
                    node,
                    f"assigning the attribute {ast.unparse(node)}",
                    "assign only self.<name> in ModelNew's methods; patch nothing else",
                )
        elif isinstance(node, ast.Subscript):
            root: ast.expr = node.value
            while isinstance(root, ast.Subscript):
                root = root.value
            if not (isinstance(root, ast.Name) and root.id in self.locals and root.id != self.self_name):
                self.refuse(
                    node,
                    f"assigning into {ast.unparse(node.value)}",
                    "assign into your own local lists, dicts and tensors only",
                )
            else:
                self.expr(node.slice)
        else:
            self.refuse(node, f"assigning to {ast.unparse(node)}", "assign to names")

    # --- expressions -----------------------------------------------------------------------------

    def expr(self, node: ast.expr, annotation: bool = False) -> None:
        if self.special(node):
            return
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bytes):
                self.refuse(node, "a bytes literal", "use numbers and strings")
        elif isinstance(node, ast.Name):
            self.name(node, annotation)
        elif isinstance(node, ast.Attribute):
            path = self.m.path(node)
            if annotation and path is not None and not any(dunder(p) for p in path.split(".")):
                return  # a type: `x: torch.Tensor`
            self.attribute(node, call=False)
        elif isinstance(node, ast.Call):
            self.call(node)
        elif isinstance(node, ast.Subscript):
            if self.launch_base(node.value):
                self.refuse(node, "a kernel indexed without a launch", "launch it: kernel[grid](args)")
                return
            self.expr(node.value, annotation)
            self.expr(node.slice, annotation)
        elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for g in node.generators:
                self.target(g.target)
                self.expr(g.iter)
                for cond in g.ifs:
                    self.expr(cond)
            for part in (node.key, node.value) if isinstance(node, ast.DictComp) else (node.elt,):
                self.expr(part)
        elif isinstance(node, ast.Dict):
            for k in node.keys:
                if k is not None:
                    self.expr(k)
            for v in node.values:
                self.expr(v)
        elif isinstance(
            node,
            ast.BinOp | ast.UnaryOp | ast.BoolOp | ast.Compare | ast.IfExp | ast.Tuple | ast.List | ast.Set
            | ast.Slice | ast.Starred | ast.JoinedStr | ast.FormattedValue,
        ):  # fmt: skip
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.expr):
                    self.expr(child, annotation)
        elif not isinstance(node, ast.expr_context | ast.operator | ast.cmpop | ast.unaryop | ast.boolop):
            self.refuse(node, f"a {type(node).__name__} expression", "use arithmetic, calls and displays")

    def name(self, node: ast.Name, annotation: bool = False) -> None:
        n = node.id
        if n in self.locals or n in self.m.constants:
            return
        if annotation and n in names.BUILTIN_TYPES:
            return
        if n in self.m.aliases:
            path = self.m.aliases[n]
            if path in names.TORCH_VALUES or path == "kernelbrain.candidate.INTERPRETED":
                return
            self.refuse(node, f"the module {path} as a value", f"use {n}.<name> of the subset directly")
        elif n in self.m.jit or n in self.m.helpers or n == "ModelNew":
            self.refuse(
                node, f"the function {n} as a value", "call it, or launch a kernel: kernel[grid](args)"
            )
        else:
            self.refuse(
                node,
                f"the name {n!r}",
                "use your locals, the module's constants and functions, and builtins (len, range, min, ...)",
            )

    def self_chain(self, node: ast.expr) -> bool:
        while isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        return isinstance(node, ast.Name) and node.id == self.self_name

    def attribute(self, node: ast.Attribute, call: bool) -> None:
        attr = node.attr
        path = self.m.path(node)
        if path is not None:
            if not self.allowed_path(path, call):
                what = f"calling {path}" if call else f"the value {path}"
                instead = (
                    "allocate, view and copy with torch.empty*/zeros*/ones*/full* and tensor methods; do "
                    "the compute in @triton.jit kernels"
                    if path.startswith("torch.")
                    else "use triton.cdiv, math, kernelbrain.candidate on the host, tl.* in kernels"
                )
                if (
                    path.startswith("torch.")
                    and not call
                    and path.split(".")[1] in {"ops", "library", "Tensor"}
                ):
                    instead = (
                        "torch.ops, torch.library and torch.Tensor's members are out of reach of candidates"
                    )
                self.refuse(node, what, instead)
            return
        if dunder(attr):
            self.refuse(
                node, f"the dunder attribute .{attr}", "read tensors' metadata through shape, stride(), dtype"
            )
            return
        direct = isinstance(node.value, ast.Name) and node.value.id == self.self_name
        if direct and call:
            ok = attr in self.methods - {"__init__"} or (self.init and attr in names.INIT_SELF_METHODS)
        elif direct:
            ok = attr not in self.methods and (attr in self.self_attrs or attr in names.MODULE_ATTRS)
        elif call:
            ok = (
                attr in METHODS
                or attr in self.m.torch_functions
                or (self.init and attr in names.INIT_TENSOR_METHODS)
            )
            if isinstance(node.value, ast.Name) and node.value.id in self.m.constants - self.locals:
                # the module's own objects stay as written: no growing, no writing in place
                ok = ok and attr not in names.MUTATORS and not attr.endswith("_")
        elif self.self_chain(node):
            ok = attr in names.MODULE_ATTRS | names.DATA_ATTRS
        else:
            ok = attr in names.DATA_ATTRS
        if not ok:
            kind = "calling the method" if call else "the attribute"
            self.refuse(
                node,
                f"{kind} .{attr}",
                "read shape, dtype, device, stride(), numel(); call views, copies and casts (contiguous, "
                "view, reshape, copy_, to); no .item(), .tolist(), .numpy(), .data_ptr()",
            )
        if not (isinstance(node.value, ast.Name) and node.value.id == self.self_name):
            self.expr(node.value)

    def allowed_path(self, path: str, call: bool) -> bool:
        head, _, last = path.rpartition(".")
        if dunder(last) or any(dunder(p) for p in path.split(".")):
            return False
        if path.startswith("math."):
            return True
        if path in names.CANDIDATE_API:
            return call or path.endswith(".INTERPRETED")
        if head == "triton.language" and (last in names.DTYPES | names.TL_DTYPES or last == "constexpr"):
            return not call or last == "constexpr"  # a kernel's dtype or constexpr argument: tl.float16
        if not call:
            return path in names.TORCH_VALUES
        if self.fn is None and path.startswith("torch."):  # at import: no tensor outlives a call
            return path in names.TORCH_MODULE_LEVEL
        if path in HOST_CALLS:
            return True
        if head in {"torch", "torch.nn.functional"} and last in self.m.torch_functions:
            return True
        parts = path.split(".")
        if parts[:3] == ["torch", "ops", "aten"] and len(parts) in (4, 5) and parts[3] in self.m.aten:
            return True  # torch.ops.aten.convolution.default, under --allow-torch conv
        if self.init:
            return bool(
                path in names.TORCH_INIT
                or path.startswith(names.INIT_PREFIXES)
                or (head == "torch.nn" and last[:1].isupper())  # module constructors: nn.Linear(...)
            )
        return False

    def launch_base(self, node: ast.expr) -> bool:
        return isinstance(node, ast.Name) and node.id in self.m.jit and node.id not in self.locals

    def call(self, node: ast.Call) -> None:
        func = node.func
        args = [*node.args, *(k.value for k in node.keywords)]
        if isinstance(func, ast.Name) and func.id not in self.locals and func.id not in self.m.constants:
            n = func.id
            if n == "isinstance" and len(node.args) == 2:
                self.expr(node.args[0])
                self.expr(node.args[1], annotation=True)
                return
            if n in self.m.aliases:
                path = self.m.aliases[n]
                if not self.allowed_path(path, call=True):
                    self.refuse(func, f"calling {path}", "stay within the subset's torch and triton calls")
            elif n in self.m.jit:
                self.refuse(func, f"calling the kernel {n} from host code", f"launch it: {n}[grid](args)")
            elif n == "ModelNew":
                self.refuse(
                    func, "building ModelNew inside the module", "build nothing at import or call time"
                )
            elif n not in self.m.helpers and n not in BUILTINS:
                self.refuse(
                    func,
                    f"calling {n}",
                    "call the module's helpers, ModelNew's methods and plain builtins (len, range, min, ...)",
                )
        elif isinstance(func, ast.Attribute):
            sup = func.value
            if (
                func.attr == "__init__"
                and self.init
                and isinstance(sup, ast.Call)
                and isinstance(sup.func, ast.Name)
                and sup.func.id == "super"
                and [ast.unparse(a) for a in sup.args] in ([], ["ModelNew", self.self_name])
            ):
                pass  # super().__init__(), super(ModelNew, self).__init__()
            else:
                self.attribute(func, call=True)
        elif isinstance(func, ast.Subscript) and self.launch_base(func.value):
            self.grid(func.slice)
        elif isinstance(func, ast.Name) and func.id in self.params and self.model is None:
            pass  # a helper handed to this helper by name: launch(x2, y2, ...)
        else:
            self.refuse(
                func, f"calling {ast.unparse(func)}", "call functions by their names: no computed callables"
            )
        api = isinstance(func, ast.Attribute) and self.m.path(func) in names.CANDIDATE_API
        helper = isinstance(func, ast.Name) and func.id in self.m.helpers and func.id not in self.locals
        for a in args:
            if api and isinstance(a, ast.Name) and self.launch_base(a):
                continue  # a kernel the API compiles
            if helper and isinstance(a, ast.Name) and a.id in self.m.helpers and a.id not in self.locals:
                continue  # a helper handed to a helper, which calls it
            self.expr(a)

    def grid(self, node: ast.expr) -> None:
        """A launch's grid: a tuple or list of numbers, written out or held in a local assigned only such."""
        if isinstance(node, ast.Tuple | ast.List):
            for e in node.elts:
                self.expr(e)
            return
        if isinstance(node, ast.Name) and node.id in self.locals:
            values = self.assigned.get(node.id, [None])
            if all(isinstance(v, ast.Tuple | ast.List) for v in values):
                return
        self.refuse(
            node,
            f"the launch grid {ast.unparse(node)}",
            "give the grid as a tuple of ints (written out, or a local assigned only tuples)",
        )
        if not isinstance(node, ast.Name):
            self.expr(node)


class Jit(Scope):
    """A @triton.jit body: tl.*, arithmetic, control flow, calls of the module's other kernels."""

    def __init__(self, module: ModuleCheck, fn: ast.FunctionDef) -> None:
        super().__init__(module, fn)
        self.constexprs = {
            a.arg
            for a in params_of(fn)
            if a.annotation is not None and module.path(a.annotation) == "triton.language.constexpr"
        }

    def run(self) -> None:
        assert self.fn is not None
        outer = Host(self.m, None)
        for d in [*self.fn.args.defaults, *(d for d in self.fn.args.kw_defaults if d is not None)]:
            outer.expr(d)
        for a in params_of(self.fn):
            if a.annotation is not None and self.m.path(a.annotation) is None:
                self.refuse(
                    a, f"the annotation of {a.arg}", "annotate kernel parameters with tl.constexpr only"
                )
        for stmt in self.fn.body:
            self.stmt(stmt)

    def stmt(self, node: ast.stmt) -> None:
        if self.special(node):
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                self.stmt(child)
            elif isinstance(child, ast.expr):
                if isinstance(child, ast.Attribute | ast.Subscript) and isinstance(child.ctx, ast.Store):
                    self.refuse(
                        child, "assigning into an attribute or element in a kernel", "assign to names"
                    )
                else:
                    self.expr(child)
        if not isinstance(
            node,
            ast.Assign | ast.AugAssign | ast.AnnAssign | ast.If | ast.For | ast.While | ast.Return | ast.Expr
            | ast.Pass | ast.Break | ast.Continue | ast.Assert,
        ):  # fmt: skip
            self.refuse(
                node,
                f"a {type(node).__name__} statement in a kernel",
                "use tl.*, arithmetic and control flow",
            )

    def expr(self, node: ast.expr) -> None:
        if self.special(node):
            return
        if isinstance(node, ast.Name):
            n = node.id
            if isinstance(node.ctx, ast.Store) or n in self.locals or n in self.m.constants:
                return
            if n not in self.m.jit:  # a kernel as a value: a combine function (tl.reduce(x, 0, _add))
                self.refuse(
                    node,
                    f"the name {n!r} in a kernel",
                    "use tl.*, your parameters and the module's constants",
                )
            return
        if isinstance(node, ast.Attribute):
            self.attribute(node, call=False)
            return
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id not in self.locals:
                if func.id not in self.m.jit and func.id not in names.JIT_BUILTINS:
                    self.refuse(
                        func,
                        f"calling {func.id} in a kernel",
                        "call tl.* and the module's @triton.jit functions",
                    )
            elif isinstance(func, ast.Attribute):
                self.attribute(func, call=True)
            else:
                self.refuse(
                    func, f"calling {ast.unparse(func)} in a kernel", "call tl.* and @triton.jit functions"
                )
            for a in [*node.args, *(k.value for k in node.keywords)]:
                self.expr(a)
            return
        if isinstance(
            node, ast.DictComp | ast.SetComp | ast.ListComp | ast.GeneratorExp | ast.Dict | ast.Set
        ):
            self.refuse(node, f"a {type(node).__name__} in a kernel", "use tl tensors")
            return
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self.expr(child)
            elif isinstance(child, ast.comprehension):
                self.refuse(node, "a comprehension in a kernel", "use tl tensors")

    def attribute(self, node: ast.Attribute, call: bool) -> None:
        path = self.m.path(node)
        if path is not None:
            if not path.startswith("triton.language.") or any(p.startswith("_") for p in path.split(".")):
                self.refuse(node, f"{path} in a kernel", "use tl.* (triton.language) in @triton.jit bodies")
            return
        base = node.value
        if isinstance(base, ast.Name) and base.id in self.constexprs and node.attr != "value":
            self.refuse(
                node, f"the attribute .{node.attr} of the constexpr {base.id}", "use constexprs as values"
            )
        elif node.attr not in TL_NAMES:
            self.refuse(
                node,
                f"the attribute .{node.attr} in a kernel",
                "use tl.* functions and .to(), .dtype, .shape",
            )
        self.expr(base)
