"""Shared memory between the supervisor and the runner, owned by the supervisor.

The supervisor hands the runner its inputs and takes its outputs back through *arenas*: blocks
of memory the supervisor allocates and exports as a file descriptor, which travels to the
runner over the Unix socket (SCM_RIGHTS) and is mapped there. A file descriptor is a capability:
it works across user ids, needs no shared path on disk and no ``/proc`` access.

- On the CPU an arena is a sealed ``memfd`` (it cannot be shrunk or grown by the other side). The
  runner gets a read-only descriptor for inputs, so a write to an input faults.
- On a GPU an arena is driver-managed device memory (``cuMemCreate`` with a POSIX-fd handle,
  called through ``ctypes`` on ``libcuda``), mapped into both processes' address spaces. The
  importer chooses its own access rights there, so the supervisor also checks afterwards that
  inputs are unchanged.

A tensor in an arena is described by a ``TensorSpec`` (offset, dtype, shape, strides): plain
JSON, so what the runner sends back is data the supervisor validates, never an object.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
from dataclasses import asdict, dataclass
from typing import Any

import torch

ALIGN = 256  # bytes: every tensor starts on a 256-byte boundary (TMA and vector loads need 16)

DTYPES = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8, "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ValueError(f"dtype {dtype} cannot travel between the supervisor and the runner") from None


@dataclass(frozen=True)
class TensorSpec:
    """Where a tensor lives in an arena; ``strides`` in elements."""

    arena: int
    offset: int
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    def as_json(self) -> dict:
        return {**asdict(self), "shape": list(self.shape), "strides": list(self.strides)}

    @classmethod
    def from_json(cls, data: Any, *, arenas: dict[int, "Arena"]) -> "TensorSpec":
        """Parse and bounds-check a spec that came from the other process (untrusted)."""
        if not isinstance(data, dict):
            raise ValueError("a tensor spec must be an object")
        arena, offset, dtype = data.get("arena"), data.get("offset"), data.get("dtype")
        shape, strides = data.get("shape"), data.get("strides")
        if not (isinstance(arena, int) and arena in arenas and isinstance(offset, int) and offset >= 0 and offset % ALIGN == 0):
            raise ValueError(f"bad arena or offset in tensor spec: {arena!r} {offset!r}")
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}")
        if not (isinstance(shape, list) and isinstance(strides, list) and len(shape) == len(strides) <= 8
                and all(isinstance(n, int) and 0 <= n < 2**40 for n in shape)
                and all(isinstance(s, int) and 0 <= s < 2**40 for s in strides)):
            raise ValueError("bad shape or strides in tensor spec")
        spec = cls(arena, offset, dtype, tuple(shape), tuple(strides))
        if spec.end() > arenas[arena].nbytes:
            raise ValueError(f"tensor spec runs past its arena ({spec.end()} > {arenas[arena].nbytes} bytes)")
        return spec

    def itemsize(self) -> int:
        return torch.empty((), dtype=DTYPES[self.dtype]).element_size()

    def end(self) -> int:
        if any(n == 0 for n in self.shape):
            return self.offset
        span = sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + 1
        return self.offset + span * self.itemsize()


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class Layout:
    """Places tensors one after another in an arena-to-be: ``place`` returns the spec."""

    def __init__(self, arena_id: int) -> None:
        self.arena_id = arena_id
        self.nbytes = 0

    def place(self, shape: tuple[int, ...], dtype: torch.dtype) -> TensorSpec:
        spec = TensorSpec(self.arena_id, self.nbytes, dtype_name(dtype), tuple(shape), contiguous_strides(tuple(shape)))
        self.nbytes = aligned(spec.end() if spec.end() > spec.offset else spec.offset + 1)
        return spec


# ---------------------------------------------------------------------------------------
class Arena:
    """One shared block: ``tensor`` is its bytes (uint8) in this process."""

    def __init__(self, arena_id: int, nbytes: int, device: torch.device, tensor: torch.Tensor, fd: int | None, keep: Any) -> None:
        self.id = arena_id
        self.nbytes = nbytes
        self.device = device
        self.tensor = tensor
        self.fd = fd  # the exportable descriptor (owner side only)
        self._keep = keep  # mmap or GPU mapping that backs ``tensor``

    @classmethod
    def create(cls, arena_id: int, nbytes: int, device: torch.device | str) -> "Arena":
        device = torch.device(device)
        nbytes = max(aligned(nbytes), ALIGN)
        if device.type == "cuda":
            mapping = _gpu_create(nbytes, device.index or 0)
            return cls(arena_id, mapping.size, device, mapping.tensor(), mapping.fd, mapping)
        fd = os.memfd_create(f"kopt-arena-{arena_id}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, nbytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        return cls(arena_id, nbytes, device, torch.frombuffer(mm, dtype=torch.uint8), fd, mm)

    def export_fd(self, writable: bool) -> int:
        """A descriptor to send: on the CPU a read-only one unless ``writable``."""
        if self.device.type == "cuda" or writable:
            return self.fd  # type: ignore[return-value]
        return os.open(f"/proc/self/fd/{self.fd}", os.O_RDONLY | os.O_CLOEXEC)

    @classmethod
    def attach(cls, arena_id: int, nbytes: int, device: torch.device | str, fd: int, writable: bool) -> "Arena":
        device = torch.device(device)
        if device.type == "cuda":
            mapping = _gpu_import(fd, nbytes, device.index or 0, writable)
            os.close(fd)
            return cls(arena_id, nbytes, device, mapping.tensor(), None, mapping)
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, prot)
        os.close(fd)
        import warnings

        with warnings.catch_warnings():  # a read-only buffer: torch warns that writing is undefined (it faults)
            warnings.simplefilter("ignore")
            tensor = torch.frombuffer(mm, dtype=torch.uint8)
        return cls(arena_id, nbytes, device, tensor, None, mm)

    def view(self, spec: TensorSpec) -> torch.Tensor:
        dtype = DTYPES[spec.dtype]
        raw = self.tensor[spec.offset:max(spec.end(), spec.offset)]
        if not spec.shape or all(n > 0 for n in spec.shape):
            flat = raw.view(dtype)
            return torch.as_strided(flat, spec.shape, spec.strides)
        return torch.empty(spec.shape, dtype=dtype, device=self.device)

    def close(self) -> None:
        self.tensor = None  # type: ignore[assignment]
        keep, self._keep = self._keep, None
        if isinstance(keep, mmap.mmap):
            try:
                keep.close()
            except BufferError:  # a view still exists; the mapping goes with the process
                pass
        elif keep is not None:
            keep.release()
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# ---- GPU: driver-API virtual memory with POSIX file-descriptor handles ------------------
_libcuda: Any = None


def _cuda() -> Any:
    global _libcuda
    if _libcuda is None:
        _libcuda = ctypes.CDLL("libcuda.so.1")
    return _libcuda


def _check(rc: int, what: str) -> None:
    if rc != 0:
        name = ctypes.c_char_p()
        _cuda().cuGetErrorName(rc, ctypes.byref(name))
        raise RuntimeError(f"{what} failed: CUDA driver error {rc} ({(name.value or b'?').decode()})")


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocProp(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


_PINNED, _POSIX_FD, _ON_DEVICE, _READ, _READ_WRITE = 1, 1, 1, 1, 3


def _prop(device_index: int) -> _AllocProp:
    prop = _AllocProp()
    prop.type, prop.requestedHandleTypes = _PINNED, _POSIX_FD
    prop.location.type, prop.location.id = _ON_DEVICE, device_index
    return prop


class _GpuMapping:
    """A mapped VMM allocation: ``ptr`` in this process, ``fd`` when exported."""

    def __init__(self, handle: int, ptr: int, size: int, device_index: int, fd: int | None) -> None:
        self.handle, self.ptr, self.size, self.device_index, self.fd = handle, ptr, size, device_index, fd

    def tensor(self) -> torch.Tensor:
        ptr, size, index = self.ptr, self.size, self.device_index

        class _Interface:  # __cuda_array_interface__ v3: a zero-copy view torch understands
            __cuda_array_interface__ = {"shape": (size,), "typestr": "|u1", "data": (ptr, False), "version": 3, "strides": None}

        return torch.as_tensor(_Interface(), device=torch.device("cuda", index))

    def release(self) -> None:
        lib = _cuda()
        lib.cuMemUnmap(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
        lib.cuMemAddressFree(ctypes.c_ulonglong(self.ptr), ctypes.c_size_t(self.size))
        lib.cuMemRelease(ctypes.c_ulonglong(self.handle))


def _map(handle: int, size: int, device_index: int, flags: int) -> int:
    lib = _cuda()
    ptr = ctypes.c_ulonglong()
    _check(lib.cuMemAddressReserve(ctypes.byref(ptr), ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(0), ctypes.c_ulonglong(0)), "cuMemAddressReserve")
    _check(lib.cuMemMap(ptr, ctypes.c_size_t(size), ctypes.c_size_t(0), ctypes.c_ulonglong(handle), ctypes.c_ulonglong(0)), "cuMemMap")
    desc = _AccessDesc()
    desc.location.type, desc.location.id, desc.flags = _ON_DEVICE, device_index, flags
    _check(lib.cuMemSetAccess(ptr, ctypes.c_size_t(size), ctypes.byref(desc), ctypes.c_size_t(1)), "cuMemSetAccess")
    return ptr.value


def _gpu_create(nbytes: int, device_index: int) -> _GpuMapping:
    torch.cuda.init()
    torch.empty(0, device=torch.device("cuda", device_index))  # a current context on this thread
    lib = _cuda()
    prop = _prop(device_index)
    granularity = ctypes.c_size_t()
    _check(lib.cuMemGetAllocationGranularity(ctypes.byref(granularity), ctypes.byref(prop), 0), "cuMemGetAllocationGranularity")
    size = (nbytes + granularity.value - 1) // granularity.value * granularity.value
    handle = ctypes.c_ulonglong()
    _check(lib.cuMemCreate(ctypes.byref(handle), ctypes.c_size_t(size), ctypes.byref(prop), ctypes.c_ulonglong(0)), "cuMemCreate")
    fd = ctypes.c_int()
    _check(lib.cuMemExportToShareableHandle(ctypes.byref(fd), handle, _POSIX_FD, ctypes.c_ulonglong(0)), "cuMemExportToShareableHandle")
    os.set_inheritable(fd.value, False)
    return _GpuMapping(handle.value, _map(handle.value, size, device_index, _READ_WRITE), size, device_index, fd.value)


def _gpu_import(fd: int, nbytes: int, device_index: int, writable: bool) -> _GpuMapping:
    torch.cuda.init()
    torch.empty(0, device=torch.device("cuda", device_index))
    handle = ctypes.c_ulonglong()
    _check(_cuda().cuMemImportFromShareableHandle(ctypes.byref(handle), ctypes.c_void_p(fd), _POSIX_FD), "cuMemImportFromShareableHandle")
    return _GpuMapping(handle.value, _map(handle.value, nbytes, device_index, _READ_WRITE if writable else _READ), nbytes, device_index, None)
