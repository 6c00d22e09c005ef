"""--solver xengine: hand-solved multi-device cases, brute force, and the single-device path."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from click.testing import CliRunner

from remat_cli.cli import main
from remat_cli.devices import synthetic_devices
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions
from remat_cli.testing.instances import brute_force_min_cost

BIG = 10**6


def chain(costs: dict[str, dict[str, float]], copy_costs: list[dict], sizes: int = 100) -> Graph:
    names = list(costs)
    values = [{"id": "x", "size": 10, "role": "input"}] + [{"id": f"v{n}", "size": sizes} for n in names]
    nodes = []
    prev = "x"
    for n in names:
        nodes.append(
            {
                "id": n,
                "inputs": [prev],
                "outputs": [f"v{n}"],
                "cost": costs[n]["cpu"],
                "device_costs": costs[n],
            }
        )
        prev = f"v{n}"
    return Graph(
        name="chain",
        values=values,
        nodes=nodes,
        outputs=[prev],
        devices=[{"id": "cpu"}, {"id": "gpu"}],
        copy_costs=copy_costs,
    )


def solve(g: Graph, budgets: dict[str, int], **params: object):
    opts = SolveOptions(time_limit=60, seed=0, workers=1, budgets=budgets, params=dict(params))
    return run_solver(g, max(budgets.values()), "xengine", opts)


def both_ways(value: str, cost: float) -> list[dict]:
    return [
        {"value": value, "from": "cpu", "to": "gpu", "cost": cost},
        {"value": value, "from": "gpu", "to": "cpu", "cost": cost},
    ]


def test_splitting_beats_both_single_devices() -> None:
    # a is cheap on the cpu, b on the gpu, c on the cpu: cpu-only 1+10+1 = 12, gpu-only
    # 0.5 (copy x) + 10+1+10 = 21.5, split a@cpu → va → b@gpu → vb → c@cpu = 1+.5+1+.5+1 = 4
    g = chain(
        {"a": {"cpu": 1, "gpu": 10}, "b": {"cpu": 10, "gpu": 1}, "c": {"cpu": 1, "gpu": 10}},
        both_ways("x", 0.5) + both_ways("va", 0.5) + both_ways("vb", 0.5),
    )
    budgets = {"cpu": BIG, "gpu": BIG}
    for method in ("milp", "heuristic"):
        s, r = solve(g, budgets, method=method)
        assert s is not None, r.message
        assert s.summary.cost == pytest.approx(4.0), method
        assert s.summary.copies == 2 and s.summary.copy_cost == pytest.approx(1.0)
        assert r.params["best_single_device_cost"] == pytest.approx(12.0)
        devices = {st.node: st.device for st in s.steps if st.op == "compute"}
        assert devices == {"a": "cpu", "b": "gpu", "c": "cpu"}
    assert s.solver.status == "feasible"
    s, _ = solve(g, budgets, method="milp")
    assert s.solver.status == "optimal" and s.solver.lower_bound == pytest.approx(4.0, rel=1e-3)


def test_asymmetric_copy_costs_are_read_in_their_direction() -> None:
    costs = {"a": {"cpu": 5, "gpu": 1}, "b": {"cpu": 1, "gpu": 1}}
    cheap_up = chain(costs, [{"value": "x", "from": "cpu", "to": "gpu", "cost": 0.1},
                             {"value": "x", "from": "gpu", "to": "cpu", "cost": 100}])  # fmt: skip
    cheap_down = chain(costs, [{"value": "x", "from": "cpu", "to": "gpu", "cost": 100},
                               {"value": "x", "from": "gpu", "to": "cpu", "cost": 0.1}])  # fmt: skip
    budgets = {"cpu": BIG, "gpu": BIG}
    s, _ = solve(cheap_up, budgets, method="milp")
    assert s.summary.cost == pytest.approx(0.1 + 1 + 1)
    s, _ = solve(cheap_down, budgets, method="milp")
    assert s.summary.cost == pytest.approx(5 + 1) and s.summary.copies == 0


def test_operator_larger_than_every_budget_is_infeasible_with_a_clear_message(tmp_path) -> None:
    g = chain({"a": {"cpu": 1, "gpu": 1}, "b": {"cpu": 1, "gpu": 1}}, both_ways("x", 1) + both_ways("va", 1))
    budgets = {"cpu": 150, "gpu": 150}  # b needs va + vb = 200 on either device
    s, r = solve(g, budgets)
    assert s is None and r.status == "infeasible"
    assert "operator 'b' fits on no device" in (r.message or "")
    path = tmp_path / "g.json"
    path.write_text(g.to_json())
    res = CliRunner().invoke(main, ["solve", str(path), "--budget", "cpu=150,gpu=150", "--solver", "xengine"])
    assert res.exit_code == 1
    assert "operator 'b' fits on no device (cpu: needs 210 B, budget 150 B, gpu: needs 200 B" in res.output


def test_memory_forces_a_split() -> None:
    # gpu much faster but holds only one activation at a time: the schedule must respect both budgets
    g = synthetic_devices(G.linear(3, seed=5), speedup=10, memory_fraction=0.3)
    budgets = {d.id: d.budget or 0 for d in g.devices or []}
    s, r = solve(g, budgets)
    assert s is not None and s.solver.status in ("optimal", "feasible")
    sim = simulate(g, s.steps)
    assert all(sim.peak_by_device[d] <= budgets[d] for d in budgets)
    assert sim.cost <= r.params["best_single_device_cost"] + 1e-9
    assert s.summary.peak_memory_by_device == sim.peak_by_device


def brute_force_unlimited(g: Graph) -> float:
    """Least cost with unlimited memory over every choice of the device set running each node
    (a set of several = recomputing there instead of copying), inputs copied once per device
    from the cheapest device holding them. Shares no code with the solver."""
    dm = g.device_model
    devs = dm.ids
    order = [n for n in g.topo_order if n in g.needed_nodes]
    subsets = [s for k in range(1, len(devs) + 1) for s in itertools.combinations(devs, k)]
    best = float("inf")
    producer = g.producer
    for choice in itertools.product(subsets, repeat=len(order)):
        where = dict(zip(order, choice, strict=True))
        total = sum(dm.cost(n, d) for n in order for d in where[n])
        for v in g.values:
            holders = [dm.home] if v.resident else list(where.get(producer.get(v.id, ""), ()))
            if not holders:
                continue
            readers = {d for n in order if v.id in g.node_map[n].inputs for d in where[n]}
            for d in readers - set(holders):
                total += min(c for h in holders if (c := dm.copy_cost(v.id, h, d)) is not None)
        best = min(best, total)
    return best


@pytest.mark.parametrize("seed", range(4))
def test_milp_matches_brute_force_with_unlimited_memory(seed: int) -> None:
    rng = random.Random(seed)
    g0 = G.random_layered(5, seed=seed) if seed % 2 else G.linear(2, seed=seed)
    data = synthetic_devices(g0, speedup=rng.choice([2.0, 5.0])).model_dump(exclude_none=True, by_alias=True)
    for n in data["nodes"]:  # random per-device costs
        n["device_costs"] = {"cpu": rng.randint(1, 9), "accel": rng.randint(1, 9)}
    data["copy_costs"] = [
        {"value": v["id"], "from": a, "to": b, "cost": rng.randint(0, 6)}
        for v in data["values"]
        for a, b in (("cpu", "accel"), ("accel", "cpu"))
    ]
    g = Graph(**data)
    s, r = solve(g, {"cpu": BIG, "accel": BIG}, method="milp")
    assert s is not None and s.solver.status == "optimal", r.message
    assert s.summary.cost == pytest.approx(brute_force_unlimited(g))


@pytest.mark.parametrize(
    "graph", [G.linear(3, seed=1), G.random_layered(6, seed=2), G.unet(depth=1, convs=1, seed=3)], ids=str
)
@pytest.mark.parametrize("fraction", [1.0, 0.8, 0.6])
def test_one_device_is_checkmate_brute_force(graph: Graph, fraction: float) -> None:
    # a graph without devices is solved as one device by the same MILP: its optimum is Checkmate's
    budget = max(int(fraction * baseline(graph).peak_memory), peak_lower_bound(graph))
    s, r = run_solver(
        graph, budget, "xengine", SolveOptions(time_limit=60, workers=1, params={"method": "milp"})
    )
    expected = brute_force_min_cost(graph, budget)
    if expected is None:
        assert s is None or s.solver.status == "infeasible"
        return
    assert s is not None and s.solver.status == "optimal", r.message
    assert all(st.device is None and st.op != "copy" for st in s.steps)
    assert s.summary.cost == pytest.approx(expected)


def test_cli_solve_and_validate_per_device(tmp_path) -> None:
    g = synthetic_devices(G.linear(3, seed=0))
    gp, sp = tmp_path / "g.json", tmp_path / "s.json"
    gp.write_text(g.to_json())
    runner = CliRunner()
    res = runner.invoke(
        main, ["solve", str(gp), "--budget", "cpu=100%,accel=30%", "-s", "xengine", "-o", str(sp)]
    )
    assert res.exit_code == 0, res.output
    sched = json.loads(sp.read_text())
    peak = baseline(g).peak_memory
    assert sched["budgets"] == {"cpu": peak, "accel": int(0.3 * peak)}
    assert set(sched["summary"]["peak_memory_by_device"]) == {"cpu", "accel"}
    res = runner.invoke(main, ["validate", str(gp), str(sp), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["within_budget"] and report["over_budget_devices"] == []
    tight = min(sched["summary"]["peak_memory_by_device"].values()) - 1
    res = runner.invoke(
        main, ["validate", str(gp), str(sp), "--budget", f"cpu={peak},accel={tight}", "--json"]
    )
    assert res.exit_code == 1
    res = runner.invoke(main, ["solve", str(gp), "--budget", "100%", "-s", "greedy"])
    assert res.exit_code == 2 and "several devices" in res.output
