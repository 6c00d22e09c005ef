"""What every check of the contract suite shares.

Its time limits, the raw solve, the agreement of a solver's claims (status, objective, bounds,
best peak) with the simulator, and the graphs a solver declares it supports.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from typing import Any

from remat_cli.graph import Graph
from remat_cli.schedule import ScheduleError, SimResult, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions, Solver, SolverResult

#: seconds given to each solve (half of it with an option at an extreme), and what a solve may take
#: beyond it (imports, model building, decoding: seconds when the cores are shared). The graphs are small: what is checked is what a solver
#: claims about the schedule it returns, not how good the schedule is.
TIME_LIMIT = 1.0
SLACK = 6.0
FRACTIONS = (1.0, 0.8, 0.6)
TOLERANCE = 1e-6  # relative, on costs


def fail(check: str, message: str) -> AssertionError:
    """The assertion a failed check raises: its message starts with the check's name."""
    return AssertionError(f"{check}: {message}")


def run_raw(solver: Solver, graph: Graph, budget: int, **options: Any) -> tuple[SolverResult, float]:
    """The solver's raw result (its params resolved as run_solver does) and the seconds it took."""
    opts = solver.resolve(SolveOptions(**options))
    t0 = time.monotonic()
    result = solver.solve(graph, budget, opts)
    return result, time.monotonic() - t0


def check_claims(
    check: str, graph: Graph, budget: int, result: SolverResult, minimises: str = "cost"
) -> SimResult | None:
    """What the solver claims agrees with the simulator; returns the simulation of its steps.

    `minimises` is the solver's objective: "cost" (compute) or "memory" (its footprint).
    """
    where = f"{graph.name} at budget {budget:,}"
    if result.status not in ("optimal", "feasible", "infeasible", "unknown", "error"):
        raise fail(check, f"{where}: unknown status {result.status!r}")
    sim = None
    if result.steps is not None:
        try:
            sim = simulate(graph, result.steps)
        except ScheduleError as e:
            raise fail(check, f"{where}: invalid schedule: {e}") from None
    # a memory plan's footprint is resident bytes + its arena (docs/FORMATS.md)
    footprint = sim.peak_memory if sim is not None else None
    if sim is not None and result.memory_plan is not None:
        footprint = max(sim.peak_memory, graph.resident_bytes + result.memory_plan.arena)
    if result.status in ("optimal", "feasible"):
        if sim is None or footprint is None:
            raise fail(check, f"{where}: status {result.status!r} without steps")
        if footprint > budget:
            raise fail(check, f"{where}: {result.status!r} but the footprint is {footprint:,}")
    if result.status == "infeasible" and footprint is not None and footprint <= budget:
        raise fail(check, f"{where}: 'infeasible' but its steps fit (footprint {footprint:,})")
    if result.best_peak is not None:
        if result.best_peak < peak_lower_bound(graph):
            raise fail(check, f"{where}: best_peak {result.best_peak:,} is below the lower bound")
        if result.status == "infeasible" and result.best_peak <= budget:
            raise fail(check, f"{where}: 'infeasible' but best_peak {result.best_peak:,} fits")
        if footprint is not None and result.best_peak > footprint:
            raise fail(check, f"{where}: best_peak {result.best_peak:,} above its own steps' footprint")
    if sim is not None and footprint is not None and footprint <= budget:
        value = float(footprint) if minimises == "memory" else sim.cost
        tol = TOLERANCE * max(1.0, value)
        if result.objective is not None and abs(result.objective - value) > tol:
            raise fail(check, f"{where}: objective {result.objective} but its steps give {value}")
        if result.lower_bound is not None and result.lower_bound > value + tol:
            raise fail(check, f"{where}: lower bound {result.lower_bound} above its own {value}")
    return sim


def applicable_graphs(solver: Solver, check: str, graphs: Iterable[Graph]) -> Iterator[Graph]:
    """The graphs the solver supports; a check that would run on none fails."""
    ran = 0
    for g in graphs:
        if solver.supports(g) is None:
            ran += 1
            yield g
    if not ran:
        raise fail(check, f"{solver.name} supports none of the contract graphs: nothing was checked")
