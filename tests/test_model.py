"""MODeL (`--solver model`): the notes' fan graph, the paper's Fig. 3, and brute force over all
topological orders x first-fit offsets on tiny random DAGs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from model_graphs import fan, fig3

from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph, Node, Value
from remat_cli.planning.check import check_plan
from remat_cli.planning.memory_plan import buffers_of
from remat_cli.schedule import baseline, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.model.lifetimes import Problem


def solve(g: Graph, budget: int = 10**12, **params: object):
    return run_solver(g, budget, "model", SolveOptions(time_limit=20, workers=1, params=dict(params)))


@pytest.mark.parametrize("k, optimum", [(3, 103), (4, 104)])
def test_fan_graph_runs_branch_by_branch(k: int, optimum: int) -> None:
    g = fan(k)
    assert baseline(g).peak_memory >= 100 * k  # the program order starts every branch first
    s, _ = solve(g)
    assert s is not None and s.memory_plan is not None
    assert s.memory_plan.arena == optimum
    assert s.summary.peak_memory == optimum
    assert s.solver.status == "optimal"
    assert len([x for x in s.steps if x.op == "compute"]) == len(g.nodes)  # one operator per step
    check_plan(g, s.steps, s.memory_plan)


def test_fig3_reorders_v3_before_v2() -> None:
    g = fig3()
    assert baseline(g).peak_memory == 62_914_560
    s, _ = solve(g)
    assert s is not None and s.memory_plan is not None
    assert s.memory_plan.arena == 47_185_920 and s.solver.status == "optimal"
    seq = [x.node for x in s.steps if x.op == "compute"]
    assert seq.index("v3") < seq.index("v2")


def test_fixed_order_keeps_the_program_order() -> None:
    g = fig3()
    s, _ = solve(g, fixed_order=True)
    assert s is not None and s.memory_plan is not None
    assert [x.node for x in s.steps if x.op == "compute"] == ["v1", "v2", "v3", "v4"]
    assert s.memory_plan.arena == 62_914_560


def test_order_only_reports_the_ideal_peak_without_a_plan() -> None:
    s, _ = solve(fan(4), order_only=True)
    assert s is not None and s.memory_plan is None
    assert s.summary.peak_memory == 104 and s.solver.objective == 104


def test_over_budget_is_infeasible_with_the_smallest_arena() -> None:
    s, r = solve(fan(4), budget=103)
    assert s is not None and s.solver.status == "infeasible"
    assert r.best_peak == 104 and r.lower_bound == 104


def test_alignment_rounds_offsets_and_sizes() -> None:
    s, _ = solve(fan(3), alignment=64)
    assert s is not None and s.memory_plan is not None
    assert all(b.offset % 64 == 0 and b.size % 64 == 0 for b in s.memory_plan.offsets)
    assert s.memory_plan.arena == 64 + 2 * 64 + 128  # x, two finished u, the last branch's t (100 -> 128)


def test_multi_output_and_resident_values() -> None:
    g = Graph(
        values=[
            Value(id="w", size=1000, role="parameter"),
            Value(id="a", size=10),
            Value(id="b", size=20),
            Value(id="c", size=5),
        ],
        nodes=[
            Node(id="split", inputs=["w"], outputs=["a", "b"]),
            Node(id="add", inputs=["a", "b", "w"], outputs=["c"]),
        ],
        outputs=["c"],
    )
    s, _ = solve(g)
    assert s is not None and s.memory_plan is not None
    assert s.memory_plan.arena == 35  # the parameter lives outside the arena
    assert s.solver.objective == 1035
    assert {b.value for b in s.memory_plan.offsets} == {"a", "b", "c"}


# ---- brute force: every topological order x first-fit offsets in every placement order ----
def tiny_dag(seed: int, n: int) -> Graph:
    rng = np.random.default_rng(seed)
    values, nodes = [], []
    for i in range(n):
        preds = [j for j in range(i) if rng.random() < 0.4]
        outs = [f"v{i}"] + ([f"w{i}"] if rng.random() < 0.25 else [])
        values += [Value(id=o, size=int(rng.integers(1, 9))) for o in outs]
        ins = [f"v{j}" for j in preds] + (
            [f"w{preds[0]}"] if preds and f"w{preds[0]}" in {v.id for v in values} else []
        )
        ws = int(rng.integers(1, 3)) if rng.random() < 0.2 else 0
        nodes.append(Node(id=f"n{i}", inputs=ins, outputs=outs, workspace=ws))
    read = {v for nd in nodes for v in nd.inputs}
    outputs = [f"v{i}" for i in range(n) if f"v{i}" not in read]
    return Graph(name=f"tiny{seed}", values=values, nodes=nodes, outputs=outputs)


def first_fit(buffers, order) -> int:
    placed: list[tuple[int, int, int, int]] = []
    for i in order:
        b = buffers[i]
        off = 0
        for s, e, o, z in sorted(placed, key=lambda x: x[2]):
            if s < b.end and b.start < e and o < off + b.size and off < o + z:
                off = o + z
        # re-scan until no clash (placed is sorted by offset, one pass can miss a lower one)
        moved = True
        while moved:
            moved = False
            for s, e, o, z in placed:
                if s < b.end and b.start < e and o < off + b.size and off < o + z:
                    off, moved = o + z, True
        placed.append((b.start, b.end, off, b.size))
    return max((o + z for _, _, o, z in placed), default=0)


def brute_force_arena(g: Graph) -> int:
    p = Problem(g)
    best = None
    for perm in itertools.permutations(range(len(p))):
        pos = {i: k for k, i in enumerate(perm)}
        if any(pos[q] > pos[i] for i in perm for q in p.preds[i]):
            continue
        steps = steps_from_sequence(g, [p.ops[i] for i in perm])
        bufs = [b for b in buffers_of(g, steps) if b.size > 0]
        for placement in itertools.permutations(range(len(bufs))):
            a = first_fit(bufs, placement)
            best = a if best is None else min(best, a)
    assert best is not None
    return best


@pytest.mark.parametrize("seed", range(8))
def test_matches_brute_force_on_tiny_dags(seed: int) -> None:
    g = tiny_dag(seed, 4)
    expected = brute_force_arena(g)
    s, r = solve(g)
    assert s is not None and s.memory_plan is not None
    check_plan(g, s.steps, s.memory_plan)
    simulate(g, s.steps)
    arena = s.memory_plan.arena
    assert r.lower_bound is not None and arena + g.resident_bytes >= r.lower_bound
    assert arena >= expected or s.solver.status != "optimal"  # first-fit over all orders is optimal
    if s.solver.status == "optimal":
        assert arena == expected


@pytest.mark.parametrize("engine", ["cp-sat", "milp"])
def test_address_engines_close_a_bad_start(engine: str) -> None:
    """Both engines of addresses.py, from every buffer stacked (no reuse), reach the order's peak."""
    from remat_cli.planning import addresses
    from remat_cli.planning.memory_plan import arena_peak

    g = fig3()
    steps = steps_from_sequence(g, ["v1", "v3", "v2", "v4"])
    bufs = buffers_of(g, steps)
    stacked, top = [], 0
    for b in bufs:
        stacked.append(top)
        top += b.size
    run = addresses.place_cpsat if engine == "cp-sat" else addresses.place_milp
    got = run(
        addresses.PlacementTask(bufs, 1 << 20, stacked, top, 0, 20.0, 1, 0)
    )  # alignment 1 MiB: small numbers
    assert got is not None
    offsets, _, proven = got
    arena = max(o + b.size for o, b in zip(offsets, bufs, strict=True))
    assert arena == arena_peak(bufs) == 47_185_920 and proven
