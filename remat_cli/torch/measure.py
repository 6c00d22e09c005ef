"""A training step's peak memory on the CPU, measured as ``remat run`` measures a replay.

With glibc's mmap threshold lowered (:func:`~remat_cli.runtime.session.lower_mmap_threshold`,
before the model is built) every tensor of 64 KiB or more is its own mapping, returned to the
system when freed, so the process's resident high-water mark follows the live tensors. The
peak of a step is VmHWM after it minus VmRSS before it (VmHWM reset through
``/proc/self/clear_refs``): the bytes it added above what was resident (parameters, inputs).
"""

from __future__ import annotations

import ctypes
import gc
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from remat_cli.runtime.session import MMAP_THRESHOLD, hwm, lower_mmap_threshold, reset_hwm

__all__ = ["lower_mmap_threshold", "heap_plugged", "step_peak", "train_step"]


#: glibc's chunk header: the size word before the user pointer, and its "mmapped" bit
_SIZE_SZ = ctypes.sizeof(ctypes.c_size_t)
_IS_MMAPPED = 0x2


@contextmanager
def heap_plugged() -> Iterator[None]:
    """Inside, every allocation of the mmap threshold or more is its own mapping, and the
    heap's free pages are no longer resident.

    glibc serves a large request from a free heap chunk that fits before it considers mmap,
    and compiling leaves megabytes of free chunks in the heap: a tensor placed there, on pages
    already resident, would not raise the high-water mark, and one freed there would not lower
    the resident set. So every free chunk of the threshold or more (the top chunk included) is
    taken, untouched, until ``malloc`` answers with a mapping; ``malloc_trim`` then returns the
    free pages of what remains. The chunks are given back on exit."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        yield
        return
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    held: list[int] = []
    try:
        while True:
            ptr = libc.malloc(MMAP_THRESHOLD - 2 * _SIZE_SZ)
            if not ptr:
                break
            if ctypes.c_size_t.from_address(ptr - _SIZE_SZ).value & _IS_MMAPPED:
                libc.free(ptr)
                break
            held.append(ptr)
        libc.malloc_trim(0)
        yield
    finally:
        for ptr in held:
            libc.free(ptr)


def train_step(model: torch.nn.Module, step: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> float:
    """One training step: gradients reset to None, the loss, its backward; returns the loss."""
    model.zero_grad(set_to_none=True)
    loss = step(*inputs)
    loss.backward()
    return float(loss.detach())


def step_peak(
    model: torch.nn.Module, step: Callable[..., torch.Tensor], *inputs: torch.Tensor
) -> tuple[int, float, float]:
    """(peak bytes above the pre-step baseline, wall seconds, the thread's CPU seconds) of one
    :func:`train_step`; the baseline is read after the gradients are dropped."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    with heap_plugged():
        base = reset_hwm()
        start, cpu = time.perf_counter(), time.thread_time()
        train_step(model, step, *inputs)
        seconds, cpu = time.perf_counter() - start, time.thread_time() - cpu
        peak = hwm() - base
    return peak, seconds, cpu


def allocated_peak(model: torch.nn.Module, step: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> int:
    """The most bytes PyTorch's CPU allocator held at once during one :func:`train_step`,
    above what it held before: the live tensors and every kernel's scratch, free of the
    system allocator's behaviour (read from the profiler's memory events)."""
    from torch._C._autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    model.zero_grad(set_to_none=True)
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        train_step(model, step, *inputs)
    events = prof.profiler.kineto_results.events()
    live = peak = 0
    memory = [e for e in events if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    for e in sorted(memory, key=lambda e: e.start_ns()):
        live += e.nbytes()
        peak = max(peak, live)
    return peak
