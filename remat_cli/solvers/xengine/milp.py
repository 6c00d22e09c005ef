"""XEngine §3.2: the multi-device Checkmate model, made sound, as a MILP (remat_cli.milp engines).

Stages t = 0..T−1 of the needed nodes in `order` (stage t first computes node t); positions
i ≤ t within a stage; devices d (home h holds inputs and parameters). Variables, all binary but U:

  R[d,t,i]    block i computed on d at position i of stage t                       eq. (2)
  S[d,t,i]    block i live on d on entry to stage t (i < t; row T: live at the end) eq. (2)
  X[e,d,t,i]  block i copied from e to d at position i of stage t, after its computes
  K[d,t,r]    resident value r held by d ≠ h during stage t (copied at the stage's start)
  Y[d,t,r]    that copy happens in stage t:  Y ≥ K[d,t,r] − K[d,t−1,r]
  FREE[d,t,i,k]  block i freed on d right after position k (k = i or a user of i)   eq. (3, 15)
  U[d,t,k]    units of d's intermediates at the instant of position k              eq. (6)

  P[d,t,i] = R[d,t,i] + S[d,t,i] + Σ_e X[e,d,t,i] ≤ 1: i is on d from position i on (never a
  second time: a copy only when the block is not already there — flaw 2 of the notes)
  min Σ c[d,i] R[d,t,i] + Σ w[e,d,i] X[e,d,t,i] + Σ w[h,d,r] Y[d,t,r]                  eq. (1)
  Σ_d R[d,t,t] ≥ 1 (= 1 for a non-recomputable node, which never runs again)    eqs. (7)–(9)
  X[e,d,t,i] ≤ R[e,t,i] + S[e,t,i]  (copy from where the block is)                        (4)
  R[d,t,k] ≤ P[d,t,i] for every edge i → k: the input on the consumer's device      eq. (12)
  R[d,t,k] ≤ K[d,t,r] for every resident r that k reads, d ≠ h
  S[d,t+1,i] ≤ P[d,t,i]; Σ_d S[d,T,i] ≥ 1 for graph outputs                          eq. (11)
  FREE[d,t,i,k] ≤ R[d,t,k] (k ≠ i) or P[d,t,i] (k = i); ≤ 1 − S[d,t+1,i];
                ≤ 1 − R[d,t,j] for users j of i with k < j ≤ t          eqs. (15), (16): the
      product R·(1 − S)·Π(1 − R) bounded by each factor; a free can only be less than the
      product, so memory is never under-counted (the solver wants frees)
  U[d,t,0] = Σ_i M_i S[d,t,i] + M_0 (R[d,t,0] + Σ_e X[e,d,t,0])                        eq. (13)
  U[d,t,k] = U[d,t,k−1] − Σ_i M_i FREE[d,t,i,k−1] + M_k (R[d,t,k] + Σ_e X[e,d,t,k])     eq. (14)
  U[d,t,k] + ws_k R[d,t,k] + Σ_r m_r K[d,t,r] ≤ budget_d (− every resident byte on h)

Sound where the paper is not (flaw 1 of the notes): every memory row is per device, and a free is
indexed by the device that holds the block; the copy term R·Z of eq. (1) is replaced by explicit
copy variables, charged once per arrival and counted on the destination (the block stays there
until freed, and may be kept). The space is Checkmate's (fixed order, frontier-advancing stages)
with copies of a block at its own position in a stage. The schedule is decoded from R, X, K and S
(frees after each block's last use on each device) and simulated; U is never trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from remat_cli.milp import LinearModel
from remat_cli.schedule import Step, copy, free
from remat_cli.solvers.xengine.problem import Problem


@dataclass
class XModel:
    problem: Problem
    model: LinearModel
    R: dict[tuple[int, int, int], int] = field(default_factory=dict)
    S: dict[tuple[int, int, int], int] = field(default_factory=dict)
    X: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    K: dict[tuple[int, int, int], int] = field(default_factory=dict)
    Y: dict[tuple[int, int, int], int] = field(default_factory=dict)
    F: dict[tuple[int, int, int, int], int] = field(default_factory=dict)
    U: dict[tuple[int, int, int], int] = field(default_factory=dict)
    cost_scale: float = 1.0

    def real(self, objective: float | None) -> float | None:
        return None if objective is None else max(objective, 0.0) / self.cost_scale


class _Rows:
    def __init__(self) -> None:
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: list[tuple[int, float]], lb: float, ub: float) -> None:
        r = len(self.lb)
        for c, v in terms:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(v)
        self.lb.append(lb)
        self.ub.append(ub)

    def flush(self, m: LinearModel) -> None:
        if self.lb:
            m.add_constraints(self.rows, self.cols, self.vals, np.array(self.lb), np.array(self.ub))


def build(p: Problem) -> XModel:
    st = p.stages
    T, D, h = p.T, p.D, p.home
    m = LinearModel("xengine")
    positive = p.cost[p.cost > 0]
    scale = 1.0 / float(positive.mean()) if positive.size else 1.0
    xm = XModel(p, m, cost_scale=scale)
    inf = math.inf

    def var(cost: float = 0.0, ub: float = 1.0, integer: bool = True) -> int:
        return int(m.add_vars(1, lb=0.0, ub=ub, integer=integer, cost=cost)[0])

    for d in range(D):
        cap = p.capacity(d)
        for t in range(T):
            for i in range(t + 1):
                if i < t and not st.recomputable[i]:
                    continue
                xm.R[d, t, i] = var(p.cost[d, i] * scale)
            for r in range(len(p.resident)):
                if d != h and math.isfinite(p.res_copy[d, r]):
                    xm.K[d, t, r] = var()
                    xm.Y[d, t, r] = var(p.res_copy[d, r] * scale)
            for k in range(t + 1):
                xm.U[d, t, k] = var(ub=max(cap, 0), integer=False)
        for t in range(1, T + 1):
            for i in range(t):
                xm.S[d, t, i] = var(ub=1.0 if t < T or st.keep[i] else 0.0)
        for e in range(D):
            if e == d:
                continue
            for t in range(T):
                for i in range(t + 1):
                    if math.isfinite(p.copy[e, d, i]):
                        xm.X[e, d, t, i] = var(p.copy[e, d, i] * scale)

    R, S, X, K, Y, U = xm.R, xm.S, xm.X, xm.K, xm.Y, xm.U

    def P(d: int, t: int, i: int) -> list[tuple[int, float]]:
        terms = [(R[d, t, i], 1.0)] if (d, t, i) in R else []
        if (d, t, i) in S:
            terms.append((S[d, t, i], 1.0))
        terms += [(X[e, d, t, i], 1.0) for e in range(D) if (e, d, t, i) in X]
        return terms

    def arrive(d: int, t: int, i: int) -> list[tuple[int, float]]:
        terms = [(R[d, t, i], 1.0)] if (d, t, i) in R else []
        return terms + [(X[e, d, t, i], 1.0) for e in range(D) if (e, d, t, i) in X]

    rows = _Rows()
    reads = [[r for r, rd in enumerate(p.readers) if k in rd] for k in range(T)]
    for t in range(T):
        frontier = [(R[d, t, t], 1.0) for d in range(D)]
        rows.add(frontier, 1.0, 1.0 if not st.recomputable[t] else inf)
    for d in range(D):
        cap = p.capacity(d)
        for t in range(T):
            for i in range(t + 1):
                rows.add(P(d, t, i), -inf, 1.0)
                for e in range(D):
                    if (e, d, t, i) in X:
                        src = [(R[e, t, i], -1.0)] if (e, t, i) in R else []
                        if (e, t, i) in S:
                            src.append((S[e, t, i], -1.0))
                        rows.add([(X[e, d, t, i], 1.0), *src], -inf, 0.0)
                if (d, t + 1, i) in S:
                    rows.add([(S[d, t + 1, i], 1.0)] + [(c, -v) for c, v in P(d, t, i)], -inf, 0.0)
            for k in range(t + 1):
                if (d, t, k) not in R:
                    continue
                for i in st.preds[k]:
                    rows.add([(R[d, t, k], 1.0)] + [(c, -v) for c, v in P(d, t, i)], -inf, 0.0)
                if d != h:
                    for r in reads[k]:
                        if (d, t, r) in K:
                            rows.add([(R[d, t, k], 1.0), (K[d, t, r], -1.0)], -inf, 0.0)
                        else:
                            rows.add([(R[d, t, k], 1.0)], -inf, 0.0)
            for r in range(len(p.resident)):
                if (d, t, r) in K:
                    prev = [(K[d, t - 1, r], 1.0)] if t > 0 else []
                    rows.add([(Y[d, t, r], 1.0), (K[d, t, r], -1.0), *prev], 0.0, inf)
            # frees (eq. 15) and the memory recurrence (eqs. 13, 14)
            freed_after: dict[int, list[tuple[int, float]]] = {}
            for i in range(t + 1):
                users = [j for j in st.succs[i] if j <= t]
                for k in [i, *users]:
                    if k != i and (d, t, k) not in R:
                        continue
                    f = var()
                    xm.F[d, t, i, k] = f
                    if k == i:
                        rows.add([(f, 1.0)] + [(c, -v) for c, v in P(d, t, i)], -inf, 0.0)
                    else:
                        rows.add([(f, 1.0), (R[d, t, k], -1.0)], -inf, 0.0)
                    if (d, t + 1, i) in S:
                        rows.add([(f, 1.0), (S[d, t + 1, i], 1.0)], -inf, 1.0)
                    for j in users:
                        if j > k and (d, t, j) in R:
                            rows.add([(f, 1.0), (R[d, t, j], 1.0)], -inf, 1.0)
                    freed_after.setdefault(k, []).append((f, float(p.mem[i])))
            for k in range(t + 1):
                terms = [(U[d, t, k], 1.0)] + [(c, -float(p.mem[k])) for c, _ in arrive(d, t, k)]
                if k == 0:
                    terms += [(S[d, t, i], -float(p.mem[i])) for i in range(t) if (d, t, i) in S]
                else:
                    terms += [(U[d, t, k - 1], -1.0)] + freed_after.get(k - 1, [])
                rows.add(terms, 0.0, 0.0)
                limit = [(U[d, t, k], 1.0)]
                if (d, t, k) in R and p.ws[k]:
                    limit.append((R[d, t, k], float(p.ws[k])))
                limit += [(K[d, t, r], float(p.res_mem[r])) for r in range(len(p.resident)) if (d, t, r) in K]
                rows.add(limit, -inf, float(cap))
    for i in range(T):
        if st.keep[i]:
            rows.add([(S[d, T, i], 1.0) for d in range(D)], 1.0, inf)
    rows.flush(m)
    return xm


@dataclass
class Decision:
    """The 0/1 decisions a schedule is decoded from (D × (T+1) × T etc.)."""

    R: np.ndarray  # D × T × T
    S: np.ndarray  # D × (T+1) × T
    X: np.ndarray  # D × D × T × T
    K: np.ndarray  # D × T × |resident|


def decision_of(xm: XModel, x: np.ndarray) -> Decision:
    p = xm.problem
    T, D = p.T, p.D
    dec = Decision(
        R=np.zeros((D, T, T), dtype=bool),
        S=np.zeros((D, T + 1, T), dtype=bool),
        X=np.zeros((D, D, T, T), dtype=bool),
        K=np.zeros((D, T, len(p.resident)), dtype=bool),
    )
    for key, c in xm.R.items():
        dec.R[key] = x[c] > 0.5
    for key, c in xm.S.items():
        dec.S[key] = x[c] > 0.5
    for key, c in xm.X.items():
        dec.X[key] = x[c] > 0.5
    for key, c in xm.K.items():
        dec.K[key] = x[c] > 0.5
    return dec


def steps_of(p: Problem, dec: Decision) -> list[Step]:
    """The schedule of a decision: per stage, resident copies at its start; per position the
    computes, then the copies out, then every block whose last use on a device has passed is
    freed there (unless carried into the next stage); copies of resident values are freed at
    the end of the last consecutive stage that holds them."""
    st, g = p.stages, p.graph
    T, D = p.T, p.D
    dev = p.devices
    outs = [g.node_map[n].outputs for n in st.ids]
    steps: list[Step] = []
    present: list[set[int]] = [set() for _ in range(D)]
    for t in range(T):
        for d in range(D):
            for r in range(len(p.resident)):
                if dec.K[d, t, r] and not (t > 0 and dec.K[d, t - 1, r]):
                    steps.append(copy(p.resident[r], dev[p.home], dev[d]))
        for k in range(t + 1):
            for d in range(D):
                if dec.R[d, t, k]:
                    steps.append(Step(op="compute", node=st.ids[k], device=dev[d]))
                    present[d].add(k)
            for e in range(D):
                for d in range(D):
                    if dec.X[e, d, t, k]:
                        steps.extend(copy(v, dev[e], dev[d]) for v in outs[k])
                        present[d].add(k)
            for d in range(D):
                for i in sorted(present[d]):
                    if dec.S[d, t + 1, i]:
                        continue
                    later = any(dec.R[d, t, j] for j in st.succs[i] if k < j <= t)
                    copy_out = i > k and dec.X[d, :, t, i].any()
                    if not later and not copy_out:
                        steps.extend(free(v, dev[d]) for v in outs[i])
                        present[d].discard(i)
        for d in range(D):
            for r in range(len(p.resident)):
                if dec.K[d, t, r] and not (t + 1 < T and dec.K[d, t + 1, r]):
                    steps.append(free(p.resident[r], dev[d]))
    return steps


def vector_of(xm: XModel, dec: Decision) -> np.ndarray:
    """A full variable vector for a decision (FREE from its product definition, U from eq. 14),
    for warm starts."""
    p, st = xm.problem, xm.problem.stages
    T, D = p.T, p.D
    x = np.zeros(xm.model.num_vars)
    for key, c in xm.R.items():
        x[c] = dec.R[key]
    for key, c in xm.S.items():
        x[c] = dec.S[key]
    for key, c in xm.X.items():
        x[c] = dec.X[key]
    for key, c in xm.K.items():
        x[c] = dec.K[key]
    for (d, t, r), c in xm.Y.items():
        x[c] = float(dec.K[d, t, r] and not (t > 0 and dec.K[d, t - 1, r]))
    pres = dec.R.copy()
    pres[:, :, :] |= dec.S[:, :T, :]
    pres |= dec.X.any(axis=0)
    for (d, t, i, k), c in xm.F.items():
        a = pres[d, t, i] if k == i else dec.R[d, t, k]
        x[c] = float(
            a and not dec.S[d, t + 1, i] and not any(dec.R[d, t, j] for j in st.succs[i] if k < j <= t)
        )
    for d in range(D):
        for t in range(T):
            u = 0.0
            for k in range(t + 1):
                if k == 0:
                    u = float(sum(p.mem[i] for i in range(t) if dec.S[d, t, i]))
                else:
                    u -= sum(p.mem[i] * x[xm.F[d, t, i, k - 1]] for i in range(k) if (d, t, i, k - 1) in xm.F)
                arrive = dec.R[d, t, k] or dec.X[:, d, t, k].any()
                u += p.mem[k] * float(arrive)
                x[xm.U[d, t, k]] = u
    return x
