"""The common checks every registered solver must pass (like scikit-learn's estimator checks).

A new solver joins by registering: it is run on the same generated graphs and budgets and must
return simulator-valid schedules, stay within budget or report infeasible, honour the time limit
and be deterministic for a seed.
"""

from __future__ import annotations

import time

import pytest

from remat_cli import generators as G
from remat_cli.graph import Graph
from remat_cli.schedule import baseline, peak_lower_bound, simulate
from remat_cli.solve import run_solver
from remat_cli.solvers import registry
from remat_cli.solvers.base import SolveOptions

TIME_LIMIT = 3.0
SLACK = 4.0  # model building, process start, decoding

GRAPHS: dict[str, Graph] = {
    "linear": G.linear(5, seed=1),
    "layered": G.random_layered(24, seed=2),
    "unet": G.unet(depth=2, convs=1, seed=3),
    "transformer": G.transformer(layers=1, seed=4),
}
FRACTIONS = (1.0, 0.8, 0.6)


def available_solvers() -> list[str]:
    return [n for n in registry.names() if registry.get(n).availability()[0] == "available"]


def budget_for(g: Graph, fraction: float) -> int:
    return max(int(fraction * baseline(g).peak_memory), peak_lower_bound(g))


@pytest.mark.parametrize("graph_name", list(GRAPHS))
@pytest.mark.parametrize("solver_name", available_solvers())
def test_valid_within_budget_and_time(solver_name: str, graph_name: str) -> None:
    g = GRAPHS[graph_name]
    solver = registry.get(solver_name)
    if solver.supports(g) is not None:
        pytest.skip(f"{solver_name} does not apply: {solver.supports(g)}")
    for fraction in FRACTIONS:
        budget = budget_for(g, fraction)
        t0 = time.monotonic()
        schedule, result = run_solver(g, budget, solver_name, SolveOptions(time_limit=TIME_LIMIT, seed=0))
        elapsed = time.monotonic() - t0
        assert elapsed <= TIME_LIMIT + SLACK, f"{solver_name} took {elapsed:.1f}s at {fraction:.0%}"
        if fraction == 1.0:
            assert schedule is not None and schedule.solver.status in ("optimal", "feasible"), (
                f"{solver_name} found no schedule at the baseline peak"
            )
        if schedule is None:
            assert result.status in ("infeasible", "unknown")
            continue
        sim = simulate(g, schedule.steps)  # valid, or this raises
        assert schedule.summary.peak_memory == sim.peak_memory
        assert schedule.summary.cost == pytest.approx(sim.cost)
        # a memory plan's arena is the footprint: resident bytes + arena (docs/FORMATS.md)
        plan = schedule.memory_plan
        footprint = max(sim.peak_memory, g.resident_bytes + plan.arena if plan is not None else 0)
        if schedule.solver.status in ("optimal", "feasible"):
            assert footprint <= budget
        else:
            assert schedule.solver.status == "infeasible" and footprint > budget


@pytest.mark.parametrize("solver_name", available_solvers())
def test_deterministic_for_a_seed(solver_name: str) -> None:
    g = GRAPHS["layered"]
    budget = budget_for(g, 0.8)
    runs = [
        run_solver(g, budget, solver_name, SolveOptions(time_limit=TIME_LIMIT, seed=7, workers=1))[0]
        for _ in range(2)
    ]
    if runs[0] is None:
        assert runs[1] is None
        return
    assert runs[1] is not None and runs[0].steps == runs[1].steps


@pytest.mark.parametrize("solver_name", available_solvers())
def test_describes_itself(solver_name: str) -> None:
    solver = registry.get(solver_name)
    assert solver.name == solver_name
    assert solver.method and solver.paper
    names = [p.name for p in solver.params]
    assert len(names) == len(set(names))
