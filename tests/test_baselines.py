"""Baseline solvers: greedy (DTR-style eviction / peak reduction) and Chen et al.'s checkpointing."""

from __future__ import annotations

import math

import pytest

from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph, Node, Value
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions, Solver, SolverResult
from remat_cli.solvers.chen import ChenGreedy, ChenSqrtN, Passes
from remat_cli.solvers.greedy import STRATEGIES, Greedy

GENERATED = {
    "linear": G.linear(12, seed=3),
    "layered": G.random_layered(60, seed=5),
    "unet": G.unet(depth=3, convs=2, seed=1),
    "transformer": G.transformer(layers=2, seed=2),
}


def solve(solver: Solver, g: Graph, b: int, **options: object) -> SolverResult:
    """The solver's own result, its params resolved as run_solver resolves them."""
    return solver.solve(g, b, solver.resolve(SolveOptions(**options)))  # type: ignore[arg-type]


def budget(g: Graph, fraction: float) -> int:
    return max(int(fraction * baseline(g).peak_memory), peak_lower_bound(g))


@pytest.mark.parametrize("name", list(GENERATED))
@pytest.mark.parametrize("fraction", [0.9, 0.75, 0.6])
def test_greedy_within_budget_when_it_claims_feasible(name: str, fraction: float) -> None:
    g = GENERATED[name]
    b = budget(g, fraction)
    result = solve(Greedy(), g, b, workers=1)
    sim = simulate(g, result.steps)
    if result.status == "feasible":
        assert sim.peak_memory <= b
    else:
        assert result.status == "infeasible" and result.best_peak is not None and sim.peak_memory > b


@pytest.mark.parametrize("name", ["linear", "unet", "transformer"])
def test_greedy_reaches_tight_budgets_on_training_graphs(name: str) -> None:
    """Not just 'valid': at 75% of the baseline peak every generated graph gets a schedule."""
    g = GENERATED[name]
    b = budget(g, 0.75)
    result = solve(Greedy(), g, b, workers=1)
    assert result.status == "feasible", result.message
    assert simulate(g, result.steps).cost > baseline(g).cost  # it had to recompute something


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_each_greedy_strategy_is_valid(strategy: str) -> None:
    g = GENERATED["layered"]
    result = solve(Greedy(), g, budget(g, 0.8), workers=1, params={"strategy": strategy})
    simulate(g, result.steps)  # raises when invalid


@pytest.mark.parametrize("name", list(GENERATED))
def test_greedy_at_full_budget_is_the_baseline(name: str) -> None:
    g = GENERATED[name]
    base = baseline(g)
    result = solve(Greedy(), g, base.peak_memory, workers=1)
    sim = simulate(g, result.steps)
    assert result.status == "feasible"
    assert sim.cost == pytest.approx(base.cost) and sim.recomputations == 0


def test_greedy_multi_output_nodes() -> None:
    """A node with two outputs: evicting one and recomputing the node must free the other first."""
    values = [Value(id="x", size=10, role="input")]
    nodes = []
    prev = "x"
    for k in range(6):
        values += [Value(id=f"a{k}", size=100), Value(id=f"b{k}", size=50)]
        nodes.append(Node(id=f"f{k}", inputs=[prev], outputs=[f"a{k}", f"b{k}"], cost=1.0))
        prev = f"a{k}"
    # a backward-like sweep reading every earlier pair in reverse
    grad = prev
    for k in reversed(range(6)):
        values.append(Value(id=f"g{k}", size=100))
        nodes.append(Node(id=f"df{k}", inputs=[grad, f"a{k}", f"b{k}"], outputs=[f"g{k}"], cost=2.0))
        grad = f"g{k}"
    g = Graph(values=values, nodes=nodes, outputs=[grad])
    b = budget(g, 0.7)
    for strategy in STRATEGIES:
        result = solve(Greedy(), g, b, workers=1, params={"strategy": strategy})
        sim = simulate(g, result.steps)
        if result.status == "feasible":
            assert sim.peak_memory <= b
    assert solve(Greedy(), g, b, workers=1).status == "feasible"


def test_chen_sqrtn_keeps_about_sqrt_n_checkpoints_on_a_chain() -> None:
    g = G.linear(16, seed=0)
    passes = Passes(g)
    assert passes.has_phases and len(passes.articulation) == 16  # every forward node but the loss
    result = solve(ChenSqrtN(), g, 10**12)
    assert "4 checkpoints" in (result.message or "")
    # every k-th articulation point with k = sqrt(16) is kept: those sqrt(n) forward nodes run
    # once, every other forward node once more when its segment is recomputed in backward
    computed = [s.node for s in result.steps if s.op == "compute"]
    once = [f"f{k}" for k in range(16) if computed.count(f"f{k}") == 1]
    assert once == ["f3", "f7", "f11", "f15"] and len(once) == math.isqrt(16)
    assert all(computed.count(f"f{k}") == 2 for k in range(16) if f"f{k}" not in once)
    sim = simulate(g, result.steps)
    assert sim.peak_memory < baseline(g).peak_memory
    assert sim.cost > baseline(g).cost


def test_chen_greedy_sweeps_to_fit_a_budget() -> None:
    g = G.linear(16, seed=0)
    base = baseline(g)
    for fraction in (0.9, 0.7):
        b = int(fraction * base.peak_memory)
        result = solve(ChenGreedy(), g, b)
        assert result.status == "feasible"
        assert simulate(g, result.steps).peak_memory <= b
    # the whole-forward segment (no checkpoint) is in the sweep: at the baseline peak, no overhead
    full = solve(ChenGreedy(), g, base.peak_memory)
    assert simulate(g, full.steps).cost == pytest.approx(base.cost)


@pytest.mark.parametrize("solver", ["chen-sqrtn", "chen-greedy"])
def test_chen_on_a_graph_without_phases(solver: str) -> None:
    g = G.random_layered(40, seed=9)
    assert all(n.phase is None for n in g.nodes)
    assert not Passes(g).has_phases
    b = budget(g, 0.9)
    schedule, result = run_solver(g, b, solver, SolveOptions(workers=1))
    assert schedule is not None
    simulate(g, schedule.steps)
    assert "forward pass" in ChenSqrtN().notes()
    if solver == "chen-sqrtn":
        assert "order treated as the forward pass" in (result.message or "")
