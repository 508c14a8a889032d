"""Tensors as raw bytes beside a JSON header: how a trial's outputs reach the judge. Nothing is
unpickled (no code of the candidate's can run in the judge) and nothing is checksummed or zipped
(torch.save moved about 1 GB/s: seconds a candidate at a full-size gate shape). The judge validates the
header before it reads any bytes.

Where the bytes go: GPU tensors, where the driver can hand memory over and the request's budget allows,
stay on the GPU in an allocation of their own whose descriptor goes to the judge (child/cuda_vmm.py,
core/descriptors.py: no host copy, and the judge maps them); everything else goes to the file, which
lives in /dev/shm where there is one (runtime/scratch.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

import torch
from pydantic import BaseModel, ConfigDict, ValidationError

from kernelbrain.child import cuda_vmm
from kernelbrain.core import descriptors
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
    on_gpu: int = 0  # the bytes of the GPU allocation whose descriptor holds them; 0: in the file


class Unreadable(Exception):
    """A file that does not hold what its header says."""


CHUNK = 64 << 20  # bytes a GPU tensor moves through the pinned buffer at a time
# the share of the GPU's memory a request's handed-over outputs may hold until the judge reads them (more
# goes through the host): the judge still needs room for the reference's outputs beside them, and the
# gatekeeper's and the benchmarker's children may each hold this much at once (10 GB on an 80 GB card)
GPU_SHARE = 0.125

_on_gpu = [0]  # bytes this request handed over on the GPU so far
_vmm: dict[str, str | None] = {}  # "why": why the driver cannot hand memory over here (None: it can)


_PINNED: list[torch.Tensor] = []  # this process's pinned buffer, made at the first GPU tensor


def _pinned() -> torch.Tensor:
    """Page-locked host memory, kept for the process: a copy from or to the device runs at the bus's
    rate there (writing into a fresh mapped file took about twice as long on the H200: every page
    faulted in, benchmarks/results/gate_cost/session10/ at 3daad6a)."""
    if not _PINNED:
        _PINNED.append(torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True))
    return _PINNED[0]


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(at, min(CHUNK, n - at)) for at in range(0, n, CHUNK)]


def new_request() -> None:
    """A request starts: its budget of GPU bytes is whole again (the descriptors the worker sent for it
    are kept: the last request's were discarded as it ended)."""
    _on_gpu[0] = 0


def _hand_on_gpu(tensors: list[torch.Tensor]) -> bool:
    """Whether these tensors go to the judge as GPU memory: all on the GPU, a channel to the worker, a
    driver that can, and room in the request's budget."""
    if not tensors or any(t.device.type != "cuda" for t in tensors) or not descriptors.available():
        return False
    if "why" not in _vmm:
        _vmm["why"] = cuda_vmm.supported()
    if _vmm["why"] is not None:
        return False
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    budget = GPU_SHARE * torch.cuda.get_device_properties(tensors[0].device).total_memory
    return _on_gpu[0] + nbytes <= budget


def write(path: Path, tensors: list[torch.Tensor]) -> None:
    """Each tensor's bytes, contiguous and in order, and a header naming their dtypes and shapes. GPU
    tensors go over as a GPU allocation where `_hand_on_gpu` allows, else through the pinned buffer in
    chunks; a host tensor is written from its own memory."""
    specs = []
    for t in tensors:
        name = str(t.dtype).removeprefix("torch.")
        if name not in DTYPES:
            raise Unreadable(f"an output of dtype {name}, which no reference returns")
        specs.append(Spec(dtype=name, shape=list(t.shape)))
    if _hand_on_gpu(tensors):
        try:
            fd, size = cuda_vmm.export(tensors)
        except cuda_vmm.VmmError:
            _vmm["why"] = "refused"  # through the host from now on
        else:
            try:
                descriptors.give(path.name, fd)
            finally:
                os.close(fd)
            _on_gpu[0] += size
            path.write_bytes(b"")
            header_of(path).write_text(Header(tensors=specs, on_gpu=size).model_dump_json())
            return
    with open(path, "wb") as f:
        for t in tensors:
            if not t.numel():
                continue
            raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
            if raw.device.type == "cpu":
                f.write(memoryview(raw.numpy()))
                continue
            buf = _pinned()
            for at, n in _chunks(raw.numel()):
                buf[:n].copy_(raw[at : at + n])
                f.write(memoryview(buf[:n].numpy()))
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
    if header.on_gpu:
        return _read_on_gpu(path, header, sizes, device)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size != sum(sizes):
                raise Unreadable(f"{path.name} holds {size} bytes, its header {sum(sizes)}")
            return [_read_one(f, spec, n, device) for spec, n in zip(header.tensors, sizes, strict=True)]
    except OSError as e:
        raise Unreadable(f"{path.name} does not read: {e}") from None


def _read_on_gpu(path: Path, header: Header, sizes: list[int], device: str) -> list[torch.Tensor]:
    """The tensors of a GPU allocation handed over under the file's name, as views of it mapped here."""
    if device != "cuda":
        raise Unreadable(f"{path.name} names GPU memory, and this check runs on {device}")
    offsets, span = cuda_vmm.layout(sizes)
    if span > header.on_gpu:
        raise Unreadable(f"its header names {span} bytes in an allocation of {header.on_gpu}")
    try:
        fd = descriptors.take(path.name)
    except descriptors.Missing as e:
        raise Unreadable(str(e)) from None
    try:
        flat = cuda_vmm.mapped(fd, header.on_gpu)
    except cuda_vmm.VmmError as e:
        raise Unreadable(f"its GPU memory does not map: {e}") from None
    finally:
        os.close(fd)
    return [
        flat[at : at + n].view(DTYPES[spec.dtype]).reshape(spec.shape)
        for spec, n, at in zip(header.tensors, sizes, offsets, strict=True)
    ]


def _read_one(f: BinaryIO, spec: Spec, n: int, device: str) -> torch.Tensor:
    out = torch.empty(n, dtype=torch.uint8, device=device)
    if device == "cpu":
        _fill(f, out)
    else:
        buf = _pinned()
        for at, m in _chunks(n):
            _fill(f, buf[:m])
            out[at : at + m].copy_(buf[:m])
    return out.view(DTYPES[spec.dtype]).reshape(spec.shape)


def _fill(f: BinaryIO, into: torch.Tensor) -> None:
    view = memoryview(into.numpy())
    while view.nbytes:
        got = f.readinto(view)
        if not got:
            raise Unreadable("the file ended early (it changed while it was read)")
        view = view[got:]
