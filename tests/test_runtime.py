"""`remat run` on the CPU: the ONNX rewrite, both replay modes, inputs, the CLI command.

Everything runs real onnxruntime sessions on the shipped torch training graphs or on tiny
models built here; no test mocks the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto
from onnx import helper as oh

from remat_cli.cli.export_torch import export_torch_command
from remat_cli.cli.run_schedule import run_command
from remat_cli.execution.runner import build_schedule, run_solver
from remat_cli.graph import Graph
from remat_cli.importers.onnx import fit_ir_version, from_onnx_file, runtime_ir_version
from remat_cli.runtime import ModelMismatch, RuntimeUnavailable, run_schedule
from remat_cli.runtime.interpret import Interpreter, interpret
from remat_cli.runtime.model import make_inputs, scheduled_model
from remat_cli.runtime.ort import session_options
from remat_cli.runtime.session import executed_order
from remat_cli.schedule import Schedule, Step, baseline, baseline_steps, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions, SolverResult

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"
MLP = GRAPHS / "torch_mlp_train.onnx"


@pytest.fixture(scope="module")
def mlp() -> Graph:
    return from_onnx_file(MLP)


def checkpoint_all(graph: Graph) -> Schedule:
    sched, _ = run_solver(graph, baseline(graph).peak_memory, "checkpoint-all", SolveOptions())
    assert sched is not None
    return sched


def recompute_forward(graph: Graph) -> Schedule:
    """A schedule with recomputations: every forward node whose output a backward node reads
    is computed again right before that backward node first needs it (its inputs stay live
    for it, so this is valid though not memory-optimal)."""
    order = [n for n in graph.topo_order if n in graph.needed_nodes]
    phase = {n.id: n.phase for n in graph.nodes}
    seq: list[str] = []
    redone: set[str] = set()
    for nid in order:
        if phase[nid] == "backward":
            for v in graph.node_map[nid].inputs:
                p = graph.producer.get(v)
                if p is not None and phase[p] == "forward" and p not in redone:
                    seq.append(p)
                    redone.add(p)
        seq.append(nid)
    steps = steps_from_sequence(graph, seq)
    return build_schedule(graph, None, "recompute-forward", SolverResult(steps=steps, status="feasible"), 0.0)


# ---------------------------------------------------------------- onnxruntime's behaviour
def _dup_model() -> onnx.ModelProto:
    """x -> Relu twice (same input: CSE would merge them) -> Add; plus an independent branch
    placed between them in the file."""
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="relu_a"),
        oh.make_node("Neg", ["y"], ["n"], name="neg"),
        oh.make_node("Relu", ["x"], ["b"], name="relu_b"),
        oh.make_node("Add", ["a", "b"], ["s"], name="add"),
        oh.make_node("Add", ["s", "n"], ["out"], name="out"),
    ]
    vi = [oh.make_tensor_value_info(n, TensorProto.FLOAT, [4, 8]) for n in ("x", "y", "out")]
    g = oh.make_graph(nodes, "dup", vi[:2], vi[2:])
    return oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9)


def test_session_options_keep_file_order_and_duplicates(tmp_path: Path) -> None:
    m = _dup_model().SerializeToString()
    feeds = {"x": np.ones((4, 8), np.float32), "y": np.ones((4, 8), np.float32)}
    ours = executed_order(m, feeds, session_options(1, profile_prefix=str(tmp_path / "p")))
    assert ours == ["relu_a", "neg", "relu_b", "add", "out"]
    # What the options guard against: basic optimisations merge the duplicated Relu (CSE).
    so = session_options(1, profile_prefix=str(tmp_path / "q"))
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert len(executed_order(m, feeds, so)) < len(ours)


# ---------------------------------------------------------------- the rewrite
def test_rewrite_duplicates_recomputed_nodes_with_renamed_outputs(mlp: Graph) -> None:
    sched = recompute_forward(mlp)
    assert sched.summary.recomputations > 0
    model = onnx.load(str(MLP))
    out = scheduled_model(model, mlp, sched.steps)
    onnx.checker.check_model(out)
    computes = [s.node for s in sched.steps if s.op == "compute"]
    names = [n.name for n in out.graph.node if "__release" not in n.name]
    assert len(names) == len(computes)
    assert sum("__remat" in n for n in names) == sched.summary.recomputations
    # graph outputs keep their names; every tensor has one producer
    produced = [t for n in out.graph.node for t in n.output if t]
    assert len(produced) == len(set(produced))
    assert {o.name for o in out.graph.output} <= set(produced)


@pytest.mark.slow
def test_rewrite_remakes_a_view_whose_base_was_recomputed(tmp_path: Path) -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="relu"),
        oh.make_node("Reshape", ["a", "shape"], ["v"], name="view"),
        oh.make_node("Neg", ["a"], ["b"], name="neg"),
        oh.make_node("Add", ["b", "b"], ["c"], name="twice"),
        oh.make_node("Flatten", ["c"], ["cf"], name="flat"),
        oh.make_node("Add", ["v", "cf"], ["out"], name="out"),
    ]
    g = oh.make_graph(
        nodes,
        "views",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])],
        initializer=[onnx.numpy_helper.from_array(np.array([4, 8], np.int64), "shape")],
    )
    path = tmp_path / "views.onnx"
    onnx.save(oh.make_model(g, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), path)
    graph = from_onnx_file(path)
    # relu, view, neg, free a, twice, relu again (v still live), flat, out
    seq = ["relu", "view", "neg", "twice", "relu", "flat", "out"]
    steps = steps_from_sequence(graph, seq)
    assert any(
        s.op == "free" and s.value == "a" for s in steps[: steps.index(Step(op="compute", node="twice"))]
    )
    sched = build_schedule(graph, None, "hand", SolverResult(steps=steps, status="feasible"), 0.0)
    out = scheduled_model(onnx.load(str(path)), graph, steps)
    ops = [(n.op_type, list(n.input)) for n in out.graph.node]
    # the view is made again from the recomputed base before `out` reads it
    assert ("Reshape", ["a", "shape"]) in ops and ops.index(("Reshape", ["a", "shape"])) > 4
    rep = run_schedule(path, graph, sched, mode="session", repeat=1, warmup=0)
    assert rep.outputs_match and rep.order_kept


def test_unread_outputs_are_dropped_or_released() -> None:
    path = GRAPHS / "torch_unet_train.onnx"
    graph = from_onnx_file(path)
    model = onnx.load(str(path))
    out = scheduled_model(model, graph, checkpoint_all(graph).steps)
    read = {t for n in out.graph.node for t in n.input} | {o.name for o in out.graph.output}
    unread = [t for n in out.graph.node for t in n.output if t and t not in read]
    assert unread and all(t.endswith("__shape") for t in unread)
    read0 = {t for n in model.graph.node for t in n.input} | {o.name for o in model.graph.output}
    original_unread = [t for n in model.graph.node for t in n.output if t and t not in read0]
    assert original_unread, "the U-Net export has unread outputs (MaxPool values/indices)"


# ---------------------------------------------------------------- inputs
def test_inputs_have_the_right_types_and_valid_indices() -> None:
    path = GRAPHS / "torch_transformer_train.onnx"
    model = onnx.load(str(path))
    feeds = make_inputs(model, seed=3)
    assert feeds["x"].dtype == np.int64 and 0 <= feeds["x"].min() and feeds["x"].max() < 512
    assert feeds["y"].max() < 512 and feeds["y"].max() > 10
    assert feeds["emb_weight"].dtype == np.float32 and feeds["emb_weight"].shape == (512, 128)
    again = make_inputs(model, seed=3, given={"x": feeds["x"]})
    assert all(np.array_equal(again[k], feeds[k]) for k in feeds)
    with pytest.raises(ValueError, match="expected"):
        make_inputs(model, given={"x": feeds["x"].astype(np.int32)})


# ---------------------------------------------------------------- replays
def test_interpret_mode_peak_is_the_simulators(mlp: Graph) -> None:
    model = onnx.load(str(MLP))
    feeds = make_inputs(model, graph=mlp)
    engine = Interpreter(model, mlp)
    for sched in (checkpoint_all(mlp), recompute_forward(mlp)):
        (run,) = interpret(engine, [sched.steps], feeds, warmup=0, repeat=1)
        assert run.peak_memory == simulate(mlp, sched.steps).peak_memory
        assert set(run.outputs) >= {o.name for o in model.graph.output}


@pytest.mark.slow
def test_a_replay_with_fewer_sessions_than_nodes_is_the_same_replay(mlp: Graph) -> None:
    """CUDA keeps only the sessions the GPU holds (node_sessions.py); here the same pool on the
    CPU is told it is full at 3 sessions: the replay remakes the others and changes nothing."""
    model = onnx.load(str(MLP))
    feeds = make_inputs(model, graph=mlp)
    sched = recompute_forward(mlp)
    (whole,) = interpret(Interpreter(model, mlp), [sched.steps], feeds, warmup=0, repeat=1)
    most = [0]

    def full() -> bool:
        most[0] = max(most[0], len(engine.sessions.held()))
        return len(engine.sessions.held()) >= 3

    engine = Interpreter(model, mlp, full=full)
    assert engine.sessions.held() == []  # made on first use
    (small,) = interpret(engine, [sched.steps], feeds, warmup=1, repeat=2)
    assert most[0] == 3 and len(engine.sessions.held()) == 3
    # the newest is dropped: the two made first stay for every replay
    first = list(dict.fromkeys(s.node for s in sched.steps if s.op == "compute"))[:2]
    assert engine.sessions.held()[:2] == first
    assert engine.sessions.created > 2 * len(mlp.nodes)  # dropped ones were made again
    assert small.peak_memory == whole.peak_memory
    assert small.outputs.keys() == whole.outputs.keys()
    assert all(np.array_equal(small.outputs[k], whole.outputs[k]) for k in whole.outputs)


@pytest.mark.slow
def test_making_sessions_is_left_out_of_a_replays_time(tmp_path: Path) -> None:
    """A chain of 20 If nodes whose then-branch (3,000 Neg nodes, each session parses it) is
    never taken, with room for one session: every step makes a session (milliseconds) and runs
    a one-node branch (microseconds). The replay's time is its runs alone."""

    def branch(k: int, length: int) -> onnx.GraphProto:
        names = [f"t{k}", *(f"b{k}_{length}_{j}" for j in range(1, length)), f"o{k}_{length}"]
        negs = [oh.make_node("Neg", [names[j]], [names[j + 1]]) for j in range(length)]
        out = oh.make_tensor_value_info(names[-1], TensorProto.FLOAT, [1])
        return oh.make_graph(negs, f"branch{k}_{length}", [], [out])

    ifs = [
        oh.make_node(
            "If", ["c"], [f"t{k + 1}"], name=f"if{k}", then_branch=branch(k, 3000), else_branch=branch(k, 1)
        )
        for k in range(20)
    ]
    graph = oh.make_graph(
        ifs,
        "chain",
        [
            oh.make_tensor_value_info("c", TensorProto.BOOL, []),
            oh.make_tensor_value_info("t0", TensorProto.FLOAT, [1]),
        ],
        [oh.make_tensor_value_info("t20", TensorProto.FLOAT, [1])],
    )
    path = tmp_path / "chain.onnx"
    onnx.save(oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=9), str(path))
    model, g = onnx.load(str(path)), from_onnx_file(path)
    feeds = make_inputs(model, graph=g, given={"c": np.array(False)})
    engine = Interpreter(model, g, full=lambda: len(engine.sessions.held()) >= 1)
    (run,) = interpret(engine, [baseline_steps(g)], feeds, warmup=0, repeat=1)
    assert engine.sessions.created == 20
    assert run.seconds < engine.sessions.seconds / 4 and run.cpu_times[0] < engine.sessions.cpu_seconds / 4


@pytest.mark.slow
def test_session_mode_replay_matches_and_measures(mlp: Graph) -> None:
    sched = recompute_forward(mlp)
    rep = run_schedule(MLP, mlp, sched, mode="session", repeat=1, warmup=1)
    assert rep.outputs_match and rep.max_abs_diff == 0.0
    assert rep.order_kept
    assert abs(rep.memory_error) <= 0.15
    assert rep.measured.seconds > 0 and rep.unscheduled.seconds > 0
    data = json.loads(rep.to_json())
    for key in ("provider", "mode", "outputs_match", "threads"):
        assert key in data
    assert set(data["predicted"]) >= {"peak_memory", "cost"}
    assert set(data["measured"]) >= {"peak_memory", "seconds"}
    assert set(data["unscheduled"]) >= {"peak_memory", "seconds"}


def test_cuda_needs_onnxruntime_gpu(mlp: Graph) -> None:
    sched = checkpoint_all(mlp)
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        with pytest.raises(RuntimeUnavailable, match="onnxruntime-gpu"):
            run_schedule(MLP, mlp, sched, provider="cuda", repeat=1, warmup=0)
    else:  # a GPU machine: the CUDA path itself
        rep = run_schedule(MLP, mlp, sched, provider="cuda", repeat=1, warmup=1)
        assert rep.outputs_match and rep.measured.peak_memory > mlp.resident_bytes


@pytest.mark.slow
def test_cli_command_prints_json(mlp: Graph, tmp_path: Path) -> None:
    sched_path = tmp_path / "s.json"
    sched_path.write_text(checkpoint_all(mlp).to_json())
    res = CliRunner().invoke(
        run_command,
        [str(MLP), str(sched_path), "--mode", "interpret", "--repeat", "1", "--warmup", "0", "--json"],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["outputs_match"] and data["mode"] == "interpret"
    assert data["measured"]["peak_memory"] == data["predicted"]["peak_memory"]
    bad = CliRunner().invoke(run_command, [str(MLP), str(sched_path), "--provider", "cuda", "--repeat", "1"])
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        assert bad.exit_code == 2 and "onnxruntime-gpu" in bad.output


def exported(tmp_path: Path, model: str, batch: str) -> Graph | None:
    """`remat export-torch` of ``nn.Sequential(model)`` on `batch` with cross-entropy, imported;
    None where the extra is not installed (after checking its clear one-line error)."""
    spec = tmp_path / "spec.py"
    spec.write_text(
        "import torch\n"
        "from torch import nn\n"
        "def net():\n"
        "    torch.manual_seed(0)\n"
        f"    return nn.Sequential({model}), ({batch}), nn.functional.cross_entropy\n"
    )
    out = tmp_path / "net.onnx"
    res = CliRunner().invoke(export_torch_command, [f"{spec}:net", "-o", str(out)])
    try:
        import torch  # noqa: F401
    except ImportError:
        assert res.exit_code == 2 and "remat-cli[torch]" in res.output
        return None
    assert res.exit_code == 0, res.output
    return from_onnx_file(out)


@pytest.mark.slow
def test_export_torch_command(tmp_path: Path) -> None:
    graph = exported(
        tmp_path,
        "nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3)",
        "torch.randn(32, 8), torch.randint(0, 3, (32,))",
    )
    if graph is None:
        return
    assert {n.phase for n in graph.nodes} >= {"forward", "loss", "backward"}
    assert len([o for o in graph.outputs if o.startswith("grad_")]) == 4


@pytest.mark.slow
def test_export_torch_pairs_each_backward_op_with_the_forward_op_it_differentiates(tmp_path: Path) -> None:
    """autograd's pairing reaches the graph as ``grad_of`` (ONNX node metadata): the op writing a
    layer's weight gradient differentiates that layer's forward op, whatever the exporter
    renamed (BatchNorm) or split into several ONNX nodes (MaxPool with indices)."""
    graph = exported(
        tmp_path,
        "nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4, track_running_stats=False), nn.ReLU(), "
        "nn.MaxPool2d(2), nn.Flatten(), nn.Linear(64, 3)",
        "torch.randn(2, 3, 8, 8), torch.randint(0, 3, (2,))",
    )
    if graph is None:
        return
    nodes = graph.node_map
    pairs = {n.id: n.grad_of for n in graph.nodes if n.grad_of is not None}
    assert all(
        nodes[b].phase == "backward" and nodes[f].phase in ("forward", "loss") for b, f in pairs.items()
    )

    def differentiates(grad: str) -> str:
        return nodes[pairs[graph.producer[grad]]].op or ""

    assert differentiates("grad_0_weight") == "Conv"
    assert differentiates("grad_1_weight") == "BatchNormalization"
    assert differentiates("grad_5_weight") in ("Gemm", "MatMul")
    # the backward of ReLU and of MaxPool: their own forward ops, not a neighbour's
    assert {nodes[f].op for f in pairs.values()} >= {"Conv", "BatchNormalization", "Relu", "MaxPool", "Gemm"}


def test_a_schedule_for_another_graph_is_refused(mlp: Graph) -> None:
    other = from_onnx_file(GRAPHS / "torch_unet_train.onnx")
    with pytest.raises(ModelMismatch, match="does not fit"):
        run_schedule(MLP, mlp, checkpoint_all(other), repeat=1, warmup=0)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["session", "interpret"])
def test_a_model_newer_than_onnxruntime_loads_is_replayed_at_the_ir_it_loads(
    tmp_path: Path, mode: str
) -> None:
    """onnxruntime-gpu 1.31 loads IR 13 at most while onnx 1.23 writes IR 14 (seen on an H200
    machine); the model here is one IR version past what this onnxruntime loads."""
    limit = runtime_ir_version()
    with pytest.raises(Exception, match="IR version"):  # the premise: onnxruntime refuses it
        too_new = onnx.load(str(MLP))
        too_new.ir_version = limit + 1
        ort.InferenceSession(too_new.SerializeToString(), providers=["CPUExecutionProvider"])
    path = tmp_path / "newer_ir.onnx"
    onnx.save(too_new, path)
    graph = from_onnx_file(path)
    rep = run_schedule(path, graph, checkpoint_all(graph), mode=mode, repeat=1, warmup=0)
    assert rep.outputs_match
    assert any(f"IR version {limit + 1} lowered to {limit}" in n for n in rep.notes)
    assert fit_ir_version(too_new).ir_version == limit and too_new.ir_version == limit + 1


def test_a_scalar_initializer_keeps_rank_zero_in_interpret_mode(tmp_path: Path) -> None:
    """y[:, -1] as torch.onnx's dynamo exporter writes it: Gather with a scalar index drops the
    axis. Fed as a 1-element vector (np.ascontiguousarray makes 0-d arrays 1-d) the Gather kept
    it, and the Gemm after it failed on a rank-3 input (an LSTM classifier in interpret mode)."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
    last = onnx.numpy_helper.from_array(np.array(-1, dtype=np.int64), "last")
    w = onnx.numpy_helper.from_array(np.ones((4, 5), dtype=np.float32), "w")
    nodes = [
        oh.make_node("Gather", ["x", "last"], ["sel"], axis=1),
        oh.make_node("Gemm", ["sel", "w"], ["y"]),
    ]
    model = oh.make_model(
        oh.make_graph(nodes, "g", [x], [y], [last, w]), opset_imports=[oh.make_opsetid("", 17)]
    )
    path = tmp_path / "gather_scalar.onnx"
    onnx.save(model, path)
    graph = from_onnx_file(path)
    sched = checkpoint_all(graph)
    rep = run_schedule(path, graph, sched, mode="interpret", repeat=1, warmup=0)
    assert rep.outputs_match


def test_a_subgraph_reading_the_enclosing_graph_runs_in_interpret_mode(tmp_path: Path) -> None:
    """An If whose branches read a tensor of the enclosing graph (torch.jit.script control flow
    exported by torch.onnx): its one-node model declares that tensor as an input too, else
    onnxruntime refused it ('is not output of any previous nodes')."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    out = oh.make_tensor_value_info("r", TensorProto.FLOAT, [3])
    then = oh.make_graph([oh.make_node("Neg", ["h"], ["r"])], "then", [], [out])
    other = oh.make_graph([oh.make_node("Abs", ["h"], ["r"])], "else", [], [out])
    nodes = [
        oh.make_node("Sin", ["x"], ["h"]),
        oh.make_node("ReduceSum", ["h"], ["s"], keepdims=0),
        oh.make_node("Greater", ["s", "zero"], ["c"]),
        oh.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other),
    ]
    zero = onnx.numpy_helper.from_array(np.array(0.0, dtype=np.float32), "zero")
    model = oh.make_model(
        oh.make_graph(nodes, "g", [x], [y], [zero]), opset_imports=[oh.make_opsetid("", 17)]
    )
    path = tmp_path / "if_outer.onnx"
    onnx.save(model, path)
    graph = from_onnx_file(path)
    rep = run_schedule(path, graph, checkpoint_all(graph), mode="interpret", repeat=1, warmup=0)
    assert rep.outputs_match


@pytest.mark.slow
@pytest.mark.parametrize("op", ["RandomUniformLike", "Dropout"])
@pytest.mark.parametrize("mode", ["session", "interpret"])
def test_dropout_draws_the_same_numbers_in_both_runs(tmp_path: Path, mode: str, op: str) -> None:
    """A training step with Dropout draws its mask in the graph (RandomUniformLike, no seed):
    the scheduled and the unscheduled run drew different masks and `remat run` reported that
    the outputs differ. Seeded from the node's name, both draw the same, replay after replay.
    The same for ONNX's own Dropout with a training_mode input (torch.onnx's training exports)."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    half = onnx.numpy_helper.from_array(np.array(0.5, dtype=np.float32), "half")
    nodes = [
        oh.make_node("Relu", ["x"], ["h"], name="relu"),
        oh.make_node("RandomUniformLike", ["h"], ["u"], name="draw"),
        oh.make_node("Less", ["u", "half"], ["keep"], name="less"),
        oh.make_node("Cast", ["keep"], ["mask"], to=TensorProto.FLOAT, name="cast"),
        oh.make_node("Mul", ["h", "mask"], ["y"], name="mul"),
    ]
    inits = [half]
    if op == "Dropout":
        nodes = [nodes[0], oh.make_node("Dropout", ["h", "half", "train"], ["y"], name="dropout")]
        inits.append(onnx.numpy_helper.from_array(np.array(True), "train"))
    model = oh.make_model(oh.make_graph(nodes, "g", [x], [y], inits), opset_imports=[oh.make_opsetid("", 17)])
    path = tmp_path / "dropout.onnx"
    onnx.save(model, path)
    graph = from_onnx_file(path)
    sched = checkpoint_all(graph)
    if mode == "interpret":  # and the replay inside a memory plan's arena draws the same too
        from remat_cli.planning.memory_plan import plan_schedule

        sched = sched.model_copy(update={"memory_plan": plan_schedule(graph, sched.steps)})
    rep = run_schedule(path, graph, sched, mode=mode, repeat=2, warmup=1)
    assert rep.outputs_match and any("seeded" in n for n in rep.notes)
    assert mode == "session" or (rep.arena is not None and rep.arena["outputs_match"])


@pytest.mark.slow
def test_a_graph_of_empty_tensors_prints_its_table(tmp_path: Path) -> None:
    """Every tensor of zero elements: the predicted peak is 0 B, and the table's 'peak vs
    predicted' row divided by it (an internal error, exit 3)."""
    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [0, 8])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [0, 8])
    # opset 17: onnx's newest opset can be newer than onnxruntime runs (onnxruntime-gpu lags)
    graph = oh.make_graph([oh.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    path, sched_path = tmp_path / "empty.onnx", tmp_path / "s.json"
    onnx.save(model, path)
    sched_path.write_text(checkpoint_all(from_onnx_file(path)).to_json())
    res = CliRunner().invoke(run_command, [str(path), str(sched_path), "--repeat", "1", "--warmup", "0"])
    assert res.exit_code == 0, res.output
