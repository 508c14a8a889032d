"""The accuracy contract: a candidate is as accurate as the reference is as the user runs it.

The bar is the user's module at the primary shape, on the run's device, with the user's backend flags,
measured against float64 truth where no candidate runs. Float32 contractions are where that differs from
IEEE float32: PyTorch runs cuDNN convolutions in TF32 by default (`torch.backends.cudnn.allow_tf32`), and
cuBLAS matmuls in TF32 or bfloat16 where the user asks (`torch.backends.cuda.matmul.allow_tf32`,
`torch.set_float32_matmul_precision`); and whether a TF32 algorithm runs at all is the library's choice,
shape by shape. So the analysis measures it (kernelbrain/child/regime.py): each float32 contraction the
reference makes at the primary shape runs once on the device as the user's flags have it, and its error
on sampled outputs (a batch slice, computed in float64) is set beside the error converting its factors to
TF32 or bfloat16 makes. The regime of each kind of contraction is IEEE where its error is far below
TF32's, else the format whose conversion errs nearest the error measured; the coarsest over a kind.

At every shape the gate checks, the reference's own error is then that of the regime: its contractions
run with their factors converted to the regime's format and summed in IEEE float32 (what a TF32 tensor
core does), the rest as the user's PyTorch runs it. The conversion is by truncation, the coarser of the
two that hardware makes (a tensor core fed float32 drops the low bits; a library may round to nearest
first): a kernel of either kind is a TF32 kernel, and one that rounds to nearest errs less. An output
element passes within the tolerance of its dtype or within REFERENCE_MULTIPLE times that error
(child/tolerance.py). A TF32 candidate so passes exactly where the user's reference is TF32 at the
primary shape, and is refused where it is IEEE float32. `--strict-fp32` (KB_STRICT_FP32 in the problem
it records) holds every contraction to IEEE float32 whatever the reference does.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

from kernelbrain.core.problem import REFERENCE_MULTIPLE

Format = Literal["ieee", "tf32", "bf16"]
Kind = Literal["conv", "matmul"]
KINDS: tuple[Kind, ...] = ("conv", "matmul")

# the libraries and flags behind each kind, for the line a user reads
LIBRARY: dict[Kind, str] = {"conv": "cuDNN", "matmul": "cuBLAS"}
FORMAT_NAME: dict[Format, str] = {"ieee": "IEEE fp32", "tf32": "TF32", "bf16": "bfloat16"}


class Measured(BaseModel):
    """One float32 contraction of the reference at the primary shape, run as the user's flags have it: its
    normwise relative error against float64 truth on sampled outputs, beside the errors converting its
    factors to TF32 and to bfloat16 makes there (to nearest, and by truncation: hardware does either),
    and the format that explains it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    op: str  # the ATen op ("convolution", "mm", "addmm", "bmm", "baddbmm")
    kind: Kind
    shape: list[int]  # its first operand's
    sampled: int  # output elements compared
    error: float
    converted: dict[str, float]  # "tf32", "tf32 truncated", "bf16", "bf16 truncated": each one's error
    format: Format


class Accuracy(BaseModel):
    """The regime the gate holds candidates to, per kind of contraction (a kind absent: IEEE), what
    was measured to decide it, and whether --strict-fp32 overrode it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    device: str  # where it was measured
    regimes: dict[Kind, Format] = {}
    measured: list[Measured] = []
    strict: bool = False
    note: str = ""  # why contractions were not measured (not traceable on meta, past the first 8), if so

    def format_of(self, kind: Kind) -> Format:
        return "ieee" if self.strict else self.regimes.get(kind, "ieee")

    @property
    def error(self) -> float:
        """The largest normwise error measured of a contraction whose regime is not IEEE (0: none), the
        scale of the reference's own error that a benchmark's screen allows for."""
        return max((m.error for m in self.measured if self.format_of(m.kind) != "ieee"), default=0.0)

    def summary(self) -> str:
        """One line: the regime and its bound, as `kb run` prints it and the audit and export show it."""
        loose = [k for k in KINDS if self.format_of(k) != "ieee"]
        if self.strict:
            head = "IEEE fp32 contractions (--strict-fp32)"
        elif not loose:
            head = "IEEE fp32 reference"
        else:
            head = ", ".join(f"{LIBRARY[k]} {FORMAT_NAME[self.format_of(k)]}" for k in loose) + " reference"
        where = "" if self.device == "cuda" else f" ({self.device})"
        if self.error:
            tail = (
                f"its error {self.error:.2g} against float64 truth at the primary shape; "
                f"candidates within {REFERENCE_MULTIPLE}x it, {REFERENCE_MULTIPLE * self.error:.2g}"
            )
        else:
            tail = f"candidates within their dtype's tolerance or {REFERENCE_MULTIPLE}x the reference's error"
        return f"{head}{where}: {tail}" + (f"; {self.note}" if self.note else "")
