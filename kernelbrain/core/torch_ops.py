"""The classes of torch ops a user may let a candidate keep in PyTorch (`kb run --allow-torch conv,matmul`),
in one place: the generator cuts the traced graph at them, the gate admits exactly them.

By default a candidate's compute is all Triton. A class names the ATen ops (overload packets, as the
dispatcher and the traced graph name them: `aten.convolution.default` is `convolution`) and the Python
functions that reach them (`F.conv2d` is `conv2d` to a torch function mode). A candidate labelled with a
class may run those ops, and the device kernels they launch, besides its Triton kernels; nothing else.
Ops that fuse more than the class's own compute (`cudnn_convolution_relu`, `_addmm_activation`) are
in no class.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict


class TorchClass(BaseModel):
    model_config = ConfigDict(frozen=True)
    what: str  # for help texts and messages
    aten: frozenset[str]  # ATen overload packets
    functions: frozenset[str]  # Python-level names a torch function mode reports


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


CLASSES: dict[str, TorchClass] = {
    "conv": TorchClass(
        what="convolutions and transposed convolutions",
        aten=_words(
            """
            convolution _convolution _convolution_mode convolution_overrideable conv1d conv2d conv3d
            conv_transpose1d conv_transpose2d conv_transpose3d conv_tbc cudnn_convolution
            cudnn_convolution_transpose mkldnn_convolution miopen_convolution miopen_depthwise_convolution
            miopen_convolution_transpose _slow_conv2d_forward slow_conv3d_forward slow_conv_transpose2d
            slow_conv_transpose3d _conv_depthwise2d conv_depthwise3d slow_conv_dilated2d
            slow_conv_dilated3d _nnpack_spatial_convolution
            """
        ),
        functions=_words(
            "conv1d conv2d conv3d conv_transpose1d conv_transpose2d conv_transpose3d convolution conv_tbc"
        ),
    ),
    "matmul": TorchClass(
        what="matrix products: mm, addmm, bmm, baddbmm, matmul, linear, mv, dot, einsum",
        aten=_words("mm addmm bmm baddbmm addbmm matmul linear mv addmv dot vdot einsum tensordot inner"),
        functions=_words(
            "mm addmm bmm baddbmm addbmm matmul linear mv addmv dot vdot einsum tensordot inner "
            "__matmul__ __rmatmul__"
        ),
    ),
    "norm": TorchClass(
        what="batch, group, layer, instance and RMS norms",
        aten=_words(
            """
            batch_norm native_batch_norm _native_batch_norm_legit _native_batch_norm_legit_no_training
            _native_batch_norm_legit_functional _batch_norm_impl_index _batch_norm_with_update
            _batch_norm_no_update cudnn_batch_norm miopen_batch_norm group_norm native_group_norm
            layer_norm native_layer_norm instance_norm rms_norm _fused_rms_norm
            """
        ),
        functions=_words("batch_norm group_norm layer_norm instance_norm rms_norm"),
    ),
}


class UnknownClass(ValueError):
    """A class name that is not one of CLASSES."""


def parse(text: str | Iterable[str]) -> tuple[str, ...]:
    """The classes a comma-separated list (or a list) names, sorted and each once; UnknownClass naming
    the first that is not one (an empty list: none, all Triton)."""
    names = text.split(",") if isinstance(text, str) else list(text)
    names = [n.strip() for n in names if n.strip()]
    for n in names:
        if n not in CLASSES:
            raise UnknownClass(f"{n!r} is not a class of torch ops; choose from {', '.join(CLASSES)}")
    return tuple(sorted(set(names)))


def packet(op: str) -> str:
    """A traced graph's op (`aten.convolution.default`) as the dispatcher's overload packet name."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else op


def class_of(op: str) -> str | None:
    """The class of an ATen op (a packet name or a graph's `aten.x.overload`), or None."""
    name = packet(op)
    return next((c for c, k in CLASSES.items() if name in k.aten), None)


def aten_ops(classes: Iterable[str]) -> frozenset[str]:
    """The ATen overload packets these classes admit."""
    return frozenset().union(*(CLASSES[c].aten for c in classes))


def functions(classes: Iterable[str]) -> frozenset[str]:
    """The Python-level names (and ATen names) of these classes, as a torch function mode reports them."""
    return frozenset().union(*(CLASSES[c].functions | CLASSES[c].aten for c in classes))


def label(classes: Iterable[str]) -> str:
    """How a labelled candidate is shown: `torch: conv, matmul` ("" for an all-Triton one)."""
    names = list(classes)
    return f"torch: {', '.join(names)}" if names else ""


def help_text() -> str:
    return "; ".join(f"{c} = {k.what}" for c, k in CLASSES.items())
