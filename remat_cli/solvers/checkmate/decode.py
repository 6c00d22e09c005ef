"""From the Checkmate model's (S, R) matrices to steps and back, and the local searches on S.

Decoding trusts S alone: R is recomputed as the least R compatible with S (:func:`minimal_R`,
eqs. 11–12 of the model in :mod:`.model`), and the resulting sequence goes through the common
decoder ``steps_from_sequence`` and the simulator; U is never read back.
"""

from __future__ import annotations

import time

import numpy as np

from remat_cli.schedule import Step, simulate, steps_from_sequence
from remat_cli.solvers.checkmate.model import CheckmateModel, Stages


def minimal_R(st: Stages, S: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The least R compatible with S, and S without its unused checkpoints.

    Stage t computes t, every node whose block must be live on entry to stage t+1 but is not live
    on entry to t, and — backwards — every missing input of a node it computes. Any feasible
    (R, S) has R ≥ minimal_R(S) (eqs. 11, 12). Stages are processed last to first so that a
    checkpoint S[t,i] that stage t neither reads nor carries on is dropped (it changes nothing in
    the decoded schedule; the MILP's dominance cuts D2 require it).
    """
    T = st.T
    S = S.copy()
    R = np.zeros((T, T), dtype=bool)
    for t in range(T - 1, -1, -1):
        R[t, t] = True
        for k in range(t - 1, -1, -1):
            used = any(R[t, j] for j in st.succs[k] if j <= t)
            if S[t, k]:
                S[t, k] = bool(S[t + 1, k]) or used
                continue
            R[t, k] = bool(S[t + 1, k]) or used
    return S, R


def repair_S(st: Stages, S: np.ndarray) -> np.ndarray:
    """Make S carry every block of a non-recomputable node from its stage to its last need."""
    if st.recomputable.all():
        return S
    S = S.copy()
    while True:
        _, R = minimal_R(st, S)
        bad = [(t, k) for k in np.flatnonzero(~st.recomputable) for t in np.flatnonzero(R[:, k]) if t != k]
        if not bad:
            return S
        for t, k in bad:
            S[k + 1 : t + 1, k] = True


def improve_S(st: Stages, S: np.ndarray, budget: int, deadline: float) -> np.ndarray:
    """Local search for the warm start: replace a recomputation by keeping the block live.

    For each recomputation R[t,k] (k < t), checkpoint k in every stage from its previous
    computation up to t; accept when the decoded schedule stays within `budget` and costs less.
    Repeats until no move helps or `deadline` (time.monotonic()) passes.
    """
    graph = st.graph
    S, R = minimal_R(st, S)
    cost = float((R * st.cost[None, :]).sum())
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        cand = [(st.cost[k], t, k) for t, k in zip(*np.nonzero(np.tril(R, -1)), strict=True)]
        for _, t, k in sorted(cand, reverse=True):  # the dearest recomputations first
            if time.monotonic() >= deadline:
                break
            if not R[t, k]:
                continue
            prev = np.flatnonzero(R[:t, k])
            if not len(prev):
                continue
            S2 = S.copy()
            S2[prev[-1] + 1 : t + 1, k] = True
            S2, R2 = minimal_R(st, S2)
            c2 = float((R2 * st.cost[None, :]).sum())
            if c2 >= cost - 1e-12:
                continue
            seq = [st.ids[j] for tt in range(st.T) for j in range(tt + 1) if R2[tt, j]]
            if simulate(graph, steps_from_sequence(graph, seq)).peak_memory <= budget:
                S, R, cost = S2, R2, c2
                improved = True
    return S


def greedy_repair_S(
    st: Stages, S: np.ndarray, budget: int, deadline: float, max_moves: int | None = None
) -> np.ndarray | None:
    """Greedy repair for the warm start: from an over-budget S (e.g. the baseline's), fix the
    first overflowing stage by dropping the checkpoint that removes the most of its overflow per
    unit of added recomputation, and move on to the next overflowing stage until all fit.

    Overflow of a stage = Σ over its compute instants of max(0, memory − budget). A move un-keeps
    block i from stage t* up to and including its next reading stage (where minimal_R recomputes
    it); it only changes stages ≥ t* − 1 and never raises memory before t*, so the first
    overflowing stage only moves right. None when the deadline passes or no move helps.

    Each move is scored by a full decode and simulation (~0.1 s at T = 250), so a step costs one
    per checkpoint of stage t*; ``max_moves`` limits a step to that many candidates — half the
    largest blocks, half the most memory per unit of recompute cost — which is what makes the
    repair finish on a few hundred stages (checkmate-lp); None scores every checkpoint.
    """
    graph = st.graph

    def evaluate(S_: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        S_, R_ = minimal_R(st, S_)
        stage_of = [tt for tt in range(st.T) for j in range(tt + 1) if R_[tt, j]]
        seq = [st.ids[j] for tt in range(st.T) for j in range(tt + 1) if R_[tt, j]]
        steps = steps_from_sequence(graph, seq)
        sim = simulate(graph, steps, keep_profile=True)
        over = np.zeros(st.T)
        k = 0
        for mem, step in zip(sim.profile, steps, strict=True):
            if step.op == "compute":
                over[stage_of[k]] += max(0, mem - budget)
                k += 1
        return over, sim.cost, S_, R_

    over, cost, S, R = evaluate(S)
    while over.any():
        if time.monotonic() >= deadline:
            return None
        t_star = int(np.flatnonzero(over)[0])
        best: tuple[float, np.ndarray] | None = None
        movable = np.flatnonzero(S[t_star, :t_star] & st.recomputable[:t_star])
        rounds = [movable]
        if max_moves is not None and len(movable) > max_moves:
            by_size = movable[np.argsort(-st.mem[movable], kind="stable")]
            ratio = st.mem[movable] / (st.cost[movable] + 1e-9 * (1.0 + float(st.cost.max())))
            by_ratio = movable[np.argsort(-ratio, kind="stable")]
            half = max(1, max_moves // 2)
            first = list(dict.fromkeys([*by_size[:half].tolist(), *by_ratio[: max_moves - half].tolist()]))
            # the rest only when none of the shortlist helps
            rounds = [np.array(first), np.setdiff1d(movable, first)]
        for cand in rounds:
            if best is not None:
                break
            for i in cand:
                S2 = S.copy()
                tt = t_star
                while tt < st.T and S2[tt, i]:
                    S2[tt, i] = False
                    if any(R[tt, j] for j in st.succs[i] if j <= tt):
                        break
                    tt += 1
                o2, c2, _, _ = evaluate(S2)
                first2 = int(np.flatnonzero(o2)[0]) if o2.any() else st.T
                gain = over[t_star] if first2 > t_star else over[t_star] - o2[t_star]
                if first2 >= t_star and gain > 1e-9:
                    score = max(c2 - cost, 0.0) / gain
                    if best is None or score < best[0]:
                        best = (score, S2)
                if time.monotonic() >= deadline:
                    return None
        if best is None:
            return None
        over, cost, S, R = evaluate(best[1])
    return S


def sequence_from_S(st: Stages, S: np.ndarray) -> list[str]:
    _, R = minimal_R(st, S)
    return [st.ids[k] for t in range(st.T) for k in range(t + 1) if R[t, k]]


def steps_from_S(st: Stages, S: np.ndarray) -> list[Step]:
    return steps_from_sequence(st.graph, sequence_from_S(st, S))


def S_from_steps(st: Stages, steps: list[Step]) -> np.ndarray | None:
    """Checkpoints of a schedule: S[t,i] = 1 when block i is live between stage t−1 and stage t,
    i.e. after node t−1 first runs (and the frees that follow it), before the next compute; row
    T is the live set at the end. None when the schedule does not first-run nodes in `order`."""
    T = st.T
    index = {n: k for k, n in enumerate(st.ids)}
    producer = st.graph.producer
    live_cnt = np.zeros(T, dtype=np.int64)  # live output values per block
    S = np.zeros((T + 1, T), dtype=bool)
    seen = 0
    pending = False  # a stage boundary is open: snapshot before the next compute
    for step in steps:
        if step.op == "compute":
            k = index.get(step.node or "")
            if k is None:
                return None
            if pending:
                S[seen, :] = live_cnt > 0
                pending = False
            if k == seen:
                seen += 1
                pending = True
            elif k > seen:
                return None
            live_cnt[k] += len(st.graph.node_map[st.ids[k]].outputs)
        else:
            p = producer.get(step.value or "")
            if p is not None and p in index:
                live_cnt[index[p]] -= 1
    if seen != T:
        return None
    S[T, :] = st.keep
    return np.tril(S, -1)


def hint_vector(cm: CheckmateModel, steps: list[Step]) -> np.ndarray | None:
    """Variables of the Checkmate model for a schedule, or None when it does not fit the model
    (wrong first-run order, or over the budget once folded to blocks)."""
    S = S_from_steps(cm.stages, steps)
    if S is None:
        return None
    x = cm.vector(*minimal_R(cm.stages, S))
    return x if cm.model.violation(x) <= 1e-6 else None
