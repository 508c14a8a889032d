"""GPU memory a process can hand to another as a file descriptor: the CUDA driver's virtual memory
management (cuMemCreate with a POSIX file descriptor handle), through ctypes.

Why not torch's CUDA IPC handles: those (cudaIpcGetMemHandle) only open in a process of the same PID
namespace, and each sandboxed child has its own. A descriptor travels over a Unix socket into any
namespace, and the memory it names lives until the last descriptor and mapping of it is gone: a trial's
outputs stay readable after the child that wrote them was stopped.

`export` copies tensors into a fresh allocation (device to device) and returns its descriptor; `mapped`
maps a received descriptor read-write in this process and returns it as a uint8 tensor, unmapped when
the tensor is freed. Both raise VmmError where the driver refuses (no VMM, no descriptor handles, a
descriptor that names no allocation of that size)."""

from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
from typing import Any

import torch

# the CUDA driver API's constants (cuda.h)
_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
_POSIX_FD = 1  # CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
_ON_DEVICE = 1  # CU_MEM_LOCATION_TYPE_DEVICE
_READ_WRITE = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE
_GRANULARITY_MINIMUM = 0  # CU_MEM_ALLOC_GRANULARITY_MINIMUM
_ATTR_VMM = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
_ATTR_POSIX_FD = 103  # CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED


ALIGN = 256  # each tensor's bytes start at a multiple of this in an allocation


def layout(nbytes: list[int]) -> tuple[list[int], int]:
    """Where each of tensors of these sizes starts in an allocation, and the bytes they span."""
    offsets, at = [], 0
    for n in nbytes:
        offsets.append(at)
        at += -(-n // ALIGN) * ALIGN
    return offsets, at


class VmmError(Exception):
    """The driver refused a step: this machine cannot hand GPU memory over, or a descriptor is wrong."""


class _Location(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("id", ctypes.c_int))


class _AllocFlags(ctypes.Structure):
    _fields_ = (
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    )


class _Prop(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = (
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", _Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", _AllocFlags),
    )


class _Access(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = (("location", _Location), ("flags", ctypes.c_int))


@functools.cache
def _driver() -> Any:
    try:
        return ctypes.CDLL("libcuda.so.1")
    except OSError as e:
        raise VmmError(f"no CUDA driver library: {e}") from None


def _call(name: str, *args: Any) -> None:
    code = getattr(_driver(), name)(*args)
    if code != 0:
        raise VmmError(f"{name} failed with CUDA driver error {code}")


def _device() -> int:
    torch.cuda.current_stream().synchronize()  # CUDA is up, its primary context current on this thread
    return torch.cuda.current_device()


def _prop(device: int) -> _Prop:
    prop = _Prop()
    prop.type, prop.requestedHandleTypes = _PINNED, _POSIX_FD
    prop.location = _Location(_ON_DEVICE, device)
    return prop


@functools.cache
def _granularity(device: int) -> int:
    size = ctypes.c_size_t()
    _call(
        "cuMemGetAllocationGranularity", ctypes.byref(size), ctypes.byref(_prop(device)), _GRANULARITY_MINIMUM
    )
    return size.value


def supported() -> str | None:
    """Why GPU memory cannot be handed over by descriptor here, or None where it can."""
    if not torch.cuda.is_available():
        return "no GPU"
    try:
        device = _device()
        for attr, what in ((_ATTR_VMM, "virtual memory management"), (_ATTR_POSIX_FD, "descriptor handles")):
            value = ctypes.c_int()
            _call("cuDeviceGetAttribute", ctypes.byref(value), attr, device)
            if not value.value:
                return f"the GPU's driver offers no {what}"
    except VmmError as e:
        return str(e)
    return None


def rounded(nbytes: int) -> int:
    """The size of an allocation holding `nbytes` (a multiple of the driver's granularity)."""
    g = _granularity(_device())
    return max(g, -(-nbytes // g) * g)


@dataclass
class _Mapping:
    """A range of this process's GPU address space mapped onto an allocation; unmapped once."""

    pointer: int
    size: int
    handle: int

    def release(self) -> None:
        """Unmap the range and release this process's handle on the allocation (best effort: a release
        never raises)."""
        if not self.size:
            return
        size, self.size = self.size, 0
        _unmap(self.pointer, size)
        _driver().cuMemRelease(ctypes.c_uint64(self.handle))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.size,), "typestr": "|u1", "data": (self.pointer, False), "version": 3}

    def __del__(self) -> None:
        self.release()


def _unmap(pointer: int, size: int) -> None:
    """Unmap a range and give its addresses back (best effort)."""
    _driver().cuMemUnmap(ctypes.c_uint64(pointer), ctypes.c_size_t(size))
    _driver().cuMemAddressFree(ctypes.c_uint64(pointer), ctypes.c_size_t(size))


def _map(handle: int, size: int, device: int) -> _Mapping:
    """`handle`'s allocation mapped read-write here. On a failure the handle stays the caller's to
    release; on success the mapping owns it."""
    pointer = ctypes.c_uint64()
    _call(
        "cuMemAddressReserve",
        ctypes.byref(pointer),
        ctypes.c_size_t(size),
        ctypes.c_size_t(0),
        ctypes.c_uint64(0),
        ctypes.c_uint64(0),
    )
    try:
        _call(
            "cuMemMap",
            pointer,
            ctypes.c_size_t(size),
            ctypes.c_size_t(0),
            ctypes.c_uint64(handle),
            ctypes.c_uint64(0),
        )
    except VmmError:
        _driver().cuMemAddressFree(pointer, ctypes.c_size_t(size))
        raise
    access = _Access(_Location(_ON_DEVICE, device), _READ_WRITE)
    try:
        _call("cuMemSetAccess", pointer, ctypes.c_size_t(size), ctypes.byref(access), ctypes.c_size_t(1))
    except VmmError:
        _unmap(pointer.value, size)
        raise
    return _Mapping(pointer.value, size, handle)


def _view(mapping: _Mapping) -> torch.Tensor:
    """The mapping as a uint8 tensor that keeps it mapped while the tensor lives."""
    return torch.as_tensor(mapping, device="cuda")


def export(tensors: list[torch.Tensor]) -> tuple[int, int]:
    """A new allocation holding each tensor's bytes in order (contiguous, device to device, each at its
    `layout` offset), and a file descriptor for it (the caller's to send and close); (descriptor,
    allocation size)."""
    device = _device()
    offsets, nbytes = layout([t.numel() * t.element_size() for t in tensors])
    size = rounded(nbytes)
    handle = ctypes.c_uint64()
    _call(
        "cuMemCreate",
        ctypes.byref(handle),
        ctypes.c_size_t(size),
        ctypes.byref(_prop(device)),
        ctypes.c_uint64(0),
    )
    mapping = None
    try:
        mapping = _map(handle.value, size, device)
        flat = _view(mapping)
        for t, at in zip(tensors, offsets, strict=True):
            n = t.numel() * t.element_size()
            if n:
                flat[at : at + n].copy_(t.detach().contiguous().reshape(-1).view(torch.uint8))
        torch.cuda.current_stream().synchronize()  # the bytes are there before the descriptor leaves
        fd = ctypes.c_int(-1)
        _call(
            "cuMemExportToShareableHandle",
            ctypes.byref(fd),
            ctypes.c_uint64(handle.value),
            _POSIX_FD,
            ctypes.c_uint64(0),
        )
        del flat
    finally:
        if mapping is not None:
            mapping.release()  # the descriptor keeps the memory: nothing of this process holds it
        else:
            _driver().cuMemRelease(ctypes.c_uint64(handle.value))
    return fd.value, size


def mapped(fd: int, size: int) -> torch.Tensor:
    """The allocation `fd` names, mapped here as `size` bytes (a uint8 tensor on this process's GPU). The
    descriptor stays the caller's to close (the mapping holds the memory)."""
    device = _device()
    if size <= 0 or size % _granularity(device):
        raise VmmError(f"an allocation of {size} bytes, not a multiple of the driver's granularity")
    handle = ctypes.c_uint64()
    _call("cuMemImportFromShareableHandle", ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD)
    try:
        mapping = _map(handle.value, size, device)
    except VmmError:
        _driver().cuMemRelease(ctypes.c_uint64(handle.value))
        raise
    return _view(mapping)
