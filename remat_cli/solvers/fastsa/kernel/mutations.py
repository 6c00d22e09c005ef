"""The three mutations of §2.2 (add, remove, rotate) and their validity conditions, for FastSA.

Each mutation updates the production and use times of the nodes it touches, the lifetime
intervals of their blocks by the four cases of §2.2.1 (no update, extend/shrink, split, merge) and,
through ``seg_add``, the segment trees; a rejected mutation is undone by its inverse. The
``do_*`` and ``can_move`` wrappers take the packed state, for the tests and for callers outside
the SA loop (:mod:`remat_cli.solvers.fastsa.kernel.anneal`).
"""

from __future__ import annotations

import numpy as np

from remat_cli.solvers.fastsa.kernel.structures import (
    ADDREM,
    F_COST,
    FL,
    I_NOCC,
    KEEP,
    LSE_BIG,
    MEM,
    NOP,
    NP,
    NU,
    PB,
    PCAP,
    PE,
    PS,
    UB,
    WS,
    jit,
    lower_bound,
    lse_leaf,
    seg_add,
    sorted_delete,
    sorted_insert,
)

# ---------------------------------------------------------------------------------------------
# lifetime intervals (§2.2.1)


@jit
def interval_end(q: int, k: int, NI: np.ndarray, PU: np.ndarray, T: int) -> int:
    """End e_k of the k-th production interval [p_k, e_k] of node q's block."""
    pb = NI[q, PB]
    p = PU[pb + k]
    ub = NI[q, UB]
    if k + 1 < NI[q, NP]:
        j = lower_bound(PU, ub, ub + NI[q, NU], PU[pb + k + 1]) - 1
    else:
        if NI[q, FL] & KEEP:
            return T - 1
        j = ub + NI[q, NU] - 1  # the last production: every use is before T, no search
    if j >= ub and PU[j] > p:
        return PU[j]
    return p


@jit
def _locate(n: int, t: int, T: int, NI: np.ndarray, PU: np.ndarray) -> tuple[int, int, int, int, int]:
    """Where time t falls among n's productions: (PB, NP, index k of the first production >= t,
    block size, end of the production interval before it or 0 when k = 0)."""
    pb = NI[n, PB]
    npn = NI[n, NP]
    k = lower_bound(PU, pb, pb + npn, t) - pb
    e_prev = 0
    if k > 0:
        e_prev = interval_end(n, k - 1, NI, PU, T)
    return pb, npn, k, NI[n, MEM], e_prev


@jit
def add_node(n: int, t: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
         pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
         occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
         istate: np.ndarray) -> None:  # fmt: skip
    """Insert node n at the nop slot t (mutation 1 of §2.2), updating intervals and the tree."""
    pb, npn, k, m, e_old = _locate(n, t, T, NI, PU)
    sorted_insert(PU, pb, npn, pb + k, t)
    NI[n, NP] = npn + 1
    if k > 0:
        # case 2/3: the previous interval now ends at its last use before t
        e_prev = interval_end(n, k - 1, NI, PU, T)
        if e_prev < e_old:
            seg_add(tz, lz, lscale, S, e_prev + 1, e_old + 1, -m)
    e_new = interval_end(n, k, NI, PU, T)
    seg_add(tz, lz, lscale, S, t, e_new + 1, m)
    # inputs: t becomes a use of every predecessor's production before t (extend, case 2)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        j = lower_bound(PU, qb, qb + NI[q, NP], t) - qb - 1
        e = interval_end(q, j, NI, PU, T)
        if e < t:
            seg_add(tz, lz, lscale, S, e + 1, t + 1, NI[q, MEM])
        ub = NI[q, UB]
        nu = NI[q, NU]
        sorted_insert(PU, ub, nu, lower_bound(PU, ub, ub + nu, t), t)
        NI[q, NU] = nu + 1
    # node-intermediate memory at its compute instant (App. B.1)
    seg_add(tz, lz, lscale, S, t, t + 1, NX[n, WS])
    if lz.shape[0] > 0:
        lse_leaf(lz, S, t, LSE_BIG)
    seq[t] = n
    c = istate[I_NOCC]
    occ[c] = t
    occpos[t] = c
    istate[I_NOCC] = c + 1
    fstate[F_COST] += cost[n]


@jit
def remove_node(n: int, t: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
            pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
            occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
            istate: np.ndarray) -> None:  # fmt: skip
    """Replace node n at slot t by nop (mutation 2 of §2.2), the exact inverse of add_node."""
    pb, npn, k, m, e_prev_old = _locate(n, t, T, NI, PU)
    e_cur = interval_end(n, k, NI, PU, T)
    seg_add(tz, lz, lscale, S, t, e_cur + 1, -m)
    sorted_delete(PU, pb, npn, pb + k)
    NI[n, NP] = npn - 1
    if k > 0:
        # case 4: the previous interval takes over the uses up to the next production
        e_prev = interval_end(n, k - 1, NI, PU, T)
        if e_prev > e_prev_old:
            seg_add(tz, lz, lscale, S, e_prev_old + 1, e_prev + 1, m)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        j = lower_bound(PU, qb, qb + NI[q, NP], t) - qb - 1
        e_old = interval_end(q, j, NI, PU, T)
        ub = NI[q, UB]
        nu = NI[q, NU]
        sorted_delete(PU, ub, nu, lower_bound(PU, ub, ub + nu, t))
        NI[q, NU] = nu - 1
        if e_old == t:  # t was the last use: shrink (case 2)
            e_new = interval_end(q, j, NI, PU, T)
            seg_add(tz, lz, lscale, S, e_new + 1, e_old + 1, -NI[q, MEM])
    seg_add(tz, lz, lscale, S, t, t + 1, -NX[n, WS])
    if lz.shape[0] > 0:
        lse_leaf(lz, S, t, -LSE_BIG)
    seq[t] = NOP
    c = istate[I_NOCC] - 1
    pos = occpos[t]
    last = occ[c]
    occ[pos] = last
    occpos[last] = pos
    occpos[t] = -1
    istate[I_NOCC] = c
    fstate[F_COST] -= cost[n]


@jit
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


@jit
def _event_span(ev_t: np.ndarray, ev_d: np.ndarray, ne: int, lo: int, hi: int, sign: int) -> int:
    """Record coverage `sign` over [lo, hi) as two events for _span_diff; the new event count."""
    ev_t[ne] = lo
    ev_d[ne] = sign
    ev_t[ne + 1] = hi
    ev_d[ne + 1] = -sign
    return ne + 2


@jit
def _move_end(tz: np.ndarray, lz: np.ndarray, lscale: float, S: int, e: int, f: int, m: int) -> None:
    """An interval of size m that ended at e now ends at f: cover or uncover the difference."""
    if f > e:
        seg_add(tz, lz, lscale, S, e + 1, f + 1, m)
    elif f < e:
        seg_add(tz, lz, lscale, S, f + 1, e + 1, -m)


@jit
def move_node(n: int, t1: int, t2: int, T: int, S: int, lscale: float, NI: np.ndarray, PU: np.ndarray,
          pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray, occ: np.ndarray,
          occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
          istate: np.ndarray) -> None:  # fmt: skip
    """Rotation (mutation 3 of §2.2): node n from slot t1 to the nop slot t2.

    The same state as ``add_node(n, t2)`` then ``remove_node(n, t1)`` (the occ bookkeeping and the cost
    arithmetic included, so that the SA's trajectory is bit for bit the same), but when no other
    production of n lies between t1 and t2 the production keeps its rank, so only the intervals
    of that production and the one before it change (§2.2.1): their old and new coverage is
    diffed and applied in one or two range-adds instead of four, and each input's use list is
    shifted in place. Otherwise it falls back to the add and the remove.
    """
    pb = NI[n, PB]
    npn = NI[n, NP]
    k = lower_bound(PU, pb, pb + npn, t1) - pb
    if t2 > t1:
        same = k + 1 >= npn or PU[pb + k + 1] > t2
    else:
        same = k == 0 or PU[pb + k - 1] < t2
    if not same:
        add_node(n, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        remove_node(n, t1, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        return
    ev_t = np.empty(8, dtype=np.int64)
    ev_d = np.empty(8, dtype=np.int64)
    ne = 0
    # the old intervals of productions k-1 and k leave, the new ones (after PU moves) come in
    if k > 0:
        ne = _event_span(ev_t, ev_d, ne, PU[pb + k - 1], interval_end(n, k - 1, NI, PU, T) + 1, -1)
    ne = _event_span(ev_t, ev_d, ne, t1, interval_end(n, k, NI, PU, T) + 1, -1)
    PU[pb + k] = t2
    if k > 0:
        ne = _event_span(ev_t, ev_d, ne, PU[pb + k - 1], interval_end(n, k - 1, NI, PU, T) + 1, 1)
    ne = _event_span(ev_t, ev_d, ne, t2, interval_end(n, k, NI, PU, T) + 1, 1)
    _span_diff(tz, lz, lscale, S, NI[n, MEM], ev_t, ev_d, ne)
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        qb = NI[q, PB]
        nq = NI[q, NP]
        j1 = lower_bound(PU, qb, qb + nq, t1) - qb - 1
        j2 = lower_bound(PU, qb, qb + nq, t2) - qb - 1
        e1 = interval_end(q, j1, NI, PU, T)
        e2 = interval_end(q, j2, NI, PU, T) if j2 != j1 else e1
        ub = NI[q, UB]
        nu = NI[q, NU]
        a = lower_bound(PU, ub, ub + nu, t1)  # the use t1 itself
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
        _move_end(tz, lz, lscale, S, e1, interval_end(q, j1, NI, PU, T), mq)
        if j2 != j1:
            _move_end(tz, lz, lscale, S, e2, interval_end(q, j2, NI, PU, T), mq)
    ws = NX[n, WS]
    if ws != 0:
        seg_add(tz, lz, lscale, S, t2, t2 + 1, ws)
        seg_add(tz, lz, lscale, S, t1, t1 + 1, -ws)
    if lz.shape[0] > 0:
        lse_leaf(lz, S, t2, LSE_BIG)
        lse_leaf(lz, S, t1, -LSE_BIG)
    seq[t2] = n
    seq[t1] = NOP
    pos = occpos[t1]
    occ[pos] = t2
    occpos[t2] = pos
    occpos[t1] = -1
    c = fstate[F_COST] + cost[n]  # as add_node then remove_node would round it
    fstate[F_COST] = c - cost[n]


@jit
def do_add(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """add_node on the packed state (for tests and callers outside the loop)."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    add_node(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@jit
def do_remove(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """remove_node on the packed state."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    remove_node(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@jit
def do_move(prob, st, n: int, t1: int, t2: int) -> None:  # noqa: ANN001
    """move_node on the packed state."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    move_node(n, t1, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


@jit
def can_move(prob, st, n: int, t1: int, t2: int) -> bool:  # noqa: ANN001
    """The §2.2 rotation condition on the packed state (t2 must also be a nop slot)."""
    T, S, lscale, NX, cost, pred_idx, add_list = prob
    seq, occ, occpos, NI, PU, tz, lz, fstate, istate, rng, log_t, log_n = st
    return seq[t2] == NOP and move_valid(n, t1, t2, T, NI, PU, pred_idx)


# ---------------------------------------------------------------------------------------------
# validity conditions of §2.2


@jit
def inputs_ready(n: int, t: int, NI: np.ndarray, PU: np.ndarray, pred_idx: np.ndarray) -> bool:
    """Add condition: every input of n is produced before time t."""
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        if NI[q, NP] == 0 or PU[NI[q, PB]] >= t:
            return False
    return True


@jit
def _no_use_between(n: int, a: int, b: int, NI: np.ndarray, PU: np.ndarray) -> bool:
    ub = NI[n, UB]
    end = ub + NI[n, NU]
    i = lower_bound(PU, ub, end, a + 1)
    return i >= end or PU[i] >= b


@jit
def can_remove(n: int, t: int, T: int, NI: np.ndarray, PU: np.ndarray) -> bool:
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


@jit
def move_valid(
    n: int, t1: int, t2: int, T: int, NI: np.ndarray, PU: np.ndarray, pred_idx: np.ndarray
) -> bool:
    """Rotation (mutation 3) = add at t2 then remove at t1; valid iff both steps are."""
    if not inputs_ready(n, t2, NI, PU, pred_idx):
        return False
    pb = NI[n, PB]
    if PU[pb] < t1 or t2 < t1:
        return True
    nxt = PU[pb + 1] if NI[n, NP] > 1 else T
    if t2 < nxt:
        nxt = t2
    return _no_use_between(n, t1, nxt, NI, PU)


# ---------------------------------------------------------------------------------------------
# recomputation chains (a deviation from §2.2)


@jit
def plan_chain(n: int, t: int, max_extra: int, T: int, NI: np.ndarray, PU: np.ndarray,
                pred_idx: np.ndarray, NX: np.ndarray, seq: np.ndarray, ch_n: np.ndarray,
                ch_t: np.ndarray) -> int:  # fmt: skip
    """Plan the recomputation of the inputs an add of n at t would otherwise keep alive.

    An add of n at t extends every input whose block is freed before t (its interval of §2.2.1
    ends before t) up to t. On ONNX training graphs the inputs of a backward op are recomputed
    through chains of many small ops (Gemm -> Relu -> Gemm ..., Conv -> BatchNorm -> Relu), and
    a chain only lowers the peak once it is complete: every single add on the way only moves
    the block it recomputes onto its input, at the same memory and a higher cost, so the SA of
    §2.2 has to cross a long uphill or neutral walk per chain, and on a peak plateau several
    chains at once. Here each such dead, recomputable input q of a node of the chain is planned
    at the latest nop slot below the chain so far (so every planned node precedes its consumers),
    breadth first, until ``max_extra`` nodes are planned or every input is live or resident. The
    plan is ``ch_n[:k]``, ``ch_t[:k]`` with strictly decreasing slots; it is applied in
    increasing slot order, each add checked by the §2.2 conditions, and accepted or undone as
    one mutation (the acceptance rule is unchanged). Returns k.
    """
    k = 0
    cursor = t
    head = 0  # ch_n[head:k] are planned but their inputs not yet examined; (n, t) first
    m = n
    s = t
    while True:
        for i in range(NI[m, PS], NI[m, PE]):
            if k >= max_extra:
                return k
            q = pred_idx[i]
            if not (NI[q, FL] & ADDREM):
                continue
            qb = NI[q, PB]
            j = lower_bound(PU, qb, qb + NI[q, NP], s) - qb - 1
            if j < 0:
                continue  # not produced before s: the add is invalid anyway
            if interval_end(q, j, NI, PU, T) >= s:
                continue  # live at s
            planned = False
            copies = 0
            for r in range(k):
                if ch_n[r] == q:
                    copies += 1
                    if ch_t[r] < s:
                        planned = True
            if planned or NI[q, NP] + copies + 1 >= NX[q, PCAP]:
                continue
            lo = PU[qb + j]
            z = cursor - 1
            while z > lo and seq[z] != NOP:
                z -= 1
            if z <= lo:
                continue
            ch_n[k] = q
            ch_t[k] = z
            k += 1
            cursor = z
        if head >= k:
            return k
        m = ch_n[head]
        s = ch_t[head]
        head += 1


@jit
def remove_chain(n: int, t: int, max_extra: int, T: int, S: int, lscale: float, NI: np.ndarray,
                  PU: np.ndarray, pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray,
                  occ: np.ndarray, occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
                  istate: np.ndarray, ch_n: np.ndarray, ch_t: np.ndarray) -> int:  # fmt: skip
    """After n was removed from t: remove the computations of its inputs that no longer have a use
    (the production before t of a recomputable input, not its only one, whose interval of §2.2.1
    is now [p, p]), then theirs, up to ``max_extra``; the inverse of an add with its chain (see
    :func:`plan_chain`). Each removal is applied at once (``ch_n[:k]``, ``ch_t[:k]`` in order,
    undone in the reverse order by ``add_node``). Returns k."""
    k = 0
    head = 0
    m = n
    s = t
    while True:
        for i in range(NI[m, PS], NI[m, PE]):
            if k >= max_extra:
                return k
            q = pred_idx[i]
            npq = NI[q, NP]
            if not (NI[q, FL] & ADDREM) or npq < 2:
                continue
            qb = NI[q, PB]
            j = lower_bound(PU, qb, qb + npq, s) - qb - 1
            if j < 0:
                continue
            p = PU[qb + j]
            if interval_end(q, j, NI, PU, T) != p or not can_remove(q, p, T, NI, PU):
                continue  # still used (a kept output's last production ends at T - 1)
            remove_node(
                q, p, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
            )
            ch_n[k] = q
            ch_t[k] = p
            k += 1
        if head >= k:
            return k
        m = ch_n[head]
        s = ch_t[head]
        head += 1
