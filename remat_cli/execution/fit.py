"""A schedule with a memory plan that fits the budget: the arena, not only the live peak.

A planned schedule occupies the resident bytes plus one arena (docs/FORMATS.md), and a
placement can leave the arena above the schedule's live peak: dynamic storage allocation is
rarely packed to its lower bound (MODeL, Steiner et al., ICML 2023, §4 places and schedules
jointly for this reason). Where the schedule sits at the budget over a long plateau, the
plan's footprint passes the budget by that gap. A plan executor can still keep the budget by
handing dead pages back, but every page handed back is faulted in and zeroed again on the next
run. Solving a little below the budget costs a few recomputations instead, once.

Before solving again, the schedule is levelled (:mod:`remat_cli.execution.level`): a solver
that fills the budget leaves a plateau of near-peak instants that no placement packs tightly,
and most of it is the order, which costs nothing to change. The placement's gap (footprint
less live peak) sets the band: every instant in it, under the peak, is brought below it
by moving operators, and the schedule placed again; where it still does not fit, the peak that
order cannot move is lowered by recomputation (:func:`remat_cli.solvers.fastsa.repair.repair`)
to where that placement's gap would fit, and the band under the new peak levelled in turn. On
MobileNet-v2's training step at 50% (fastsa, 30 s) levelling alone takes the footprint from
5.6% above the budget to 40 bytes below it, at the same cost (the plan at the arena's bound);
the solver asked for less than the budget finds nothing lower than 4% above it.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from remat_cli.execution.level import level
from remat_cli.execution.runner import build_schedule, run_solver
from remat_cli.graph import Graph
from remat_cli.planning.addresses import place
from remat_cli.planning.memory_plan import Buffer, buffers_of, make_plan
from remat_cli.schedule import Schedule, Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.solvers.fastsa.repair import repair

#: rounds of levelling and placing again before the solver is asked for less than the budget
LEVEL_ROUNDS = 2
#: what the message of a levelled schedule's solver says
LEVELLED = "levelled to fit its memory plan"


def fit_plan(
    graph: Graph,
    budget: int,
    solver: str,
    options: SolveOptions,
    *,
    alignment: int = 64,
    place_time: float = 30.0,
    level_time: float = 30.0,
    tries: int = 3,
    start: Schedule | None = None,
) -> tuple[Schedule | None, SolverResult]:
    """Solve at `budget` (or take `start`, a schedule `solver` made at it) and place every
    buffer (`alignment`, `place_time` seconds); while the plan's footprint (resident bytes +
    arena) passes the budget, level the schedule and place it again (:func:`level_to_fit`,
    `level_time` seconds for each levelling or repair), and where that does not fit either,
    solve again at a budget lowered by the excess and 1% of the budget more, at most `tries`
    schedules in all.

    Returns the first schedule whose plan fits, carrying the caller's budget. Where none does
    (a later solve finds nothing, or the tries run out), the first schedule and its plan: a plan
    executor then hands dead pages back to keep the budget. Where even the first schedule's live
    peak passes the budget, no lower budget can help, and it is returned as it is."""
    target = budget
    first: tuple[Schedule, SolverResult] | None = None
    result = SolverResult(steps=None, status="infeasible")
    for attempt in range(tries):
        if attempt == 0 and start is not None:
            sched, result = start, as_result(start)
        else:
            sched, result = run_solver(graph, target, solver, options)
        if sched is None or (first is not None and sched.summary.peak_memory > budget):
            break
        bufs = buffers_of(graph, sched.steps)
        offsets, arena, _, _ = place(bufs, alignment, place_time, options.workers or 1)
        result.memory_plan = make_plan(bufs, offsets, alignment)
        planned = build_schedule(graph, budget, solver, result, sched.solver.seconds)
        first = first or (planned, result)
        footprint = graph.resident_bytes + arena
        if footprint <= budget or sched.summary.peak_memory > budget:
            return planned, result
        gap = footprint - sched.summary.peak_memory
        levelled = level_to_fit(
            graph, budget, sched.steps, gap, alignment, (place_time, level_time), options.workers or 1
        )
        if levelled is not None:
            steps, bufs, offsets = levelled
            fitted = dataclasses.replace(
                result,
                steps=steps,
                objective=cost_if(result, sched, simulate(graph, steps).cost),
                memory_plan=make_plan(bufs, offsets, alignment),
                message="; ".join(filter(None, [result.message, LEVELLED])),
            )
            return build_schedule(graph, budget, solver, fitted, sched.solver.seconds), fitted
        target -= footprint - budget + budget // 100
    return first or (None, result)


def level_to_fit(
    graph: Graph,
    budget: int,
    steps: Sequence[Step],
    gap: int,
    alignment: int,
    seconds: tuple[float, float],
    workers: int,
) -> tuple[list[Step], list[Buffer], list[int]] | None:
    """`steps` levelled until their plan fits `budget` (module docstring): (steps, buffers,
    offsets), or None after LEVEL_ROUNDS placements that do not fit, or where recomputation
    cannot bring the schedule under the level. `gap`: the first placement's footprint less the
    schedule's live peak, the band under the peak that each round levels; `seconds`: the most
    each placement takes, and each levelling or repair."""
    place_time, level_time = seconds
    band = gap
    for _ in range(LEVEL_ROUNDS):
        peak = simulate(graph, steps).peak_memory
        steps = level(graph, steps, min(peak, budget) - band, time.monotonic() + level_time)
        bufs = buffers_of(graph, steps)
        offsets, arena, _, _ = place(bufs, alignment, place_time, workers)
        if graph.resident_bytes + arena <= budget:
            return list(steps), bufs, offsets
        # what order alone cannot take off the peak, recomputation does, to where this
        # placement's gap (and a margin: a lower level places a little differently) would fit
        mark = budget - (graph.resident_bytes + arena - peak) - budget // 200
        fixed = repair(graph, steps, mark, time.monotonic() + level_time) if peak > mark else steps
        if fixed is None:
            return None
        steps = fixed
    return None


def cost_if(result: SolverResult, schedule: Schedule, cost: float) -> float | None:
    """`cost` as the objective of a result whose objective was its schedule's cost (None for
    one that minimised something else, or claimed nothing)."""
    if result.objective is None or abs(result.objective - schedule.summary.cost) > 1e-9 * max(1.0, cost):
        return None
    return cost


def as_result(schedule: Schedule) -> SolverResult:
    """What the solver of `schedule` returned, as far as the schedule records it."""
    info = schedule.solver
    return SolverResult(
        steps=list(schedule.steps),
        status=info.status,
        backend=info.backend,
        objective=info.objective,
        lower_bound=info.lower_bound,
        params=dict(info.params or {}),
        message=info.message,
    )
