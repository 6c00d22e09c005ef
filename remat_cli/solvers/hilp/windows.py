"""Windows: the flat start improved by exact ILPs over stretches of its own order (our
addition to HiREmate's "framework of solvers", §3.2.1).

The H-ILP's leaves are RK-Checkmate (Gusak et al., App. B): Checkmate's MILP (Jain et al., eqs.
1-16, :mod:`remat_cli.solvers.checkmate.model`) over atomic operators in a fixed order. Posed over
the whole graph in the order in which the flat start's schedule first computes its operators,
that MILP holds the schedule itself (:func:`hint_vector`), but the engines do not improve on it in
minutes: torch_unet_train at 50%, fastsa's 8.27% schedule, SCIP 600 s and HiGHS 120 s, gaps of
76-92%. Posed over a *window* of ``size`` consecutive stages, with R's rows outside it and S's
rows outside it and its two ends fixed at the schedule's values (:meth:`LinearModel.restricted`),
it is a model of the window's size that HiGHS solves or nearly solves in seconds; the window
chooses anew what the schedule keeps, frees and recomputes there, within the budget, in the same
order. Windows overlap by half; the ones where the schedule recomputes most go first, and one it
recomputes nothing in is skipped (its part of the objective is 0 already). A cheaper schedule
that the simulator confirms within budget replaces the start, so the result is never costlier.
On that unet schedule three windows of 40 stages gave 7.89% in 20 s; fastsa itself, given the
same 20 s more, gives 7.88% (``bench/hilp_windows.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.schedule import Step, simulate
from remat_cli.solvers.checkmate.decode import hint_vector, steps_from_S
from remat_cli.solvers.checkmate.model import CheckmateModel, build_model, stages_of, stri, tri

#: most stages the whole-graph model is built for (it has O(T²) columns: 1.1 M at 627 stages,
#: built in 2-3 s); past it the windows are not tried
MAX_STAGES = 800
#: deterministic mode: HiGHS branch-and-bound nodes per window (a work limit, not a clock)
WINDOW_NODES = 100


@dataclass
class Windows:
    """What the sweep gave: a cheaper schedule within budget (or None), and what it did."""

    steps: list[Step] | None
    cost: float
    peak: int
    tried: int
    improved: int
    note: str


def in_order(graph: Graph, seq: list[str]) -> Graph:
    """The graph with its operators ordered as `seq` first computes them (the rest after, in
    their own order), so that Checkmate's stages follow that schedule."""
    first = list(dict.fromkeys(seq))
    seen = set(first)
    order = first + [n for n in graph.topo_order if n not in seen]
    data = graph.model_dump(by_alias=True)
    data["order"] = order
    return Graph.model_validate(data)


def column_stages(cm: CheckmateModel) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The stage of every R, of every S and of every U/FREE column of `cm` (-1: a column of
    another kind), to cut windows of stages by."""
    T, n = cm.stages.T, cm.model.num_vars
    stage_r, stage_s, stage_u = np.full(n, -1), np.full(n, -1), np.full(n, -1)
    t, i = np.tril_indices(T)
    stage_r[cm.R[tri(t, i)]] = t
    stage_u[cm.U[tri(t, i)]] = t
    stage_u[cm.FREE] = cm.free_t
    t, i = np.tril_indices(T + 1, -1)
    keep = t >= 1
    stage_s[cm.S[stri(t[keep], i[keep])]] = t[keep]
    return stage_r, stage_s, stage_u


def spans(T: int, size: int) -> list[tuple[int, int]]:
    """Windows [a, b) of `size` of T stages, overlapping by half, the last one ending at T."""
    step = max(1, size // 2)
    return [(a, min(T, a + size)) for a in range(0, max(1, T - size + step), step)]


def sweep(
    graph: Graph,
    budget: int,
    steps: list[Step],
    size: int,
    time_limit: float,
    seed: int,
    deterministic: bool,
    deadline: float | None = None,
) -> Windows:
    """Windows of ``size`` stages over `steps`' order, each solved from the schedule's values,
    within `time_limit` seconds in all (and by ``deadline``, epoch seconds). With
    ``deterministic`` every window stops on HiGHS nodes (``WINDOW_NODES``), not on the clock,
    and a window the clock stops first is dropped, as the H-ILPs' runs are
    (:func:`remat_cli.solvers.hilp.subgraphs.solve_instance`). Windows are taken where the
    schedule recomputes most first."""
    started = time.monotonic()
    if deadline is not None:
        time_limit = min(time_limit, deadline - time.time())
    base = simulate(graph, steps)
    seq = [s.node for s in steps if s.op == "compute" and s.node is not None]
    st = stages_of(in_order(graph, seq), budget)
    if st.T > MAX_STAGES:
        return Windows(
            None, base.cost, base.peak_memory, 0, 0, f"not tried: {st.T} stages, more than {MAX_STAGES}"
        )
    cm = build_model(st)
    x = hint_vector(cm, steps)
    if x is None:
        return Windows(
            None,
            base.cost,
            base.peak_memory,
            0,
            0,
            "not tried: the schedule is none of Checkmate's in its order",
        )
    M = cm.model
    stage_r, stage_s, stage_u = column_stages(cm)
    windows = spans(st.T, size)
    rc = M.cost * (stage_r >= 0)  # the recomputation cost of each R column, 0 elsewhere

    def recomputed(a: int, b: int) -> float:
        sel = (stage_r >= a) & (stage_r < b)
        return float(rc[sel] @ x[sel])

    # where the schedule recomputes most first: a window it recomputes nothing in cannot
    # recompute less there, and is skipped
    windows = sorted((w for w in windows if recomputed(*w) > 0), key=lambda w: (-recomputed(*w), w[0]))
    cost, peak, best_steps, improved, tried, dropped = base.cost, base.peak_memory, None, 0, 0, 0
    for n, (a, b) in enumerate(windows):
        left = time_limit - (time.monotonic() - started)
        if left <= 0.2:
            break
        if recomputed(a, b) <= 0:
            continue
        # R and U/FREE of the window's stages (FREE[a-1] frees what S[a] drops), S of its
        # stages and both ends: the rest is the schedule's
        free = (
            ((stage_r >= a) & (stage_r < b))
            | ((stage_s >= a) & (stage_s <= b))
            | ((stage_u >= a - 1) & (stage_u <= b))
        )
        sub = M.restricted(free, x)
        # a window may take a third of what is left: most are solved in seconds, and the first
        # (where the schedule recomputes most) are the likeliest to pay
        settings = EngineSettings(
            backend="highs", time_limit=left / min(3, len(windows) - n), threads=1, seed=seed, hint=x[free]
        )
        if deterministic:
            settings.engine_options = {"highs": {"mip_max_nodes": WINDOW_NODES}}
            settings.time_limit = left
        res = milp_solve(sub, settings)
        tried += 1
        if deterministic and res.seconds >= left - 0.05:
            dropped += 1  # what the clock picked is not reproducible
            continue
        if res.x is None or float(sub.cost @ res.x) >= float(sub.cost @ x[free]) - 1e-9:
            continue
        cand = x.copy()
        cand[free] = res.x
        cand_steps = steps_from_S(st, cm.S_matrix(cand))
        sim = simulate(graph, cand_steps)
        # the next window starts from the decoded schedule's own values (the decoder recomputes
        # and frees as little as the stages allow, which may differ from the engine's vector)
        cand = hint_vector(cm, cand_steps)
        if cand is not None and sim.peak_memory <= budget and sim.cost < cost:
            x, cost, peak, best_steps = cand, sim.cost, sim.peak_memory, cand_steps
            improved += 1
    note = f"{improved} of {tried} windows improved it"
    if dropped:
        note += f" ({dropped} stopped by the clock: dropped for determinism)"
    return Windows(best_steps, cost, peak, tried, improved, note)
