"""Rendering composed stages (compose/stages.py): their kernels, launchers and chains as module text with
every top-level name suffixed (so that they sit beside the head's in one module), and the lines of
forward that launch them, each launch of a chain reading the values before it by name (`links`)."""

from __future__ import annotations

import ast
import functools
from typing import Any

from kernelbrain.templates.compose.cut import NotTail
from kernelbrain.templates.compose.stages import VALUE
from kernelbrain.templates.families import conv, moments, pointwise, pool, reduce, row_norm, staged
from kernelbrain.templates.render import chain, dtype_of, parts_of, renamed

SUFFIX = "_tail"  # the suffix of a tail's parts
PRE = "_pre"  # the suffix of a prelude's parts
PRELUDE = "kb_x"  # what forward names the prelude's value
HEAD = "kb_h"  # what forward names the head's value (and the tail's, which it returns)
_POINTWISE_LAUNCH = ("_load", "_flat_tile", "_flat_kernel", "_flat_persistent_kernel", "_strided_offset")
_POINTWISE_LAUNCH += ("_strided_kernel", "MAX_DIMS", "_collapsed", "_launch")
_POOL_PARTS = ("_pool_kernel", "_out_size", "_pool_launch")


def reading(forward: list[str], before: dict[str, Any] | None) -> list[str]:
    """The names of the tensors a head with a prelude (or None) reads by input index: forward's, and the
    prelude's value at its index."""
    if before is None:
        return forward
    names = [*forward, *[""] * (before["at"] + 1 - len(forward))]
    names[before["at"]] = PRELUDE
    return names


def _chains(spec: dict[str, Any]) -> str:
    return (
        chain("_prologue", spec["prologue"], spec["prologue_result"])
        + "\n\n"
        + chain("_epilogue", spec["epilogue"], spec["epilogue_result"])
    )


@functools.lru_cache(maxsize=1024)
def _top_names(text: str) -> tuple[str, ...]:
    """The functions and constants a stage's parts define (kept: a search renders the same parts text
    for every knob set of a stage, and parsing it was most of a render's time)."""
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            out.append(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out.append(node.targets[0].id)
    return tuple(out)


def _sections(stage: dict[str, Any]) -> list[str]:
    """One launch's kernels, launchers and chains, as its family renders them for a stage."""
    family, spec = stage["family"], stage["spec"]
    reduction = parts_of(reduce.PARTS, "_reduce_kernel", "_reduce_launch")
    if family == "reduce":
        return [pointwise.helper_parts(spec), _chains(spec), reduce.shared_parts(), reduction]
    if family == "normalize":
        stat, mapped = spec["stat"], spec["map"]
        return [
            pointwise.helper_parts(stat, mapped),
            _chains(stat),
            chain("_body", mapped["body"], mapped["result"]),
            reduce.shared_parts() + "\n\n" + reduction,
            parts_of(pointwise.PARTS, *_POINTWISE_LAUNCH),
        ]
    if family == "staged":
        return [pointwise.helper_parts(*spec["stages"]), reduce.shared_parts(), *staged.stage_parts(spec)]
    if family == "moments":
        return [parts_of(moments.PARTS, *moments.PART_NAMES)]
    if family == "layernorm":
        return [row_norm.kernels(stage["knobs"], "_layer_norm")]
    if family == "conv":
        return [conv.stage_parts(spec)]
    if family == "pool":
        return [
            pointwise.helper_parts(spec),
            chain("_prologue", spec["prologue"], spec["prologue_result"], "v0"),
            chain("_epilogue", spec["epilogue"], spec["epilogue_result"], "v0"),
            parts_of(pool.PARTS, *_POOL_PARTS),
        ]
    if family == "pointwise":
        body = chain("_body", spec["body"], spec["result"])
        return [pointwise.helper_parts(spec), body, parts_of(pointwise.PARTS, *_POINTWISE_LAUNCH)]
    raise NotTail(f"a tail of family {family}")


def render_parts(stage: dict[str, Any], suffix: str = SUFFIX) -> str:
    """The stage's kernels, launchers and chains, every top-level name suffixed (each later launch of its
    chain with one more "2")."""
    text = "\n\n".join(s.strip("\n") for s in _sections(stage) if s.strip()) + "\n"
    text = renamed(text, suffix, _top_names(text))
    return text if stage["then"] is None else text + "\n\n" + render_parts(stage["then"], suffix + "2")


def links(
    stage: dict[str, Any], args: list[str], out: str, suffix: str = SUFFIX
) -> list[tuple[dict[str, Any], list[str], str, str]]:
    """The launches of a stage's chain in order, each (its link of the chain, the names of what it reads:
    the value before it, then its sources; the name it sets, its parts' suffix): `args[0]` names the
    stage's value 0 (h, or the prelude's input), args[i] its source i. Each launch but the last sets a
    name of its own, so that a later one may read it again; the last sets `out`."""
    names = {repr(s): a for s, a in zip(stage["sources"], args[1:], strict=True)}
    names[repr([VALUE, 0])] = args[0]
    out_links, k, at = [], 0, stage
    while at is not None:
        target = out if at["then"] is None else f"kb_v{k + 1}{suffix}"
        here = [names[repr([VALUE, k])], *(names[repr(s)] for s in at["sources"])]
        out_links.append((at, here, target, suffix + "2" * k))
        names[repr([VALUE, k + 1])] = target
        at, k = at["then"], k + 1
    return out_links


def call(stage: dict[str, Any], args: list[str], out: str, suffix: str = SUFFIX) -> str:
    """Lines of forward (indented for a method) setting `out` to the stage of `args` (as `links` reads
    them: args[0] the value it starts from, args[i] the expression of its source i)."""
    return "".join(_call(at, here, target, sfx) for at, here, target, sfx in links(stage, args, out, suffix))


def _reduce_call(
    spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any], launch: str = ""
) -> str:
    xs = ", ".join(args[i] for i in spec["inputs"])
    dtype = dtype_of(spec["dtype"], f"{args[0]}.dtype")
    divisor = "0"
    if spec.get("divide_by"):
        index, start, end = spec["divide_by"]
        divisor = f"_prod{suffix}({args[index]}.shape[{start}:{end}])"
    how = [repr(spec["dims"]), repr(spec["keepdim"]), dtype, *(str(spec[k]) for k in ("op", "pre", "post"))]
    how += [str(knobs[k]) for k in ("block_k", "block_r", "split", "num_warps")]
    return f"        {out} = _reduce_launch{launch}{suffix}([{xs}], {', '.join(how)}, {divisor})\n"


def _call(stage: dict[str, Any], args: list[str], out: str, suffix: str) -> str:
    family, spec, knobs = stage["family"], stage["spec"], stage["knobs"]
    if family == "reduce":
        return _reduce_call(spec, args, out, suffix, knobs)
    if family == "staged":
        n, last = spec["n_forward"], len(spec["stages"]) - 1
        names = args[:n] + [f"kb_t{k}" for k in range(len(spec["stages"]))]
        return "".join(
            _reduce_call(s, names, out if k == last else f"kb_t{k}", suffix, knobs, f"_{k}")
            for k, s in enumerate(spec["stages"])
        )
    if family == "moments":
        return _moments_call(spec, args, out, suffix, knobs)
    if family == "pool":
        return _pool_call(spec, args, out, suffix, knobs)
    if family == "layernorm":
        return _layernorm_call(spec, args, out, suffix, knobs)
    if family == "conv":
        return conv.stage_call(spec, knobs, args, out, suffix)
    if family == "pointwise":
        return _pointwise_call(spec, args, out, suffix, knobs)
    return _normalize_call(spec, args, out, suffix, knobs)


def _normalize_call(
    spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any]
) -> str:
    stat, mapped = spec["stat"], spec["map"]
    stat_xs = ", ".join(args[i] for i in stat["inputs"])
    map_xs = ", ".join(args[i] if i < spec["n_forward"] else "kb_stat" for i in mapped["inputs"])
    how = [repr(stat["dims"]), repr(bool(stat["dims"])), "torch.float32"]
    how += [str(stat[k]) for k in ("op", "pre", "post")]
    how += [str(knobs[k]) for k in ("block_k", "block_r", "split", "num_warps")]
    slot = mapped["stat_slot"]
    dtype = dtype_of(mapped["dtype"], "None")
    return (
        f"        kb_stat = _reduce_launch{suffix}([{stat_xs}], {', '.join(how)})\n"
        f"        kb_xs = [{map_xs}]\n"
        f"        kb_given = [x for i, x in enumerate(kb_xs) if i != {slot}]\n"
        "        kb_same = all(x.dtype == kb_given[0].dtype for x in kb_given)\n"
        f"        kb_dtype = {dtype} or (kb_given[0].dtype if kb_same else torch.float32)\n"
        "        kb_shape = torch.broadcast_shapes(*(x.shape for x in kb_xs))\n"
        "        kb_y = torch.empty(kb_shape, dtype=kb_dtype, device=kb_xs[0].device)\n"
        f"        {out} = _launch{suffix}(kb_y, kb_xs, {knobs['block']}, {knobs['num_warps']}, 0)\n"
    )


def _moments_call(spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any]) -> str:
    running = spec["running"] or [None, None]
    tensors = [moments.state(spec["weight"], False), moments.state(spec["bias"], False)]
    tensors += [moments.state(running[0], True), moments.state(running[1], True)]
    tensors.append(moments.state(spec["count"], True))
    how = [repr(spec["mode"]), str(spec["group"]), *tensors, repr(spec["eps"]), repr(spec["momentum"])]
    how += [str(knobs[k]) for k in ("block", "split", "num_warps")]
    x = args[spec["input"]] + spec.get("pre", "")
    return f"        {out} = _moments_launch{suffix}({x}, {', '.join(how)}){spec.get('post', '')}\n"


def _layernorm_call(
    spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any]
) -> str:
    x, k = args[spec["input"]], spec["norm_dims"]
    weight, bias = (args[spec[key]] if spec[key] is not None else "None" for key in ("weight", "bias"))
    launch = f"{row_norm.launcher(knobs)}{suffix}"
    constants = ", ".join(f"{name}{suffix}" for name in row_norm.knob_args(knobs).split(", "))
    how = f"{weight}, {bias}, {spec['eps']!r}, {launch}, ({constants},)"
    return f"        {out} = _layer_norm{suffix}({x}, {x}.shape[{x}.dim() - {k} :], {how})\n"


def _pool_call(spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any]) -> str:
    x = args[spec["inputs"][0]]
    dtype = dtype_of(spec["dtype"], f"{x}.dtype")
    keys = ("pre", "post", "spatial", "kernel", "stride", "padding", "dilation", "ceil", "max", "count_pad")
    how = [repr(spec[k]) for k in (*keys, "divisor")] + [dtype, str(knobs["block"]), str(knobs["num_warps"])]
    return f"        {out} = _pool_launch{suffix}({x}, {', '.join(how)})\n"


def _pointwise_call(
    spec: dict[str, Any], args: list[str], out: str, suffix: str, knobs: dict[str, Any]
) -> str:
    views = spec.get("views") or [""] * len(spec["inputs"])
    xs = ", ".join(args[i] + view for i, view in zip(spec["inputs"], views, strict=True))
    dtype = dtype_of(spec["dtype"], "None")
    ctas = knobs.get("ctas_per_sm", 0) if knobs["strategy"] == "persistent" else 0
    return (
        f"        kb_xs = [{xs}]\n"
        "        kb_same = all(x.dtype == kb_xs[0].dtype for x in kb_xs)\n"
        f"        kb_dtype = {dtype} or (kb_xs[0].dtype if kb_same else torch.float32)\n"
        "        kb_shape = torch.broadcast_shapes(*(x.shape for x in kb_xs))\n"
        "        kb_y = torch.empty(kb_shape, dtype=kb_dtype, device=kb_xs[0].device)\n"
        f"        {out} = _launch{suffix}(kb_y, kb_xs, {knobs['block']}, {knobs['num_warps']}, {ctas})\n"
    )
