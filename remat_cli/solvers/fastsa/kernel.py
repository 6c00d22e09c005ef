"""The compiled hot loop of FastSA (Imanishi et al., NeurIPS'23, ``papers/fastsa.txt``).

Everything here is numba-compiled with ``cache=True``; :mod:`remat_cli.solvers.fastsa.solver` does the
set-up, node grouping, stopping and decoding in Python and calls :func:`sa_chunk` for fixed-size
chunks of iterations.

State (§2.2). The sequence ``seq[0..T)`` holds a node index or ``NOP`` (-1) at every time step.
For every node ``n`` we keep the sorted production times ``P_n`` (the times ``t`` with
``seq[t] == n``) and the sorted use times ``U_n`` (the times a consumer of ``n`` runs). Memory is
folded to one block per node (``NodeView``): the block of ``n`` is live over one interval per
production ``p_k`` (Fig. 2, the function L_S of §2.1), which with the simulator's rule "free after
the last use before the next production" is

    [p_k, e_k],  e_k = max(p_k, last use u with p_k < u < p_{k+1})

and ``e_k = T - 1`` for the last production of a graph output (it stays live to the end). The
memory at time ``t`` is the sum of the blocks whose interval contains ``t`` plus the node
intermediate memory (workspace) of ``seq[t]`` (App. B.1). It lives in a range-add / range-max
segment tree (§2.1.1) so that M(S) is the root, and every add / remove of a node changes O(deg)
intervals by the four cases of §2.2.1 (no update, extend/shrink, split, merge), each one
``seg_add`` in O(log T).

The optional range-add / range-logaddexp tree (App. C.2) runs beside the max tree: leaves start at
a large negative constant, a node added at ``t`` adds the constant back at ``t``, sizes are
rescaled so that the largest block is 10, and the base is 2, all as in App. C.2. It then gives the
"soft" peak used in the objective; feasibility is always judged on the exact max tree.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

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


@njit(cache=True, error_model="numpy")
def _rand(rng: np.ndarray) -> np.uint64:
    x = rng[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    rng[0] = x
    return x * np.uint64(2685821657736338717)


@njit(cache=True, error_model="numpy")
def _below(r: np.uint64, n: int) -> int:
    """A number in [0, n) from the top 32 bits of r (Lemire's multiply-shift, no division)."""
    return np.int64(((r >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(cache=True, error_model="numpy")
def _unit(r: np.uint64) -> float:
    return float(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------------------------------------
# range-add / range-max segment tree (§2.1.1)
# and the optional range-add / range-logaddexp tree (App. C.2) with the same layout


@njit(cache=True, error_model="numpy")
def _lae2(a: float, b: float) -> float:
    """logaddexp in base 2 (App. C.2)."""
    if a >= b:
        return a + math.log2(1.0 + math.exp2(b - a))
    return b + math.log2(1.0 + math.exp2(a - b))


@njit(cache=True, error_model="numpy")
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
            lz[2 * l0] = _lae2(lz[4 * l0], lz[4 * l0 + 2]) + lz[2 * l0 + 1]
        if r0 != l0:
            a = tz[4 * r0]
            b = tz[4 * r0 + 2]
            v = (a if a > b else b) + tz[2 * r0 + 1]
            changed = changed or v != tz[2 * r0]
            tz[2 * r0] = v
            if lse:
                lz[2 * r0] = _lae2(lz[4 * r0], lz[4 * r0 + 2]) + lz[2 * r0 + 1]
        if not changed and not lse and level > levels:
            return


@njit(cache=True, error_model="numpy")
def _lse_leaf(lz: np.ndarray, S: int, t: int, x: float) -> None:
    """Add x at one leaf of the logaddexp tree only (the nop constant of App. C.2)."""
    p = t + S
    lz[2 * p] += x
    while p > 1:
        p >>= 1
        lz[2 * p] = _lae2(lz[4 * p], lz[4 * p + 2]) + lz[2 * p + 1]


# ---------------------------------------------------------------------------------------------
# sorted small arrays


@njit(cache=True, error_model="numpy")
def _lower(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    """First index i in [lo, hi) with a[i] >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True, error_model="numpy")
def _insert(a: np.ndarray, base: int, count: int, idx: int, x: int) -> None:
    i = base + count
    while i > idx:
        a[i] = a[i - 1]
        i -= 1
    a[idx] = x


@njit(cache=True, error_model="numpy")
def _delete(a: np.ndarray, base: int, count: int, idx: int) -> None:
    end = base + count - 1
    i = idx
    while i < end:
        a[i] = a[i + 1]
        i += 1


# ---------------------------------------------------------------------------------------------
# lifetime intervals (§2.2.1)


@njit(cache=True, error_model="numpy")
def _end(q: int, k: int, NI: np.ndarray, PU: np.ndarray, T: int) -> int:
    """End e_k of the k-th production interval [p_k, e_k] of node q's block."""
    pb = NI[q, PB]
    p = PU[pb + k]
    ub = NI[q, UB]
    if k + 1 < NI[q, NP]:
        j = _lower(PU, ub, ub + NI[q, NU], PU[pb + k + 1]) - 1
    else:
        if NI[q, FL] & KEEP:
            return T - 1
        j = ub + NI[q, NU] - 1  # the last production: every use is before T, no search
    if j >= ub and PU[j] > p:
        return PU[j]
    return p


@njit(cache=True, error_model="numpy")
def _locate(n: int, t: int, T: int, NI: np.ndarray, PU: np.ndarray) -> tuple[int, int, int, int, int]:
    """Where time t falls among n's productions: (PB, NP, index k of the first production >= t,
    block size, end of the production interval before it or 0 when k = 0)."""
    pb = NI[n, PB]
    npn = NI[n, NP]
    k = _lower(PU, pb, pb + npn, t) - pb
    e_prev = 0
    if k > 0:
        e_prev = _end(n, k - 1, NI, PU, T)
    return pb, npn, k, NI[n, MEM], e_prev


@njit(cache=True, error_model="numpy")
def _add(n: int, t: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
         pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
         occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
         istate: np.ndarray) -> None:  # fmt: skip
    """Insert node n at the nop slot t (mutation 1 of §2.2), updating intervals and the tree."""
    pb, npn, k, m, e_old = _locate(n, t, T, NI, PU)
    _insert(PU, pb, npn, pb + k, t)
    NI[n, NP] = npn + 1
    if k > 0:
        # case 2/3: the previous interval now ends at its last use before t
        e_prev = _end(n, k - 1, NI, PU, T)
        if e_prev < e_old:
            seg_add(tz, lz, lscale, S, e_prev + 1, e_old + 1, -m)
    e_new = _end(n, k, NI, PU, T)
    seg_add(tz, lz, lscale, S, t, e_new + 1, m)
    # inputs: t becomes a use of every predecessor's production before t (extend, case 2)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        j = _lower(PU, qb, qb + NI[q, NP], t) - qb - 1
        e = _end(q, j, NI, PU, T)
        if e < t:
            seg_add(tz, lz, lscale, S, e + 1, t + 1, NI[q, MEM])
        ub = NI[q, UB]
        nu = NI[q, NU]
        _insert(PU, ub, nu, _lower(PU, ub, ub + nu, t), t)
        NI[q, NU] = nu + 1
    # node-intermediate memory at its compute instant (App. B.1)
    seg_add(tz, lz, lscale, S, t, t + 1, NX[n, WS])
    if lz.shape[0] > 0:
        _lse_leaf(lz, S, t, LSE_BIG)
    seq[t] = n
    c = istate[I_NOCC]
    occ[c] = t
    occpos[t] = c
    istate[I_NOCC] = c + 1
    fstate[F_COST] += cost[n]


@njit(cache=True, error_model="numpy")
def _remove(n: int, t: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
            pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
            occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
            istate: np.ndarray) -> None:  # fmt: skip
    """Replace node n at slot t by nop (mutation 2 of §2.2), the exact inverse of _add."""
    pb, npn, k, m, e_prev_old = _locate(n, t, T, NI, PU)
    e_cur = _end(n, k, NI, PU, T)
    seg_add(tz, lz, lscale, S, t, e_cur + 1, -m)
    _delete(PU, pb, npn, pb + k)
    NI[n, NP] = npn - 1
    if k > 0:
        # case 4: the previous interval takes over the uses up to the next production
        e_prev = _end(n, k - 1, NI, PU, T)
        if e_prev > e_prev_old:
            seg_add(tz, lz, lscale, S, e_prev_old + 1, e_prev + 1, m)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        j = _lower(PU, qb, qb + NI[q, NP], t) - qb - 1
        e_old = _end(q, j, NI, PU, T)
        ub = NI[q, UB]
        nu = NI[q, NU]
        _delete(PU, ub, nu, _lower(PU, ub, ub + nu, t))
        NI[q, NU] = nu - 1
        if e_old == t:  # t was the last use: shrink (case 2)
            e_new = _end(q, j, NI, PU, T)
            seg_add(tz, lz, lscale, S, e_new + 1, e_old + 1, -NI[q, MEM])
    seg_add(tz, lz, lscale, S, t, t + 1, -NX[n, WS])
    if lz.shape[0] > 0:
        _lse_leaf(lz, S, t, -LSE_BIG)
    seq[t] = NOP
    c = istate[I_NOCC] - 1
    pos = occpos[t]
    last = occ[c]
    occ[pos] = last
    occpos[last] = pos
    occpos[t] = -1
    istate[I_NOCC] = c
    fstate[F_COST] -= cost[n]


@njit(cache=True, error_model="numpy")
def _span_diff(tz: np.ndarray, lz: np.ndarray, lscale: float, S: int, m: int, ev_t: np.ndarray,
               ev_d: np.ndarray, ne: int) -> None:  # fmt: skip
    """Apply m times the coverage difference given as ne events (time, +1/-1 from that time on):
    sorted, swept, and every maximal run of equal non-zero difference becomes one seg_add."""
    for i in range(1, ne):  # insertion sort: at most 8 events
        a, b = ev_t[i], ev_d[i]
        j = i - 1
        while j >= 0 and ev_t[j] > a:
            ev_t[j + 1] = ev_t[j]
            ev_d[j + 1] = ev_d[j]
            j -= 1
        ev_t[j + 1] = a
        ev_d[j + 1] = b
    level = 0
    run_start = 0
    i = 0
    while i < ne:
        t = ev_t[i]
        new_level = level
        while i < ne and ev_t[i] == t:
            new_level += ev_d[i]
            i += 1
        if new_level != level:
            if level != 0:
                seg_add(tz, lz, lscale, S, run_start, t, level * m)
            run_start = t
            level = new_level


@njit(cache=True, error_model="numpy")
def _event_span(ev_t: np.ndarray, ev_d: np.ndarray, ne: int, lo: int, hi: int, sign: int) -> int:
    """Record coverage `sign` over [lo, hi) as two events for _span_diff; the new event count."""
    ev_t[ne] = lo
    ev_d[ne] = sign
    ev_t[ne + 1] = hi
    ev_d[ne + 1] = -sign
    return ne + 2


@njit(cache=True, error_model="numpy")
def _move_end(tz: np.ndarray, lz: np.ndarray, lscale: float, S: int, e: int, f: int, m: int) -> None:
    """An interval of size m that ended at e now ends at f: cover or uncover the difference."""
    if f > e:
        seg_add(tz, lz, lscale, S, e + 1, f + 1, m)
    elif f < e:
        seg_add(tz, lz, lscale, S, f + 1, e + 1, -m)


@njit(cache=True, error_model="numpy")
def _move(n: int, t1: int, t2: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
          pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
          occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
          istate: np.ndarray) -> None:  # fmt: skip
    """Rotation (mutation 3 of §2.2): node n from slot t1 to the nop slot t2.

    The same state as ``_add(n, t2)`` then ``_remove(n, t1)`` (the occ bookkeeping and the cost
    arithmetic included, so that the SA's trajectory is bit for bit the same), but when no other
    production of n lies between t1 and t2 the production keeps its rank, so only the intervals
    of that production and the one before it change (§2.2.1): their old and new coverage is
    diffed and applied in one or two range-adds instead of four, and each input's use list is
    shifted in place. Otherwise it falls back to the add and the remove.
    """
    pb = NI[n, PB]
    npn = NI[n, NP]
    k = _lower(PU, pb, pb + npn, t1) - pb
    if t2 > t1:
        same = k + 1 >= npn or PU[pb + k + 1] > t2
    else:
        same = k == 0 or PU[pb + k - 1] < t2
    if not same:
        _add(n, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        _remove(n, t1, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        return
    ev_t = np.empty(8, dtype=np.int64)
    ev_d = np.empty(8, dtype=np.int64)
    ne = 0
    # the old intervals of productions k-1 and k leave, the new ones (after PU moves) come in
    if k > 0:
        ne = _event_span(ev_t, ev_d, ne, PU[pb + k - 1], _end(n, k - 1, NI, PU, T) + 1, -1)
    ne = _event_span(ev_t, ev_d, ne, t1, _end(n, k, NI, PU, T) + 1, -1)
    PU[pb + k] = t2
    if k > 0:
        ne = _event_span(ev_t, ev_d, ne, PU[pb + k - 1], _end(n, k - 1, NI, PU, T) + 1, 1)
    ne = _event_span(ev_t, ev_d, ne, t2, _end(n, k, NI, PU, T) + 1, 1)
    _span_diff(tz, lz, lscale, S, NI[n, MEM], ev_t, ev_d, ne)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        nq = NI[q, NP]
        j1 = _lower(PU, qb, qb + nq, t1) - qb - 1
        j2 = _lower(PU, qb, qb + nq, t2) - qb - 1
        e1 = _end(q, j1, NI, PU, T)
        e2 = _end(q, j2, NI, PU, T) if j2 != j1 else e1
        ub = NI[q, UB]
        nu = NI[q, NU]
        a = _lower(PU, ub, ub + nu, t1)  # the use t1 itself
        if t2 > t1:
            while a + 1 < ub + nu and PU[a + 1] < t2:
                PU[a] = PU[a + 1]
                a += 1
        else:
            while a > ub and PU[a - 1] > t2:
                PU[a] = PU[a - 1]
                a -= 1
        PU[a] = t2
        mq = NI[q, MEM]
        _move_end(tz, lz, lscale, S, e1, _end(q, j1, NI, PU, T), mq)
        if j2 != j1:
            _move_end(tz, lz, lscale, S, e2, _end(q, j2, NI, PU, T), mq)
    ws = NX[n, WS]
    if ws != 0:
        seg_add(tz, lz, lscale, S, t2, t2 + 1, ws)
        seg_add(tz, lz, lscale, S, t1, t1 + 1, -ws)
    if lz.shape[0] > 0:
        _lse_leaf(lz, S, t2, LSE_BIG)
        _lse_leaf(lz, S, t1, -LSE_BIG)
    seq[t2] = n
    seq[t1] = NOP
    pos = occpos[t1]
    occ[pos] = t2
    occpos[t2] = pos
    occpos[t1] = -1
    c = fstate[F_COST] + cost[n]  # as _add then _remove would round it
    fstate[F_COST] = c - cost[n]


@njit(cache=True, error_model="numpy")
def do_add(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """_add on the packed state (for tests and callers outside the loop)."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    _add(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@njit(cache=True, error_model="numpy")
def do_remove(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """_remove on the packed state."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    _remove(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@njit(cache=True, error_model="numpy")
def do_move(prob, st, n: int, t1: int, t2: int) -> None:  # noqa: ANN001
    """_move on the packed state."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    _move(n, t1, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@njit(cache=True, error_model="numpy")
def can_move(prob, st, n: int, t1: int, t2: int) -> bool:  # noqa: ANN001
    """The §2.2 rotation condition on the packed state (t2 must also be a nop slot)."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    return seq[t2] == NOP and _can_move(n, t1, t2, T, NI, PU, pred_idx)


# ---------------------------------------------------------------------------------------------
# validity conditions of §2.2


@njit(cache=True, error_model="numpy")
def _inputs_ready(n: int, t: int, NI: np.ndarray, PU: np.ndarray, pred_idx: np.ndarray) -> bool:
    """Add condition: every input of n is produced before time t."""
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        if NI[q, NP] == 0 or PU[NI[q, PB]] >= t:
            return False
    return True


@njit(cache=True, error_model="numpy")
def _no_use_between(n: int, a: int, b: int, NI: np.ndarray, PU: np.ndarray) -> bool:
    ub = NI[n, UB]
    end = ub + NI[n, NU]
    i = _lower(PU, ub, end, a + 1)
    return i >= end or PU[i] >= b


@njit(cache=True, error_model="numpy")
def _can_remove(n: int, t: int, T: int, NI: np.ndarray, PU: np.ndarray) -> bool:
    """Remove condition: the output of n_t is produced before t, or nothing uses it before its
    next production (and a graph output keeps at least one production)."""
    pb = NI[n, PB]
    if PU[pb] < t:
        return True
    if NI[n, NP] == 1:
        if NI[n, FL] & KEEP:
            return False
        nxt = T
    else:
        nxt = PU[pb + 1]
    return _no_use_between(n, t, nxt, NI, PU)


@njit(cache=True, error_model="numpy")
def _can_move(n: int, t1: int, t2: int, T: int, NI: np.ndarray, PU: np.ndarray, pred_idx: np.ndarray) -> bool:
    """Rotation (mutation 3) = add at t2 then remove at t1; valid iff both steps are."""
    if not _inputs_ready(n, t2, NI, PU, pred_idx):
        return False
    pb = NI[n, PB]
    if PU[pb] < t1 or t2 < t1:
        return True
    nxt = PU[pb + 1] if NI[n, NP] > 1 else T
    if t2 < nxt:
        nxt = t2
    return _no_use_between(n, t1, nxt, NI, PU)


# ---------------------------------------------------------------------------------------------
# objective


@njit(cache=True, error_model="numpy")
def objective(M: float, C: float, B: float, mode: int, sharp: float = 100.0, over: float = 1.0) -> float:
    """f(S). mode 0: eq. (1) max(budget, M)·C. mode 1 (footnote 2 of §3.1):
    L(Elu(L⁻¹(M)))·C^0.6 with L linear, L(0) = budget, L(-sharp) = 0 (the paper: sharp = 100);
    above the budget this is M·C^0.6, below it B·(1 + (exp(sharp·(M/B - 1)) - 1)/sharp).
    ``over`` > 1 steepens the part above the budget to (B + over·(M - B))·C^0.6 (the paper: 1;
    the footnote notes that its objective may end above the budget, which this counters).
    mode 2: M alone."""
    if mode == OBJ_MAX:
        return (M if M > B else B) * C
    if mode == OBJ_ELU:
        x = sharp * (M / B - 1.0)
        if x > 0.0:
            lm = B + over * (M - B)
        else:
            lm = B * (1.0 + (math.exp(x) - 1.0) / sharp)
        return lm * C**0.6
    return M


@njit(cache=True, error_model="numpy")
def _peak(tz: np.ndarray, lz: np.ndarray, resident: float, lscale: float) -> tuple[float, float]:
    """(exact M(S), the M used by the objective: exact, or the logaddexp soft peak)."""
    m = float(tz[2]) + resident
    if lz.shape[0] > 0:
        soft = lz[2] / lscale + resident
        return m, (soft if soft > m else m)
    return m, m


# ---------------------------------------------------------------------------------------------
# the SA loop (Fig. 3)


@njit(cache=True, error_model="numpy")
def sa_chunk(prob, st, n_iters: int, budget: float, resident: float, c_floor: float, mode: int,
             h: float, h_ratio: float, p_add: float, p_remove: float, stop_at_budget: bool,
             local: float, sharp: float, over: float) -> int:  # fmt: skip
    """Run up to n_iters SA iterations from the current state; returns the number run.

    Each iteration draws one mutation of §2.2 (add with probability p_add, remove with p_remove,
    otherwise rotate), skips it when the §2.2 validity conditions fail, else applies it, evaluates
    f(S') from the segment-tree root and the running cost, and keeps it by the Metropolis rule at
    temperature h (multiplied by h_ratio every iteration: the exponential schedule of App. D.4);
    a rejected mutation is undone by its inverse.

    With probability ``local`` the times are drawn where the mutation can be valid and useful instead of
    uniformly over [0, T) (a deviation from §2.2 that only changes the proposal distribution):
    an add of n goes uniformly between a use u of n (drawn uniformly) and the production of n
    that u reads, i.e. a recomputation just before some use; a rotation moves n uniformly
    between the first productions of its inputs and the first use of n after t1 (or T), which
    is exactly the window where the §2.2 conditions can hold. Every accepted change is journalled (log_t,
    log_n) and the journal positions of the best feasible state (least cost with M <= budget,
    then least M) and of the least-peak state are recorded, so that the caller can rebuild them.
    """
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    n_add = add_list.shape[0]
    mask = T - 1
    n = 0
    t = 0
    t1 = 0
    t2 = 0
    kind = ADD
    m_exact, m_obj = _peak(tz, lz, resident, lscale)
    f = objective(m_obj, fstate[F_COST] + c_floor, budget, mode, sharp, over)
    it = 0
    while it < n_iters:
        it += 1
        h *= h_ratio
        r = _rand(rng)
        u = _unit(_rand(rng))
        nocc = istate[I_NOCC]
        if u < p_add:
            kind = ADD
            if n_add == 0:
                continue
            n = add_list[_below(r, n_add)]
            if local > 0.0 and NI[n, NU] > 0 and NI[n, NP] > 0 and _unit(_rand(rng)) < local:
                ub = NI[n, UB]
                u_t = PU[ub + _below(_rand(rng), NI[n, NU])]
                pb = NI[n, PB]
                lo = PU[_lower(PU, pb, pb + NI[n, NP], u_t) - 1]
                if u_t - lo < 2:
                    continue
                t = lo + 1 + _below(_rand(rng), u_t - lo - 1)
            else:
                t = np.int64(r & np.uint64(mask))
            if seq[t] != NOP or NI[n, NP] + 1 >= NX[n, PCAP] or not _inputs_ready(n, t, NI, PU, pred_idx):
                continue
            _add(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        elif u < p_add + p_remove:
            kind = REMOVE
            if nocc == 0:
                continue
            t = occ[_below(r, nocc)]
            n = seq[t]
            if not (NI[n, FL] & ADDREM) or not _can_remove(n, t, T, NI, PU):
                continue
            _remove(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        else:
            kind = ROTATE
            if nocc == 0:
                continue
            t1 = occ[_below(r, nocc)]
            n = seq[t1]
            if local > 0.0 and _unit(_rand(rng)) < local:
                lo = -1
                for i in range(NI[n, PS], NI[n, PE]):
                    q = pred_idx[i]
                    if NI[q, NP] > 0 and PU[NI[q, PB]] > lo:
                        lo = PU[NI[q, PB]]
                hi = T
                ub = NI[n, UB]
                nu = NI[n, NU]
                j = _lower(PU, ub, ub + nu, t1 + 1)
                if j < ub + nu:
                    hi = PU[j]
                if hi - lo < 3:
                    continue
                t2 = lo + 1 + _below(_rand(rng), hi - lo - 1)
            else:
                t2 = np.int64(r & np.uint64(mask))
            if seq[t2] != NOP or not _can_move(n, t1, t2, T, NI, PU, pred_idx):
                continue
            _move(n, t1, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)  # fmt: skip
        istate[I_VALID] += 1
        m_exact, m_obj = _peak(tz, lz, resident, lscale)
        c = fstate[F_COST]
        f_new = objective(m_obj, c + c_floor, budget, mode, sharp, over)
        d = f_new - f
        if d <= 0.0 or (h > 0.0 and _unit(_rand(rng)) < math.exp(-d / h)):
            f = f_new
            istate[I_ACCEPTED] += 1
            ll = istate[I_LOG_LEN]
            if kind == ADD:
                log_t[ll] = t
                log_n[ll] = n
                ll += 1
            elif kind == REMOVE:
                log_t[ll] = t
                log_n[ll] = NOP
                ll += 1
            else:
                log_t[ll] = t2
                log_n[ll] = n
                log_t[ll + 1] = t1
                log_n[ll + 1] = NOP
                ll += 2
            istate[I_LOG_LEN] = ll
            if m_exact <= budget:
                tol = 1e-9 * abs(c)
                bc = fstate[F_BEST_FEAS_COST]
                if c < bc - tol or (c <= bc + tol and m_exact < fstate[F_BEST_FEAS_PEAK]):
                    fstate[F_BEST_FEAS_COST] = c
                    fstate[F_BEST_FEAS_PEAK] = m_exact
                    istate[I_MARK_FEAS] = ll
            if m_exact < fstate[F_BEST_PEAK] or (
                m_exact == fstate[F_BEST_PEAK] and c < fstate[F_BEST_PEAK_COST] - 1e-9 * abs(c)
            ):
                fstate[F_BEST_PEAK] = m_exact
                fstate[F_BEST_PEAK_COST] = c
                istate[I_MARK_PEAK] = ll
            if stop_at_budget and m_exact <= budget:
                istate[I_MET] = 1
                break
        else:
            if kind == ADD:
                _remove(
                    n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
                )
            elif kind == REMOVE:
                _add(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
            else:
                _move(n, t2, t1, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate,
                      istate)  # fmt: skip
    fstate[F_OBJ] = f
    fstate[F_TEMP] = h
    return it


@njit(cache=True, error_model="numpy")
def polish(prob, st, limit: float) -> int:  # noqa: ANN001
    """Greedy removal of redundant computations from the final sequence; returns how many.

    Not in the paper: the SA's last state may still hold copies that are never needed (free to
    run, e.g. zero-cost reshapes, so the cold stage has no reason to drop them) or whose removal
    would now keep M(S) within ``limit`` (kernel units, without the resident bytes). Every
    occupied slot of a node that runs more than once is tried, the costliest first, by the
    remove mutation of §2.2 under its validity condition; a removal is kept when the peak stays
    at most ``limit``, so the cost never rises and the peak never exceeds the limit. Passes repeat
    until one removes nothing. Deterministic (no random numbers).
    """
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    removed = 0
    while True:
        cand = np.empty(T, dtype=np.int64)
        key = np.empty(T, dtype=np.float64)
        m = 0
        for t in range(T):
            n = seq[t]
            if n != NOP and (NI[n, FL] & ADDREM) and NI[n, NP] > 1:
                cand[m] = t
                key[m] = -cost[n] - 1e-12 * t  # costliest first, later slots first among equals
                m += 1
        if m == 0:
            break
        order = np.argsort(key[:m], kind="mergesort")
        progress = 0
        for i in range(m):
            t = cand[order[i]]
            n = seq[t]
            if n == NOP or NI[n, NP] < 2 or not _can_remove(n, t, T, NI, PU):
                continue
            _remove(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
            if float(tz[2]) <= limit:
                progress += 1
            else:
                _add(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        removed += progress
        if progress == 0:
            break
    return removed


# ---------------------------------------------------------------------------------------------
# building a state from a sequence (initialisation, re-spacing, and the tests' full recomputation)


@njit(cache=True, error_model="numpy")
def rebuild(prob, st) -> None:  # noqa: ANN001
    """Recompute every derived array of st from its seq alone, in O(T + sum of intervals).

    NI's static columns (PB, UB, MEM, PS, PE, FL) must be set; NP, NU, PU, occ, the trees and
    the cost are recomputed.
    """
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    K = NI.shape[0]
    NI[:, NP] = 0
    NI[:, NU] = 0
    occpos[:] = -1
    nocc = 0
    c = 0.0
    for t in range(T):
        n = seq[t]
        if n == NOP:
            continue
        PU[NI[n, PB] + NI[n, NP]] = t
        NI[n, NP] += 1
        for i in range(NI[n, PS], NI[n, PE]):
            q = pred_idx[i]
            PU[NI[q, UB] + NI[q, NU]] = t
            NI[q, NU] += 1
        occ[nocc] = t
        occpos[t] = nocc
        nocc += 1
        c += cost[n]
    diff = np.zeros(T + 1, dtype=np.int64)
    for q in range(K):
        for k in range(NI[q, NP]):
            p = PU[NI[q, PB] + k]
            e = _end(q, k, NI, PU, T)
            diff[p] += NI[q, MEM]
            diff[e + 1] -= NI[q, MEM]
    run = 0
    for t in range(T):
        run += diff[t]
        n = seq[t]
        tz[2 * (S + t)] = run + (NX[n, WS] if n != NOP else 0)
        tz[2 * (S + t) + 1] = 0
    for p in range(S - 1, 0, -1):
        a = tz[4 * p]
        b = tz[4 * p + 2]
        tz[2 * p] = a if a > b else b
        tz[2 * p + 1] = 0
    if lz.shape[0] > 0:
        for t in range(T):
            lz[2 * (S + t)] = tz[2 * (S + t)] * lscale + (0.0 if seq[t] != NOP else -LSE_BIG)
            lz[2 * (S + t) + 1] = 0.0
        for p in range(S - 1, 0, -1):
            lz[2 * p] = _lae2(lz[4 * p], lz[4 * p + 2])
            lz[2 * p + 1] = 0.0
    istate[I_NOCC] = nocc
    fstate[F_COST] = c


@njit(cache=True, error_model="numpy")
def apply_log(seq: np.ndarray, log_t: np.ndarray, log_n: np.ndarray, upto: int) -> None:
    for i in range(upto):
        seq[log_t[i]] = log_n[i]


@njit(cache=True, error_model="numpy")
def spread(order: np.ndarray, T: int) -> np.ndarray:
    """Place a compact sequence evenly in T slots with nops between (App. D.4: t = i/(k+1)·T)."""
    seq = np.full(T, NOP, dtype=np.int32)
    k = order.shape[0]
    for i in range(k):
        seq[((i + 1) * T) // (k + 1)] = order[i]
    return seq
