"""Turn an LLM's reply into a candidate module, deterministically, or say why it cannot be done.

Steps, each recorded when it changes something: pick the code block (the one defining ModelNew,
else the largest with an nn.Module class), trim prose a fence-less reply wraps its code in, rename
the model class to ModelNew, give ModelNew.__init__/forward the reference's parameter names, and
add the imports of torch, nn, triton and tl when they are used but never imported. Everything is
done on the text with positions from `ast`, so a repaired candidate keeps the reply's formatting.
"""

from __future__ import annotations

import ast
import re
import textwrap
from dataclasses import dataclass, field

TARGET = "ModelNew"

# name -> the import that binds it; only added when the name is used and bound nowhere
IMPORTS: dict[str, str] = {
    "torch": "import torch",
    "nn": "import torch.nn as nn",
    "F": "import torch.nn.functional as F",
    "triton": "import triton",
    "tl": "import triton.language as tl",
    "math": "import math",
}
PYTHON_LANGS = {"", "python", "py", "python3", "triton"}
_FENCE = re.compile(r"^[ \t]*(```|~~~)[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:^[ \t]*\1[ \t]*$|\Z)", re.M | re.S)
_CODE_START = re.compile(r"^(import |from \w[\w.]* import |@|class \w|def \w|[A-Za-z_]\w* *=[^=])")


@dataclass(frozen=True)
class RepairResult:
    """`source` with the `repairs` applied, or `source` None and `reason` saying why not."""

    source: str | None
    repairs: list[str] = field(default_factory=list)
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.source is not None


@dataclass(frozen=True)
class _Block:
    code: str
    lang: str
    index: int


def code_blocks(reply: str) -> list[tuple[str, str]]:
    """Fenced blocks of a reply as (language, code); an unterminated last fence runs to the end."""
    return [(m.group(2).lower(), m.group(3)) for m in _FENCE.finditer(reply)]


def _parses(code: str) -> ast.Module | None:
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError):
        return None


def _module_bases(node: ast.ClassDef) -> list[str]:
    return [ast.unparse(b) for b in node.bases]


def module_classes(tree: ast.Module) -> list[ast.ClassDef]:
    """Top-level classes deriving from nn.Module (directly or through another class of the file)."""
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    found: dict[str, ast.ClassDef] = {}
    changed = True
    while changed:
        changed = False
        for c in classes:
            if c.name in found:
                continue
            bases = _module_bases(c)
            if any(b in ("nn.Module", "torch.nn.Module", "Module") or b in found for b in bases):
                found[c.name] = c
                changed = True
    return [c for c in classes if c.name in found]


def _defines_target(tree: ast.Module) -> bool:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == TARGET:
            return True
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == TARGET for t in node.targets
        ):
            return True
    return False


def _jit_functions(tree: ast.Module) -> set[str]:
    out = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
                if name in ("jit", "autotune", "heuristics"):
                    out.add(node.name)
    return out


def _pick(blocks: list[_Block]) -> tuple[_Block | None, list[_Block]]:
    """The block to use and the other parseable blocks; None when no block parses with a Module class."""
    parsed = [(b, t) for b in blocks if (t := _parses(b.code)) is not None]
    with_target = [(b, t) for b, t in parsed if _defines_target(t)]
    if with_target:
        best = max(with_target, key=lambda bt: (len(bt[0].code), -bt[0].index))[0]
    else:
        with_module = [(b, t) for b, t in parsed if module_classes(t)]
        if not with_module:
            return None, []
        best = max(with_module, key=lambda bt: (len(bt[0].code), -bt[0].index))[0]
    return best, [b for b, _ in parsed if b is not best]


def _trim_prose(text: str) -> str | None:
    """A fence-less reply: the longest run of lines from a code-looking line that parses."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _CODE_START.match(line)]
    for start in starts:
        for end in range(len(lines), start, -1):
            chunk = "\n".join(lines[start:end]).strip("\n") + "\n"
            tree = _parses(chunk)
            if tree is not None and module_classes(tree):
                return chunk
    return None


def extract(reply: str) -> tuple[str | None, list[str], str | None]:
    """(code, repairs, reason): the reply's candidate code before any rewriting."""
    repairs: list[str] = []
    fenced = code_blocks(reply)
    if fenced:
        blocks = [_Block(textwrap.dedent(code), lang, i) for i, (lang, code) in enumerate(fenced)]
        python = [b for b in blocks if b.lang in PYTHON_LANGS] or blocks
        best, others = _pick(python)
        if best is None:
            # a block that does not parse: report its syntax error rather than "no class"
            for b in sorted(python, key=lambda b: -len(b.code)):
                if "class " in b.code:
                    return b.code, repairs, None
            return None, repairs, "no code block defines an nn.Module class"
        code = best.code
        if len(fenced) > 1:
            repairs.append(f"picked code block {best.index + 1} of {len(fenced)}")
        tree = ast.parse(code)
        if not _jit_functions(tree):
            # the kernels sometimes come in a block of their own, before the module
            kernel_blocks = [b for b in others if _jit_functions(ast.parse(b.code))]
            if kernel_blocks:
                code = "\n\n\n".join([*(b.code.rstrip("\n") for b in kernel_blocks), code])
                repairs.append(f"joined the @triton.jit kernels of {len(kernel_blocks)} other block(s)")
        return code, repairs, None
    text = reply.strip("\n")
    if not text.strip():
        return None, repairs, "the reply is empty"
    tree = _parses(text + "\n")
    if tree is not None and module_classes(tree):
        repairs.append("took the fence-less reply as code")
        return text + "\n", repairs, None
    trimmed = _trim_prose(text)
    if trimmed is not None:
        repairs.append("took the code out of the prose around it (no code fence)")
        return trimmed, repairs, None
    if re.search(r"^\s*class \w+", text, re.M):
        return textwrap.dedent(text) + "\n", repairs, None  # code with a syntax error: reported below
    return None, repairs, "the reply contains no code (no code block and no class definition)"


# --- rewriting by position -----------------------------------------------------------------------


def _edit(source: str, edits: list[tuple[int, int, int, str]]) -> str:
    """Apply (line, byte start, byte end, text) edits; lines 1-based, columns in UTF-8 bytes."""
    lines = source.splitlines(keepends=True)
    for lineno, start, end, text in sorted(set(edits), key=lambda e: (e[0], e[1]), reverse=True):
        raw = lines[lineno - 1].encode()
        lines[lineno - 1] = (raw[:start] + text.encode() + raw[end:]).decode()
    return "".join(lines)


def _rename_class(source: str, tree: ast.Module, old: str, new: str) -> str:
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == old:
            line = source.splitlines()[node.lineno - 1].encode()
            m = re.compile(rb"class\s+(" + re.escape(old.encode()) + rb")\b").search(line, node.col_offset)
            if m:
                edits.append((node.lineno, m.start(1), m.end(1), new))
        elif isinstance(node, ast.Name) and node.id == old:
            edits.append((node.lineno, node.col_offset, node.end_col_offset, new))
    return _edit(source, edits)


def _choose_model_class(tree: ast.Module, forward_params: list[str] | None) -> ast.ClassDef:
    """Among several nn.Module classes: one launching a kernel, the forward arity, then the last one."""
    classes = module_classes(tree)
    jit = _jit_functions(tree)
    used_as_part = {n.id for c in classes for n in ast.walk(c) if isinstance(n, ast.Name) and n.id != c.name}

    def score(c: ast.ClassDef) -> tuple[int, int, int, int]:
        launches = any(isinstance(n, ast.Name) and n.id in jit for n in ast.walk(c))
        fwd = _method(c, "forward")
        arity = fwd is not None and forward_params is not None and len(_params(fwd)) == len(forward_params)
        return (int(launches), int(c.name not in used_as_part), int(arity), c.lineno)

    return max(classes, key=score)


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _params(fn: ast.FunctionDef) -> list[ast.arg]:
    a = fn.args
    out = [*a.posonlyargs, *a.args]
    out = out[1:]  # self
    if a.vararg:
        out.append(a.vararg)
    out += a.kwonlyargs
    if a.kwarg:
        out.append(a.kwarg)
    return out


def _rename_params(source: str, fn: ast.FunctionDef, want: list[str]) -> tuple[str, list[str]]:
    """Rename fn's parameters to `want` when only the names differ; (source, notes)."""
    got = _params(fn)
    names = [p.arg for p in got]
    if names == want or len(names) != len(want):
        return source, []
    if fn.args.vararg or fn.args.kwarg or fn.args.kwonlyargs:
        return source, []
    mapping = {old: new for old, new in zip(names, want, strict=True) if old != new}
    body_names = {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}
    clash = [new for new in mapping.values() if new in body_names and new not in mapping]
    if clash:
        return source, [f"left {fn.name}({', '.join(names)}) alone: {', '.join(clash)} is already a local"]
    edits = [
        (p.lineno, p.col_offset, p.col_offset + len(p.arg.encode()), mapping[p.arg])
        for p in got
        if p.arg in mapping
    ]
    for n in ast.walk(fn):
        if isinstance(n, ast.Name) and n.id in mapping:
            edits.append((n.lineno, n.col_offset, n.end_col_offset, mapping[n.id]))
    note = f"renamed the parameters of ModelNew.{fn.name}({', '.join(names)}) to ({', '.join(want)})"
    return _edit(source, edits), [note]


def _add_init(source: str, cls: ast.ClassDef, params: list[str]) -> str:
    """Give a class without __init__ one with the reference's parameters (nn.Module's takes *args)."""
    first = cls.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and len(cls.body) > 1:
        first = cls.body[1]  # after the docstring
    lines = source.splitlines(keepends=True)
    indent = re.match(r"[ \t]*", lines[first.lineno - 1]).group(0)
    line = first.lineno if not first.decorator_list else first.decorator_list[0].lineno  # type: ignore[union-attr]
    args = ", ".join(["self", *params])
    block = f"{indent}def __init__({args}):\n{indent}    super().__init__()\n\n"
    lines.insert(line - 1, block)
    return "".join(lines)


def _bound_names(tree: ast.Module) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            for a in node.names:
                out.add((a.asname or a.name).split(".")[0])
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            out.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            out.add(node.id)
        elif isinstance(node, ast.arg):
            out.add(node.arg)
    return out


def _add_imports(source: str, tree: ast.Module) -> tuple[str, list[str]]:
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    missing = [name for name in IMPORTS if name in used and name not in _bound_names(tree)]
    if not missing:
        return source, []
    # after a module docstring and any `from __future__` import
    after = 0
    for node in tree.body:
        docstring = isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and after == 0
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        if (docstring and node is tree.body[0]) or future:
            after = node.end_lineno or after
        else:
            break
    lines = source.splitlines(keepends=True)
    lines.insert(after, "".join(IMPORTS[n] + "\n" for n in missing))
    return "".join(lines), [f"added {IMPORTS[n]}" for n in missing]


def repair(
    reply: str, init_params: list[str] | None = None, forward_params: list[str] | None = None
) -> RepairResult:
    """The candidate in an LLM reply, repaired; or the reason it has none.

    `init_params`/`forward_params` are the reference Model's parameter names without self
    (ProblemAnalysed.signature["init"] and ["forward"]); None skips the signature repairs.
    """
    code, repairs, reason = extract(reply)
    if code is None:
        return RepairResult(None, repairs, reason)
    try:
        tree = ast.parse(code)
    except SyntaxError as e:
        return RepairResult(None, repairs, f"the code has a syntax error at line {e.lineno}: {e.msg}")
    classes = module_classes(tree)
    if not _defines_target(tree):
        if not classes:
            return RepairResult(None, repairs, "the code defines no nn.Module class")
        cls = _choose_model_class(tree, forward_params)
        if any(isinstance(n, ast.Name) and n.id == TARGET for n in ast.walk(tree)):
            return RepairResult(None, repairs, f"the code uses the name {TARGET} without defining it")
        code = _rename_class(code, tree, cls.name, TARGET)
        repairs.append(f"renamed class {cls.name} to {TARGET}")
        tree = ast.parse(code)
    target = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == TARGET), None)
    if target is not None:
        if init_params is not None:
            init = _method(target, "__init__")
            if init is None:
                code = _add_init(code, target, init_params)
                repairs.append(f"added ModelNew.__init__({', '.join(['self', *init_params])})")
                tree = ast.parse(code)
                target = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == TARGET)
            else:
                code, notes = _rename_params(code, init, init_params)
                repairs += notes
                tree = ast.parse(code)
                target = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == TARGET)
        if forward_params is not None:
            fwd = _method(target, "forward")
            if fwd is not None:
                code, notes = _rename_params(code, fwd, forward_params)
                repairs += notes
                tree = ast.parse(code)
    code, notes = _add_imports(code, tree)
    repairs += notes
    try:
        ast.parse(code)
    except SyntaxError as e:  # a repair must never break the code; say so rather than hide it
        return RepairResult(None, repairs, f"repair produced a syntax error at line {e.lineno}: {e.msg}")
    return RepairResult(code, repairs, None)
