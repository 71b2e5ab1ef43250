"""The probe buffer at one address in every worker the warm pool forks, so that the same
scenario traces to the same IR in each of them (the buffer's address is a constant of the
probed device code) and the compile can be reused (engine/compile_cache.py).

- The pool's server, before it forks anything and without CUDA, reserves ``RESERVE_BYTES``
  of address space (``reserve``: ``PROT_NONE``, no memory behind it). Every forked worker
  inherits the reservation at the same address.
- A worker that runs probes maps fresh zeroed private pages over the start of it
  (``MAP_FIXED``: its own, never shared with the server or another worker), page-locks them
  for the GPU (``cuMemHostRegister`` with ``DEVICEMAP | PORTABLE``) and asks the driver for
  their device address. The probes need host and device to agree on that address (the kernel
  stores through it; the host reads the same bytes): with unified addressing and a GPU that
  can use host pointers for registered memory it is the host address itself. Where the driver
  answers otherwise, or anything fails, the pages are given back to the reservation and the
  worker takes a pinned torch buffer as without the pool (``fixed_buffer`` returns None and
  says why in ``last_miss``): its IR then differs per run and is compiled afresh.

A fresh run worker (a cold `cutedebug run`) reserves the same kind of range at one fixed
address, ``FIXED_AT``, the same in every process (``reserve(FIXED_AT)``, before CUDA starts;
where that range is taken, no reservation: today's pinned buffer). Its probed IR is then the same
from one cold run to the next, and the compile can be reused from the user's cache folder
(engine/compile_cache.py: user_folder).

A buffer larger than the reservation (grids beyond what sized_for_grid allows) takes the same
fallback. Outside a pool worker or a fresh run worker there is no reservation and nothing here
runs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable
from typing import Any

# Above sized_for_grid's largest buffer (16 MiB of records + 16 MiB of beacons + header).
RESERVE_BYTES = 64 << 20
PAGE = mmap.PAGESIZE
_PROT_NONE, _PROT_RW = 0, mmap.PROT_READ | mmap.PROT_WRITE
_MAP_PRIVATE, _MAP_ANON, _MAP_FIXED = mmap.MAP_PRIVATE, mmap.MAP_ANONYMOUS, 0x10
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
# Linux >= 4.17: map there or fail, never over a mapping (older kernels take it as a hint,
# which the address check below catches)
_MAP_FIXED_NOREPLACE = 0x100000
# 96 TiB: far above a process's heap (PIE binaries and their brk sit near 85 TiB) and far below
# the shared-library and mmap area that grows down from near 128 TiB
FIXED_AT = 0x600000000000
_MAP_FAILED = ctypes.c_void_p(-1).value

_reserved: tuple[int, int] | None = None  # (address, bytes), inherited by forked workers
_taken = False  # this process mapped its buffer over the reservation already
last_miss = ""  # why the latest fixed_buffer call returned None


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return libc


def _mmap(addr: int, size: int, prot: int, flags: int) -> int:
    libc = _libc()
    got = libc.mmap(ctypes.c_void_p(addr or None), size, prot, flags, -1, 0)
    if got is None or got == _MAP_FAILED:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return int(got)


def reserve(at: int | None = None, nbytes: int = RESERVE_BYTES) -> int | None:
    """Reserve the probe buffers' address range, once per process; returns its address, or
    None where it could not be had (workers then take today's pinned buffer).

    - ``at`` None: anywhere (the pool's server, before it forks: every worker inherits it).
    - ``at`` an address (a fresh run worker, before CUDA starts: ``FIXED_AT``, the same in
      every process): there or nowhere; ``last_miss`` says why where that range is taken or
      the kernel would place it elsewhere."""
    global _reserved, last_miss
    if _reserved is None:
        flags = _MAP_PRIVATE | _MAP_ANON | _MAP_NORESERVE
        try:
            got = _mmap(at or 0, nbytes, _PROT_NONE, flags | (_MAP_FIXED_NOREPLACE if at else 0))
        except OSError as e:
            if at:
                last_miss = f"no fixed probe buffer: the range at {at:#x} is taken ({e})"
            return None
        if at and got != at:  # a kernel without MAP_FIXED_NOREPLACE placed it elsewhere
            _libc().munmap(ctypes.c_void_p(got), nbytes)
            last_miss = f"no fixed probe buffer: the kernel placed the range at {got:#x}"
            return None
        _reserved = (got, nbytes)
    return _reserved[0]


def reserved() -> tuple[int, int] | None:
    return _reserved


def _round_up(n: int) -> int:
    return -(-n // PAGE) * PAGE


def map_pages(nbytes: int) -> tuple[int, int]:
    """Fresh zeroed private pages over the start of the reservation: (address, bytes).
    OSError when there is no reservation, it is too small, or it is taken already."""
    global _taken
    if _reserved is None:
        raise OSError("no reservation (not a warm pool worker)")
    addr, room = _reserved
    size = _round_up(max(nbytes, 1))
    if size > room:
        raise OSError(f"{nbytes} bytes exceed the {room}-byte reservation")
    if _taken:
        raise OSError("this process mapped its probe buffer already")
    got = _mmap(addr, size, _PROT_RW, _MAP_PRIVATE | _MAP_ANON | _MAP_FIXED)
    if got != addr:  # MAP_FIXED either maps there or fails
        raise OSError(f"mapped at {got:#x}, not {addr:#x}")
    _taken = True
    return addr, size


def unmap_pages(size: int) -> None:
    """Give pages taken by map_pages back to the reservation (PROT_NONE again)."""
    global _taken
    if _reserved is None:
        return
    addr, _ = _reserved
    _mmap(addr, size, _PROT_NONE, _MAP_PRIVATE | _MAP_ANON | _MAP_FIXED | _MAP_NORESERVE)
    _taken = False


def cuda_register(addr: int, size: int) -> int:
    """Page-lock ``size`` bytes at ``addr`` for the GPU of the current context and return
    their device address (RuntimeError naming the call that failed)."""
    import cuda.bindings.driver as drv

    flags = drv.CU_MEMHOSTREGISTER_DEVICEMAP | drv.CU_MEMHOSTREGISTER_PORTABLE
    (err,) = drv.cuMemHostRegister(addr, size, flags)
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuMemHostRegister: {err.name}")
    err, dptr = drv.cuMemHostGetDevicePointer(addr, 0)
    if err != drv.CUresult.CUDA_SUCCESS:
        drv.cuMemHostUnregister(addr)
        raise RuntimeError(f"cuMemHostGetDevicePointer: {err.name}")
    dev = int(dptr)
    if dev != addr:
        drv.cuMemHostUnregister(addr)
    return dev


def fixed_buffer(
    nbytes: int, register: Callable[[int, int], int] = cuda_register
) -> tuple[Any, int] | None:
    """The probe buffer at the reservation's address: (a uint8 torch tensor over it, the
    address), registered with the GPU through ``register(addr, size) -> device address``.
    None (``last_miss`` says why) when it cannot be had with device address == host address;
    the caller then allocates as it did before."""
    global last_miss
    last_miss = ""
    try:
        addr, size = map_pages(nbytes)
    except OSError as e:
        last_miss = f"no fixed probe buffer: {e}"
        return None
    try:
        dev = register(addr, size)
    except Exception as e:  # noqa: BLE001  (any driver refusal: today's pinned buffer)
        unmap_pages(size)
        last_miss = f"no fixed probe buffer: {e}"
        return None
    if dev != addr:
        unmap_pages(size)
        last_miss = (
            f"no fixed probe buffer: the device address {dev:#x} of registered host memory "
            f"is not its host address {addr:#x}"
        )
        return None
    import torch

    view = (ctypes.c_uint8 * nbytes).from_address(addr)
    return torch.frombuffer(view, dtype=torch.uint8), addr
