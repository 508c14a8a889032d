"""Tensors as raw bytes beside a JSON header: how a trial's outputs reach the judge. Nothing is
unpickled (no code of the candidate's can run in the judge) and nothing is checksummed or zipped
(torch.save moved about 1 GB/s: seconds a candidate at a full-size gate shape). The judge maps the
bytes and validates the header before it reads any."""

from __future__ import annotations

from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from kernelbrain.core.handoff import header_of

DTYPES = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}


class Spec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    dtype: str
    shape: list[int]


class Header(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    tensors: list[Spec]


class Unreadable(Exception):
    """A file that does not hold what its header says."""


def write(path: Path, tensors: list[torch.Tensor]) -> None:
    """Each tensor's bytes, contiguous and in order, and a header naming their dtypes and shapes. The
    file is sized first and mapped, so a GPU tensor is copied once, straight into it (no host copy to
    write out after)."""
    specs, sizes = [], []
    for t in tensors:
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise Unreadable(f"an output of dtype {name}, which no reference returns")
        specs.append(Spec(dtype=name, shape=list(t.shape)))
        sizes.append(t.numel() * t.element_size())
    with open(path, "wb") as f:
        f.truncate(sum(sizes))
    if sum(sizes):
        mapped = torch.from_file(str(path), shared=True, size=sum(sizes), dtype=torch.uint8)
        at = 0
        for t, n in zip(tensors, sizes, strict=True):
            if n:
                mapped[at : at + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
            at += n
        del mapped
    header_of(path).write_text(Header(tensors=specs).model_dump_json())


def read(path: Path, device: str) -> list[torch.Tensor]:
    """The tensors of a file written by `write`, on the device; Unreadable names what is wrong."""
    try:
        header = Header.model_validate_json(header_of(path).read_bytes())
    except (OSError, ValidationError) as e:
        raise Unreadable(f"its header {header_of(path).name} does not read: {e}") from None
    sizes = []
    for spec in header.tensors:
        if spec.dtype not in DTYPES or any(n < 0 for n in spec.shape):
            raise Unreadable(f"its header names a tensor of dtype {spec.dtype} and shape {spec.shape}")
        numel = 1
        for n in spec.shape:
            numel *= n
        sizes.append(numel * DTYPES[spec.dtype].itemsize)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise Unreadable(f"{path.name} does not read: {e}") from None
    if size != sum(sizes):
        raise Unreadable(f"{path.name} holds {size} bytes, its header {sum(sizes)}")
    data = torch.from_file(str(path), shared=False, size=size, dtype=torch.uint8) if size else None
    out, at = [], 0
    for spec, n in zip(header.tensors, sizes, strict=True):
        dtype = DTYPES[spec.dtype]
        if n == 0:
            out.append(torch.empty(spec.shape, dtype=dtype, device=device))
            continue
        assert data is not None
        out.append(data[at : at + n].to(device).view(dtype).reshape(spec.shape))
        at += n
    return out
