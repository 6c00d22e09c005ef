"""The best-fit placement loop of `memory_plan`, compiled (numba): it runs hundreds of times per
MODeL solve (perturbed orders, the plateau walk), where the numpy version took 4 ms for the 203
buffers of an exported VGG-11 step and 30 ms for 891 (ResNet-18). Imported lazily by
`memory_plan`, so that commands which never place buffers do not load numba.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def best_fit_kernel(
    start: np.ndarray, end: np.ndarray, size: np.ndarray, order: np.ndarray, offset: np.ndarray
) -> np.ndarray:
    """Place the buffers of `order` in turn (buffer i live over [start[i], end[i]), `size[i]`
    bytes) at the bottom of the tightest gap left by the placed buffers live at the same time,
    or on top of them all. `offset` holds the fixed buffers' offsets and -1 for the others;
    returns the filled copy."""
    return _fit(start, end, size, order, offset, False)


@njit(cache=True)
def first_fit_kernel(
    start: np.ndarray, end: np.ndarray, size: np.ndarray, order: np.ndarray, offset: np.ndarray
) -> np.ndarray:
    """`best_fit_kernel`, but each buffer goes into the lowest gap it fits, not the tightest: what
    `plateau.joint_walk` re-places with (there it took MobileNet-v2 b1 from 1.44% above its
    order's peak to 0.56% in 60 s, where best fit stayed at 1.39-1.41% with three seeds)."""
    return _fit(start, end, size, order, offset, True)


@njit(cache=True)
def _fit(
    start: np.ndarray, end: np.ndarray, size: np.ndarray, order: np.ndarray, offset: np.ndarray, lowest: bool
) -> np.ndarray:
    offset = offset.copy()
    n = len(start)
    lo = np.empty(n, dtype=np.int64)
    hi = np.empty(n, dtype=np.int64)
    for i in order:
        if size[i] == 0:
            offset[i] = 0
            continue
        m = 0
        for j in range(n):
            if offset[j] >= 0 and size[j] > 0 and start[j] < end[i] and start[i] < end[j]:
                lo[m] = offset[j]
                hi[m] = offset[j] + size[j]
                m += 1
        if m == 0:
            offset[i] = 0
            continue
        by_lo = np.argsort(lo[:m], kind="mergesort")
        reach = 0  # top of everything below the current interval
        best_gap = -1
        chosen = -1
        for k in by_lo:
            gap = lo[k] - reach
            if gap >= size[i] and (best_gap < 0 or gap < best_gap):
                best_gap = gap
                chosen = reach
                if lowest:
                    break
            if hi[k] > reach:
                reach = hi[k]
        offset[i] = chosen if chosen >= 0 else reach
    return offset


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel on a two-buffer case: the first call after
    an install compiles for seconds (2.5 s on one core), which must not come out of a solve's
    time limit (a MODeL solve of 3 s then stopped its stages elsewhere than the next run, and
    seeded runs differed)."""
    one = np.ones(2, dtype=np.int64)
    for kernel in (best_fit_kernel, first_fit_kernel):
        kernel(np.zeros(2, dtype=np.int64), one * 2, one, np.arange(2, dtype=np.int64), -one)
