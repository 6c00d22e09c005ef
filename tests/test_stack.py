"""--solver stack: one block's keep patterns (a Pareto front) combined over the stack by a
dynamic program. On the shipped 12-layer decoder its schedules fit and cost less than per-block
checkpointing and the ratio construction; the program is the exact optimum of its own model
(checked against enumeration); graphs without repeated blocks are refused."""

from __future__ import annotations

import itertools
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from remat_cli import registry
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.schedule import baseline, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.stack.pattern import THIN, Point
from remat_cli.solvers.stack.solver import Measured, Stack, program

DECODER = Path(__file__).resolve().parents[1] / "graphs" / "torch_decoder12_train.onnx"


@cache
def decoder() -> Graph:
    return from_onnx_file(DECODER)


def test_front_is_a_pareto_front_from_keeping_all() -> None:
    st = Stack.of(decoder())
    kept = [p.kept for p in st.front]
    cost = [p.cost for p in st.front]
    assert len(st.front) >= 5
    g = st.graph
    block_cost = sum(g.node_map[n].cost for n in st.blocks[len(st.blocks) // 2])
    assert cost[0] <= THIN * block_cost  # the first point keeps what costs something to make
    assert all(a > b for a, b in itertools.pairwise(kept)), kept
    assert all(a < b for a, b in itertools.pairwise(cost)), cost
    # every block has the template's keys: a pattern drops the same values in each
    for cands in st.cands[1:]:
        assert st.front[-1].dropped <= set(cands)


def test_uniform_pattern_costs_its_front_cost_in_every_block() -> None:
    g = decoder()
    st = Stack.of(g)
    base = baseline(g)
    p = st.front[len(st.front) // 2]
    sim = simulate(g, run_solver_steps(g, st, p))
    extra = sim.cost - base.cost
    # block 0 also makes the shared mask: at least L times the block's pattern cost, barely more
    assert len(st.blocks) * p.cost <= extra * (1 + 1e-9)
    assert extra <= len(st.blocks) * p.cost * 1.05


def run_solver_steps(g: Graph, st: Stack, p: Point) -> list:
    return steps_from_sequence(g, st.seq([p] * len(st.blocks)))


@pytest.mark.parametrize("share", [0.5, 0.3])
def test_fits_and_beats_blocks_and_ratio(share: float) -> None:
    g = decoder()
    base = baseline(g)
    budget = int(share * base.peak_memory)
    opts = SolveOptions(time_limit=60, seed=0, workers=1)
    schedule, result = run_solver(g, budget, "stack", opts)
    assert schedule is not None and result.status == "feasible"
    sim = simulate(g, schedule.steps)
    assert sim.peak_memory <= budget
    blocks, _ = run_solver(g, base.peak_memory, "blocks", SolveOptions())
    ratio, _ = run_solver(g, budget, "ratio", SolveOptions(time_limit=60, seed=0, workers=1))
    assert blocks is not None and ratio is not None
    assert sim.cost < blocks.summary.cost
    assert sim.cost < ratio.summary.cost


def _brute(ms: list[Measured], budget: int, L: int) -> float:
    best = np.inf
    for picks in itertools.product(range(len(ms)), repeat=L):
        below, ok = 0, True
        for layer, j in enumerate(picks):
            ok &= below + ms[j].work[layer] <= budget
            below += ms[j].kept
        ok &= below + ms[picks[-1]].head <= budget
        if ok:
            best = min(best, sum(ms[j].point.cost for j in picks))
    return best


@pytest.mark.parametrize("seed", range(6))
def test_program_is_the_optimum_of_its_model(seed: int) -> None:
    rng = np.random.default_rng(seed)
    L = 4
    ms = []
    for k in range(3):
        kept = int(rng.integers(0, 300))
        work = rng.integers(500, 1200, size=L)
        point = Point(frozenset({("v", k)}), kept, float(rng.integers(0, 100)))
        ms.append(Measured(point, kept, work, int(rng.integers(200, 800))))
    found = 0
    for cap in range(1000, 2600, 100):  # below 2 x GRID bytes: the program's grid is exact
        want = _brute(ms, cap, L)
        picks = program(ms, cap, L)
        if not np.isfinite(want):
            assert picks is None
            continue
        found += 1
        assert picks is not None
        assert sum(ms[j].point.cost for j in picks) == want
    assert found > 0


def test_refuses_graphs_without_repeated_blocks() -> None:
    why = registry.get("stack").supports(G.random_layered(30, seed=1))
    assert why is not None and "scope" in why


def test_first_schedule_comes_before_the_end_and_fits_with_no_time_left() -> None:
    g = decoder()
    budget = int(0.5 * baseline(g).peak_memory)
    seen: list[tuple[int, float]] = []

    def got(steps: list) -> None:
        sim = simulate(g, steps)
        seen.append((sim.peak_memory, sim.cost))

    solver = registry.get("stack")
    res = solver.solve(g, budget, SolveOptions(time_limit=60, params=solver.defaults(), on_incumbent=got))
    assert res.status == "feasible" and res.steps is not None
    final = simulate(g, res.steps)
    # each report fits and is cheaper than the one before (the first from the front's two ends
    # alone, a later search improves it); the last is the result
    assert len(seen) >= 2 and all(peak <= budget for peak, _ in seen)
    assert all(a[1] > b[1] for a, b in itertools.pairwise(seen)), seen
    assert seen[-1] == (final.peak_memory, final.cost)
    # no time at all: the first search (a third of the patterns) still answers, within budget
    late = solver.solve(g, budget, SolveOptions(time_limit=0, params=solver.defaults()))
    assert late.status == "feasible" and late.steps is not None
    assert simulate(g, late.steps).peak_memory <= budget
    assert late.message is not None and res.message is not None
    n_late, n_all = (int(m.split(", ")[1].split()[0]) for m in (late.message, res.message))
    assert 2 <= n_late < n_all
