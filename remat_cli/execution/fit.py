"""A schedule with a memory plan that fits the budget: the arena, not only the live peak.

A planned schedule occupies the resident bytes plus one arena (docs/FORMATS.md), and a
placement can leave the arena above the schedule's live peak: dynamic storage allocation is
rarely packed to its lower bound (MODeL, Steiner et al., ICML 2023, §4 places and schedules
jointly for this reason). Where the schedule sits at the budget over a long plateau, the
plan's footprint passes the budget by that gap. A plan executor can still keep the budget by
handing dead pages back, but every page handed back is faulted in and zeroed again on the next
run. Solving a little below the budget costs a few recomputations instead, once.
"""

from __future__ import annotations

from remat_cli.execution.runner import build_schedule, run_solver
from remat_cli.graph import Graph
from remat_cli.planning.addresses import place
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.schedule import Schedule
from remat_cli.solver import SolveOptions, SolverResult


def fit_plan(
    graph: Graph,
    budget: int,
    solver: str,
    options: SolveOptions,
    *,
    alignment: int = 64,
    place_time: float = 30.0,
    tries: int = 3,
    start: Schedule | None = None,
) -> tuple[Schedule | None, SolverResult]:
    """Solve at `budget` (or take `start`, a schedule `solver` made at it) and place every
    buffer (`alignment`, `place_time` seconds); while the plan's footprint (resident bytes +
    arena) passes the budget, solve again at a budget lowered by the excess and 1% of the budget
    more, at most `tries` schedules in all.

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
        target -= footprint - budget + budget // 100
    return first or (None, result)


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
