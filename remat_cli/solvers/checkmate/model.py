"""The exact MILP of Checkmate (Jain et al., MLSys 2020) over T frontier-advancing stages.

The formulation is the one described in XEngine §3.2 (eqs. 2, 7–16 with a single device; the
paper's own statement of Checkmate), Moccasin §1.1, FastSA App. A, and HiREmate App. B.3 for the
hazard linearisation of FREE. It runs on the graph folded by :class:`~remat_cli.graph.NodeView`
(one memory block per node, kept and freed together), restricted to the nodes some graph output
needs; stage t (0-based) computes node t of `order` for the first time.

Variables (``T`` = number of needed nodes, ``i ≤ t`` throughout)
  R[t,i] ∈ {0,1}  node i is (re)computed in stage t                                  eq. (2)
  S[t,i] ∈ {0,1}  node i's block is live on entry to stage t (checkpoint)            eq. (2)
  FREE[t,i,k] ∈ {0,1}  for k ≤ t and i ∈ DEPS[k] ∪ {k}: block i is freed right after
                  computing k in stage t                                             eq. (3)
  U[t,k] ≥ 0      memory of the intermediate blocks right after computing k          eq. (6)

Objective  min Σ_t Σ_i cost_i R[t,i]                                                 eq. (1)
Constraints
  R[t,t] = 1, R[t,i] = 0 for i > t (frontier advancing)                     eqs. (7), (8), (9)
  S[t,i] = 0 for i ≥ t                                                               eq. (10)
  S[t+1,i] ≤ S[t,i] + R[t,i]; the virtual row S[T,i] = keep[i] keeps graph outputs    eq. (11)
  R[t,k] ≤ R[t,i] + S[t,i] for every edge i → k                                      eq. (12)
  U[t,0] = Σ_i M_i S[t,i] + M_0 R[t,0]                                               eq. (13)
  U[t,k+1] = U[t,k] − Σ_{i ∈ DEPS[k] ∪ {k}} M_i FREE[t,i,k] + M_{k+1} R[t,k+1]          eq. (14–15)
  FREE[t,i,k] = R[t,k]·(1 − S[t+1,i])·Π_{j ∈ USERS[i], k<j≤t}(1 − R[t,j]), linearised with the
    hazard count h = (1 − R[t,k]) + S[t+1,i] + Σ_j R[t,j] and κ = 2 + |{j}|:
    1 − FREE ≤ h  and  κ(1 − FREE) ≥ h                                 eq. (16), HiREmate B.3
  U[t,k] + workspace_k R[t,k] ≤ budget − resident     (workspace counts at the compute instant)
  R[t,i] = 0 for i < t when node i is not recomputable.

Two defects of the reference implementation are not repeated: the own block of k is in
FREE[t,k,k] (so an output nobody reads later is freed within its stage), and the schedule is
decoded from S alone with the minimal-recompute rule (:func:`minimal_R`) and then simulated by
``run_solver`` — U is never trusted.

Memory is scaled by the gcd of all block sizes and workspaces (exact: the budget becomes
⌊(budget − resident)/g⌋), which also gives CP-SAT the integer model it needs.

Beyond the paper (each valid for the MILP, so the optimum is unchanged; checked against brute
force in tests/test_checkmate.py, also without any warm start):
  D1–D3  dominance cuts: every recomputation and checkpoint is used (:func:`_add_dominance`).
  V1     Σ_k FREE[t,i,k] + S[t+1,i] ≤ S[t,i] + R[t,i]: a block is freed at most once per stage,
         only when present and not carried on (:func:`_add_free_once`).
  V2     a knapsack row per stage on the blocks that must be live when node t runs: the inputs
         of t and every block carried into stage t+1 (:func:`_add_live_memory`).
  Each of V1, V2 lifts the root LP bound, after which reduced-cost fixing with a good incumbent
  shrinks the model to a few thousand columns within the root node.
Warm start (:func:`.warm_start.warm_start_steps`): besides greedy and the baseline, a short run of the
staged Moccasin CP (Moccasin §2.3), whose schedules lie in the same stage space; it is what
gives the MILP a near-optimal incumbent from the start. Engine: SCIP by default, which proves
the bench optima faster than HiGHS once V1/V2 are in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph
from remat_cli.milp import LinearModel

PAPER = "Jain et al., Checkmate, MLSys 2020 (as restated in XEngine §3.2, Moccasin §1.1, HiREmate B.3)"


@dataclass
class Stages:
    """The needed nodes of a graph in `order`, as the T stages of the Checkmate MILP."""

    graph: Graph
    ids: list[str]  # node id of stage / column i
    mem: np.ndarray  # scaled block sizes (int64)
    ws: np.ndarray  # scaled workspaces
    cost: np.ndarray
    preds: list[list[int]]
    succs: list[list[int]]
    keep: np.ndarray  # bool
    recomputable: np.ndarray  # bool
    scale: int  # bytes per memory unit
    capacity: int  # ⌊(budget − resident)/scale⌋, may be negative

    @property
    def T(self) -> int:
        return len(self.ids)

    @property
    def base_cost(self) -> float:
        """Every needed node once, the baseline's cost (1 when all costs are 0: it divides)."""
        return float(self.cost.sum()) or 1.0


def stages_of(graph: Graph, budget: int) -> Stages:
    v = graph.node_view
    keep_idx = v.needed_index
    local = {g: k for k, g in enumerate(keep_idx)}
    mem = np.array([v.mem[i] for i in keep_idx], dtype=np.int64)
    ws = np.array([v.workspace[i] for i in keep_idx], dtype=np.int64)
    g = 0
    for m in (*mem.tolist(), *ws.tolist()):
        g = math.gcd(g, int(m))
    g = max(g, 1)
    preds = [[local[p] for p in v.preds[i] if p in local] for i in keep_idx]
    succs: list[list[int]] = [[] for _ in keep_idx]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    return Stages(
        graph=graph,
        ids=[v.ids[i] for i in keep_idx],
        mem=mem // g,
        ws=ws // g,
        cost=np.array([v.cost[i] for i in keep_idx], dtype=float),
        preds=preds,
        succs=[sorted(s) for s in succs],
        keep=np.array([v.keep[i] for i in keep_idx], dtype=bool),
        recomputable=np.array([v.recomputable[i] for i in keep_idx], dtype=bool),
        scale=g,
        capacity=(budget - v.resident) // g,
    )


def tri(t: np.ndarray | int, i: np.ndarray | int) -> Any:
    """Index of (t, i), i ≤ t, in a row-major lower triangle with diagonal."""
    return t * (t + 1) // 2 + i


def stri(t: np.ndarray | int, i: np.ndarray | int) -> Any:
    """Index of (t, i), i < t, in a row-major strict lower triangle (rows 1..T)."""
    return t * (t - 1) // 2 + i


@dataclass
class CheckmateModel:
    stages: Stages
    model: LinearModel
    R: np.ndarray  # column of R[t,i] at tri(t,i)
    S: np.ndarray  # column of S[t,i] at stri(t,i), t = 1..T
    U: np.ndarray  # column of U[t,k] at tri(t,k)
    free_t: np.ndarray  # the (t, i, k) of each FREE column, in column order
    free_i: np.ndarray
    free_k: np.ndarray
    FREE: np.ndarray
    cost_scale: float  # model objective = cost_scale × (recomputation cost)
    unit: float = 1.0  # bytes-per-scale units per model memory unit

    def real_cost(self, objective: float | None) -> float | None:
        """Total compute cost of a model objective value (first runs added back)."""
        if objective is None:
            return None
        # costs are ≥ 0, so the recomputation cost is too: a negative engine bound (before its
        # root LP) says nothing more than "no recomputation"
        return max(objective, 0.0) / self.cost_scale + float(self.stages.cost.sum())

    # ---- solution <-> matrices ----
    def S_matrix(self, x: np.ndarray) -> np.ndarray:
        """(T+1) × T 0/1 matrix of S (row T is the virtual "live at the end" row)."""
        T = self.stages.T
        out = np.zeros((T + 1, T), dtype=bool)
        t, i = np.tril_indices(T + 1, -1)
        t, i = t[t >= 1], i[t >= 1]
        out[t, i] = x[self.S[stri(t, i)]] > 0.5
        return out

    def vector(self, S: np.ndarray, R: np.ndarray) -> np.ndarray:
        """A full variable vector for (S, R): FREE from its definition, U from the recurrence."""
        st = self.stages
        T = st.T
        x = np.zeros(self.model.num_vars)
        t, i = np.tril_indices(T)
        x[self.R[tri(t, i)]] = R[t, i]
        t2, i2 = np.tril_indices(T + 1, -1)
        sel = t2 >= 1
        x[self.S[stri(t2[sel], i2[sel])]] = S[t2[sel], i2[sel]]
        # FREE[t,i,k] = R[t,k] (1 − S[t+1,i]) Π_{j ∈ USERS[i], k<j≤t} (1 − R[t,j])
        fv = np.zeros(len(self.FREE))
        for n, (tt, ii, kk) in enumerate(zip(self.free_t, self.free_i, self.free_k, strict=True)):
            if R[tt, kk] and not S[tt + 1, ii]:
                fv[n] = float(not any(R[tt, j] for j in st.succs[ii] if kk < j <= tt))
        x[self.FREE] = fv
        freed = np.zeros((T, T))
        np.add.at(freed, (self.free_t, self.free_k), fv * st.mem[self.free_i])
        for tt in range(T):
            u = float(S[tt, :tt] @ st.mem[:tt]) if tt else 0.0
            for k in range(tt + 1):
                u += R[tt, k] * st.mem[k]
                x[self.U[tri(tt, k)]] = u / self.unit
                u -= freed[tt, k]
        return x


CUTS = ("free_once", "stage_end", "instant")


def parse_cuts(text: str) -> tuple[str, ...]:
    """The --cuts option: a comma list of CUTS, or "none"."""
    names = tuple(c.strip() for c in text.split(",") if c.strip() and c.strip() != "none")
    bad = [c for c in names if c not in CUTS]
    if bad:
        raise ValueError(f"unknown cuts {bad} (known: {', '.join(CUTS)}, none)")
    return names


def build_model(
    st: Stages,
    capacity: int | None = None,
    integer_u: bool = False,
    free_form: str = "product",
    tighten: bool = True,
    cuts: tuple[str, ...] = ("free_once", "stage_end"),
    memory: str = "recurrence",
) -> CheckmateModel:
    """The Checkmate MILP of the module docstring, built in bulk (see remat_cli.milp.engine).

    Memory is in gcd units when `integer_u` (CP-SAT's all-integer model); otherwise it is
    normalised so that the capacity is 1, which keeps the LP well scaled (HiGHS solves the CM1
    relaxation ~8× faster than with raw units). The decoded schedule is simulated in bytes, so a
    tolerance-sized overshoot is caught (see ``Checkmate.solve``).
    """
    T = st.T
    cap_units = st.capacity if capacity is None else capacity
    unit = 1.0 if integer_u else float(max(cap_units, 1))
    cap = cap_units / unit
    mem = st.mem / unit
    wsp = st.ws / unit
    m = LinearModel("checkmate")
    ntri = T * (T + 1) // 2
    base_cost = st.base_cost
    # The objective is the recomputation cost only (the first runs, R[t,t] = 1, are a constant
    # added back by real_cost): the engines' relative gap then measures the overhead, not the
    # total, and a "proved optimal" overhead of 0.03% is not 0.01% of the total away from the
    # optimum. Scaled so that the mean node costs 1.
    cost_scale = T / base_cost
    # ---- R: lower triangle with diagonal; R[t,t] = 1; R[t,i<t] = 0 when not recomputable
    t_idx, i_idx = np.tril_indices(T)
    r_lb = (t_idx == i_idx).astype(float)
    r_ub = np.where((t_idx == i_idx) | st.recomputable[i_idx], 1.0, 0.0)
    R = m.add_vars(
        ntri, lb=r_lb, ub=r_ub, integer=True, cost=np.where(t_idx == i_idx, 0.0, st.cost[i_idx] * cost_scale)
    )
    # ---- S: strict lower triangle of rows 1..T; row T fixed to keep (graph outputs live at end)
    ts, is_ = np.tril_indices(T + 1, -1)
    sel = ts >= 1
    ts, is_ = ts[sel], is_[sel]
    s_fix = ts == T
    s_lb = np.where(s_fix, st.keep[is_], 0).astype(float)
    s_ub = np.where(s_fix, st.keep[is_], 1).astype(float)
    S = m.add_vars(len(ts), lb=s_lb, ub=s_ub, integer=True)
    live_only = memory == "live"
    # ---- U
    U = m.add_vars(0 if live_only else ntri, lb=0.0, ub=max(cap, 0.0), integer=integer_u)
    # ---- FREE: (t, i, k) for k ≤ t, i ∈ DEPS[k] ∪ {k}
    free_t, free_i, free_k = _free_index(st, live_only)
    FREE = m.add_vars(len(free_t), integer=True)

    _add_retention(m, T, R, S)
    _add_dependencies(m, st, R, S)
    if not live_only:
        _add_free_definition(m, st, R, S, FREE, (free_t, free_i, free_k), free_form)

    if tighten:
        _add_dominance(m, st, R, S)
    if "free_once" in cuts and not live_only:
        _add_free_once(m, st, R, S, FREE, free_t, free_i)
    if live_only:
        _add_live_memory_chained(m, st, R, S, mem, wsp, cap)
    elif "stage_end" in cuts or "instant" in cuts:
        _add_live_memory(m, st, R, S, mem, wsp, cap, all_instants="instant" in cuts)

    if not live_only:
        _add_memory_recurrence(m, st, R, S, U, FREE, (free_t, free_i, free_k), mem, wsp, cap)
    return CheckmateModel(st, m, R, S, U, free_t, free_i, free_k, FREE, cost_scale, unit)


def _free_index(st: Stages, live_only: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (t, i, k) of the FREE variables: k ≤ t, i ∈ DEPS[k] ∪ {k} (none for the live-memory form)."""
    T = st.T
    ft: list[np.ndarray] = []
    fi: list[np.ndarray] = []
    fk: list[np.ndarray] = []
    for k in range(0 if live_only else T):
        ts_k = np.arange(k, T)
        for i in (*st.preds[k], k):
            ft.append(ts_k)
            fi.append(np.full(len(ts_k), i))
            fk.append(np.full(len(ts_k), k))
    free_t = np.concatenate(ft) if ft else np.zeros(0, np.int64)
    free_i = np.concatenate(fi) if fi else np.zeros(0, np.int64)
    free_k = np.concatenate(fk) if fk else np.zeros(0, np.int64)
    return free_t, free_i, free_k


def _add_retention(m: LinearModel, T: int, R: np.ndarray, S: np.ndarray) -> None:
    """Eq. (11): a value is kept into stage t+1 only if it was kept or computed in stage t."""
    # S[t+1,i] − S[t,i] − R[t,i] ≤ 0   for t = 0..T−1, i ≤ t
    t_, i_ = np.tril_indices(T)
    n = len(t_)
    rows = np.arange(n)
    cols = [S[stri(t_ + 1, i_)], R[tri(t_, i_)]]
    vals = [np.ones(n), -np.ones(n)]
    has_prev = i_ < t_
    rows_all = [rows, rows, rows[has_prev]]
    cols.append(S[stri(t_[has_prev], i_[has_prev])])
    vals.append(-np.ones(int(has_prev.sum())))
    m.add_constraints(
        np.concatenate(rows_all), np.concatenate(cols), np.concatenate(vals), -np.inf, 0.0, count=n
    )


def _add_dependencies(m: LinearModel, st: Stages, R: np.ndarray, S: np.ndarray) -> None:
    """Eq. (12): a node runs only when each input is computed or kept in the same stage."""
    T = st.T
    # R[t,k] − R[t,i] − S[t,i] ≤ 0 for each edge i → k and t ≥ k
    er, ec, ev = [], [], []
    nrow = 0
    for k in range(T):
        tk = np.arange(k, T)
        for i in st.preds[k]:
            r = np.arange(nrow, nrow + len(tk))
            er += [r, r]
            ec += [R[tri(tk, k)], R[tri(tk, i)]]
            ev += [np.ones(len(tk)), -np.ones(len(tk))]
            # S[t,i] exists for t ≥ 1 > i, always true here since i < k ≤ t
            er.append(r)
            ec.append(S[stri(tk, i)])
            ev.append(-np.ones(len(tk)))
            nrow += len(tk)
    if nrow:
        m.add_constraints(
            np.concatenate(er), np.concatenate(ec), np.concatenate(ev), -np.inf, 0.0, count=nrow
        )


def _add_free_definition(
    m: LinearModel,
    st: Stages,
    R: np.ndarray,
    S: np.ndarray,
    FREE: np.ndarray,
    free_tik: tuple[np.ndarray, np.ndarray, np.ndarray],
    free_form: str,
) -> None:
    """Eq. (16): FREE[t,i,k] is the product R[t,k] (1 − S[t+1,i]) Π (1 − R[t,j]) over the users j
    of i with k < j ≤ t, linearised as the hazard pair of the paper or as the product's bounds."""
    T = st.T
    free_t, free_i, free_k = free_tik
    # eq. (16): hazards. h = 1 − R[t,k] + S[t+1,i] + Σ_{j∈USERS[i], k<j≤t} R[t,j]
    #   FREE + h ≥ 1   ⇔  FREE − R[t,k] + S[t+1,i] + ΣR ≥ 0
    #   κ FREE + h ≤ κ ⇔  κ FREE − R[t,k] + S[t+1,i] + ΣR ≤ κ − 1
    nF = len(free_t)
    hr, hc, hv = (
        [np.arange(nF)] * 3,
        [FREE, R[tri(free_t, free_k)], S[stri(free_t + 1, free_i)]],
        [
            np.ones(nF),
            -np.ones(nF),
            np.ones(nF),
        ],
    )
    hr, hc, hv = list(hr), list(hc), list(hv)
    users_cnt = np.zeros(nF, dtype=np.int64)
    # for each FREE row, users j of i with k < j ≤ t: loop over (i, j) pairs, vectorised over rows
    by_i: dict[int, np.ndarray] = {}
    order = np.argsort(free_i, kind="stable")
    bounds = np.searchsorted(free_i[order], np.arange(T + 1))
    for i in range(T):
        by_i[i] = order[bounds[i] : bounds[i + 1]]
    for i in range(T):
        rows_i = by_i[i]
        if not len(rows_i):
            continue
        for j in st.succs[i]:
            sel_j = rows_i[(free_k[rows_i] < j) & (free_t[rows_i] >= j)]
            if len(sel_j):
                hr.append(sel_j)
                hc.append(R[tri(free_t[sel_j], j)])
                hv.append(np.ones(len(sel_j)))
                users_cnt[sel_j] += 1
    kappa = 2.0 + users_cnt
    hr_a, hc_a, hv_a = np.concatenate(hr), np.concatenate(hc), np.concatenate(hv)
    if free_form == "hazard":
        m.add_constraints(hr_a, hc_a, hv_a, 0.0, np.inf, count=nF)
        hv_b = hv_a.copy()
        hv_b[:nF] = kappa  # the first block is the FREE column itself
        m.add_constraints(hr_a, hc_a, hv_b, -np.inf, kappa - 1.0, count=nF)
    else:
        # the product's own bounds, one per factor: FREE ≤ R[t,k], FREE ≤ 1 − S[t+1,i],
        # FREE ≤ 1 − R[t,j]. The lower side (FREE ≥ 1 − h) is dropped: freeing only lowers U, so
        # an optimum frees whenever allowed, and the decoder frees at the last use anyway.
        nterm = len(hr_a)
        pr = np.arange(nterm - nF)  # one row per non-FREE term
        src = hr_a[nF:]
        m.add_constraints(
            np.concatenate([pr, pr]),
            np.concatenate([FREE[src], hc_a[nF:]]),
            np.concatenate([np.ones(len(pr)), np.where(np.arange(len(pr)) < nF, -1.0, 1.0)]),
            -np.inf,
            np.where(np.arange(len(pr)) < nF, 0.0, 1.0),
        )


def _add_memory_recurrence(
    m: LinearModel,
    st: Stages,
    R: np.ndarray,
    S: np.ndarray,
    U: np.ndarray,
    FREE: np.ndarray,
    free_tik: tuple[np.ndarray, np.ndarray, np.ndarray],
    mem: np.ndarray,
    wsp: np.ndarray,
    cap: float,
) -> None:
    """Eqs. (13)–(15): U[t,k], the memory after computing node k in stage t, as a recurrence over
    k, and the memory at each compute instant within the capacity."""
    T = st.T
    free_t, free_i, free_k = free_tik
    # eqs. (13)–(15): memory recurrence, one equality per (t, k)
    ur, uc, uv = [], [], []
    t_, k_ = np.tril_indices(T)
    n = len(t_)
    rows = np.arange(n)
    ur += [rows, rows]
    uc += [U[tri(t_, k_)], R[tri(t_, k_)]]
    uv += [np.ones(n), -mem[k_].astype(float)]
    first = k_ == 0
    later = ~first
    # k > 0: − U[t,k−1] + Σ M_i FREE[t,i,k−1]
    ur.append(rows[later])
    uc.append(U[tri(t_[later], k_[later] - 1)])
    uv.append(-np.ones(int(later.sum())))
    row_id = tri(t_, k_)  # rows are numbered like the triangle
    assert np.array_equal(row_id, rows)
    nxt = free_k + 1 <= free_t  # FREE[t,i,k] feeds row (t, k+1) when k < t
    ur.append(tri(free_t[nxt], free_k[nxt] + 1))
    uc.append(FREE[nxt])
    uv.append(mem[free_i[nxt]].astype(float))
    # k = 0: − Σ_{i<t} M_i S[t,i]
    tS, iS = np.tril_indices(T, -1)  # t ≥ 1, i < t
    ur.append(tri(tS, 0))
    uc.append(S[stri(tS, iS)])
    uv.append(-mem[iS].astype(float))
    m.add_constraints(np.concatenate(ur), np.concatenate(uc), np.concatenate(uv), 0.0, 0.0, count=n)

    # memory at the compute instant: U[t,k] + ws_k R[t,k] ≤ capacity (U's bound covers ws = 0)
    wk = wsp[k_] > 0
    if wk.any():
        r = np.arange(int(wk.sum()))
        m.add_constraints(
            np.concatenate([r, r]),
            np.concatenate([U[tri(t_[wk], k_[wk])], R[tri(t_[wk], k_[wk])]]),
            np.concatenate([np.ones(len(r)), wsp[k_[wk]].astype(float)]),
            -np.inf,
            cap,
        )


def _add_free_once(
    m: LinearModel,
    st: Stages,
    R: np.ndarray,
    S: np.ndarray,
    FREE: np.ndarray,
    free_t: np.ndarray,
    free_i: np.ndarray,
) -> None:
    """(V1) Σ_k FREE[t,i,k] + S[t+1,i] ≤ S[t,i] + R[t,i] for every i ≤ t.

    Valid: a block is freed at most once per stage, only when it is present (S or R), and never
    when it is carried into stage t+1 (FREE ≤ 1 − S[t+1,i]). It contains eq. (11). The LP
    relaxation otherwise frees a fractionally kept block several times in one stage (FREE[t,i,i]
    ≤ 1 − R[t,j] and FREE[t,i,j] ≤ R[t,j] sum to 1 for R[t,j] = ½), which undercounts memory.
    """
    T = st.T
    t_, i_ = np.tril_indices(T)  # i ≤ t; the row of (t, i) is tri(t, i)
    n = len(t_)
    rows = np.arange(n)
    has_prev = i_ < t_
    m.add_constraints(
        np.concatenate([tri(free_t, free_i), rows, rows, rows[has_prev]]),
        np.concatenate([FREE, S[stri(t_ + 1, i_)], R[tri(t_, i_)], S[stri(t_[has_prev], i_[has_prev])]]),
        np.concatenate([np.ones(len(FREE)), np.ones(n), -np.ones(n), -np.ones(int(has_prev.sum()))]),
        -np.inf,
        0.0,
        count=n,
    )


def _add_live_memory(
    m: LinearModel,
    st: Stages,
    R: np.ndarray,
    S: np.ndarray,
    mem: np.ndarray,
    wsp: np.ndarray,
    cap: float,
    all_instants: bool,
) -> None:
    """(V2) Memory lower bounds at a compute instant (t, k) from blocks that must be live there:

      Σ_{i<k, i∈P(t)} M_i + Σ_{i<k, i∉P(t)} M_i S[t+1,i] + (M_k + ws_k) R[t,k] + M_k S[t,k]
        + Σ_{k<i<t} M_i S[t,i] ≤ capacity

    Valid for the model's U[t,k]: a block carried into stage t+1 is never freed in stage t
    (FREE ≤ 1 − S[t+1,i]) and was present since position i < k (eq. 11); an input i of node t is
    not freed before t (FREE[t,i,k'] ≤ 1 − R[t,t] = 0); a checkpoint i > k is freed only at
    positions ≥ i. Without `all_instants` only k = t (the stage's last compute, T rows: a knapsack
    row on S[t+1,·] alone) is added; all instants add O(T³) nonzeros.
    """
    T = st.T
    rr, rc, rv, rub = [], [], [], []
    row = 0
    in_pt = np.zeros(T, dtype=bool)
    for t in range(T):
        in_pt[:] = False
        in_pt[st.preds[t]] = True
        ks = range(t + 1) if all_instants else (t,)
        for k in ks:
            const = float(mem[:k][in_pt[:k]].sum())
            i_s1 = np.flatnonzero(~in_pt[:k])
            cols = [S[stri(t + 1, i_s1)], [R[tri(t, k)]]]
            vals = [mem[i_s1], [mem[k] + wsp[k]]]
            if k < t:
                i_s = np.arange(k, t)
                cols.append(S[stri(t, i_s)])
                vals.append(mem[i_s])
            c = np.concatenate(cols)
            rc.append(c)
            rv.append(np.concatenate(vals).astype(float))
            rr.append(np.full(len(c), row))
            rub.append(cap - const)
            row += 1
    m.add_constraints(np.concatenate(rr), np.concatenate(rc), np.concatenate(rv), -np.inf, np.array(rub))


def _add_live_memory_chained(
    m: LinearModel, st: Stages, R: np.ndarray, S: np.ndarray, mem: np.ndarray, wsp: np.ndarray, cap: float
) -> None:
    """V2 at every instant (t, k) in O(T²) nonzeros, for the ``memory="live"`` relaxation.

    The two sums of V2 are carried by continuous prefix / suffix variables,
      A[t,k] ≥ A[t,k−1] + [k−1 ∉ P(t)] M_{k−1} S[t+1,k−1]      (A[t,k] ≥ Σ_{i<k, i∉P(t)} M_i S[t+1,i])
      B[t,k] ≥ B[t,k+1] + M_{k+1} S[t,k+1]  for k+1 < t         (B[t,k] ≥ Σ_{k<i<t} M_i S[t,i])
      A[t,k] + B[t,k] + (M_k + ws_k) R[t,k] + M_k S[t,k] ≤ capacity − Σ_{i<k, i∈P(t)} M_i,
    which states the same rows as :func:`_add_live_memory` with ``all_instants`` (A, B only
    bound the sums from above), with at most four nonzeros per row instead of O(T).
    """
    T = st.T
    ntri = T * (T + 1) // 2
    # A, B ≤ capacity holds in every feasible point (the memory row); the finite bound lets a
    # Lagrangian bound (milp.engine.lagrangian_bound) price these columns
    A = m.add_vars(ntri, lb=0.0, ub=max(cap, 0.0), integer=False)
    B = m.add_vars(ntri, lb=0.0, ub=max(cap, 0.0), integer=False)
    in_p = np.zeros((T, T), dtype=bool)
    for t in range(T):
        in_p[t, st.preds[t]] = True
    memf = mem.astype(float)
    t_, k_ = np.tril_indices(T)  # k ≤ t
    # A chain: k ≥ 1
    sel = k_ >= 1
    ta, ka = t_[sel], k_[sel]
    n = len(ta)
    r = np.arange(n)
    coef = np.where(in_p[ta, ka - 1], 0.0, memf[ka - 1])
    m.add_constraints(
        np.concatenate([r, r, r]),
        np.concatenate([A[tri(ta, ka)], A[tri(ta, ka - 1)], S[stri(ta + 1, ka - 1)]]),
        np.concatenate([np.ones(n), -np.ones(n), -coef]),
        0.0,
        np.inf,
        count=n,
    )
    # B chain: k + 1 < t
    sel = k_ + 1 < t_
    tb, kb = t_[sel], k_[sel]
    n = len(tb)
    r = np.arange(n)
    m.add_constraints(
        np.concatenate([r, r, r]),
        np.concatenate([B[tri(tb, kb)], B[tri(tb, kb + 1)], S[stri(tb, kb + 1)]]),
        np.concatenate([np.ones(n), -np.ones(n), -memf[kb + 1]]),
        0.0,
        np.inf,
        count=n,
    )
    # the memory rows
    const = np.cumsum(np.where(in_p, memf[None, :], 0.0), axis=1)  # const[t, k] = Σ_{i≤k, i∈P(t)}
    c_tk = np.where(k_ >= 1, const[t_, np.maximum(k_ - 1, 0)], 0.0)
    n = len(t_)
    r = np.arange(n)
    has_s = k_ < t_
    m.add_constraints(
        np.concatenate([r, r, r, r[has_s]]),
        np.concatenate([A[tri(t_, k_)], B[tri(t_, k_)], R[tri(t_, k_)], S[stri(t_[has_s], k_[has_s])]]),
        np.concatenate([np.ones(n), np.ones(n), memf[k_] + wsp[k_], memf[k_[has_s]]]),
        -np.inf,
        cap - c_tk,
        count=n,
    )


def _add_dominance(m: LinearModel, st: Stages, R: np.ndarray, S: np.ndarray) -> None:
    """Cuts that keep at least one optimum: every recomputation and every checkpoint is used.

    From any optimal (R, S), dropping a recomputation that no node of its stage reads and that is
    not carried on, a checkpoint that is neither read in its stage nor carried on, or a
    recomputation of a block that is already checkpointed, lowers cost and memory and keeps
    eqs. (11)–(12); repeating this ends in a solution that satisfies, for i < t,
      (D1) R[t,i] ≤ S[t+1,i] + Σ_{j ∈ USERS[i], j ≤ t} R[t,j]
      (D2) S[t,i] ≤ S[t+1,i] + Σ_{j ∈ USERS[i], j ≤ t} R[t,j]
      (D3) R[t,i] + S[t,i] ≤ 1.
    They remove the useless (and symmetric) parts of the search space the MILP engines would
    otherwise branch over; the optimum value is unchanged (checked against brute force).
    """
    T = st.T
    t_, i_ = np.tril_indices(T, -1)  # i < t
    n = len(t_)
    rows = np.arange(n)
    # users j of i with j ≤ t: loop over edges (i, j), vectorised over the rows with t ≥ j
    ur, uc = [], []
    # an index (t, i) → row, then one slice per edge (i, j) over the stages t ≥ j
    row_of = np.full((T, T), -1, dtype=np.int64)
    row_of[t_, i_] = rows
    for i in range(T):
        for j in st.succs[i]:
            ts = np.arange(j, T)
            ur.append(row_of[ts, i])
            uc.append(R[tri(ts, j)])
    users_r = np.concatenate(ur) if ur else np.zeros(0, np.int64)
    users_c = np.concatenate(uc) if uc else np.zeros(0, np.int64)
    for own in (R[tri(t_, i_)], S[stri(t_, i_)]):
        m.add_constraints(
            np.concatenate([rows, rows, users_r]),
            np.concatenate([own, S[stri(t_ + 1, i_)], users_c]),
            np.concatenate([np.ones(n), -np.ones(n), -np.ones(len(users_r))]),
            -np.inf,
            0.0,
            count=n,
        )
    m.add_constraints(
        np.concatenate([rows, rows]),
        np.concatenate([R[tri(t_, i_)], S[stri(t_, i_)]]),
        1.0,
        -np.inf,
        1.0,
        count=n,
    )
