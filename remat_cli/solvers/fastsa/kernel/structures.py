"""The state's layout and its data structures, for the FastSA kernels (Imanishi et al., NeurIPS'23).

The layout of the packed state (columns of the per-node table, slots of the scalar state), the
random numbers, the range-add / range-max segment tree of §2.1.1 with the optional range-add /
range-logaddexp tree of App. C.2 beside it, and the sorted small arrays that hold production and
use times. The package docstring (:mod:`remat_cli.solvers.fastsa.kernel`) describes the state.
"""

from __future__ import annotations

import numpy as np

from remat_cli.util.numba_cache import package_njit

#: ``numba.njit(cache=True)`` for every kernel of this package: its cache entries are stamped with
#: all the package's files, since the kernels call each other across them (remat_cli.util.numba_cache)
jit = package_njit(error_model="numpy")
#: the same without the runtime's reference counting (numba ``_nrt=False``), for the parts of one
#: annealing iteration (anneal.py): they allocate nothing, and counting references to the state's
#: arrays on every call would slow the loop that calls them
helper_jit = package_njit(error_model="numpy", _nrt=False)

NOP = -1

#: mutation kinds of §2.2
ADD, REMOVE, ROTATE = 0, 1, 2

#: objectives: eq. (1), footnote 2 of §3.1, and plain M(S)
OBJ_MAX, OBJ_ELU, OBJ_MEMORY = 0, 1, 2

#: App. C.2: the large negative constant of nop leaves in the logaddexp tree
LSE_BIG = 4096.0

# columns of the per-node table NI (one 64-byte row per node, so that a node's bookkeeping is one
# cache line): where its production times and use times start in PU, its block size, its
# predecessor range in pred_idx, its production and use counts, and flags
PB, UB, MEM, PS, PE, NP, NU, FL = 0, 1, 2, 3, 4, 5, 6, 7
KEEP, ADDREM = 1, 2
# columns of NX: workspace, capacity of the production list (one spare for rotations)
WS, PCAP = 0, 1

# fstate slots
F_COST, F_OBJ, F_BEST_FEAS_COST, F_BEST_PEAK, F_BEST_PEAK_COST, F_TEMP, F_BEST_FEAS_PEAK = 0, 1, 2, 3, 4, 5, 6
F_LEN = 7
# istate slots
I_NOCC, I_LOG_LEN, I_MARK_FEAS, I_MARK_PEAK, I_VALID, I_ACCEPTED, I_MET = 0, 1, 2, 3, 4, 5, 6
I_LEN = 7


# ---------------------------------------------------------------------------------------------
# random numbers: xorshift64* (own state, so a seed fixes the run whatever else uses numba RNG)


@jit
def rand_next(rng: np.ndarray) -> np.uint64:
    x = rng[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    rng[0] = x
    return x * np.uint64(2685821657736338717)


@jit
def rand_below(r: np.uint64, n: int) -> int:
    """A number in [0, n) from the top 32 bits of r (Lemire's multiply-shift, no division)."""
    return np.int64(((r >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@jit
def rand_unit(r: np.uint64) -> float:
    return float(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------------------------------------
# range-add / range-max segment tree (§2.1.1)
# and the optional range-add / range-logaddexp tree (App. C.2) with the same layout


#: log2(1 + 2^-d) for d = k / LAE_STEPS, k = 0 .. LAE_STEPS * LAE_RANGE + 1: the soft peak's
#: logaddexp as a table lookup (its two libm calls were most of the soft kernel's time); linear
#: interpolation errs by at most ln 2 / 4 / (8 LAE_STEPS^2) < 6e-6 of the tree's 10 units, and
#: beyond LAE_RANGE the smaller operand adds less than 2^-LAE_RANGE
LAE_STEPS = 64
LAE_RANGE = 40
LAE_TABLE = np.log2(1.0 + np.exp2(-np.arange(LAE_STEPS * LAE_RANGE + 2) / LAE_STEPS))


@jit
def lae2(a: float, b: float) -> float:
    """logaddexp in base 2 (App. C.2), from ``LAE_TABLE``."""
    if a < b:
        a, b = b, a
    x = (a - b) * LAE_STEPS
    if x >= LAE_STEPS * LAE_RANGE:
        return a
    i = int(x)
    lo = LAE_TABLE[i]
    return a + lo + (x - i) * (LAE_TABLE[i + 1] - lo)


@jit
def seg_add(tz: np.ndarray, lz: np.ndarray, lscale: float, S: int, lo: int, hi: int, x: int) -> None:
    """Add x to A[i] for i in [lo, hi) — O(log T).

    Bottom-up layout, value and pending add of node p side by side for locality: tz[2p] =
    max(tz[4p], tz[4p+2]) + tz[2p+1]; the leaves S..2S-1 hold A. Nodes fully inside the range get
    the add; then the two boundary paths are recomputed towards the root, stopping early once
    above the highest modified level nothing changes any more.
    """
    if lo >= hi or x == 0:
        return
    lse = lz.shape[0] > 0
    xf = x * lscale
    lft = lo + S
    rgt = hi + S
    l0 = lft
    r0 = rgt - 1
    levels = 0
    while lft < rgt:
        if lft & 1:
            tz[2 * lft] += x
            tz[2 * lft + 1] += x
            if lse:
                lz[2 * lft] += xf
                lz[2 * lft + 1] += xf
            lft += 1
        if rgt & 1:
            rgt -= 1
            tz[2 * rgt] += x
            tz[2 * rgt + 1] += x
            if lse:
                lz[2 * rgt] += xf
                lz[2 * rgt + 1] += xf
        lft >>= 1
        rgt >>= 1
        levels += 1
    level = 0
    while l0 > 1:
        l0 >>= 1
        r0 >>= 1
        level += 1
        a = tz[4 * l0]
        b = tz[4 * l0 + 2]
        v = (a if a > b else b) + tz[2 * l0 + 1]
        changed = v != tz[2 * l0]
        tz[2 * l0] = v
        if lse:
            lz[2 * l0] = lae2(lz[4 * l0], lz[4 * l0 + 2]) + lz[2 * l0 + 1]
        if r0 != l0:
            a = tz[4 * r0]
            b = tz[4 * r0 + 2]
            v = (a if a > b else b) + tz[2 * r0 + 1]
            changed = changed or v != tz[2 * r0]
            tz[2 * r0] = v
            if lse:
                lz[2 * r0] = lae2(lz[4 * r0], lz[4 * r0 + 2]) + lz[2 * r0 + 1]
        if not changed and not lse and level > levels:
            return


@jit
def lse_leaf(lz: np.ndarray, S: int, t: int, x: float) -> None:
    """Add x at one leaf of the logaddexp tree only (the nop constant of App. C.2)."""
    p = t + S
    lz[2 * p] += x
    while p > 1:
        p >>= 1
        lz[2 * p] = lae2(lz[4 * p], lz[4 * p + 2]) + lz[2 * p + 1]


# ---------------------------------------------------------------------------------------------
# sorted small arrays


@jit
def lower_bound(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    """First index i in [lo, hi) with a[i] >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@jit
def sorted_insert(a: np.ndarray, base: int, count: int, idx: int, x: int) -> None:
    i = base + count
    while i > idx:
        a[i] = a[i - 1]
        i -= 1
    a[idx] = x


@jit
def sorted_delete(a: np.ndarray, base: int, count: int, idx: int) -> None:
    end = base + count - 1
    i = idx
    while i < end:
        a[i] = a[i + 1]
        i += 1
