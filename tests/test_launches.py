"""The GPU launch check (kernelbrain.child.launches): which recorded kernels break the rule, the Triton
kernel names a candidate module defines, and (on a GPU only) the profiler's records themselves.

The kernel names are CUPTI's demangled names as torch 2.11's profiler reported them on an H200
(tools/gpu_launch_check.py, benchmarks/results/trust/launch_check.txt)."""

from __future__ import annotations

import pytest
import torch

from kernelbrain.child import launches
from kernelbrain.child.guard import Violation
from kernelbrain.child.loading import load_module

OWN = "softmax_rows"

# allocation, fill and copy: what torch.zeros/full, clone, contiguous, .to(dtype), .to(device) and .item()
# launch
FILL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, "
    "1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)"
)
FILL_STRIDED = (
    "void at::native::elementwise_kernel<128, 4, "
    "at::native::gpu_kernel_impl_nocast<at::native::FillFunctor<c10::Half> >(at::TensorIteratorBase&, "
    "at::native::FillFunctor<c10::Half> const&)::{lambda(int)#1}>(int, "
    "at::native::gpu_kernel_impl_nocast<at::native::FillFunctor<c10::Half> >(at::TensorIteratorBase&, "
    "at::native::FillFunctor<c10::Half> const&)::{lambda(int)#1})"
)
COPY = (
    "void at::native::vectorized_elementwise_kernel<4, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, "
    "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul>)"
)
CAST = (
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda()#3}::operator()() "
    "const::{lambda()#10}::operator()() const::{lambda(c10::Half)#1}, std::array<char*, 2ul>, 4, "
    "TrivialOffsetCalculator<1, unsigned int>, TrivialOffsetCalculator<1, unsigned int>, "
    "at::native::memory::LoadWithCast<1>, at::native::memory::StoreWithCast<1> >(int, ...)"
)
HALF_CAST = (
    "void at::native::vectorized_templated_elementwise_kernel<4, at::native::float16_copy_kernel_cuda("
    "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul>, c10::Half, float>(int, ...)"
)
ARANGE = (
    "void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out("
    "c10::Scalar const&, c10::Scalar const&, c10::Scalar const&, at::Tensor&)::{lambda()#1}::"
    "operator()() const::{lambda()#4}::operator()() const::{lambda(long)#1}>(int, ...)"
)
MEMCPY = [
    "Memcpy HtoD (Pageable -> Device)",
    "Memcpy DtoD (Device -> Device)",
    "Memcpy DtoH (Device -> Pinned)",
]
MEMSET = "Memset (Device)"
GLUE = [FILL, FILL_STRIDED, COPY, CAST, HALF_CAST, ARANGE, *MEMCPY, MEMSET]

# compute: cuBLAS (torch.matmul, F.linear), softmax, reductions, pointwise ops, cat, attention
GEMM = (
    "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas"
)
NVJET = "nvjet_tst_128x128_64x4_1x2_h_bz_coopA_NTT"
CUTLASS = (
    "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>"
    "(cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4::Params)"
)
GEMV = (
    "void gemv2T_kernel_val<int, int, float, float, float, float, 128, 16, 4, 4, false, false>(float const*)"
)
SOFTMAX_WARP = (
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*, "
    "float const*, int, int, int, bool const*, int, bool)"
)
SOFTMAX_BLOCK = (
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)"
)
ADD = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
    "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)"
)
MUL = (
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, ...)"
)
EXP = (
    "void at::native::vectorized_elementwise_kernel<4, "
    "at::native::exp_kernel_cuda(at::TensorIteratorBase&)::{lambda()#2}::operator()() "
    "const::{lambda()#1}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >(int, ...)"
)
REDUCE = (
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, "
    "at::native::func_wrapper_t<float, at::native::sum_functor<float, float, "
    "float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4, 4> "
    ">(at::native::ReduceOp<float, ...>)"
)
CAT = (
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous "
    "namespace)::OpaqueType<4u>, unsigned int, 2, 128, 1>(...)"
)
FLASH = (
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
    "cutlass::half_t, Flash_kernel_traits<64, 128, 128, 4, cutlass::half_t> >, false, false, false, "
    "false, true, true, false, false>(pytorch_flash::Flash_fwd_params)"
)
CUDNN = "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x128_4x1x1_kernel0_0"
INDUCTOR = "triton_per_fused__softmax_0"
FOREIGN_TRITON = "add_kernel"
COMPUTE = [
    GEMM, NVJET, CUTLASS, GEMV, SOFTMAX_WARP, SOFTMAX_BLOCK, ADD, MUL, EXP, REDUCE, CAT, FLASH, CUDNN,
    INDUCTOR, FOREIGN_TRITON,
]  # fmt: skip


def test_own_triton_kernels_and_glue_pass() -> None:
    names = [FILL, OWN, COPY, OWN, *GLUE, "row_max"]
    assert launches.classify(names, {OWN, "row_max"}) == []


@pytest.mark.parametrize("name", COMPUTE)
def test_compute_kernels_break_the_rule(name: str) -> None:
    assert launches.classify([FILL, OWN, name, COPY], {OWN}) == [name]


def test_offenders_each_once_in_the_order_they_ran() -> None:
    assert launches.classify([GEMM, OWN, SOFTMAX_WARP, GEMM, FILL], {OWN}) == [GEMM, SOFTMAX_WARP]


def test_triton_names_match_exactly() -> None:
    # Triton 3.x names a kernel after its function, with no specialisation suffix
    for near in (f"{OWN}_0", f"{OWN}_0d1d2de", f"x{OWN}", OWN.upper(), f"{OWN} "):
        assert launches.classify([near], {OWN}) == [near]


def test_a_triton_kernel_may_not_take_a_library_kernels_name() -> None:
    # a decoy named like the kernel torch.matmul picks would otherwise let that kernel pass as its own
    for name in (GEMM, NVJET, CUDNN, INDUCTOR, "ampere_sgemm_128x64_tn", "sm80_xmma_gemm_x"):
        assert launches.classify([name], {name}) == [name]
    assert launches.classify(["matmul_kernel", "gemm_tile"], {"matmul_kernel", "gemm_tile"}) == []


def test_glue_patterns_decide_on_the_first_functor() -> None:
    # a compute functor whose later template arguments mention a copy or fill is still compute
    sneaky = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
        "at::native::FillFunctor<float> >(int)"
    )
    spoofed_memcpy = [
        "Memcpy_HtoD",
        "Memcpy HtoD",
        "Memset",
        "Memset (Device)x",
        "Memcpy HtoD (Device -> Device)_",
    ]
    assert launches.classify([sneaky, *spoofed_memcpy], set()) == [sneaky, *spoofed_memcpy]


def test_the_message_names_the_kernels_shortly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launches, "record_kernels", lambda fn: [FILL, OWN, GEMM, SOFTMAX_WARP, REDUCE, GEMM])
    with pytest.raises(Violation) as e:
        launches.check_launches(lambda: None, {OWN})
    msg = str(e.value)
    assert msg.startswith(
        "forward launched kernels that are not its own Triton kernels (cuBLAS, ATen compute): "
    )
    assert "(anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>;" not in msg
    assert "(anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>," in msg
    assert msg.endswith("; only its Triton kernels and allocation/copy kernels may run")
    assert "void " not in msg and "\n" not in msg and len(msg) < 500
    assert msg.count(GEMM[:40]) == 1


def test_a_pass_with_none_of_its_own_kernels_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launches, "record_kernels", lambda fn: [FILL, COPY])
    with pytest.raises(Violation, match="none of its own Triton kernels"):
        launches.check_launches(lambda: None, {OWN})
    launches.check_launches(lambda: None, {OWN}, require_own=False)
    monkeypatch.setattr(launches, "record_kernels", lambda fn: [FILL, OWN, MEMSET])
    launches.check_launches(lambda: None, {OWN})


def test_kinds_for_the_message() -> None:
    kinds = {name: launches.kind(name) for name in (GEMM, NVJET, CUTLASS, GEMV, CUDNN, FLASH)}
    assert kinds == {
        GEMM: "cuBLAS",
        NVJET: "cuBLAS",
        CUTLASS: "cuBLAS",
        GEMV: "cuBLAS",
        CUDNN: "cuDNN",
        FLASH: "flash attention",
    }
    assert {launches.kind(n) for n in (SOFTMAX_WARP, SOFTMAX_BLOCK, ADD, REDUCE, CAT)} == {"ATen compute"}
    assert launches.kind(INDUCTOR) == launches.kind(FOREIGN_TRITON) == "another module's Triton kernel"


def test_short_names() -> None:
    assert (
        launches.short(SOFTMAX_WARP)
        == "(anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>"
    )
    assert launches.short(OWN) == OWN
    assert len(launches.short(GEMM)) == 90 and launches.short(GEMM).endswith("...")


HELPER = """
import triton
import triton.language as tl


@triton.jit
def foreign_kernel(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 0.0, mask=offs < n)
"""

CANDIDATE = """
import sys
import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

foreign = sys.modules["{helper}"].foreign_kernel


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=cols < n_cols)


@triton.autotune(configs=[triton.Config({{"BLOCK": 128}}), triton.Config({{"BLOCK": 256}})], key=["n"])
@triton.jit
def tuned_add(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + 1, mask=offs < n)


@triton.autotune(configs=[triton.Config({{"BLOCK": 128}})], key=["n"])
@triton.heuristics({{"EVEN": lambda args: args["n"] % args["BLOCK"] == 0}})
@triton.jit
def tuned_even(x_ptr, n, BLOCK: tl.constexpr, EVEN: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(x_ptr + offs, 0.0, mask=offs < n)


def plain_scale(x_ptr, n):
    pass


interpreted = InterpretedFunction(plain_scale)
alias = softmax_rows


class ModelNew(nn.Module):
    @staticmethod
    @triton.jit
    def inner_fill(y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, 0.0, mask=offs < n)

    def forward(self, x):
        return x
"""


def test_triton_kernel_names_of_a_candidate_module() -> None:
    helper = load_module(HELPER, "launch_helper")
    cand = load_module(CANDIDATE.format(helper=helper.__name__), "launch_cand")
    # jit, autotuned, autotuned over heuristics, the interpreter's twin, a class's static kernel; not the
    # imported kernel, nor plain functions
    assert launches.triton_kernel_names(cand) == {
        "softmax_rows",
        "tuned_add",
        "tuned_even",
        "plain_scale",
        "inner_fill",
    }
    assert launches.triton_kernel_names(helper) == {"foreign_kernel"}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the profiler's kernel records need a GPU")
def test_record_kernels_on_a_gpu() -> None:
    x = torch.randn(256, 256, device="cuda")
    names = launches.record_kernels(lambda: (torch.zeros(1024, device="cuda"), x.clone(), x @ x))
    assert any("FillFunctor" in n for n in names), names
    bad = launches.classify(names, set())
    # the matmul's kernels alone break the rule, each named cuBLAS's (on the H100, driver 580, cuBLAS ran
    # two distinct sm80_xmma_gemm kernels for this one product)
    assert bad and [launches.kind(n) for n in bad] == ["cuBLAS"] * len(bad), names
    assert launches.record_kernels(lambda: None) == []
