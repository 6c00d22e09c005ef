"""The SA loop of Fig. 3 and its objective, for FastSA (Imanishi et al., NeurIPS'23).

:func:`sa_chunk` runs a fixed number of iterations of the annealing on the packed state;
:func:`polish` greedily drops redundant computations from a final state; :func:`rebuild` derives
every array of a state from its sequence alone (initialisation, re-spacing between chunks and the
tests' full recomputation).
"""

from __future__ import annotations

import math

import numpy as np

from remat_cli.solvers.fastsa.kernel.mutations import (
    add_node,
    can_remove,
    inputs_ready,
    interval_end,
    move_node,
    move_valid,
    plan_chain,
    remove_chain,
    remove_node,
)
from remat_cli.solvers.fastsa.kernel.structures import (
    ADD,
    ADDREM,
    F_BEST_FEAS_COST,
    F_BEST_FEAS_PEAK,
    F_BEST_PEAK,
    F_BEST_PEAK_COST,
    F_COST,
    F_OBJ,
    F_TEMP,
    FL,
    I_ACCEPTED,
    I_LOG_LEN,
    I_MARK_FEAS,
    I_MARK_PEAK,
    I_MET,
    I_NOCC,
    I_VALID,
    LSE_BIG,
    MEM,
    NOP,
    NP,
    NU,
    OBJ_ELU,
    OBJ_MAX,
    PB,
    PCAP,
    PE,
    PS,
    REMOVE,
    ROTATE,
    UB,
    WS,
    helper_jit,
    jit,
    lae2,
    lower_bound,
    rand_below,
    rand_next,
    rand_unit,
)

# ---------------------------------------------------------------------------------------------
# objective


@jit
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


@jit
def _peak(tz: np.ndarray, lz: np.ndarray, resident: float, lscale: float) -> tuple[float, float]:
    """(exact M(S), the M used by the objective: exact, or the logaddexp soft peak)."""
    m = float(tz[2]) + resident
    if lz.shape[0] > 0:
        soft = lz[2] / lscale + resident
        return m, (soft if soft > m else m)
    return m, m


# ---------------------------------------------------------------------------------------------
# parts of one iteration of sa_chunk (``helper_jit``: no reference counting of the state's arrays
# on each call; they allocate nothing, so the rotation's undo, move_node, stays in sa_chunk)


@helper_jit
def _rotation_window(n: int, t1: int, T: int, NI: np.ndarray, PU: np.ndarray,
                     pred_idx: np.ndarray) -> tuple[int, int]:  # fmt: skip
    """The window (lo, hi) where a rotation of n from t1 can be valid (§2.2): after the first
    productions of its inputs, before the first use of n after t1 (or T).

    With probability ``local`` sa_chunk draws the times of a mutation where it can be valid and
    useful instead of uniformly over [0, T) (a deviation from §2.2 that only changes the proposal
    distribution): an add of n goes uniformly between a use u of n (drawn uniformly) and the
    production of n that u reads, i.e. a recomputation just before some use; a rotation moves n
    uniformly within this window, exactly where the §2.2 conditions can hold."""
    lo = -1
    for i in range(NI[n, PS], NI[n, PE]):
        q = pred_idx[i]
        if NI[q, NP] > 0 and PU[NI[q, PB]] > lo:
            lo = PU[NI[q, PB]]
    hi = T
    ub = NI[n, UB]
    nu = NI[n, NU]
    j = lower_bound(PU, ub, ub + nu, t1 + 1)
    if j < ub + nu:
        hi = PU[j]
    return lo, hi


@helper_jit
def _add_chain(nch: int, ch_n: np.ndarray, ch_t: np.ndarray, T: int, S: int, lscale: float, NI: np.ndarray,
               PU: np.ndarray, pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray, seq: np.ndarray,
               occ: np.ndarray, occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
               istate: np.ndarray) -> bool:  # fmt: skip
    """The recomputation chain of an add (a deviation from §2.2, see
    :func:`~.mutations.plan_chain`), in increasing slots, inputs before their consumers; False,
    with every node of it removed again, where one of them cannot be added.

    With ``chain`` > 0 half of the adds also recompute, just before them, up to a number drawn
    uniformly from [1, chain] of the inputs they would otherwise keep alive (and theirs,
    recursively), and half of the removes also remove up to that many input computations left
    without a use (its inverse, :func:`~.mutations.remove_chain`, so that a chain taken in one
    move can be given back in one); the chain is one mutation, accepted or undone as a whole,
    and journalled as one entry per node."""
    done = 0
    for i in range(nch - 1, -1, -1):
        m = ch_n[i]
        if NI[m, NP] + 1 >= NX[m, PCAP] or not inputs_ready(m, ch_t[i], NI, PU, pred_idx):
            break
        add_node(
            m, ch_t[i], T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
        )
        done += 1
    if done < nch:
        for i in range(nch - done, nch):
            remove_node(ch_n[i], ch_t[i], T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz,
                        lz, fstate, istate)  # fmt: skip
        return False
    return True


@helper_jit
def _journal(log_t: np.ndarray, log_n: np.ndarray, istate: np.ndarray, kind: int, n: int, t: int, t1: int,
             t2: int, nch: int, ch_n: np.ndarray, ch_t: np.ndarray) -> int:  # fmt: skip
    """An accepted mutation journalled (log_t, log_n), one entry per node it adds or removes;
    returns the journal's new length."""
    ll = istate[I_LOG_LEN]
    if kind == ADD:
        for i in range(nch - 1, -1, -1):
            log_t[ll] = ch_t[i]
            log_n[ll] = ch_n[i]
            ll += 1
        log_t[ll] = t
        log_n[ll] = n
        ll += 1
    elif kind == REMOVE:
        log_t[ll] = t
        log_n[ll] = NOP
        ll += 1
        for i in range(nch):
            log_t[ll] = ch_t[i]
            log_n[ll] = NOP
            ll += 1
    else:
        log_t[ll] = t2
        log_n[ll] = n
        log_t[ll + 1] = t1
        log_n[ll + 1] = NOP
        ll += 2
    istate[I_LOG_LEN] = ll
    return ll


@helper_jit
def _mark_bests(fstate: np.ndarray, istate: np.ndarray, m_exact: float, c: float, budget: float,
                ll: int) -> None:  # fmt: skip
    """The journal position `ll` marked as the best feasible state (least cost with M <= budget,
    then least M) and as the least-peak state, where the accepted state is one."""
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


@helper_jit
def _undo(kind: int, n: int, t: int, nch: int, ch_n: np.ndarray, ch_t: np.ndarray, T: int, S: int,
          lscale: float, NI: np.ndarray, PU: np.ndarray, pred_idx: np.ndarray, NX: np.ndarray, cost: np.ndarray,
          seq: np.ndarray, occ: np.ndarray, occpos: np.ndarray, tz: np.ndarray, lz: np.ndarray, fstate: np.ndarray,
          istate: np.ndarray) -> None:  # fmt: skip
    """A rejected add or remove (with its chain) undone by its inverse."""
    if kind == ADD:
        remove_node(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        for i in range(nch):  # decreasing slots: consumers before their inputs
            remove_node(ch_n[i], ch_t[i], T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz,
                        lz, fstate, istate)  # fmt: skip
    else:
        for i in range(nch - 1, -1, -1):  # the exact reverse of the removals
            add_node(ch_n[i], ch_t[i], T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz,
                     fstate, istate)  # fmt: skip
        add_node(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)


# ---------------------------------------------------------------------------------------------
# the SA loop (Fig. 3)


@jit
def sa_chunk(prob, st, n_iters: int, budget: float, resident: float, c_floor: float, mode: int,
             h: float, h_ratio: float, p_add: float, p_remove: float, stop_at_budget: bool,
             local: float, sharp: float, over: float, chain: int = 0) -> int:  # fmt: skip
    """Run up to n_iters SA iterations from the current state; returns the number run.

    Each iteration draws one mutation of §2.2 (add with probability p_add, remove with p_remove,
    otherwise rotate), skips it when the §2.2 validity conditions fail, else applies it, evaluates
    f(S') from the segment-tree root and the running cost, and keeps it by the Metropolis rule at
    temperature h (multiplied by h_ratio every iteration: the exponential schedule of App. D.4);
    a rejected mutation is undone by its inverse.

    With probability ``local`` the times are drawn where the mutation can be valid and useful
    (see :func:`_rotation_window`). Every accepted change is journalled (:func:`_journal`, with the
    bests' positions, :func:`_mark_bests`), so that the caller can rebuild those states.

    ``chain`` > 0: recomputation chains with half of the adds and removes (see :func:`_add_chain`;
    the journal must hold (chain + 2) entries per iteration).
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
    ch_n = np.empty(chain + 1, dtype=np.int64)
    ch_t = np.empty(chain + 1, dtype=np.int64)
    nch = 0
    m_exact, m_obj = _peak(tz, lz, resident, lscale)
    f = objective(m_obj, fstate[F_COST] + c_floor, budget, mode, sharp, over)
    it = 0
    while it < n_iters:
        it += 1
        h *= h_ratio
        r = rand_next(rng)
        u = rand_unit(rand_next(rng))
        nocc = istate[I_NOCC]
        if u < p_add:
            kind = ADD
            if n_add == 0:
                continue
            n = add_list[rand_below(r, n_add)]
            if local > 0.0 and NI[n, NU] > 0 and NI[n, NP] > 0 and rand_unit(rand_next(rng)) < local:
                ub = NI[n, UB]
                u_t = PU[ub + rand_below(rand_next(rng), NI[n, NU])]
                pb = NI[n, PB]
                lo = PU[lower_bound(PU, pb, pb + NI[n, NP], u_t) - 1]
                if u_t - lo < 2:
                    continue
                t = lo + 1 + rand_below(rand_next(rng), u_t - lo - 1)
            else:
                t = np.int64(r & np.uint64(mask))
            if seq[t] != NOP or NI[n, NP] + 1 >= NX[n, PCAP] or not inputs_ready(n, t, NI, PU, pred_idx):
                continue
            nch = 0
            if chain > 0 and rand_unit(rand_next(rng)) < 0.5:
                k_max = 1 + rand_below(rand_next(rng), chain)
                nch = plan_chain(n, t, k_max, T, NI, PU, pred_idx, NX, seq, ch_n, ch_t)
            if not _add_chain(nch, ch_n, ch_t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz,
                              lz, fstate, istate):  # fmt: skip
                continue
            add_node(n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)
        elif u < p_add + p_remove:
            kind = REMOVE
            if nocc == 0:
                continue
            t = occ[rand_below(r, nocc)]
            n = seq[t]
            if not (NI[n, FL] & ADDREM) or not can_remove(n, t, T, NI, PU):
                continue
            remove_node(
                n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
            )
            nch = 0
            if chain > 0 and rand_unit(rand_next(rng)) < 0.5:
                k_max = 1 + rand_below(rand_next(rng), chain)
                nch = remove_chain(n, t, k_max, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos,
                                    tz, lz, fstate, istate, ch_n, ch_t)  # fmt: skip
        else:
            kind = ROTATE
            if nocc == 0:
                continue
            t1 = occ[rand_below(r, nocc)]
            n = seq[t1]
            if local > 0.0 and rand_unit(rand_next(rng)) < local:
                lo, hi = _rotation_window(n, t1, T, NI, PU, pred_idx)
                if hi - lo < 3:
                    continue
                t2 = lo + 1 + rand_below(rand_next(rng), hi - lo - 1)
            else:
                t2 = np.int64(r & np.uint64(mask))
            if seq[t2] != NOP or not move_valid(n, t1, t2, T, NI, PU, pred_idx):
                continue
            move_node(n, t1, t2, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate)  # fmt: skip
        istate[I_VALID] += 1
        m_exact, m_obj = _peak(tz, lz, resident, lscale)
        c = fstate[F_COST]
        f_new = objective(m_obj, c + c_floor, budget, mode, sharp, over)
        d = f_new - f
        if d <= 0.0 or (h > 0.0 and rand_unit(rand_next(rng)) < math.exp(-d / h)):
            f = f_new
            istate[I_ACCEPTED] += 1
            ll = _journal(log_t, log_n, istate, kind, n, t, t1, t2, nch, ch_n, ch_t)
            _mark_bests(fstate, istate, m_exact, c, budget, ll)
            if stop_at_budget and m_exact <= budget:
                istate[I_MET] = 1
                break
        elif kind == ROTATE:  # rejected: undone by its inverse
            move_node(n, t2, t1, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate,
                      istate)  # fmt: skip
        else:
            _undo(kind, n, t, nch, ch_n, ch_t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz,
                  fstate, istate)  # fmt: skip
    fstate[F_OBJ] = f
    fstate[F_TEMP] = h
    return it


@jit
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
            if n == NOP or NI[n, NP] < 2 or not can_remove(n, t, T, NI, PU):
                continue
            remove_node(
                n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
            )
            if float(tz[2]) <= limit:
                progress += 1
            else:
                add_node(
                    n, t, T, S, lscale, NI, PU, pred_idx, NX, cost, seq, occ, occpos, tz, lz, fstate, istate
                )
        removed += progress
        if progress == 0:
            break
    return removed


# ---------------------------------------------------------------------------------------------
# building a state from a sequence (initialisation, re-spacing, and the tests' full recomputation)


@jit
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
            e = interval_end(q, k, NI, PU, T)
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
            lz[2 * p] = lae2(lz[4 * p], lz[4 * p + 2])
            lz[2 * p + 1] = 0.0
    istate[I_NOCC] = nocc
    fstate[F_COST] = c


@jit
def apply_log(seq: np.ndarray, log_t: np.ndarray, log_n: np.ndarray, upto: int) -> None:
    for i in range(upto):
        seq[log_t[i]] = log_n[i]


@jit
def spread(order: np.ndarray, T: int) -> np.ndarray:
    """Place a compact sequence evenly in T slots with nops between (App. D.4: t = i/(k+1)·T)."""
    seq = np.full(T, NOP, dtype=np.int32)
    k = order.shape[0]
    for i in range(k):
        seq[((i + 1) * T) // (k + 1)] = order[i]
    return seq
