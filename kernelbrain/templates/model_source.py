"""What a template reads from the problem's source that the traced ops cannot show.

The trace records which torch calls ran and on what shapes, not which parameters Model holds or under
which names. A family whose ModelNew must hold Model's parameters (so the gate's state-dict copy makes
them identical) reproduces Model's constructor: its parameter list and body, copied from the source,
when they only use their own arguments, builtins and torch/nn (a standalone candidate module has
nothing else). Everything here reads the source as text (ast); nothing of the problem is executed.
"""

from __future__ import annotations

import ast
import builtins
from typing import NamedTuple

# the names a rendered candidate module binds, and the modules they must be bound to in the problem too
CANDIDATE_MODULES = {"torch": "torch", "nn": "torch.nn"}


class Constructor(NamedTuple):
    params: str  # Model.__init__'s parameters after self, annotations dropped: "normalized_shape, eps=1e-05"
    body: str  # its statements, docstring dropped, unindented; super(Model, self) made super()


class Forward(NamedTuple):
    params: list[str]  # after self
    call: ast.Call  # the call whose value forward returns
    aliases: dict[str, str]  # problem's import aliases: local name -> module path
    init: ast.FunctionDef | None


def _model(tree: ast.Module) -> ast.ClassDef | None:
    return next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    return next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name), None)


def model_method(source: str, name: str) -> ast.FunctionDef | None:
    """Model's method `name` as parsed from the source."""
    cls = _model(ast.parse(source))
    return _method(cls, name) if cls else None


def aliases(tree: ast.Module) -> dict[str, str]:
    """Module-level imports: the local name -> the dotted module or object path it binds."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.AST, names: dict[str, str]) -> str | None:
    """`F.layer_norm` -> "torch.nn.functional.layer_norm" under `import torch.nn.functional as F`."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([names.get(node.id, node.id), *reversed(parts)])


def free_names(nodes: list[ast.AST], bound: set[str]) -> set[str]:
    """Names read by `nodes` that neither they nor `bound` bind (builtins count as bound)."""
    stored, loaded = set(bound), set()
    for root in nodes:
        for n in ast.walk(root):
            if isinstance(n, ast.Name):
                (stored if isinstance(n.ctx, ast.Store | ast.Del) else loaded).add(n.id)
            elif isinstance(n, ast.arg):
                stored.add(n.arg)
            elif isinstance(n, ast.comprehension):
                stored |= {t.id for t in ast.walk(n.target) if isinstance(t, ast.Name)}
    return loaded - stored - set(dir(builtins))


def candidate_names(names: dict[str, str]) -> set[str]:
    """The module names an expression may use in a candidate: those the problem binds as it does."""
    return {n for n, mod in CANDIDATE_MODULES.items() if names.get(n) == mod}


class _PlainSuper(ast.NodeTransformer):
    """super(Model, self) -> super(): the candidate's class is ModelNew."""

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super" and node.args:
            return ast.Call(func=node.func, args=[], keywords=[])
        return node


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def constructor(source: str) -> Constructor | None:
    """Model.__init__ as a ModelNew can hold it, or None when it uses names a candidate lacks."""
    tree = ast.parse(source)
    cls = _model(tree)
    init = _method(cls, "__init__") if cls else None
    if init is None:
        return Constructor(params="", body="super().__init__()")
    fn = _PlainSuper().visit(ast.parse(ast.unparse(init)).body[0])
    assert isinstance(fn, ast.FunctionDef)
    for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs, fn.args.vararg, fn.args.kwarg]:
        if a is not None:
            a.annotation = None
    fn.returns = None
    body = _strip_docstring(fn.body) or [ast.Pass()]
    defaults = [d for d in [*fn.args.defaults, *fn.args.kw_defaults] if d is not None]
    if free_names([*defaults, *body], {"self", *_arg_names(fn)}) - candidate_names(aliases(tree)):
        return None
    params = ast.unparse(fn.args).split(",", 1)
    return Constructor(
        params=params[1].strip() if len(params) > 1 else "",
        body="\n".join(ast.unparse(s) for s in body),
    )


def _arg_names(fn: ast.FunctionDef) -> list[str]:
    a = fn.args
    names = [x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    return names + [x.arg for x in (a.vararg, a.kwarg) if x is not None]


def forward(source: str) -> Forward | None:
    """The call Model.forward returns: `return CALL`, or `y = CALL` then `return y`; else None."""
    tree = ast.parse(source)
    cls = _model(tree)
    fwd = _method(cls, "forward") if cls else None
    if fwd is None:
        return None
    body = _strip_docstring(fwd.body)
    call = None
    if (len(body) == 1 and isinstance(body[0], ast.Return)) or (
        len(body) == 2
        and isinstance(body[0], ast.Assign)
        and len(body[0].targets) == 1
        and isinstance(body[0].targets[0], ast.Name)
        and isinstance(body[1], ast.Return)
        and isinstance(body[1].value, ast.Name)
        and body[1].value.id == body[0].targets[0].id
    ):
        call = body[0].value
    if not isinstance(call, ast.Call):
        return None
    return Forward(
        params=_arg_names(fwd)[1:], call=call, aliases=aliases(tree), init=_method(cls, "__init__")
    )


def self_assignment(init: ast.FunctionDef | None, attr: str) -> ast.expr | None:
    """The value `self.<attr> = VALUE` assigns in __init__ (the only such assignment), else None."""
    if init is None:
        return None
    values = [
        n.value
        for n in ast.walk(init)
        if isinstance(n, ast.Assign)
        and any(
            isinstance(t, ast.Attribute)
            and t.attr == attr
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
            for t in n.targets
        )
    ]
    return values[0] if len(values) == 1 else None


def bind(call: ast.Call, names: list[str], defaults: dict[str, ast.expr]) -> dict[str, ast.expr] | None:
    """A call's arguments by parameter name (positional in `names` order, then keywords); None when it
    passes *args/**kwargs or a name twice."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(names):
        return None
    out = dict(zip(names, call.args, strict=False))
    for k in call.keywords:
        if k.arg in out or k.arg not in names:
            return None
        out[k.arg] = k.value
    return {**defaults, **out}


def init_args(signature: dict[str, list[str]], fallback: str) -> str:
    """`, <Model.__init__'s parameters>` for a rendered ModelNew: as the reference declares them
    (defaults, keyword-only, `*args`), where the analysis recorded them, so ModelNew builds from every
    call Model does (KernelBench's loader: `ModelNew(*get_init_inputs())`, defaults filling the rest);
    else the family's own `fallback` from the names alone (a run analysed before they were recorded)."""
    params = signature.get("params")
    return "".join(f", {p}" for p in params) if params else fallback


def with_constructor(spec: dict, problem_source: str | None) -> dict | None:
    """The spec with Model's constructor (its parameters and body, `init_params`, `init_body`), which
    ModelNew then runs so that its parameters are Model's; None where the source is absent or its
    constructor uses what a candidate lacks."""
    ctor = constructor(problem_source) if problem_source is not None else None
    if ctor is None:
        return None
    return {**spec, "init_params": ctor.params, "init_body": ctor.body}
