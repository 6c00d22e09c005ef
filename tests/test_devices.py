"""The multi-device format and simulator (remat_cli/devices.py) against hand-computed numbers."""

from __future__ import annotations

import pytest

from remat_cli import registry
from remat_cli.budget import BudgetError, parse_device_budgets
from remat_cli.devices import resolve_device_budgets, simulate_devices, synthetic_devices
from remat_cli.graph import Graph
from remat_cli.schedule import Schedule, ScheduleError, Step, baseline_steps, compute, copy, free, simulate


def two_devices(**extra: object) -> Graph:
    # x(10, input on cpu) -> a(100) -> b(20, output); gpu is 10x faster; copies 1 + bytes/10 each way
    data = {
        "name": "t",
        "values": [
            {"id": "x", "size": 10, "role": "input"},
            {"id": "va", "size": 100},
            {"id": "vb", "size": 20},
        ],
        "nodes": [
            {"id": "a", "inputs": ["x"], "outputs": ["va"], "cost": 10, "device_costs": {"gpu": 1}},
            {
                "id": "b",
                "inputs": ["va"],
                "outputs": ["vb"],
                "cost": 10,
                "workspace": 5,
                "device_costs": {"gpu": 1},
            },
        ],
        "outputs": ["vb"],
        "devices": [{"id": "cpu"}, {"id": "gpu", "budget": 200}],
        "links": [
            {"from": "cpu", "to": "gpu", "latency": 1, "bandwidth": 10},
            {"from": "gpu", "to": "cpu", "latency": 1, "bandwidth": 10},
        ],
    }
    data |= extra
    return Graph(**data)


def on(node: str, device: str) -> Step:
    return Step(op="compute", node=node, device=device)


def test_per_device_peaks_copy_buffer_and_costs() -> None:
    g = two_devices()
    steps = [copy("x", "cpu", "gpu"), on("a", "gpu"), free("x", "gpu"), on("b", "gpu"), free("va", "gpu")]
    sim = simulate(g, steps)
    # gpu: copy x 10; a: 10+100; free x; b: 100+20+ws 5 = 125; cpu: x = 10 all along
    assert sim.peak_by_device == {"cpu": 10, "gpu": 125}
    assert sim.peak_memory == 125
    assert sim.copies == 1 and sim.copy_cost == pytest.approx(1 + 10 / 10)
    assert sim.cost == pytest.approx(2 + 1 + 1)


def test_copy_destination_buffer_counts_during_the_copy() -> None:
    g = two_devices()
    steps = [on("a", "cpu"), copy("va", "cpu", "gpu"), free("va", "cpu"), on("b", "gpu"), free("va", "gpu")]
    sim = simulate(g, steps)
    assert sim.peak_by_device == {"cpu": 110, "gpu": 125}
    assert sim.cost == pytest.approx(10 + (1 + 100 / 10) + 1)


def test_compute_needs_its_inputs_on_its_own_device() -> None:
    g = two_devices()
    with pytest.raises(ScheduleError, match=r"needs 'va', which is not live on 'gpu' \(it is live on cpu\)"):
        simulate(g, [on("a", "cpu"), on("b", "gpu")])
    with pytest.raises(ScheduleError, match="needs 'x', which is not live on 'gpu'"):
        simulate(g, [on("a", "gpu")])


def test_copy_and_free_rules() -> None:
    g = two_devices()
    with pytest.raises(ScheduleError, match="where it is not live"):
        simulate(g, [copy("va", "cpu", "gpu")])
    with pytest.raises(ScheduleError, match="already live"):
        simulate(g, [copy("x", "cpu", "gpu"), copy("x", "cpu", "gpu")])
    with pytest.raises(ScheduleError, match="which is a input"):
        simulate(g, [free("x", "cpu")])
    with pytest.raises(ScheduleError, match="unknown device 'tpu'"):
        simulate(g, [on("a", "tpu")])
    with pytest.raises(ScheduleError, match="graph output 'vb'"):
        simulate(g, [on("a", "cpu"), on("b", "cpu"), free("vb", "cpu")])
    # a copy of an input may be freed off its home device; outputs may end on any device
    sim = simulate(g, [copy("x", "cpu", "gpu"), on("a", "gpu"), free("x", "gpu"), on("b", "gpu")])
    assert sim.peak_by_device["gpu"] == 125


def test_asymmetric_explicit_copy_costs_win_over_links() -> None:
    g = two_devices(
        links=[{"from": "cpu", "to": "gpu", "latency": 1, "bandwidth": 10}],
        copy_costs=[{"value": "va", "from": "gpu", "to": "cpu", "cost": 0.5}],
    )
    dm = g.device_model
    assert dm.copy_cost("va", "cpu", "gpu") == pytest.approx(11)
    assert dm.copy_cost("va", "gpu", "cpu") == pytest.approx(0.5)
    assert dm.copy_cost("vb", "gpu", "cpu") is None
    with pytest.raises(ScheduleError, match="no link"):
        simulate(g, [copy("x", "cpu", "gpu"), on("a", "gpu"), on("b", "gpu"), copy("vb", "gpu", "cpu")])


def test_graph_without_devices_is_unchanged_and_refuses_copies() -> None:
    data = two_devices().model_dump(exclude_none=True, by_alias=True)
    for k in ("devices", "links"):
        data.pop(k)
    g = Graph(**data)
    assert g.device_model is not None and g.home_device is None
    sim = simulate(g, [compute("a"), compute("b"), free("va")])
    assert sim.peak_by_device is None and sim.copies == 0 and sim.cost == 20
    with pytest.raises(ScheduleError, match="needs a graph with devices"):
        simulate(g, [copy("x", "cpu", "gpu")])


def test_graph_validation_names_the_device() -> None:
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        two_devices(links=[{"from": "cpu", "to": "tpu", "bandwidth": 1}])
    with pytest.raises(ValueError, match="home device 'tpu'"):
        two_devices(home="tpu")
    with pytest.raises(ValueError, match="duplicate device id 'cpu'"):
        two_devices(devices=[{"id": "cpu"}, {"id": "cpu"}])
    data = two_devices().model_dump(exclude_none=True, by_alias=True)
    data.pop("devices")
    with pytest.raises(ValueError, match="'links' needs a 'devices' list"):
        Graph(**data)


def test_copy_step_json_uses_from_and_to() -> None:
    s = copy("va", "cpu", "gpu")
    assert s.model_dump(by_alias=True, exclude_none=True) == {
        "op": "copy",
        "value": "va",
        "from": "cpu",
        "to": "gpu",
    }
    assert Step.model_validate({"op": "copy", "value": "va", "from": "cpu", "to": "gpu"}) == s
    with pytest.raises(ValueError, match="needs 'value', 'from' and 'to'"):
        Step.model_validate({"op": "copy", "value": "va"})
    g = two_devices()
    assert Graph.model_validate_json(g.to_json()).sha256() == g.sha256()
    assert '"from": "cpu"' in g.to_json().replace('":"', '": "')
    assert Schedule.model_fields["budgets"].default is None


def test_device_budgets() -> None:
    g = two_devices()
    assert parse_device_budgets("4GB") is None
    assert parse_device_budgets("cpu=1KB, gpu=50%", 1000) == {"cpu": 1000, "gpu": 500}
    assert resolve_device_budgets(g, "cpu=1KB", 1000) == {"cpu": 1000, "gpu": 200}  # gpu: the graph's
    assert resolve_device_budgets(g, "300", 1000) == {"cpu": 300, "gpu": 300}
    with pytest.raises(BudgetError, match="no budget for device 'cpu'"):
        resolve_device_budgets(g, "gpu=1KB", 1000)
    with pytest.raises(BudgetError, match="unknown device 'tpu'"):
        resolve_device_budgets(g, "tpu=1KB,cpu=1", 1000)
    with pytest.raises(BudgetError, match="twice"):
        parse_device_budgets("cpu=1,cpu=2")


def test_single_device_solvers_refuse_multi_device_graphs() -> None:
    g = two_devices()
    for name in ("greedy", "checkmate", "checkpoint-all"):
        assert "several devices" in (registry.get(name).supports(g) or "")
    assert registry.get("xengine").supports(g) is None


def test_synthetic_profile() -> None:
    from remat_cli.importers import generators as G

    base = G.linear(3, seed=0)
    g = synthetic_devices(base, speedup=10, memory_fraction=0.25)
    budgets = {d.id: d.budget for d in g.devices or []}
    assert budgets["accel"] == int(0.25 * budgets["cpu"])
    n = g.nodes[0]
    assert n.device_costs == {"cpu": n.cost, "accel": pytest.approx(n.cost / 10)}
    # all on the home device is the single-device baseline
    steps = baseline_steps(base)
    assert simulate_devices(g, steps).cost == pytest.approx(simulate(base, steps).cost)


def test_per_device_profile() -> None:
    g = two_devices()
    steps = [copy("x", "cpu", "gpu"), on("a", "gpu"), free("x", "gpu"), on("b", "gpu"), free("va", "gpu")]
    sim = simulate(g, steps, keep_profile=True)
    # gpu: copy x 10; a 10+100; free x 100; b 100+20+ws 5; free va 20. cpu keeps x (10) throughout
    assert sim.device_profile == {"cpu": (10,) * 5, "gpu": (10, 110, 100, 125, 20)}
    assert sim.profile == (10, 110, 100, 125, 20)
    assert {d: max(p) for d, p in sim.device_profile.items()} == sim.peak_by_device
    assert simulate(g, steps).device_profile is None
    from remat_cli.importers import generators as G

    single = G.linear(3, seed=0)
    assert simulate(single, baseline_steps(single), keep_profile=True).device_profile is None
