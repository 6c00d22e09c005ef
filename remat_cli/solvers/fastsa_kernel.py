"""The compiled hot loop of FastSA (Imanishi et al., NeurIPS'23, ``papers/fastsa.txt``).

Everything here is numba-compiled with ``cache=True``; :mod:`remat_cli.solvers.fastsa` does the
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

# fstate slots
F_COST, F_OBJ, F_BEST_FEAS_COST, F_BEST_PEAK, F_BEST_PEAK_COST, F_TEMP, F_BEST_FEAS_PEAK = 0, 1, 2, 3, 4, 5, 6
F_LEN = 7
# istate slots
I_NOCC, I_LOG_LEN, I_MARK_FEAS, I_MARK_PEAK, I_VALID, I_ACCEPTED, I_MET = 0, 1, 2, 3, 4, 5, 6
I_LEN = 7


# ---------------------------------------------------------------------------------------------
# random numbers: xorshift64* (own state, so a seed fixes the run whatever else uses numba RNG)


@njit(cache=True)
def _rand(rng: np.ndarray) -> np.uint64:
    x = rng[0]
    x ^= x >> np.uint64(12)
    x ^= x << np.uint64(25)
    x ^= x >> np.uint64(27)
    rng[0] = x
    return x * np.uint64(2685821657736338717)


@njit(cache=True)
def _below(r: np.uint64, n: int) -> int:
    """A number in [0, n) from the top 32 bits of r (Lemire's multiply-shift, no division)."""
    return np.int64(((r >> np.uint64(32)) * np.uint64(n)) >> np.uint64(32))


@njit(cache=True)
def _unit(r: np.uint64) -> float:
    return float(r >> np.uint64(11)) * (1.0 / 9007199254740992.0)


# ---------------------------------------------------------------------------------------------
# range-add / range-max segment tree (§2.1.1), bottom-up: tr[p] = max(tr[2p], tr[2p+1]) + td[p]
# and the optional range-add / range-logaddexp tree (App. C.2) with the same layout


@njit(cache=True)
def _lae2(a: float, b: float) -> float:
    """logaddexp in base 2 (App. C.2)."""
    if a >= b:
        return a + math.log2(1.0 + math.exp2(b - a))
    return b + math.log2(1.0 + math.exp2(a - b))


@njit(cache=True)
def seg_add(tr: np.ndarray, td: np.ndarray, lt: np.ndarray, ld: np.ndarray, lscale: float, S: int,
            lo: int, hi: int, x: int) -> None:  # fmt: skip
    """Add x to A[i] for i in [lo, hi) — O(log T)."""
    if lo >= hi or x == 0:
        return
    lse = lt.shape[0] > 0
    xf = x * lscale
    l = lo + S
    r = hi + S
    l0 = l >> 1
    r0 = (r - 1) >> 1
    while l < r:
        if l & 1:
            tr[l] += x
            td[l] += x
            if lse:
                lt[l] += xf
                ld[l] += xf
            l += 1
        if r & 1:
            r -= 1
            tr[r] += x
            td[r] += x
            if lse:
                lt[r] += xf
                ld[r] += xf
        l >>= 1
        r >>= 1
    while l0 >= 1:
        a = tr[2 * l0]
        b = tr[2 * l0 + 1]
        tr[l0] = (a if a > b else b) + td[l0]
        if lse:
            lt[l0] = _lae2(lt[2 * l0], lt[2 * l0 + 1]) + ld[l0]
        if r0 != l0:
            a = tr[2 * r0]
            b = tr[2 * r0 + 1]
            tr[r0] = (a if a > b else b) + td[r0]
            if lse:
                lt[r0] = _lae2(lt[2 * r0], lt[2 * r0 + 1]) + ld[r0]
        l0 >>= 1
        r0 >>= 1


@njit(cache=True)
def _lse_leaf(lt: np.ndarray, ld: np.ndarray, S: int, t: int, x: float) -> None:
    """Add x at one leaf of the logaddexp tree only (the nop constant of App. C.2)."""
    p = t + S
    lt[p] += x
    ld[p] += x
    p >>= 1
    while p >= 1:
        lt[p] = _lae2(lt[2 * p], lt[2 * p + 1]) + ld[p]
        p >>= 1


# ---------------------------------------------------------------------------------------------
# sorted small arrays


@njit(cache=True)
def _lower(a: np.ndarray, lo: int, hi: int, x: int) -> int:
    """First index i in [lo, hi) with a[i] >= x (hi if none)."""
    while lo < hi:
        mid = (lo + hi) >> 1
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit(cache=True)
def _insert(a: np.ndarray, base: int, count: int, idx: int, x: int) -> None:
    i = base + count
    while i > idx:
        a[i] = a[i - 1]
        i -= 1
    a[idx] = x


@njit(cache=True)
def _delete(a: np.ndarray, base: int, count: int, idx: int) -> None:
    end = base + count - 1
    i = idx
    while i < end:
        a[i] = a[i + 1]
        i += 1


# ---------------------------------------------------------------------------------------------
# lifetime intervals (§2.2.1)


@njit(cache=True)
def _end(q: int, k: int, P: np.ndarray, pbase: np.ndarray, nprod: np.ndarray, U: np.ndarray,
         ubase: np.ndarray, nuse: np.ndarray, keep: np.ndarray, T: int) -> int:  # fmt: skip
    """End e_k of the k-th production interval [p_k, e_k] of node q's block."""
    pb = pbase[q]
    p = P[pb + k]
    if k + 1 < nprod[q]:
        nxt = P[pb + k + 1]
    else:
        if keep[q]:
            return T - 1
        nxt = T
    ub = ubase[q]
    j = _lower(U, ub, ub + nuse[q], nxt) - 1
    if j >= ub and U[j] > p:
        return U[j]
    return p


@njit(cache=True)
def do_add(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """Insert node n at the nop slot t (mutation 1 of §2.2), updating intervals and the tree."""
    (T, S, pred_ptr, pred_idx, mem, ws, cost, keep, addrem, add_list, pbase, pcap, ubase, lscale) = prob
    (seq, occ, occpos, P, nprod, U, nuse, tr, td, lt, ld, fstate, istate, rng, log_t, log_n) = st
    pb = pbase[n]
    npn = nprod[n]
    k = _lower(P, pb, pb + npn, t) - pb
    m = mem[n]
    e_old = 0
    if k > 0:
        e_old = _end(n, k - 1, P, pbase, nprod, U, ubase, nuse, keep, T)
    _insert(P, pb, npn, pb + k, t)
    nprod[n] = npn + 1
    if k > 0:
        # case 2/3: the previous interval now ends at its last use before t
        e_prev = _end(n, k - 1, P, pbase, nprod, U, ubase, nuse, keep, T)
        if e_prev < e_old:
            seg_add(tr, td, lt, ld, lscale, S, e_prev + 1, e_old + 1, -m)
    e_new = _end(n, k, P, pbase, nprod, U, ubase, nuse, keep, T)
    seg_add(tr, td, lt, ld, lscale, S, t, e_new + 1, m)
    # inputs: t becomes a use of every predecessor's production before t (extend, case 2)
    for i in range(pred_ptr[n], pred_ptr[n + 1]):
        q = pred_idx[i]
        qb = pbase[q]
        j = _lower(P, qb, qb + nprod[q], t) - qb - 1
        e = _end(q, j, P, pbase, nprod, U, ubase, nuse, keep, T)
        if e < t:
            seg_add(tr, td, lt, ld, lscale, S, e + 1, t + 1, mem[q])
        ub = ubase[q]
        nu = nuse[q]
        _insert(U, ub, nu, _lower(U, ub, ub + nu, t), t)
        nuse[q] = nu + 1
    # node-intermediate memory at its compute instant (App. B.1)
    seg_add(tr, td, lt, ld, lscale, S, t, t + 1, ws[n])
    if lt.shape[0] > 0:
        _lse_leaf(lt, ld, S, t, LSE_BIG)
    seq[t] = n
    c = istate[I_NOCC]
    occ[c] = t
    occpos[t] = c
    istate[I_NOCC] = c + 1
    fstate[F_COST] += cost[n]


@njit(cache=True)
def do_remove(prob, st, n: int, t: int) -> None:  # noqa: ANN001
    """Replace node n at slot t by nop (mutation 2 of §2.2), the exact inverse of do_add."""
    (T, S, pred_ptr, pred_idx, mem, ws, cost, keep, addrem, add_list, pbase, pcap, ubase, lscale) = prob
    (seq, occ, occpos, P, nprod, U, nuse, tr, td, lt, ld, fstate, istate, rng, log_t, log_n) = st
    pb = pbase[n]
    npn = nprod[n]
    k = _lower(P, pb, pb + npn, t) - pb
    m = mem[n]
    e_cur = _end(n, k, P, pbase, nprod, U, ubase, nuse, keep, T)
    e_prev_old = 0
    if k > 0:
        e_prev_old = _end(n, k - 1, P, pbase, nprod, U, ubase, nuse, keep, T)
    seg_add(tr, td, lt, ld, lscale, S, t, e_cur + 1, -m)
    _delete(P, pb, npn, pb + k)
    nprod[n] = npn - 1
    if k > 0:
        # case 4: the previous interval takes over the uses up to the next production
        e_prev = _end(n, k - 1, P, pbase, nprod, U, ubase, nuse, keep, T)
        if e_prev > e_prev_old:
            seg_add(tr, td, lt, ld, lscale, S, e_prev_old + 1, e_prev + 1, m)
    for i in range(pred_ptr[n], pred_ptr[n + 1]):
        q = pred_idx[i]
        qb = pbase[q]
        j = _lower(P, qb, qb + nprod[q], t) - qb - 1
        e_old = _end(q, j, P, pbase, nprod, U, ubase, nuse, keep, T)
        ub = ubase[q]
        nu = nuse[q]
        _delete(U, ub, nu, _lower(U, ub, ub + nu, t))
        nuse[q] = nu - 1
        if e_old == t:  # t was the last use: shrink (case 2)
            e_new = _end(q, j, P, pbase, nprod, U, ubase, nuse, keep, T)
            seg_add(tr, td, lt, ld, lscale, S, e_new + 1, e_old + 1, -mem[q])
    seg_add(tr, td, lt, ld, lscale, S, t, t + 1, -ws[n])
    if lt.shape[0] > 0:
        _lse_leaf(lt, ld, S, t, -LSE_BIG)
    seq[t] = NOP
    c = istate[I_NOCC] - 1
    pos = occpos[t]
    last = occ[c]
    occ[pos] = last
    occpos[last] = pos
    occpos[t] = -1
    istate[I_NOCC] = c
    fstate[F_COST] -= cost[n]


# ---------------------------------------------------------------------------------------------
# validity conditions of §2.2


@njit(cache=True)
def _inputs_ready(prob, st, n: int, t: int) -> bool:  # noqa: ANN001
    """Add condition: every input of n is produced before time t."""
    pred_ptr, pred_idx, pbase = prob[2], prob[3], prob[10]
    P, nprod = st[3], st[4]
    for i in range(pred_ptr[n], pred_ptr[n + 1]):
        q = pred_idx[i]
        if nprod[q] == 0 or P[pbase[q]] >= t:
            return False
    return True


@njit(cache=True)
def _no_use_between(prob, st, n: int, a: int, b: int) -> bool:  # noqa: ANN001
    ubase = prob[12]
    U, nuse = st[5], st[6]
    ub = ubase[n]
    end = ub + nuse[n]
    i = _lower(U, ub, end, a + 1)
    return i >= end or U[i] >= b


@njit(cache=True)
def can_remove(prob, st, n: int, t: int) -> bool:  # noqa: ANN001
    """Remove condition: the output of n_t is produced before t, or nothing uses it before its
    next production (and a graph output keeps at least one production)."""
    T, keep, pbase = prob[0], prob[7], prob[10]
    P, nprod = st[3], st[4]
    pb = pbase[n]
    if P[pb] < t:
        return True
    if nprod[n] == 1:
        if keep[n]:
            return False
        nxt = T
    else:
        nxt = P[pb + 1]
    return _no_use_between(prob, st, n, t, nxt)


@njit(cache=True)
def can_move(prob, st, n: int, t1: int, t2: int) -> bool:  # noqa: ANN001
    """Rotation (mutation 3) = add at t2 then remove at t1; valid iff both steps are."""
    if not _inputs_ready(prob, st, n, t2):
        return False
    pbase = prob[10]
    P, nprod = st[3], st[4]
    pb = pbase[n]
    if P[pb] < t1 or t2 < t1:
        return True
    nxt = P[pb + 1] if nprod[n] > 1 else prob[0]
    if t2 < nxt:
        nxt = t2
    return _no_use_between(prob, st, n, t1, nxt)


# ---------------------------------------------------------------------------------------------
# objective


@njit(cache=True)
def objective(M: float, C: float, B: float, mode: int, lscale: float) -> float:
    """f(S). mode 0: eq. (1) max(budget, M)·C. mode 1 (footnote 2 of §3.1):
    L(Elu(L⁻¹(M)))·C^0.6 with L linear, L(0) = budget, L(-100) = 0. mode 2: M alone."""
    if mode == OBJ_MAX:
        return (M if M > B else B) * C
    if mode == OBJ_ELU:
        x = 100.0 * (M / B - 1.0)
        if x > 0.0:
            lm = M
        else:
            lm = B * (1.0 + (math.exp(x) - 1.0) / 100.0)
        return lm * C**0.6
    return M


@njit(cache=True)
def _peak(st, resident: float, lscale: float) -> tuple[float, float]:  # noqa: ANN001
    """(exact M(S), the M used by the objective: exact, or the logaddexp soft peak)."""
    tr, lt = st[7], st[9]
    m = float(tr[1]) + resident
    if lt.shape[0] > 0:
        soft = lt[1] / lscale + resident
        return m, (soft if soft > m else m)
    return m, m


# ---------------------------------------------------------------------------------------------
# the SA loop (Fig. 3)


@njit(cache=True)
def sa_chunk(prob, st, n_iters: int, budget: float, resident: float, c_floor: float, mode: int,
             h: float, h_ratio: float, p_add: float, p_remove: float, stop_at_budget: bool) -> int:  # fmt: skip
    """Run up to n_iters SA iterations from the current state; returns the number run.

    Each iteration draws one mutation of §2.2 (add with probability p_add, remove with p_remove,
    otherwise rotate), skips it when the §2.2 validity conditions fail, else applies it, evaluates
    f(S') from the segment-tree root and the running cost, and keeps it by the Metropolis rule at
    temperature h (multiplied by h_ratio every iteration: the exponential schedule of App. D.4);
    a rejected mutation is undone by its inverse. Every accepted change is journalled (log_t,
    log_n) and the journal positions of the best feasible state (least cost with M <= budget)
    and of the least-peak state are recorded, so that the caller can rebuild them.
    """
    (T, S, pred_ptr, pred_idx, mem, ws, cost, keep, addrem, add_list, pbase, pcap, ubase, lscale) = prob
    (seq, occ, occpos, P, nprod, U, nuse, tr, td, lt, ld, fstate, istate, rng, log_t, log_n) = st
    n_add = add_list.shape[0]
    mask = T - 1
    n = 0
    t = 0
    t1 = 0
    t2 = 0
    kind = ADD
    m_exact, m_obj = _peak(st, resident, lscale)
    f = objective(m_obj, fstate[F_COST] + c_floor, budget, mode, lscale)
    fstate[F_OBJ] = f
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
            t = np.int64(r & np.uint64(mask))
            if seq[t] != NOP or nprod[n] + 1 >= pcap[n] or not _inputs_ready(prob, st, n, t):
                continue
            do_add(prob, st, n, t)
            t1 = t
            t2 = t
        elif u < p_add + p_remove:
            kind = REMOVE
            if nocc == 0:
                continue
            t = occ[_below(r, nocc)]
            n = seq[t]
            if not addrem[n] or not can_remove(prob, st, n, t):
                continue
            do_remove(prob, st, n, t)
            t1 = t
            t2 = t
        else:
            kind = ROTATE
            if nocc == 0:
                continue
            t1 = occ[_below(r, nocc)]
            t2 = np.int64(r & np.uint64(mask))
            n = seq[t1]
            if seq[t2] != NOP or not can_move(prob, st, n, t1, t2):
                continue
            do_add(prob, st, n, t2)
            do_remove(prob, st, n, t1)
        istate[I_VALID] += 1
        m_exact, m_obj = _peak(st, resident, lscale)
        c = fstate[F_COST]
        f_new = objective(m_obj, c + c_floor, budget, mode, lscale)
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
                do_remove(prob, st, n, t)
            elif kind == REMOVE:
                do_add(prob, st, n, t)
            else:
                do_add(prob, st, n, t1)
                do_remove(prob, st, n, t2)
    fstate[F_OBJ] = f
    fstate[F_TEMP] = h
    return it


# ---------------------------------------------------------------------------------------------
# building a state from a sequence (initialisation, re-spacing, and the tests' full recomputation)


@njit(cache=True)
def rebuild(prob, st) -> None:  # noqa: ANN001
    """Recompute every derived array of st from st's seq alone, in O(T + sum of intervals)."""
    (T, S, pred_ptr, pred_idx, mem, ws, cost, keep, addrem, add_list, pbase, pcap, ubase, lscale) = prob
    (seq, occ, occpos, P, nprod, U, nuse, tr, td, lt, ld, fstate, istate, rng, log_t, log_n) = st
    K = mem.shape[0]
    nprod[:] = 0
    nuse[:] = 0
    occpos[:] = -1
    nocc = 0
    c = 0.0
    for t in range(T):
        n = seq[t]
        if n == NOP:
            continue
        P[pbase[n] + nprod[n]] = t
        nprod[n] += 1
        for i in range(pred_ptr[n], pred_ptr[n + 1]):
            q = pred_idx[i]
            U[ubase[q] + nuse[q]] = t
            nuse[q] += 1
        occ[nocc] = t
        occpos[t] = nocc
        nocc += 1
        c += cost[n]
    diff = np.zeros(T + 1, dtype=np.int64)
    for q in range(K):
        for k in range(nprod[q]):
            p = P[pbase[q] + k]
            e = _end(q, k, P, pbase, nprod, U, ubase, nuse, keep, T)
            diff[p] += mem[q]
            diff[e + 1] -= mem[q]
    run = 0
    for t in range(T):
        run += diff[t]
        n = seq[t]
        tr[S + t] = run + (ws[n] if n != NOP else 0)
    td[:] = 0
    for p in range(S - 1, 0, -1):
        a = tr[2 * p]
        b = tr[2 * p + 1]
        tr[p] = a if a > b else b
    if lt.shape[0] > 0:
        ld[:] = 0.0
        for t in range(T):
            lt[S + t] = tr[S + t] * lscale + (0.0 if seq[t] != NOP else -LSE_BIG)
        for p in range(S - 1, 0, -1):
            lt[p] = _lae2(lt[2 * p], lt[2 * p + 1])
    istate[I_NOCC] = nocc
    fstate[F_COST] = c


@njit(cache=True)
def apply_log(seq: np.ndarray, log_t: np.ndarray, log_n: np.ndarray, upto: int) -> None:
    for i in range(upto):
        seq[log_t[i]] = log_n[i]


@njit(cache=True)
def spread(order: np.ndarray, T: int) -> np.ndarray:
    """Place a compact sequence evenly in T slots with nops between (App. D.4: t = i/(k+1)·T)."""
    seq = np.full(T, NOP, dtype=np.int32)
    k = order.shape[0]
    for i in range(k):
        seq[((i + 1) * T) // (k + 1)] = order[i]
    return seq
