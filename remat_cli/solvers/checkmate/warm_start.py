"""Warm starts for the Checkmate MILP: the candidates (the --hint, greedy, a short staged Moccasin
run, the baseline) and the one handed to the engine, repaired and polished to fit the model."""

from __future__ import annotations

import time

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import Step, baseline_steps, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.checkmate.decode import (
    S_from_steps,
    greedy_repair_S,
    improve_S,
    minimal_R,
    steps_from_S,
)
from remat_cli.solvers.checkmate.lp import best_rounding
from remat_cli.solvers.checkmate.model import CheckmateModel


def warm_start_steps(
    graph: Graph, budget: int, options: SolveOptions, moccasin_share: float, notes: list[str]
) -> list[tuple[str, list[Step]]]:
    """Candidate warm starts: the user's --hint, the greedy schedule, a short run of the staged
    Moccasin CP (when `moccasin_share` > 0), the baseline. A helper solver that fails is named
    in `notes` (one that is not installed is skipped: the baseline always exists).

    Moccasin's staged time domain (Moccasin §2.3, eq. 11: stage j computes nodes ≤ j in order and
    runs node j for the first time at its end) is exactly Checkmate's stage space with at most
    ``max_copies`` computations per node, so its schedules map onto (S, R) one to one
    (:func:`S_from_steps`). CP-SAT finds near-optimal schedules of this space in seconds (RL
    n100 at 80%: the published optimum 2.30% in 2.2 s, where the greedy repair gives 10.4%), and
    a good incumbent is what lets the MILP's branch and bound prune.
    """
    from remat_cli.registry import call_solver

    out: list[tuple[str, list[Step]]] = []
    if options.hint:
        out.append(("hint", list(options.hint)))
    sub = SolveOptions(time_limit=min(5.0, options.remaining() or 5.0), seed=options.seed, workers=1)
    res = call_solver("greedy", graph, budget, sub, notes)
    if res is not None and res.steps is not None:
        out.append(("greedy", res.steps))
        if simulate(graph, res.steps).peak_memory <= budget:
            options.incumbent(res.steps)  # model building may outlast the time limit
    rem = options.remaining()
    if moccasin_share > 0 and (rem is None or rem >= 2.0):
        limit = min(30.0, moccasin_share * rem) if rem is not None else 30.0
        sub = SolveOptions(time_limit=limit, seed=options.seed, workers=options.workers, hint=options.hint)
        res = call_solver("moccasin", graph, budget, sub, notes)
        if res is not None and res.steps is not None and simulate(graph, res.steps).peak_memory <= budget:
            out.append((f"moccasin ({res.status})", res.steps))
            options.incumbent(res.steps)
    out.append(("baseline", baseline_steps(graph)))
    return out


def model_warm_start(
    graph: Graph,
    budget: int,
    options: SolveOptions,
    cm: CheckmateModel,
    warm: list[tuple[str, list[Step]]],
    lp_rounding: bool,
) -> tuple[np.ndarray | None, str]:
    """The cheapest candidate that fits the model, so the engine has an incumbent at once.

    Candidates: the user's hint and the greedy schedule when within budget; the baseline
    repaired by :func:`greedy_repair_S`; and, when none of those fits, Checkmate's LP
    rounding. The chosen one is polished by :func:`improve_S`. Each heuristic gets a share of
    the time limit (15%, LP 25%; 30 s caps without one).
    """
    st = cm.stages

    def share(frac: float) -> float:
        rem = options.remaining()
        return min(30.0, frac * rem) if rem is not None else 30.0

    cands: list[tuple[float, str, np.ndarray]] = []

    def add(src: str, S: np.ndarray | None) -> None:
        if S is None:
            return
        S, R = minimal_R(st, S)
        seq = [st.ids[j] for t in range(st.T) for j in range(t + 1) if R[t, j]]
        sim = simulate(graph, steps_from_sequence(graph, seq))
        if sim.peak_memory <= budget:
            cands.append((sim.cost, src, S))

    base_S = None
    for src, steps in warm:
        S = S_from_steps(st, steps)
        if src == "baseline":
            base_S = S
        add(src, S)
    if not cands and base_S is not None:
        add(
            "baseline + greedy repair",
            greedy_repair_S(st, base_S, budget, time.monotonic() + share(0.15)),
        )
    rem = options.remaining()
    # the LP of a large model can take tens of seconds and HiGHS does not stop mid-presolve
    if not cands and lp_rounding and (rem is None or rem >= 40.0):
        sub = SolveOptions(time_limit=share(0.25), seed=options.seed, workers=options.workers)
        rr = best_rounding(graph, budget, sub, 0.9, 20)
        if rr.best is not None:
            add(f"LP rounding ({rr.best[3]})", S_from_steps(st, rr.best[2]))
    for _, src, S in sorted(cands, key=lambda c: c[0]):
        S = improve_S(st, S, budget, time.monotonic() + share(0.1))
        x = cm.vector(*minimal_R(st, S))
        if cm.model.violation(x) <= 1e-6:
            options.incumbent(steps_from_S(st, cm.S_matrix(x)))
            inc = cm.real_cost(cm.model.objective(x))
            if inc is not None:  # an incumbent on the progress line before the engine starts
                options.progress(
                    elapsed=time.monotonic() - options.started,
                    incumbent=inc,
                    overhead=inc / st.base_cost - 1.0,
                )
            return x, src + " + local search"
    return None, ""
