"""Deployment truth in onnxruntime: `remat run`'s ORT-defaults column, `remat apply`'s
deployable model, `remat optimize`'s offline-optimized model, the plan executor.

Real onnxruntime sessions on tiny models built here and on the shipped training graphs; no
test mocks the runtime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto
from onnx import helper as oh

from remat_cli.graph import Graph
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.runner import build_schedule
from remat_cli.runtime import run_schedule
from remat_cli.runtime.cli_command import run_command
from remat_cli.schedule import Schedule, steps_from_sequence
from remat_cli.solver import SolverResult

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
        onnx.numpy_helper.from_array(np.array([1, 8], np.int64), "reps"),
        onnx.numpy_helper.from_array(np.array([1], np.int64), "axes"),
    ]
    g = oh.make_graph(
        nodes,
        "chain",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [64, 256])],
        [oh.make_tensor_value_info("out", TensorProto.FLOAT, [64, 256])],
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
