"""`remat run --mode interpret` on several devices (issue 17 item 5), on two CPU "devices".

Both devices run on onnxruntime's CPU provider but keep their own live tensors, so copies and
per-device accounting are exercised without a GPU. Real onnxruntime sessions throughout.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

from remat_cli.cli import main
from remat_cli.devices import synthetic_devices
from remat_cli.execution.runner import build_schedule
from remat_cli.graph import Graph
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.runtime import ModelMismatch, run_schedule
from remat_cli.runtime.devices import DeviceRunReport, Placement, transfer
from remat_cli.schedule import Schedule, Step, simulate
from remat_cli.solver import SolverResult

TWO_CPUS = [{"id": "cpu0", "kind": "cpu"}, {"id": "cpu1", "kind": "cpu"}]


def chain_model(path: Path) -> Path:
    """x[4,16] -mm1(W1)-> h1[4,32] -relu1-> a1 -reshape-> r1[8,16] -mm2(W2)-> h2[8,8] -relu2-> out."""
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((16, 32), dtype=np.float32), "W1"),
        numpy_helper.from_array(rng.standard_normal((16, 8), dtype=np.float32), "W2"),
        numpy_helper.from_array(np.array([8, 16], dtype=np.int64), "shape"),
    ]
    nodes = [
        oh.make_node("MatMul", ["x", "W1"], ["h1"], name="mm1"),
        oh.make_node("Relu", ["h1"], ["a1"], name="relu1"),
        oh.make_node("Reshape", ["a1", "shape"], ["r1"], name="reshape"),
        oh.make_node("MatMul", ["r1", "W2"], ["h2"], name="mm2"),
        oh.make_node("Relu", ["h2"], ["out"], name="relu2"),
    ]
    g = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [8, 8])],
        inits,
    )
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), str(path))
    return path


def with_devices(graph: Graph, devices: list[dict] = TWO_CPUS) -> Graph:
    data = graph.model_dump(exclude_none=True, by_alias=True)
    data["devices"] = devices
    a, b = devices[0]["id"], devices[1]["id"]
    data["links"] = [{"from": a, "to": b, "bandwidth": 1e9}, {"from": b, "to": a, "bandwidth": 1e9}]
    return Graph(**data)


def c(node: str, device: str) -> Step:
    return Step(op="compute", node=node, device=device)


def f(value: str, device: str) -> Step:
    return Step(op="free", value=value, device=device)


def cp(value: str, a: str, b: str) -> Step:
    return Step.model_validate({"op": "copy", "value": value, "from": a, "to": b})


#: the first half on cpu0, the second on cpu1 (with a copy of the weight W2), the output back
SPLIT = [
    c("mm1", "cpu0"),
    c("relu1", "cpu0"),
    f("h1", "cpu0"),
    cp("a1", "cpu0", "cpu1"),
    f("a1", "cpu0"),
    cp("shape", "cpu0", "cpu1"),
    c("reshape", "cpu1"),
    f("shape", "cpu1"),
    cp("W2", "cpu0", "cpu1"),
    c("mm2", "cpu1"),
    f("r1", "cpu1"),
    f("a1", "cpu1"),
    f("W2", "cpu1"),
    c("relu2", "cpu1"),
    f("h2", "cpu1"),
    cp("out", "cpu1", "cpu0"),
    f("out", "cpu1"),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chain_model(tmp_path_factory.mktemp("xrt") / "chain.onnx")


@pytest.fixture(scope="module")
def graph(model: Path) -> Graph:
    return with_devices(from_onnx_file(model))


def hand(graph: Graph, steps: list[Step]) -> Schedule:
    return build_schedule(graph, None, "hand", SolverResult(steps=steps, status="feasible"), 0.0)


def test_split_schedule_replays_with_copies_and_per_device_peaks(model: Path, graph: Graph) -> None:
    sim = simulate(graph, SPLIT)
    assert sim.copies == 4 and sim.peak_by_device is not None
    rep = run_schedule(model, graph, hand(graph, SPLIT), mode="interpret", repeat=1, warmup=0)
    assert isinstance(rep, DeviceRunReport)
    assert rep.outputs_match and rep.max_abs_diff == 0.0
    by = {d.id: d for d in rep.devices}
    # The documented tolerance is 0: exact live tensor bytes, counted like the simulator.
    for d, predicted in sim.peak_by_device.items():
        assert by[d].predicted_peak == predicted
        assert by[d].measured_peak == predicted, d
        assert by[d].memory_error == 0.0
    # cpu1 held a1 (512 B; r1 is its view), W2 (512 B), h2 being written (256 B) at mm2: its
    # own peak, not cpu0's.
    assert by["cpu1"].measured_peak == 512 + 512 + 256
    assert by["cpu0"].measured_peak == graph.resident_bytes + 512 + 512  # h1 and a1 at relu1
    assert by["cpu1"].unscheduled_peak == 0  # the reference runs everything on home
    assert rep.copies == 4 and rep.copy_cost > 0
    assert rep.measured.peak_memory == sim.peak_memory


def test_copy_of_a_view_is_a_real_buffer(model: Path, graph: Graph) -> None:
    """The graph counts the Reshape output r1 as 0 bytes; copied to another device it is a
    buffer of its own, counted at its real 512 bytes and noted."""
    steps = [
        c("mm1", "cpu0"),
        c("relu1", "cpu0"),
        f("h1", "cpu0"),
        c("reshape", "cpu0"),
        cp("a1", "cpu0", "cpu1"),  # mm2 reads the view's base too (the importer keeps it live)
        cp("r1", "cpu0", "cpu1"),
        f("r1", "cpu0"),
        f("a1", "cpu0"),
        cp("W2", "cpu0", "cpu1"),
        c("mm2", "cpu1"),
        f("r1", "cpu1"),
        f("a1", "cpu1"),
        f("W2", "cpu1"),
        c("relu2", "cpu1"),
        f("h2", "cpu1"),
    ]
    sim = simulate(graph, steps)
    rep = run_schedule(model, graph, hand(graph, steps), mode="interpret", repeat=1, warmup=0)
    assert isinstance(rep, DeviceRunReport) and rep.outputs_match
    by = {d.id: d for d in rep.devices}
    assert sim.peak_by_device is not None
    assert by["cpu1"].measured_peak == sim.peak_by_device["cpu1"] + 512
    assert by["cpu0"].measured_peak == sim.peak_by_device["cpu0"]
    assert any("views" in n and "512" in n for n in rep.notes)


def test_a_compute_without_its_input_on_the_device_is_refused(model: Path, graph: Graph) -> None:
    steps = [c("mm1", "cpu0"), c("relu1", "cpu1")]  # h1 lives on cpu0 only
    bad = hand(graph, SPLIT).model_copy(update={"steps": steps})
    with pytest.raises(ModelMismatch, match="not live on 'cpu1'"):
        run_schedule(model, graph, bad, mode="interpret", repeat=1, warmup=0)


def test_xengine_schedule_replays_through_the_cli(model: Path, tmp_path: Path) -> None:
    """`remat solve --solver xengine` on the model with a synthetic second device (run by the
    CPU provider), then `remat run --graph`: every device within its measured budget."""
    g = synthetic_devices(from_onnx_file(model), speedup=10, accelerator="cpu1", host="cpu0")
    data = g.model_dump(exclude_none=True, by_alias=True)
    data["devices"][1]["kind"] = "cpu"
    gp, sp = tmp_path / "g.json", tmp_path / "s.json"
    gp.write_text(json.dumps(data))
    runner = CliRunner()
    res = runner.invoke(
        main,
        ["solve", str(gp), "--solver", "xengine", "--budget", "cpu0=100%,cpu1=60%", "--time-limit", "20"],
    )
    assert res.exit_code == 0, res.output
    sp.write_text(res.stdout)
    sched = Schedule.model_validate_json(res.stdout)
    assert sched.summary.copies and sched.budgets
    assert any(s.op == "compute" and s.device == "cpu1" for s in sched.steps)
    args = [str(model), str(sp), "--graph", str(gp), "--mode", "interpret", "--repeat", "1", "--json"]
    res = runner.invoke(main, ["run", *args])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["outputs_match"] and rep["copies"] == sched.summary.copies
    for d in rep["devices"]:
        assert d["measured_peak"] == sched.summary.peak_memory_by_device[d["id"]]
        assert d["measured_peak"] <= sched.budgets[d["id"]]
    assert "peak on cpu1" in res.stderr


def test_bad_devices_and_modes_exit_2(model: Path, graph: Graph, tmp_path: Path) -> None:
    runner = CliRunner()
    sp = tmp_path / "s.json"
    sched = hand(graph, SPLIT).model_copy(update={"budget": 10**6, "budgets": {"cpu0": 10**6, "cpu1": 10**6}})
    sp.write_text(sched.to_json())

    def run(g: Graph | None, *extra: str):
        args = [str(model), str(sp), "--repeat", "1", "--warmup", "0", *extra]
        if g is not None:
            gp = tmp_path / "g.json"
            gp.write_text(g.model_dump_json(exclude_none=True, by_alias=True))
            args += ["--graph", str(gp)]
        return runner.invoke(main, ["run", *args])

    res = run(graph)  # session mode is the default
    assert res.exit_code == 2 and "interpret mode" in res.output
    res = run(None, "--mode", "interpret")
    assert res.exit_code == 2 and "--graph" in res.output
    tpu = with_devices(from_onnx_file(model), [{"id": "cpu0", "kind": "cpu"}, {"id": "cpu1", "kind": "tpu"}])
    res = run(tpu, "--mode", "interpret")
    assert res.exit_code == 2 and "kind 'tpu'" in res.output
    gpu = with_devices(from_onnx_file(model), [{"id": "cpu0", "kind": "cpu"}, {"id": "cpu1", "kind": "cuda"}])
    res = run(gpu, "--mode", "interpret")
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert res.exit_code == 2 and "CUDAExecutionProvider" in res.output
    else:  # a GPU machine: cpu1 really is the GPU
        assert res.exit_code == 0, res.output


def test_a_copy_from_host_memory_takes_its_own_buffer() -> None:
    """On an H200 a CUDA session's plain run returned host OrtValues; the copy to the CPU, judged
    by the device the value was placed on (cuda), kept a view of one, the free step at the source
    dropped it, and the replay's output was garbage (max difference 7e5). The copy must own its
    buffer whenever the value is in host memory, whichever device it was placed on."""
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    value = ort.OrtValue.ortvalue_from_numpy(a.copy())
    copied = transfer(value, Placement("cpu0", "cpu"))
    assert not np.shares_memory(copied.numpy(), value.numpy())
    assert np.array_equal(copied.numpy(), a)
