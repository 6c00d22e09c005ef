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
and most of it is the order, which costs nothing to change. The placement's gap (footprint less
live peak, at least 1% of the budget) sets the band under the peak that is levelled, and the
schedule is placed again; each schedule solved below the budget is levelled in turn. Where
none fits (a solver that cannot go below the budget), the first levelled schedule is repaired
below its peak by recomputation (:func:`remat_cli.solvers.fastsa.repair.repair`), to where its
placement's gap would fit, and levelled again. The repair comes last as its greedy choice of
recomputations can cost far more than a solver's at a lower budget.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass

from remat_cli.execution.level import level
from remat_cli.execution.order import restore_order
from remat_cli.execution.runner import build_schedule, run_solver
from remat_cli.graph import Graph
from remat_cli.planning.addresses import place
from remat_cli.planning.memory_plan import Buffer, buffers_of, make_plan
from remat_cli.schedule import Schedule, Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.solvers.fastsa.repair import repair

#: rounds of recomputing, levelling and placing again, where neither levelling nor solving again
#: gives a plan that fits
REPAIR_ROUNDS = 2
#: what the message of a levelled schedule's solver says
LEVELLED = "levelled to fit its memory plan"


@dataclass
class Placed:
    """A schedule's steps with their buffers' offsets, its plan's footprint and its live peak."""

    steps: list[Step]
    buffers: list[Buffer]
    offsets: list[int]
    footprint: int
    peak: int

    @property
    def gap(self) -> int:
        """The footprint above the live peak: what the placement adds."""
        return self.footprint - self.peak


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
    arena) passes the budget, level the schedule and place it again (`level_time` seconds),
    and where that does not fit either, solve again at a budget lowered by the excess and 1% of
    the budget more, at most `tries` schedules in all. Where none of them fits, the first
    levelled schedule is repaired below its peak (:func:`recompute_to_fit`).

    Returns the first schedule whose plan fits, carrying the caller's budget. Where none does
    (a later solve finds nothing, or the tries run out), the first schedule and its plan: a plan
    executor then hands dead pages back to keep the budget. Where even the first schedule's live
    peak passes the budget, no lower budget can help: it is returned with its operators back in
    the graph's order as far as its peak allows (:func:`in_model_order`)."""
    target = budget
    first: tuple[Schedule, SolverResult, Placed, int] | None = None
    result = SolverResult(steps=None, status="infeasible")
    times, workers = (place_time, level_time), options.workers or 1
    for attempt in range(tries):
        if attempt == 0 and start is not None:
            sched, result = start, as_result(start)
        else:
            sched, result = run_solver(graph, target, solver, options)
        if sched is None or (first is not None and sched.summary.peak_memory > budget):
            break
        if sched.summary.peak_memory > budget:  # the lowest peak is all there is: the model's order
            sched, result = in_model_order(graph, budget, solver, sched, result)
        bufs = buffers_of(graph, sched.steps)
        offsets, arena, _, _ = place(bufs, alignment, place_time, workers)
        result.memory_plan = make_plan(bufs, offsets, alignment)
        planned = build_schedule(graph, budget, solver, result, sched.solver.seconds)
        footprint = graph.resident_bytes + arena
        if footprint <= budget or sched.summary.peak_memory > budget:
            return planned, result
        band = max(footprint - sched.summary.peak_memory, budget // 100)
        levelled = level_and_place(graph, budget, sched.steps, band, alignment, times, workers)
        if levelled.footprint <= budget:
            return with_plan(graph, budget, solver, sched, result, levelled, alignment)
        first = first or (planned, result, levelled, band)
        target -= footprint - budget + budget // 100
    if first is None:
        return None, result
    planned, result, levelled, band = first
    repaired = recompute_to_fit(graph, budget, levelled, band, alignment, times, workers)
    if repaired is None:
        return planned, result
    return with_plan(graph, budget, solver, planned, result, repaired, alignment)


def level_and_place(
    graph: Graph,
    budget: int,
    steps: Sequence[Step],
    band: int,
    alignment: int,
    seconds: tuple[float, float],
    workers: int,
) -> Placed:
    """`steps` levelled under the `band` below their peak (or the budget, the lower) and placed
    (`seconds`: the most the placement and the levelling take)."""
    place_time, level_time = seconds
    peak = simulate(graph, steps).peak_memory
    steps = level(graph, steps, min(peak, budget) - band, time.monotonic() + level_time)
    bufs = buffers_of(graph, steps)
    offsets, arena, _, _ = place(bufs, alignment, place_time, workers)
    return Placed(
        list(steps), bufs, offsets, graph.resident_bytes + arena, simulate(graph, steps).peak_memory
    )


def recompute_to_fit(
    graph: Graph,
    budget: int,
    placed: Placed,
    band: int,
    alignment: int,
    seconds: tuple[float, float],
    workers: int,
) -> Placed | None:
    """`placed` repaired below its peak by recomputation (:func:`remat_cli.solvers.fastsa.repair.
    repair`) to where its placement's gap, and a margin of 0.5% of the budget, would fit, then
    levelled under the `band` below the new peak and placed again: the first that fits, or
    None after REPAIR_ROUNDS (or where the repair finds no schedule). Each round's repair takes
    at most the levelling's seconds."""
    for _ in range(REPAIR_ROUNDS):
        mark = budget - placed.gap - budget // 200
        fixed = repair(graph, placed.steps, mark, time.monotonic() + seconds[1])
        if fixed is None:
            return None
        placed = level_and_place(graph, budget, fixed, band, alignment, seconds, workers)
        if placed.footprint <= budget:
            return placed
    return None


def with_plan(
    graph: Graph,
    budget: int,
    solver: str,
    schedule: Schedule,
    result: SolverResult,
    placed: Placed,
    alignment: int,
) -> tuple[Schedule, SolverResult]:
    """The schedule of `placed`'s steps and plan, and the result it comes from: `result`, with
    those steps, their cost as its objective where it was its schedule's cost, and LEVELLED."""
    cost = simulate(graph, placed.steps).cost
    same = result.objective is not None and abs(result.objective - schedule.summary.cost) <= 1e-9 * max(
        1.0, cost
    )
    fitted = dataclasses.replace(
        result,
        steps=placed.steps,
        objective=cost if same else None,
        memory_plan=make_plan(placed.buffers, placed.offsets, alignment),
        message="; ".join(filter(None, [result.message, LEVELLED])),
    )
    return build_schedule(graph, budget, solver, fitted, schedule.solver.seconds), fitted


def in_model_order(
    graph: Graph, budget: int, solver: str, schedule: Schedule, result: SolverResult
) -> tuple[Schedule, SolverResult]:
    """`schedule` with its operators back in the graph's own order as far as its peak allows
    (:func:`remat_cli.execution.order.restore_order`): where no schedule reaches the budget,
    the solver only lowered the peak, and its order costs time the simulator does not see."""
    steps = restore_order(graph, schedule.steps)
    restored = dataclasses.replace(result, steps=steps)
    return build_schedule(graph, budget, solver, restored, schedule.solver.seconds), restored


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
