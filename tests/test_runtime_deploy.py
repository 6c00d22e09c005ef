"""Deployment truth in onnxruntime: `remat run`'s ORT-defaults column, `remat apply`'s
deployable model, `remat optimize`'s offline-optimized model, the plan executor.

Real onnxruntime sessions on tiny models built here and on the shipped training graphs; no
test mocks the runtime.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto
from onnx import helper as oh

from remat_cli.cli.deploy import apply_command, optimize_command
from remat_cli.cli.run_schedule import run_command
from remat_cli.execution.runner import build_schedule
from remat_cli.graph import Graph
from remat_cli.importers.onnx import from_onnx_file, onnx_node_ids
from remat_cli.planning.addresses import place
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.runtime import PlanExecutor, run_schedule
from remat_cli.runtime.deploy import ORT_CONFIG, PLAN_KEY, deployed_session, read_metadata
from remat_cli.runtime.model import make_inputs, recomputed_copies
from remat_cli.runtime.ort import open_session, session_options
from remat_cli.runtime.plan_executor import PAGE
from remat_cli.runtime.session import measure
from remat_cli.schedule import Schedule, simulate, steps_from_sequence
from remat_cli.solver import SolverResult
from tests.planned import apply_planned_order

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"


def chain_model() -> onnx.ModelProto:
    """a = Sin(x) is read at the start and at the end, with a bigger tensor in between: a
    schedule that frees `a` and computes it again has two Sin(x) nodes, which onnxruntime's
    common subexpression elimination would merge back into one. No op here is fused."""
    nodes = [
        oh.make_node("Sin", ["x"], ["a"], name="sin_a"),
        oh.make_node("Tile", ["a", "reps"], ["t"], name="tile"),
        oh.make_node("Cos", ["t"], ["c"], name="cos"),
        oh.make_node("ReduceSum", ["c", "axes"], ["r"], name="reduce", keepdims=1),
        oh.make_node("Mul", ["r", "a"], ["out"], name="mul"),
    ]
    inits = [
        onnx.numpy_helper.from_array(np.array([1, 16], np.int64), "reps"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    g = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [256, 1024])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [256, 1024])],
        inits,
    )
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Graph, Schedule]:
    """The chain model on disk, its import and a schedule that recomputes `a`."""
    path = tmp_path_factory.mktemp("chain") / "chain.onnx"
    onnx.save(chain_model(), str(path))
    graph = from_onnx_file(path)
    ids = {n.source[0] if n.source else n.id: n.id for n in graph.nodes}
    seq = [ids[k] for k in ("sin_a", "tile", "cos", "reduce", "sin_a", "mul")]
    sched = build_schedule(
        graph, None, "by-hand", SolverResult(steps=steps_from_sequence(graph, seq), status="feasible"), 0.0
    )
    return path, graph, sched


@pytest.mark.slow
def test_run_reports_ort_defaults_and_keeps_the_recomputation(chain, tmp_path: Path) -> None:
    path, graph, sched = chain
    rep = run_schedule(path, graph, sched, repeat=1, warmup=0)
    assert rep.outputs_match and rep.order_kept
    assert rep.ort_defaults is not None and rep.ort_defaults_unscheduled is not None
    assert rep.ort_defaults.peak_memory > 0 and rep.ort_defaults.seconds > 0
    # red when onnxruntime merges the recomputed Sin back (common subexpression elimination on)
    assert rep.recomputations == 1 and rep.recomputations_kept == 1
    sched_path = tmp_path / "s.json"
    sched_path.write_text(sched.to_json())
    res = CliRunner().invoke(
        run_command, [str(path), str(sched_path), "--repeat", "1", "--warmup", "0", "--json"]
    )
    assert res.exit_code == 0, res.output
    assert "ORT defaults" in res.stderr and "recomputations kept" in res.stderr
    data = json.loads(res.stdout)
    assert data["ort_defaults"]["peak_memory"] > 0 and data["ort_defaults_unscheduled"]["seconds"] > 0
    assert data["recomputations_kept"] == 1


def _apply(chain, tmp_path: Path, *extra: str) -> tuple[object, Path]:
    path, _, sched = chain
    sched_path = tmp_path / "s.json"
    sched_path.write_text(sched.to_json())
    out = tmp_path / "out.onnx"
    res = CliRunner().invoke(apply_command, [str(path), str(sched_path), "-o", str(out), *extra])
    return res, out


def test_apply_writes_a_checked_model_in_the_schedules_order_with_equal_outputs(
    chain, tmp_path: Path
) -> None:
    res, out = _apply(chain, tmp_path)
    assert res.exit_code == 0, res.output
    m = onnx.load(str(out))
    onnx.checker.check_model(m, full_check=True)
    assert [n.op_type for n in m.graph.node] == ["Sin", "Tile", "Cos", "ReduceSum", "Sin", "Mul"]
    assert "so.execution_order = onnxruntime.ExecutionOrder.PRIORITY_BASED" in res.stderr
    meta = read_metadata(out)
    assert meta[ORT_CONFIG]["session_options"]["graph_optimization_level"] == 0
    x = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    plain = ort.InferenceSession(str(chain[0]), providers=["CPUExecutionProvider"])
    got = deployed_session(out).run(None, {"x": x})[0]
    assert np.allclose(got, plain.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    # the session deployed with what the file carries keeps the duplicated Sin
    so = deployed_session(out).get_session_options()
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert so.execution_order == ort.ExecutionOrder.PRIORITY_BASED and not so.enable_mem_pattern


def test_onnxruntime_reads_the_carried_level_with_load_config_from_model(chain, tmp_path: Path) -> None:
    _, out = _apply(chain, tmp_path)
    probe = (
        "import sys, onnxruntime as ort\n"
        "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
        "print(s.get_session_options().graph_optimization_level.name)\n"
    )
    levels = {}
    for flag in ("1", None):
        env = {k: v for k, v in os.environ.items() if k != "ORT_LOAD_CONFIG_FROM_MODEL"}
        if flag:
            env["ORT_LOAD_CONFIG_FROM_MODEL"] = flag
        done = subprocess.run(
            [sys.executable, "-c", probe, str(out)], env=env, capture_output=True, text=True
        )
        levels[flag] = done.stdout.strip()
    assert levels == {"1": "ORT_DISABLE_ALL", None: "ORT_ENABLE_ALL"}


def test_apply_refuses_bad_input_in_one_line_without_a_file(chain, tmp_path: Path) -> None:
    path, graph, sched = chain
    other = sched.model_copy(deep=True)
    other.graph.sha256 = "0" * 64
    (tmp_path / "other.json").write_text(other.to_json())
    corpus = Path(__file__).parent / "corpus"
    cases = [
        [str(path), str(tmp_path / "other.json")],
        [str(corpus / "extdata_dotdot.onnx"), str(tmp_path / "other.json")],
    ]
    for args in cases:
        out = tmp_path / "never.onnx"
        res = CliRunner().invoke(apply_command, [*args, "-o", str(out)])
        assert res.exit_code == 2, res.output
        assert len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert not out.exists() and not list(tmp_path.glob(".remat-*"))
    res = CliRunner().invoke(optimize_command, [str(corpus / "extdata_dotdot.onnx"), "-o", str(out)])
    assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1 and not out.exists()
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        for cmd, args in (
            (optimize_command, [str(path), "--level", "all", "--provider", "cuda"]),
            (apply_command, [str(path), str(tmp_path / "s.json"), "--provider", "cuda"]),
        ):
            (tmp_path / "s.json").write_text(sched.to_json())
            res = CliRunner().invoke(cmd, [*args, "-o", str(out)])
            assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
            assert not out.exists()


def test_optimize_fuses_and_the_importer_costs_the_fused_ops(tmp_path: Path) -> None:
    src = GRAPHS / "torch_unet_train.onnx"
    out = tmp_path / "unet.opt.onnx"
    res = CliRunner().invoke(optimize_command, [str(src), "-o", str(out), "--level", "extended"])
    assert res.exit_code == 0, res.output
    fused = [n for n in onnx.load(str(out)).graph.node if n.op_type == "FusedConv"]
    assert fused
    before, after = from_onnx_file(src), from_onnx_file(out)
    # a FusedConv costs its convolution's FLOPs: the whole step costs about the same
    total = sum(n.cost for n in after.nodes) / sum(n.cost for n in before.nodes)
    assert 0.95 < total <= 1.0
    graph = onnx.load(str(out)).graph
    fused_ids = {i for i, n in zip(onnx_node_ids(graph), graph.node, strict=True) if n.op_type == "FusedConv"}
    fused_nodes = [n for n in after.nodes if (n.source or [n.id])[0] in fused_ids]
    assert len(fused_nodes) == len(fused)
    for n in fused_nodes:  # at least 2 x 9 FLOPs per output element (a 3x3 convolution), not one
        assert n.cost >= 18 * after.value_map[n.outputs[0]].size // 4 > 0


@pytest.mark.slow
def test_the_deployed_peak_stays_within_the_claim(chain, tmp_path: Path) -> None:
    """remat apply's model with a memory plan, deployed with the settings it carries and inside
    its plan: the measured peak is the prediction within 3% (red when it drifts above)."""
    path, graph, sched = chain
    bufs = buffers_of(graph, sched.steps)
    offsets, _, _, _ = place(bufs, 64, 1.0, 1)
    planned = sched.model_copy(deep=True)
    planned.memory_plan = make_plan(bufs, offsets, 64)
    (tmp_path / "p.json").write_text(planned.to_json())
    out = tmp_path / "out.onnx"
    res = CliRunner().invoke(apply_command, [str(path), str(tmp_path / "p.json"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    np.savez(tmp_path / "in.npz", **make_inputs(onnx.load(str(path)), graph=graph))
    got = measure(
        [(out, tmp_path / "d.npz"), (out, tmp_path / "p.npz")],
        tmp_path / "in.npz",
        repeat=1,
        warmup=1,
        settings=["deployed", "plan"],
    )
    predicted = simulate(graph, sched.steps).peak_memory
    for m in got:
        assert m.peak_above_baseline + graph.resident_bytes <= 1.03 * predicted
    with np.load(tmp_path / "d.npz") as d, np.load(tmp_path / "p.npz") as p:
        assert np.array_equal(d["out"], p["out"])


def test_onnxruntimes_defaults_without_cse_keep_the_recomputation(chain, tmp_path: Path) -> None:
    """What remat run's ORT-defaults column runs: the duplicated Sin survives onnxruntime's
    optimizers with common subexpression elimination off, and only then."""
    res, out = _apply(chain, tmp_path)
    assert res.exit_code == 0, res.output
    kept = {}
    for settings in ("defaults", "replay"):
        so = session_options(1, settings=settings)
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        so.optimized_model_filepath = str(tmp_path / f"{settings}.onnx")
        open_session(str(out), so, ["CPUExecutionProvider"], settings)
        kept[settings] = recomputed_copies(onnx.load(so.optimized_model_filepath))
    assert kept == {"defaults": 1, "replay": 0}  # replay's settings with every optimizer: CSE merges it


def test_optimize_reads_an_old_opset_model_zoo_model(tmp_path: Path) -> None:
    zoo = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"
    out = tmp_path / "squeezenet.opt.onnx"
    res = CliRunner().invoke(optimize_command, [str(zoo), "-o", str(out)])
    assert res.exit_code == 0, res.output
    graph = from_onnx_file(out)
    fused = [n for n in graph.nodes if n.op == "FusedConv"]
    assert fused and all(n.cost > 2 * graph.value_map[n.outputs[0]].size // 4 > 0 for n in fused)


def test_the_plan_executor_writes_every_planned_tensor_in_its_arena(chain, tmp_path: Path) -> None:
    path, graph, sched = chain
    bufs = buffers_of(graph, sched.steps)
    offsets, arena, _, _ = place(bufs, 64, 1.0, 1)
    planned = sched.model_copy(deep=True)
    planned.memory_plan = make_plan(bufs, offsets, 64)
    (tmp_path / "p.json").write_text(planned.to_json())
    out = tmp_path / "out.onnx"
    assert (
        CliRunner().invoke(apply_command, [str(path), str(tmp_path / "p.json"), "-o", str(out)]).exit_code
        == 0
    )
    feeds = make_inputs(onnx.load(str(path)), graph=graph)
    pe = PlanExecutor(out)
    assert pe.arena_bytes == arena
    got = pe.run(feeds)
    want = deployed_session(out).run(None, feeds)[0]
    assert np.array_equal(got["out"], want)
    # the graph output lives in the arena at its planned offset: the kernels wrote in place
    slot = next(b for b in read_metadata(out)[PLAN_KEY]["buffers"] if b.get("tensor") == "out")
    at = pe.arena[slot["offset"] : slot["offset"] + want.nbytes].view(np.float32).reshape(want.shape)
    assert np.array_equal(at, want)


def test_a_plan_with_an_omitted_optional_output_runs(tmp_path: Path) -> None:
    """MaxPool's Indices, read by nothing, has a buffer in the plan but is no tensor of the
    written model (the rewrite omits it): the plan leaves it out and the executor runs."""
    nodes = [
        oh.make_node("MaxPool", ["x"], ["y", "idx"], name="pool", kernel_shape=[2, 2], strides=[2, 2]),
        oh.make_node("Relu", ["y"], ["out"], name="relu"),
    ]
    g = oh.make_graph(
        nodes,
        "pool",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 64, 64])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [1, 4, 32, 32])],
    )
    path = tmp_path / "pool.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), str(path))
    graph = from_onnx_file(path)
    out = tmp_path / "out.onnx"
    apply_planned_order(path, graph, tmp_path / "p.json", out)
    tensors = {b.get("tensor") for b in read_metadata(out)[PLAN_KEY]["buffers"]}
    assert "idx" not in tensors and "out" in tensors
    x = make_inputs(onnx.load(str(path)), graph=graph)
    assert np.array_equal(PlanExecutor(out).run(x)["out"], deployed_session(out).run(None, x)[0])


def spread_chain(tmp_path: Path, budget: int | None = None) -> tuple[Path, Path, Graph, int]:
    """A chain of eight 2 MiB tensors, applied with every tensor at bytes of its own (an arena
    over twice the prediction) under `budget`: (model, applied model, graph, predicted peak)."""
    nodes = [
        oh.make_node("Sin" if k % 2 else "Cos", [f"t{k}"], [f"t{k + 1}"], name=f"op{k}") for k in range(8)
    ]
    g = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("t0", TensorProto.FLOAT, [512, 1024])],
        [oh.make_tensor_value_info("t8", TensorProto.FLOAT, [512, 1024])],
    )
    path = tmp_path / "chain.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), str(path))
    graph = from_onnx_file(path)
    out = tmp_path / "out.onnx"
    sched = apply_planned_order(path, graph, tmp_path / "p.json", out, spread=True, budget=budget)
    predicted = simulate(graph, sched.steps).peak_memory
    assert read_metadata(out)[PLAN_KEY]["arena"] >= 2 * predicted
    return path, out, graph, predicted


def huge_page_bytes(arr: np.ndarray) -> int:
    """Bytes of transparent huge pages in this process's mappings that overlap `arr`."""
    start, end = arr.ctypes.data, arr.ctypes.data + arr.nbytes
    inside, total = False, 0
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1]) * 1024
    return total


def test_the_plan_executors_arena_is_backed_by_base_pages(tmp_path: Path) -> None:
    """NumPy asks for huge pages on a large array; a hand-back followed by a write would then
    fault in 2 MiB where the plan counts the tensor's pages, so the arena refuses them."""
    path, out, graph, _ = spread_chain(tmp_path)
    ex = PlanExecutor(out)
    ex.run(make_inputs(onnx.load(str(path)), graph=graph))
    assert ex.arena.nbytes >= 8 << 20
    assert huge_page_bytes(ex.arena) == 0


def test_the_plan_executor_hands_pages_back_only_to_keep_the_budget(tmp_path: Path) -> None:
    """The resident set is held to the schedule's budget, not below it: under a budget the
    wide arena fits, the model runs in one session with nothing handed back; under one halfway
    between the live peak and the arena, less is handed back than with no budget (the live
    peak), and something still is."""
    arena = 8 * (2 << 20)
    handed, held = {}, {}
    # resident: the 2 MiB input
    for name, budget in (("none", None), ("half", 5 * (2 << 20)), ("fits", arena + (4 << 20))):
        (tmp_path / name).mkdir()
        _, out, _, predicted = spread_chain(tmp_path / name, budget)
        pe = PlanExecutor(out)
        assert pe.arena_bytes >= arena
        handed[name] = (len(pe.segments), sum(n for s in pe.segments for _, n in s.discard))
        held[name] = pe.held_bytes
    assert predicted < 5 * (2 << 20) < arena
    assert handed["fits"] == (1, 0)
    assert 0 < handed["half"][1] < handed["none"][1]
    # what a run holds: the whole arena, or the budget less the resident input
    assert held["fits"] == pe.arena_bytes // PAGE * PAGE
    assert 4 * (2 << 20) <= held["half"] <= 1.003 * 4 * (2 << 20)


@pytest.mark.slow
def test_the_plan_executors_peak_is_the_live_tensors_not_a_wide_arena(tmp_path: Path) -> None:
    """A placement may leave the arena above the live peak: the executor hands dead pages back
    where the touched ones would pass it, so the measured peak is the prediction, not the arena
    (here every tensor has bytes of its own: an arena over twice the prediction)."""
    path, out, graph, predicted = spread_chain(tmp_path)
    np.savez(tmp_path / "in.npz", **make_inputs(onnx.load(str(path)), graph=graph))
    got = measure([(out, tmp_path / "p.npz")], tmp_path / "in.npz", repeat=1, warmup=1, settings=["plan"])
    assert got[0].peak_above_baseline + graph.resident_bytes <= 1.03 * predicted
    with np.load(tmp_path / "p.npz") as p:
        want = deployed_session(out).run(None, make_inputs(onnx.load(str(path)), graph=graph))[0]
        assert np.array_equal(p["t8"], want)


def test_the_plan_executor_reads_each_runs_feeds(tmp_path: Path) -> None:
    """A run binds again only the inputs that are not the array of the run before: the same
    array changed in place, another array, and a strided view (copied when bound) each give the
    deployed model's outputs of that run's values."""
    path, out, graph, _ = spread_chain(tmp_path)
    pe = PlanExecutor(out)
    x = make_inputs(onnx.load(str(path)), graph=graph)["t0"]
    ref = deployed_session(out)
    view = np.zeros((512, 2048), np.float32)[:, ::2]
    for feed in (x, x, x, x.copy() + 1.0, view, view):
        feed += 0.5  # the same array, changed since the run before
        got = pe.run({"t0": feed})["t8"]
        assert np.array_equal(got, ref.run(None, {"t0": np.ascontiguousarray(feed)})[0])
