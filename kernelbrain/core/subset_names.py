"""The names kb's candidate subset admits (core/subset.py reads them), each list with why it holds what
it holds. An allowlist: a name not here is refused, whatever it does.

Paths are canonical, as the imports bind them: `F.conv2d` is `torch.nn.functional.conv2d` under
`import torch.nn.functional as F`, `tl.load` is `triton.language.load`.
"""

from __future__ import annotations

from collections.abc import Iterable

from kernelbrain.core import torch_ops


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# what a candidate may import, as the canonical path each import binds: torch and Triton, math (pure
# functions of numbers), and kb's candidate API (kernelbrain/candidate.py) for what the templates need
# beyond the subset (device properties, occupancy, a launch-configuration cache). No os, sys, numpy,
# ctypes, threading, time, inspect, importlib: each reaches past the gate's view
MODULES = _words(
    "torch torch.nn torch.nn.functional triton triton.language triton.language.extra "
    "triton.language.extra.libdevice triton.language.math math kernelbrain.candidate"
)
FUTURE = "__future__"

# torch calls that allocate, or answer questions about dtypes and shapes, and compute nothing a result
# could be made of: the host code of every candidate may call them
TORCH_HOST = frozenset(
    f"torch.{n}"
    for n in _words(
        "empty empty_like empty_strided zeros zeros_like ones ones_like full full_like "
        "broadcast_shapes finfo iinfo Size"
    )
)
# torch values (not calls) host code may read: dtypes
DTYPES = _words(
    "float32 float16 bfloat16 float64 float int32 int64 int16 int8 uint8 bool half double long int "
    "float8_e4m3fn float8_e5m2 complex64 complex128"
)
TORCH_VALUES = frozenset(f"torch.{n}" for n in DTYPES)
# torch calls a module-level constant may make: questions about dtypes, never a tensor (one allocated at
# import would outlive every call: a cache)
TORCH_MODULE_LEVEL = _words("torch.finfo torch.iinfo torch.Size")
# Triton's dtypes, which host code may hand a kernel as constexprs (tl.float16), beside tl.constexpr(...)
TL_DTYPES = _words("float32 float16 bfloat16 float64 int1 int8 int16 int32 int64 uint8 uint16 uint32 uint64")
# what ModelNew's constructor may call besides: the problem's own constructor, which the templates copy
# (module constructors, parameters, random and constant initialisers); it runs once, before any input
TORCH_INIT = frozenset(
    f"torch.{n}"
    for n in _words(
        "randn rand randint randn_like rand_like randperm normal eye arange linspace tensor as_tensor "
        "tril triu no_grad nn.Parameter nn.ParameterList nn.ModuleList nn.ModuleDict nn.ParameterDict"
    )
)
INIT_PREFIXES = ("torch.nn.init.",)  # nn.init's initialisers

# Triton on the host: integer helpers, and the launch configuration of @triton.autotune
TRITON_HOST = _words("triton.cdiv triton.next_power_of_2")
TRITON_DECORATORS = _words("triton.jit triton.autotune")
TRITON_CONFIG = "triton.Config"

# kb's candidate API (kernelbrain/candidate.py): its public names
CANDIDATE_API = frozenset(
    f"kernelbrain.candidate.{n}"
    for n in _words(
        "INTERPRETED sm_count device_properties programs_per_sm programs_fitting LaunchCache aligned"
    )
)

# builtins host code may call: arithmetic on numbers, sequences and their iteration; exceptions to raise
BUILTIN_CALLS = _words(
    "len range min max abs int float bool tuple list dict set zip enumerate reversed sorted sum all any "
    "isinstance round divmod pow str"
)
BUILTIN_TYPES = _words("int float bool tuple list dict set str")  # as isinstance's second argument
EXCEPTIONS = _words(
    "ValueError RuntimeError NotImplementedError TypeError AssertionError IndexError KeyError"
)
# builtins a @triton.jit body may call (Triton folds them or supports them)
JIT_BUILTINS = _words("range min max float int len abs")

# tensor methods host code may call: metadata, views, copies into its own buffers, casts
TENSOR_METHODS = _words(
    """
    size stride dim numel element_size is_contiguous is_floating_point storage_offset get_device
    contiguous view view_as reshape reshape_as expand expand_as permute transpose t flatten unflatten
    unsqueeze squeeze movedim narrow select chunk split unbind as_strided
    new_empty new_zeros new_ones new_full copy_ fill_ zero_ to float half bfloat16 double int long bool
    detach clone
    """
)
# methods of Python's own containers host code may call
# (and kernelbrain.candidate.LaunchCache's: get, remember)
CONTAINER_METHODS = _words(
    "append extend insert pop index count get items keys values update setdefault copy remember"
)
# container methods that change a container: never called on the module's own constants (a cache)
MUTATORS = _words("append extend insert pop update setdefault")
# attributes host code may read of any value: a tensor's metadata, a device's
# (and torch.finfo's: bits, eps, tiny, max, min)
DATA_ATTRS = _words("shape dtype device ndim is_cuda index type T mT itemsize bits eps tiny max min")
# attributes of ModelNew's submodules (`self.conv.weight`): their parameters, buffers and settings
MODULE_ATTRS = _words(
    """
    weight bias running_mean running_var num_batches_tracked eps momentum affine track_running_stats
    training stride padding dilation groups kernel_size in_channels out_channels output_padding
    padding_mode in_features out_features normalized_shape elementwise_affine num_features num_groups
    num_channels dim p negative_slope inplace ceil_mode count_include_pad divisor_override beta
    threshold alpha approximate reduction ignore_index label_smoothing scale_factor mode align_corners
    weight_g weight_v
    """
)
# tensor methods ModelNew's constructor may also call: the problem's own initialisation of its weights
INIT_TENSOR_METHODS = _words(
    "uniform_ normal_ fill_ zero_ copy_ mul_ add_ div_ sub_ clamp_ bernoulli_ exponential_ random_ "
    "requires_grad_ abs_ neg_ sign_"
)
# ModelNew's own methods it may call on itself beyond those it defines (in its constructor only)
INIT_SELF_METHODS = _words("register_buffer register_parameter")

# a @triton.jit body: methods and attributes of Triton's tensors (triton.language.core.tensor)
TL_METHODS = _words(
    """
    to reshape view trans permute broadcast_to expand_dims split ravel sum max min argmax argmin cumsum
    cumprod sort flip abs exp exp2 log log2 sqrt rsqrt sigmoid softmax cos sin floor ceil erf xor_sum
    reduce associative_scan histogram cast
    """
)
TL_ATTRS = _words("dtype element_ty shape T type numel value primitive_bitwidth is_floating is_ptr is_int")


# ATen views a candidate may call as `torch.ops.aten.<op>.<overload>` (kb's partial candidates write the
# traced head so); no other torch.ops
ATEN_VIEWS = _words("t view reshape permute transpose expand unsqueeze squeeze slice select alias contiguous")


def aten_calls(classes: Iterable[str]) -> frozenset[str]:
    """The ATen overload packets a candidate may call through torch.ops.aten: the allowed classes' ops
    and the views."""
    return torch_ops.aten_ops(classes) | ATEN_VIEWS


def torch_functions(classes: Iterable[str]) -> frozenset[str]:
    """The Python names of the torch ops the user allowed (`--allow-torch`, core/torch_ops.py), as calls
    `torch.<name>`, `torch.nn.functional.<name>` or tensor methods: no others."""
    return frozenset(n for n in torch_ops.functions(classes) if not n.startswith("_"))
