"""Run one solver and turn its steps into a checked Schedule.

Every schedule goes through `simulate()` here; its summary comes from the simulator. A solver
that returns an invalid schedule is a bug and raises SolverBug rather than writing it.
"""

from __future__ import annotations

import time

from remat_cli.graph import Graph
from remat_cli.plan_check import check_plan
from remat_cli.schedule import (
    GraphRef,
    Schedule,
    ScheduleError,
    SimResult,
    SolverInfo,
    Step,
    Summary,
    baseline,
    simulate,
)
from remat_cli.solvers import registry
from remat_cli.solvers.base import SolveOptions, SolverResult


class SolverBug(RuntimeError):
    """A solver returned steps the simulator rejects."""


def build_schedule(
    graph: Graph,
    budget: int | None,
    solver_name: str,
    result: SolverResult,
    seconds: float,
    base: SimResult | None = None,
) -> Schedule:
    """Simulate `result.steps` and wrap them as remat-schedule v1."""
    assert result.steps is not None
    try:
        sim = simulate(graph, result.steps)
    except ScheduleError as e:
        raise SolverBug(f"solver {solver_name!r} returned an invalid schedule: {e}") from e
    base = base or baseline(graph)
    status = result.status
    footprint = sim.peak_memory
    if result.memory_plan is not None:
        try:
            check_plan(graph, result.steps, result.memory_plan)
        except ScheduleError as e:
            raise SolverBug(f"solver {solver_name!r} returned an invalid memory plan: {e}") from e
        footprint = max(footprint, graph.resident_bytes + result.memory_plan.arena)
    if budget is not None and footprint > budget:
        status = "infeasible"
    elif status == "infeasible":
        status = "feasible"
    return Schedule(
        graph=GraphRef(name=graph.name, sha256=graph.sha256()),
        budget=budget,
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
        summary=Summary(
            peak_memory=sim.peak_memory,
            cost=sim.cost,
            baseline_peak_memory=base.peak_memory,
            baseline_cost=base.cost,
            overhead=(sim.cost / base.cost - 1.0) if base.cost > 0 else 0.0,
            recomputations=sim.recomputations,
        ),
        memory_plan=result.memory_plan,
    )


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective - bound) / objective on the total cost; None unless the solver proves a bound."""
    if objective is None or bound is None:
        return None
    return max(0.0, objective - bound) / objective if objective > 0 else 0.0


def run_solver(
    graph: Graph, budget: int, name: str, options: SolveOptions
) -> tuple[Schedule | None, SolverResult]:
    """Solve; returns (schedule or None when the solver found nothing, the raw result).

    Ctrl-C during the solve returns the last incumbent the solver reported, if any.
    """
    solver = registry.get(name)
    params = solver.defaults() | options.params
    options.params = params
    incumbent: list[list[Step]] = []
    user_cb = options.on_incumbent

    def remember(steps: list[Step]) -> None:
        incumbent[:] = [steps]
        if user_cb is not None:
            user_cb(steps)

    options.on_incumbent = remember
    options.started = time.monotonic()
    try:
        result = solver.solve(graph, budget, options)
    except KeyboardInterrupt:
        if not incumbent:
            raise
        result = SolverResult(
            steps=incumbent[0], status="feasible", message="interrupted; best schedule so far"
        )
    seconds = time.monotonic() - options.started
    result.params = params | result.params
    if result.steps is None:
        return None, result
    return build_schedule(graph, budget, name, result, seconds), result
