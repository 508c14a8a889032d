"""Rendering a composed tail (compose/tail.py): its kernels, launchers and chains as module text with
every top-level name suffixed, and the lines of forward that launch them, per family."""

from __future__ import annotations

import ast
from typing import Any

from kernelbrain.templates.base import Refusal
from kernelbrain.templates.families import moments, pointwise, pool, reduce, row_norm
from kernelbrain.templates.render import chain, parts, renamed

SUFFIX = "_tail"
VALUE = "value"  # a source ["value", k]: the k-th value of the tail's chain of launches (0: h)
_POINTWISE_LAUNCH = (
    "_load",
    "_flat_tile",
    "_flat_kernel",
    "_flat_persistent_kernel",
    "_strided_offset",
    "_strided_kernel",
    "MAX_DIMS",
    "_collapsed",
    "_launch",
)
_MOMENTS_PARTS = ("_moments_kernel", "_moments_finish", "_moments_map", "_moments_launch")
_POOL_PARTS = ("_pool_kernel", "_out_size", "_pool_launch")


class NotTail(Refusal):
    """What the tail holds that no memory-bound family composes (named in the refusal)."""


def _conv() -> Any:
    """The conv family (it builds on compose/tail, so it is imported where used)."""
    from kernelbrain.templates.families import conv

    return conv


def _helpers(*specs: dict) -> str:
    used = [h for h in pointwise.HELPERS if any(h in s["helpers"] for s in specs)]
    return parts(pointwise.PARTS, *used) if used else ""


def _chains(spec: dict) -> str:
    return (
        chain("_prologue", spec["prologue"], spec["prologue_result"])
        + "\n\n"
        + chain("_epilogue", spec["epilogue"], spec["epilogue_result"])
    )


def _top_names(text: str) -> list[str]:
    out = []
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef):
            out.append(node.name)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out.append(node.targets[0].id)
    return out


def render_parts(tail: dict, suffix: str = SUFFIX) -> str:
    """The tail's kernels, launchers and chains, every top-level name suffixed."""
    family, spec = tail["family"], tail["spec"]
    sections: list[str] = []
    if family == "reduce":
        sections = [_helpers(spec), _chains(spec), reduce.shared_parts()]
        sections.append(parts(reduce.PARTS, "_reduce_kernel", "_reduce_launch"))
    elif family == "normalize":
        stat, mapped = spec["stat"], spec["map"]
        sections = [_helpers(stat, mapped), _chains(stat), chain("_body", mapped["body"], mapped["result"])]
        sections.append(
            reduce.shared_parts() + "\n\n" + parts(reduce.PARTS, "_reduce_kernel", "_reduce_launch")
        )
        sections.append(parts(pointwise.PARTS, *_POINTWISE_LAUNCH))
    elif family == "staged":
        sections = [_helpers(*spec["stages"]), reduce.shared_parts()]
        for k, stage in enumerate(spec["stages"]):
            text = _chains(stage) + "\n\n" + parts(reduce.PARTS, "_reduce_kernel", "_reduce_launch")
            names = ("_prologue", "_epilogue", "_reduce_kernel", "_reduce_launch")
            sections.append(renamed(text, f"_{k}", names))
    elif family == "moments":
        sections = [parts(moments.PARTS, *_MOMENTS_PARTS)]
    elif family == "layernorm":
        sections = [row_norm.kernels(tail["knobs"], "_layer_norm")]
    elif family == "conv":
        sections = [_conv().stage_parts(spec)]
    elif family == "pool":
        sections = [
            _helpers(spec),
            chain("_prologue", spec["prologue"], spec["prologue_result"], "v0"),
            chain("_epilogue", spec["epilogue"], spec["epilogue_result"], "v0"),
            parts(pool.PARTS, *_POOL_PARTS),
        ]
    elif family == "pointwise":
        sections = [_helpers(spec), chain("_body", spec["body"], spec["result"])]
        sections.append(parts(pointwise.PARTS, *_POINTWISE_LAUNCH))
    else:
        raise NotTail(f"a tail of family {family}")
    text = "\n\n".join(s.strip("\n") for s in sections if s.strip()) + "\n"
    text = renamed(text, suffix, _top_names(text))
    return text if tail["then"] is None else text + "\n\n" + render_parts(tail["then"], suffix + "2")


def _reduce_call(spec: dict, args: list[str], out: str, suffix: str, knobs: dict, launch: str = "") -> str:
    xs = ", ".join(args[i] for i in spec["inputs"])
    dtype = f"torch.{spec['dtype']}" if spec["dtype"] else f"{args[0]}.dtype"
    divisor = "0"
    if spec.get("divide_by"):
        index, start, end = spec["divide_by"]
        divisor = f"_prod{suffix}({args[index]}.shape[{start}:{end}])"
    how = [
        repr(spec["dims"]),
        repr(spec["keepdim"]),
        dtype,
        str(spec["op"]),
        str(spec["pre"]),
        str(spec["post"]),
    ]
    how += [str(knobs[k]) for k in ("block_k", "block_r", "split", "num_warps")]
    return f"        {out} = _reduce_launch{launch}{suffix}([{xs}], {', '.join(how)}, {divisor})\n"


def call(tail: dict, args: list[str], out: str, suffix: str = SUFFIX) -> str:
    """Lines of forward (indented for a method) setting `out` to the tail of `args`: args[0] the head's
    value, args[i] the expression of the tail's input i (its sources, in order; `tensor` names each
    source as forward reads it). Each launch of the chain but the last sets its own name, so that a
    later one may read it again."""
    names = {repr(s): a for s, a in zip(tail["sources"], args[1:], strict=True)}
    names[repr([VALUE, 0])] = args[0]
    lines, k, at = "", 0, tail
    while at is not None:
        target = out if at["then"] is None else f"kb_v{k + 1}{suffix}"
        here = [names[repr([VALUE, k])], *(names[repr(s)] for s in at["sources"])]
        lines += _call(at, here, target, suffix + "2" * k)
        names[repr([VALUE, k + 1])] = target
        at, k = at["then"], k + 1
    return lines


def _call(tail: dict, args: list[str], out: str, suffix: str) -> str:
    family, spec, knobs = tail["family"], tail["spec"], tail["knobs"]
    if family == "reduce":
        return _reduce_call(spec, args, out, suffix, knobs)
    if family == "staged":
        n = spec["n_forward"]
        names = args[:n] + [f"kb_t{k}" for k in range(len(spec["stages"]))]
        lines = [
            _reduce_call(
                stage, names, out if k == len(spec["stages"]) - 1 else f"kb_t{k}", suffix, knobs, f"_{k}"
            )
            for k, stage in enumerate(spec["stages"])
        ]
        return "".join(lines)
    if family == "moments":
        return _moments_call(spec, args, out, suffix, knobs)
    if family == "pool":
        return _pool_call(spec, args, out, suffix, knobs)
    if family == "layernorm":
        return _layernorm_call(spec, args, out, suffix, knobs)
    if family == "conv":
        return _conv().stage_call(spec, knobs, args, out, suffix)
    if family == "pointwise":
        return _pointwise_call(spec, args, out, suffix, knobs)
    stat, mapped = spec["stat"], spec["map"]
    stat_xs = ", ".join(args[i] for i in stat["inputs"])
    map_xs = ", ".join(args[i] if i < spec["n_forward"] else "kb_stat" for i in mapped["inputs"])
    how = [repr(stat["dims"]), repr(bool(stat["dims"])), "torch.float32"]
    how += [str(stat[k]) for k in ("op", "pre", "post")]
    how += [str(knobs[k]) for k in ("block_k", "block_r", "split", "num_warps")]
    slot = mapped["stat_slot"]
    dtype = f"torch.{mapped['dtype']}" if mapped["dtype"] is not None else "None"
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


def _state(name: str | None, buffer: bool) -> str:
    """The expression reading a parameter or buffer of the one ModelNew by its state-dict name."""
    if name is None:
        return "None"
    return f"self.get_buffer({name!r})" if buffer else f"self.get_parameter({name!r})"


def _moments_call(spec: dict, args: list[str], out: str, suffix: str, knobs: dict) -> str:
    running = spec["running"] or [None, None]
    tensors = [_state(spec["weight"], False), _state(spec["bias"], False)]
    tensors += [_state(running[0], True), _state(running[1], True), _state(spec["count"], True)]
    how = [repr(spec["mode"]), str(spec["group"]), *tensors, repr(spec["eps"]), repr(spec["momentum"])]
    how += [str(knobs[k]) for k in ("block", "split", "num_warps")]
    x = args[spec["input"]] + spec.get("pre", "")
    return f"        {out} = _moments_launch{suffix}({x}, {', '.join(how)}){spec.get('post', '')}\n"


def _layernorm_call(spec: dict, args: list[str], out: str, suffix: str, knobs: dict) -> str:
    x, k = args[spec["input"]], spec["norm_dims"]
    weight, bias = (args[spec[key]] if spec[key] is not None else "None" for key in ("weight", "bias"))
    launch = f"{row_norm.launcher(knobs)}{suffix}"
    constants = ", ".join(f"{name}{suffix}" for name in row_norm.knob_args(knobs).split(", "))
    how = f"{weight}, {bias}, {spec['eps']!r}, {launch}, ({constants},)"
    return f"        {out} = _layer_norm{suffix}({x}, {x}.shape[{x}.dim() - {k} :], {how})\n"


def _pool_call(spec: dict, args: list[str], out: str, suffix: str, knobs: dict) -> str:
    x = args[spec["inputs"][0]]
    dtype = f"torch.{spec['dtype']}" if spec["dtype"] else f"{x}.dtype"
    keys = ("pre", "post", "spatial", "kernel", "stride", "padding", "dilation", "ceil", "max", "count_pad")
    how = [repr(spec[k]) for k in (*keys, "divisor")] + [dtype, str(knobs["block"]), str(knobs["num_warps"])]
    return f"        {out} = _pool_launch{suffix}({x}, {', '.join(how)})\n"


def _pointwise_call(spec: dict, args: list[str], out: str, suffix: str, knobs: dict) -> str:
    views = spec.get("views") or [""] * len(spec["inputs"])
    xs = ", ".join(args[i] + view for i, view in zip(spec["inputs"], views, strict=True))
    dtype = f"torch.{spec['dtype']}" if spec["dtype"] is not None else "None"
    ctas = knobs.get("ctas_per_sm", 0) if knobs["strategy"] == "persistent" else 0
    return (
        f"        kb_xs = [{xs}]\n"
        "        kb_same = all(x.dtype == kb_xs[0].dtype for x in kb_xs)\n"
        f"        kb_dtype = {dtype} or (kb_xs[0].dtype if kb_same else torch.float32)\n"
        "        kb_shape = torch.broadcast_shapes(*(x.shape for x in kb_xs))\n"
        "        kb_y = torch.empty(kb_shape, dtype=kb_dtype, device=kb_xs[0].device)\n"
        f"        {out} = _launch{suffix}(kb_y, kb_xs, {knobs['block']}, {knobs['num_warps']}, {ctas})\n"
    )
