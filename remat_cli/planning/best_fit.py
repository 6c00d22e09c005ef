"""The best-fit placement loop of `memory_plan`, compiled (numba): it runs hundreds of times per
MODeL solve (perturbed orders, the plateau walk) and tens of thousands in the joint walk, where
a numpy loop over hundreds of buffers costs milliseconds a call. Imported lazily by `memory_plan`, so that commands which never place buffers do not
load numba.
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
    `plateau.joint_walk` re-places with: lifted buffers packed low leave the top free, where best
    fit's tight gaps strand them higher up."""
    return _fit(start, end, size, order, offset, True)


@njit(cache=True)
def _fit(
    start: np.ndarray, end: np.ndarray, size: np.ndarray, order: np.ndarray, offset: np.ndarray, lowest: bool
) -> np.ndarray:
    # The placed buffers are kept sorted by offset, so each buffer's gaps come from one scan in
    # address order, not from collecting its overlaps and sorting them (several times faster on
    # the joint walk's moves over thousands of buffers)
    offset = offset.copy()
    n = len(start)
    placed = np.empty(n + len(order), dtype=np.int64)  # room for a fixed buffer placed again
    fixed = np.nonzero((offset >= 0) & (size > 0))[0]
    count = len(fixed)
    placed[:count] = fixed[np.argsort(offset[fixed], kind="mergesort")]
    for i in order:
        if size[i] == 0:
            offset[i] = 0
            continue
        reach = 0  # top of everything below the current gap
        best_gap = -1
        chosen = -1
        for q in range(count):
            j = placed[q]
            if start[j] < end[i] and start[i] < end[j]:
                gap = offset[j] - reach
                if gap >= size[i] and (best_gap < 0 or gap < best_gap):
                    best_gap = gap
                    chosen = reach
                    if lowest:
                        break
                top = offset[j] + size[j]
                if top > reach:
                    reach = top
        at = chosen if chosen >= 0 else reach
        offset[i] = at
        # insert i after every placed buffer at or below its offset
        q = count
        while q > 0 and offset[placed[q - 1]] > at:
            placed[q] = placed[q - 1]
            q -= 1
        placed[q] = i
        count += 1
    return offset


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernel on a two-buffer case: the first call after
    an install compiles for seconds, which must not come out of a solve's time limit (a short
    MODeL solve would then stop its stages elsewhere than the next run, and seeded runs differ)."""
    one = np.ones(2, dtype=np.int64)
    for kernel in (best_fit_kernel, first_fit_kernel):
        kernel(np.zeros(2, dtype=np.int64), one * 2, one, np.arange(2, dtype=np.int64), -one)
