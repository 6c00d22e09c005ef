"""A training step's peak memory on the CPU, measured as ``remat run`` measures a replay.

With glibc's mmap threshold lowered (:func:`~remat_cli.runtime.session.lower_mmap_threshold`,
before the model is built) every tensor of 64 KiB or more is its own mapping, returned to the
system when freed, so the process's resident high-water mark follows the live tensors. The
peak of a step is VmHWM after it minus VmRSS before it (VmHWM reset through
``/proc/self/clear_refs``): the bytes it added above what was resident (parameters, inputs).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import torch

from remat_cli.runtime.session import hwm, lower_mmap_threshold, reset_hwm

__all__ = ["lower_mmap_threshold", "step_peak", "train_step"]


def train_step(model: torch.nn.Module, step: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> float:
    """One training step: gradients reset to None, the loss, its backward; returns the loss."""
    model.zero_grad(set_to_none=True)
    loss = step(*inputs)
    loss.backward()
    return float(loss.detach())


def step_peak(
    model: torch.nn.Module, step: Callable[..., torch.Tensor], *inputs: torch.Tensor
) -> tuple[int, float]:
    """(peak bytes above the pre-step baseline, seconds) of one :func:`train_step`; the
    baseline is read after the gradients are dropped."""
    model.zero_grad(set_to_none=True)
    gc.collect()
    base = reset_hwm()
    start = time.perf_counter()
    train_step(model, step, *inputs)
    seconds = time.perf_counter() - start
    return hwm() - base, seconds
