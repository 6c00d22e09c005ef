"""moccasin: optimality against brute force on tiny graphs, hints, time-outs, decoding.

The brute forces here are independent of the CP model: they enumerate compute sequences and
score each with the shared decoder (`steps_from_sequence`) and the simulator.

- Staged space (§2.3, the default): stage j computes any subset of nodes 1..j-1 in order, then
  node j. This is exactly Checkmate's fixed-order stage space (T = n stages, stage t computes
  node t and may recompute earlier nodes in topological order); MOCCASIN additionally caps the
  computations of each node at C_v, so with C_v ≥ n the two optima coincide.
- Free space (§2.1): any sequence in which every node's predecessors were computed before it,
  each node computed 1..C_v times.
"""

from __future__ import annotations

import itertools
import random

import pytest

from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph, Node, Value
from remat_cli.importers import generators as G
from remat_cli.schedule import ScheduleError, baseline, peak_lower_bound, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.moccasin import model as MM
from remat_cli.solvers.moccasin import solver as MS
from remat_cli.solvers.moccasin import starts as MST


def tiny_graph(n: int, seed: int, *, multi: bool = False) -> Graph:
    """A random DAG on n nodes with unit-free integer sizes and costs (and, by seed, a parameter,
    a workspace, a non-recomputable node, a second graph output)."""
    rng = random.Random(seed)
    values = [Value(id="x", size=rng.randint(0, 3), role="input")]
    nodes = []
    for k in range(n):
        preds = [p for p in range(k) if rng.random() < 0.45] or ([k - 1] if k else [])
        ins = [f"v{p}" for p in preds] or ["x"]
        if rng.random() < 0.2:
            values.append(Value(id=f"w{k}", size=rng.randint(1, 3), role="parameter"))
            ins.append(f"w{k}")
        outs = [f"v{k}"]
        values.append(Value(id=f"v{k}", size=rng.randint(1, 9)))
        if multi and rng.random() < 0.4:
            outs.append(f"y{k}")
            values.append(Value(id=f"y{k}", size=rng.randint(1, 5)))
        nodes.append(
            Node(
                id=f"n{k}",
                inputs=ins,
                outputs=outs,
                cost=float(rng.randint(1, 6)),
                workspace=rng.choice([0, 0, 0, 2]),
                recomputable=rng.random() > 0.1,
            )
        )
    outputs = [f"v{n - 1}"] + ([f"v{n // 2}"] if seed % 3 == 0 and n > 2 else [])
    return Graph(name=f"tiny{seed}", values=values, nodes=nodes, outputs=outputs)


def _score(g: Graph, seq: list[str], budget: int) -> float | None:
    try:
        sim = simulate(g, steps_from_sequence(g, seq))
    except ScheduleError:
        return None
    return sim.cost if sim.peak_memory <= budget else None


def _allowed(g: Graph, seq: list[str], c_v: int) -> bool:
    counts: dict[str, int] = {}
    for x in seq:
        counts[x] = counts.get(x, 0) + 1
    return all(c <= (c_v if g.node_map[x].recomputable else 1) for x, c in counts.items())


def staged_sequences(g: Graph) -> list[tuple[int, float, int]]:
    """(peak, cost, most computations of one node) of every sequence of the staged space."""
    order = [x for x in g.topo_order if x in g.needed_nodes]
    out = []
    choices = [list(itertools.product((0, 1), repeat=j)) for j in range(len(order))]
    for picks in itertools.product(*choices):
        seq: list[str] = []
        for j, pick in enumerate(picks):
            seq += [order[i] for i in range(j) if pick[i]] + [order[j]]
        if not _allowed(g, seq, len(order)):
            continue
        sim = simulate(g, steps_from_sequence(g, seq))  # staged sequences are always valid
        out.append((sim.peak_memory, sim.cost, max(seq.count(x) for x in order)))
    return out


def brute_staged(table: list[tuple[int, float, int]], budget: int, c_v: int) -> float | None:
    costs = [cost for peak, cost, most in table if peak <= budget and most <= c_v]
    return min(costs) if costs else None


def brute_free(g: Graph, budget: int, c_v: int) -> float | None:
    needed = [x for x in g.topo_order if x in g.needed_nodes]
    preds = {x: {g.producer[v] for v in g.node_map[x].inputs if v in g.producer} for x in needed}
    cap = {x: c_v if g.node_map[x].recomputable else 1 for x in needed}
    best: list[float | None] = [None]

    def dfs(seq: list[str], counts: dict[str, int]) -> None:
        if len(counts) == len(needed):
            cost = _score(g, seq, budget)
            if cost is not None and (best[0] is None or cost < best[0]):
                best[0] = cost
        for x in needed:
            if counts.get(x, 0) < cap[x] and all(p in counts for p in preds[x]):
                counts[x] = counts.get(x, 0) + 1
                dfs(seq + [x], counts)
                counts[x] -= 1
                if counts[x] == 0:
                    del counts[x]

    dfs([], {})
    return best[0]


def budgets(g: Graph) -> list[int]:
    lo, hi = peak_lower_bound(g), baseline(g).peak_memory
    return sorted({lo, (2 * lo + hi) // 3, (lo + 2 * hi) // 3, hi})


def solve(g: Graph, budget: int, **params: object):
    return run_solver(
        g, budget, "moccasin", SolveOptions(time_limit=20, seed=0, workers=1, params=dict(params))
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(8))
def test_staged_optimum_equals_brute_force(seed: int) -> None:
    """With C_v ≥ n the staged optimum is Checkmate's fixed-order optimum; with C_v = 2 it is
    the optimum over staged sequences computing each node at most twice."""
    g = tiny_graph(6, 18) if seed == 7 else tiny_graph(5, seed)  # 18: six needed nodes, two outputs
    n = len(g.nodes)
    table = staged_sequences(g)
    for budget in budgets(g):
        for c_v in (n, 2):
            want = brute_staged(table, budget, c_v)
            schedule, result = solve(g, budget, max_copies=c_v)
            if want is None:
                assert schedule is None and result.status == "infeasible", (budget, c_v)
                continue
            assert schedule is not None and result.status == "optimal", (budget, c_v, result.message)
            assert schedule.summary.cost == pytest.approx(want), (budget, c_v)
            assert schedule.summary.peak_memory <= budget


@pytest.mark.parametrize("seed", range(4))
def test_free_order_optimum_equals_brute_force(seed: int) -> None:
    g = tiny_graph(4, 100 + seed)
    table = staged_sequences(g)
    for budget in budgets(g):
        want = brute_free(g, budget, 2)
        schedule, result = solve(g, budget, max_copies=2, free_order=True)
        if want is None:
            assert schedule is None and result.status == "infeasible"
            continue
        assert schedule is not None and result.status == "optimal", result.message
        assert schedule.summary.cost == pytest.approx(want)
        staged = brute_staged(table, budget, 2)
        assert staged is None or want <= staged + 1e-9  # the free space contains the staged one


@pytest.mark.parametrize("seed", range(3))
def test_multi_output_nodes_are_one_block(seed: int) -> None:
    """Folding outputs into one block can only cost memory: the staged optimum is never below
    the per-value brute force, and every schedule passes the simulator within budget."""
    g = tiny_graph(5, 200 + seed, multi=True)
    table = staged_sequences(g)
    for budget in budgets(g):
        want = brute_staged(table, budget, 5)
        schedule, result = solve(g, budget, max_copies=5)
        if schedule is None:
            assert result.status == "infeasible"
            continue
        assert want is not None and schedule.summary.cost >= want - 1e-9
        assert simulate(g, schedule.steps).peak_memory <= budget


def test_integer_costs_keep_ratios() -> None:
    assert MM.integer_costs([2.0, 4.0, 6.0]) == ([1, 2, 3], 2.0)
    ints, unit = MM.integer_costs([0.5, 0.25, 1.0])
    assert ints == [2, 1, 4] and unit == pytest.approx(0.25)
    ints, unit = MM.integer_costs([1 / 3, 2 / 3, 1.0])
    assert [i * unit for i in ints] == pytest.approx([1 / 3, 2 / 3, 1.0], rel=1e-5)


def test_time_out_returns_incumbent_with_bound() -> None:
    g = G.random_layered(60, seed=5)
    budget = int(0.8 * baseline(g).peak_memory)
    seen: list[int] = []
    opts = SolveOptions(time_limit=3, seed=1, workers=1, on_incumbent=lambda steps: seen.append(len(steps)))
    schedule, result = run_solver(g, budget, "moccasin", opts)
    assert schedule is not None and schedule.summary.peak_memory <= budget
    assert seen, "incumbents are reported while solving"
    assert result.status in ("optimal", "feasible")
    assert result.lower_bound is not None and result.lower_bound <= schedule.summary.cost + 1e-6
    assert result.objective == pytest.approx(schedule.summary.cost)


def test_one_worker_says_when_the_clock_not_its_work_stopped_it() -> None:
    """With one worker a seed repeats only where CP-SAT stops on its deterministic budget: a run
    the wall clock cut says so (the H-ILP's flat start drops it), a finished one does not. On a
    3-layer transformer at 50% CP-SAT runs its deterministic time at about a fifth of the wall
    clock, so a second's limit is always the clock's."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.5 * baseline(g).peak_memory)
    _, cut = run_solver(g, budget, "moccasin", SolveOptions(time_limit=1, seed=3, workers=1))
    assert cut.params.get("clock_stopped") is True
    small = tiny_graph(5, seed=0)
    _, done = run_solver(
        small, baseline(small).peak_memory, "moccasin", SolveOptions(time_limit=30, seed=3, workers=1)
    )
    assert done.status == "optimal" and "clock_stopped" not in done.params


def test_hint_is_used_and_never_beaten_by_worse() -> None:
    g = G.unet(depth=2, convs=1, seed=3)
    budget = int(0.8 * baseline(g).peak_memory)
    first, _ = solve(g, budget)
    assert first is not None
    opts = SolveOptions(time_limit=5, seed=0, workers=1, hint=first.steps)
    again, result = run_solver(g, budget, "moccasin", opts)
    assert again is not None and again.summary.cost <= first.summary.cost + 1e-9
    assert "phase 1 skipped" in (result.message or "")


@pytest.mark.parametrize("seed", range(3))
def test_repair_and_lower_peak_give_valid_starts(seed: int) -> None:
    """Another solver's sequence (here: a node computed up to 4 times) is cut to C_v copies, and a
    start over the budget is brought within it by splitting intervals; both stay valid sequences
    whose simulated peak is at most the folded peak of eq. (4)."""
    import math
    from functools import reduce

    g = G.random_layered(40, seed=seed)
    view = g.node_view
    unit_mem = reduce(math.gcd, [x for x in view.mem + view.workspace if x > 0], 0) or 1
    base = baseline(g)
    needed = [i for i in range(len(view)) if view.needed[i]]
    w, _ = MM.integer_costs([view.cost[i] for i in needed])
    cap = (int(0.8 * base.peak_memory) - view.resident) // unit_mem
    m = MM.build_model(view, cap, unit_mem, w, 2, True, "literals")
    rng = random.Random(seed)
    seq: list[int] = []
    for k in range(len(m.nodes)):  # input order, with random recomputations of earlier nodes
        for r in sorted(rng.sample(range(k), min(k, 3))):
            seq.append(r)
        seq.append(k)
    assert max(seq.count(k) for k in set(seq)) > 2
    ids = view.ids

    def check(s: list[int]) -> int:
        ivs = MST.map_sequence(m, s)
        assert ivs is not None and MST.within_copies(m, ivs)
        sim = simulate(g, steps_from_sequence(g, [ids[m.nodes[k]] for k in s]))
        peak = MST.folded_peak(m, ivs)
        assert sim.peak_memory <= peak * unit_mem + view.resident
        return peak

    fixed = MST.repair_sequence(m, seq, cap)
    assert fixed is not None
    peak = check(fixed)
    target = int(0.99 * peak)  # a start 1% over its budget, as greedy's repaired ones are
    lowered = MST.lower_peak(m, fixed, target, None, MS.LOWER_STEPS)
    assert lowered is not None and check(lowered) <= target
