"""Run one solver and turn its steps into a checked Schedule.

Every schedule goes through `simulate()` here; its summary comes from the simulator. A solver
that returns an invalid schedule is a bug and raises SolverBug rather than writing it.
"""

from __future__ import annotations

import math
import time

from remat_cli import registry
from remat_cli.execution.cost_bound import CostBound, cost_lower_bound, meets
from remat_cli.graph import Graph
from remat_cli.planning.check import check_plan
from remat_cli.schedule import (
    GraphRef,
    Schedule,
    ScheduleError,
    SimResult,
    SolverInfo,
    Step,
    evaluate,
    relative_gap,
)
from remat_cli.solver import SolveOptions, SolverResult


class SolverBug(RuntimeError):
    """A solver returned steps the simulator rejects."""


def build_schedule(
    graph: Graph,
    budget: int | None,
    solver_name: str,
    result: SolverResult,
    seconds: float,
    base: SimResult | None = None,
    budgets: dict[str, int] | None = None,
) -> Schedule:
    """Simulate `result.steps` and wrap them as remat-schedule v1."""
    assert result.steps is not None
    try:
        ev = evaluate(graph, result.steps, budget, base, budgets)
    except ScheduleError as e:
        raise SolverBug(f"solver {solver_name!r} returned an invalid schedule: {e}") from e
    # the status a user sees follows the simulator, not the solver's claim (remat_cli.testing
    # checks the claim itself)
    status = result.status
    within = ev.within_budget
    if result.memory_plan is not None:
        try:
            check_plan(graph, result.steps, result.memory_plan)
        except ScheduleError as e:
            raise SolverBug(f"solver {solver_name!r} returned an invalid memory plan: {e}") from e
        # a planned schedule occupies resident bytes + one arena (docs/FORMATS.md)
        footprint = max(ev.sim.peak_memory, graph.resident_bytes + result.memory_plan.arena)
        within = within and (budget is None or footprint <= budget)
    if not within:
        status = "infeasible"
    elif status == "infeasible":
        status = "feasible"
    multi = ev.sim.peak_by_device is not None
    return Schedule(
        graph=GraphRef(name=graph.name, sha256=graph.sha256()),
        budget=budget,
        budgets=budgets if multi else None,
        solver=SolverInfo(
            name=solver_name,
            backend=result.backend,
            status=status,
            seconds=round(seconds, 4),
            objective=result.objective,
            lower_bound=result.lower_bound,
            gap=relative_gap(result.objective, result.lower_bound),
            params=result.params,
            message=result.message,
        ),
        steps=list(result.steps),
        summary=ev.summary(),
        memory_plan=result.memory_plan,
    )


def run_solver(
    graph: Graph, budget: int, name: str, options: SolveOptions
) -> tuple[Schedule | None, SolverResult]:
    """Solve; returns (schedule or None when the solver found nothing, the raw result).

    Ctrl-C during the solve returns the last incumbent the solver reported, if any.
    """
    solver = registry.get(name)
    incumbent: list[list[Step]] = []
    user_cb = options.on_incumbent

    def remember(steps: list[Step]) -> None:
        incumbent[:] = [steps]
        if user_cb is not None:
            user_cb(steps)

    # a new, resolved SolveOptions: the caller's is never changed
    resolved = solver.resolve(options)
    resolved.on_incumbent = remember
    resolved.started = time.monotonic()
    try:
        result = solver.solve(graph, budget, resolved)
    except KeyboardInterrupt:
        if not incumbent:
            raise
        result = SolverResult(
            steps=incumbent[0], status="feasible", message="interrupted; best schedule so far"
        )
    seconds = time.monotonic() - resolved.started
    result.params = resolved.params | result.params
    if result.steps is None:
        return None, result
    return build_schedule(graph, budget, name, result, seconds, budgets=options.budgets), result


def with_cost_bound(
    graph: Graph, schedule: Schedule, seconds: float, cut: CostBound | None = None
) -> Schedule:
    """`schedule` with the cut bound (remat_cli/execution/cost_bound.py) as its lower bound, when its solver
    minimises compute: the bound holds for every order, so for every solver's space, and a
    schedule whose cost meets it is optimal whatever found it (status "optimal"). A solver's own
    bound is kept where higher. Multi-device graphs, planned schedules and schedules over their
    budget come back unchanged."""
    info = schedule.solver
    if (
        graph.devices
        or schedule.memory_plan is not None
        or schedule.budget is None
        or info.status not in ("feasible", "optimal")
        or registry.get(info.name).minimises != "cost"
    ):
        return schedule
    if cut is None:
        cut = cost_lower_bound(graph, schedule.budget, time_limit=seconds)
    if not math.isfinite(cut.extra_cost):
        # "no schedule fits", with one in hand: the engine failed numerically, and an infinite
        # bound would call every schedule optimal
        return schedule
    cost, base = schedule.summary.cost, schedule.summary.baseline_cost
    lower = base + cut.extra_cost
    if info.lower_bound is not None and info.objective is not None and math.isclose(info.objective, cost):
        lower = max(lower, info.lower_bound)  # the solver's own bound, in the same unit
    optimal = meets(cost, lower)
    note = f"cut bound: overhead >= {cut.overhead(base):.4%}"
    return schedule.model_copy(
        update={
            "solver": info.model_copy(
                update={
                    "status": "optimal" if optimal else info.status,
                    "objective": cost,
                    "lower_bound": lower,
                    "gap": relative_gap(cost, lower),
                    "message": f"{info.message}; {note}" if info.message else note,
                }
            )
        }
    )
