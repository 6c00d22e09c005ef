"""The ONNX importer on models built here with onnx.helper (ir_version=10: onnxruntime 1.31
rejects the IR 14 that onnx 1.23 writes by default)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper

from remat_cli.graph import Graph, GraphError
from remat_cli.importers import load_graph
from remat_cli.importers.onnx import from_onnx_file, from_onnx_model, onnx_node_ids
from remat_cli.schedule import baseline

F = T.FLOAT


def make(nodes, inputs, outputs, inits=(), opset: int = 17, name: str = "g") -> onnx.ModelProto:
    g = oh.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    return oh.make_model(g, ir_version=10, opset_imports=[oh.make_opsetid("", opset)])


def vi(name: str, shape, elem=F) -> onnx.ValueInfoProto:
    return oh.make_tensor_value_info(name, elem, shape)


def weight(name: str, *shape: int, seed: int = 0) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).random(shape, dtype=np.float32), name)


def ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def mlp(batch=2, widths=(3, 4, 5)) -> onnx.ModelProto:
    """x -> MatMul W0 -> Relu -> MatMul W1 -> out; no value_info: shapes come from inference."""
    nodes, inits, h = [], [], "x"
    for k in range(len(widths) - 1):
        inits.append(weight(f"W{k}", widths[k], widths[k + 1], seed=k))
        nodes.append(oh.make_node("MatMul", [h, f"W{k}"], [f"m{k}"], name=f"mm{k}"))
        h = f"m{k}"
        if k < len(widths) - 2:
            nodes.append(oh.make_node("Relu", [h], [f"r{k}"], name=f"relu{k}"))
            h = f"r{k}"
    nodes.append(oh.make_node("Identity", [h], ["out"], name="out_id"))
    return make(nodes, [vi("x", [batch, widths[0]])], [vi("out", None)], inits)


def test_sizes_roles_ids_from_shape_inference() -> None:
    g = from_onnx_model(mlp(batch=2, widths=(3, 4, 5)), name="mlp")
    vm = g.value_map
    assert vm["x"].role == "input" and vm["x"].size == 2 * 3 * 4
    assert vm["W0"].role == "parameter" and vm["W0"].size == 3 * 4 * 4
    assert vm["m0"].size == 2 * 4 * 4 and vm["m0"].shape == [2, 4] and vm["m0"].dtype == "float32"
    assert vm["m1"].size == 2 * 5 * 4
    assert vm["out"].size == 0  # Identity is a view of m1
    assert g.outputs == ["out", "m1"]
    assert [n.id for n in g.nodes] == ["mm0", "relu0", "mm1", "out_id"]
    assert all(n.source == [n.id] and n.phase is None for n in g.nodes)
    assert [n.op for n in g.nodes] == ["MatMul", "Relu", "MatMul", "Identity"]
    assert g.cost_unit == "flops"
    assert g.resident_bytes == 2 * 3 * 4 + (12 + 20) * 4


def test_mixed_dtypes_and_int_initializer_size() -> None:
    m = make(
        [oh.make_node("Cast", ["x"], ["h"], to=T.FLOAT16), oh.make_node("Reshape", ["h", "s"], ["y"])],
        [vi("x", [4, 6])],
        [vi("y", None, T.FLOAT16)],
        [ints("s", [3, 8])],
    )
    g = from_onnx_model(m)
    assert g.value_map["h"].size == 24 * 2 and g.value_map["h"].dtype == "float16"
    assert g.value_map["s"].size == 2 * 8
    assert g.value_map["y"].shape == [3, 8] and g.value_map["y"].size == 0
    assert g.outputs == ["y", "h"]


def symbolic_model() -> onnx.ModelProto:
    m = mlp()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    return m


def test_symbolic_dims_resolved_by_input_shapes_and_batch() -> None:
    g = from_onnx_model(symbolic_model(), input_shapes={"x": [5, 3]})
    assert g.value_map["x"].size == 5 * 3 * 4 and g.value_map["m1"].size == 5 * 5 * 4
    g = from_onnx_model(symbolic_model(), batch=7)
    assert g.value_map["x"].shape == [7, 3] and g.value_map["m0"].size == 7 * 4 * 4


def test_symbol_shared_between_inputs_and_value_info() -> None:
    m = make(
        [oh.make_node("Add", ["a", "b"], ["c"]), oh.make_node("Relu", ["c"], ["d"])],
        [vi("a", ["B", 8]), vi("b", ["B", 8])],
        [vi("d", ["B", 8])],
    )
    m.graph.value_info.append(vi("c", ["B", 8]))
    g = from_onnx_model(m, input_shapes={"a": [3, 8]})
    assert g.value_map["b"].size == g.value_map["c"].size == g.value_map["d"].size == 3 * 8 * 4


def test_value_info_with_an_expression_of_fixed_symbols() -> None:
    """torch.onnx's dynamo exporter declares dims such as '4*batch': with batch fixed they are
    numbers (left symbolic, the tensor's size was unknown)."""
    m = make(  # the Reshape target is an input: only the declared dims say y's shape
        [oh.make_node("Reshape", ["x", "flat"], ["y"]), oh.make_node("Relu", ["y"], ["z"])],
        [vi("x", ["batch", 4]), vi("flat", [1], T.INT64)],
        [vi("z", ["4*batch"])],
    )
    m.graph.value_info.append(vi("y", ["4*batch"]))
    g = from_onnx_model(m, batch=3)
    assert g.value_map["y"].shape == g.value_map["z"].shape == [12] and g.value_map["z"].size == 12 * 4


@pytest.mark.parametrize(
    ("text", "value"),
    [("4*batch", 12), ("seq*batch + 1", 22), ("Max(1, batch - 5)", 1), ("(seq - 1)//2", 3)]
    + [("batch/2", None), ("other*2", None), ("batch**99", None), ("__import__('os')", None)],
)
def test_dim_expressions(text: str, value: int | None) -> None:
    from remat_cli.importers.onnx.shapes import dim_expression

    assert dim_expression(text, {"batch": 3, "seq": 7}) == value


def test_reshape_target_from_shape_arithmetic_is_folded() -> None:
    """A Slice of Shape(x) whose end is computed (Reshape(Mod(c1, c2)), as torch.onnx exports
    nn.MultiheadAttention): neither onnx's nor onnxruntime's inference resolves it, folding
    the arithmetic does; the slice then feeds a Reshape target."""
    nodes = [
        oh.make_node("Shape", ["x"], ["s"]),
        oh.make_node("Mod", ["c7", "c4"], ["m"]),  # 7 % 4 = 3
        oh.make_node("Reshape", ["m", "one"], ["end"]),
        oh.make_node("Slice", ["s", "zero", "end"], ["dims"]),  # [2, 3, 5]
        oh.make_node("ReduceProd", ["dims"], ["n"], keepdims=1),  # [30]
        oh.make_node("Concat", ["n", "minus1"], ["target"], axis=0),  # [30, -1]
        oh.make_node("Reshape", ["x", "target"], ["y"]),
        oh.make_node("Relu", ["y"], ["z"]),
    ]
    inits = [ints("c7", 7), ints("c4", 4), ints("one", [1]), ints("zero", [0]), ints("minus1", [-1])]
    m = make(nodes, [vi("x", [2, 3, 5, 4])], [vi("z", None)], inits)
    g = from_onnx_model(m)
    assert g.value_map["z"].shape == [30, 4] and g.value_map["z"].size == 30 * 4 * 4
    assert [n.id for n in g.nodes if n.op == "Relu"]  # the graph keeps its nodes: only inference folds


def test_unresolved_dim_is_an_error_naming_the_tensor() -> None:
    with pytest.raises(GraphError, match=r"tensor 'x'.*symbolic dim 'N'.*--input-shape"):
        from_onnx_model(symbolic_model())


def test_unknown_shape_is_an_error_naming_the_tensor() -> None:
    m = make(
        [oh.make_node("Relu", ["x"], ["y"], name="r")],
        [oh.make_tensor_value_info("x", F, None)],
        [vi("y", None)],
    )
    with pytest.raises(GraphError, match=r"tensor 'x'"):
        from_onnx_model(m)


def test_contrib_op_shapes_from_onnxruntime_symbolic_inference() -> None:
    # onnx's own inference knows nothing of com.microsoft ops; onnxruntime's fills the gap
    m = make(
        [
            oh.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="gelu"),
            oh.make_node("Relu", ["y"], ["z"]),
        ],
        [vi("x", [2, 8])],
        [vi("z", None)],
    )
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    g = from_onnx_model(m, cost="profile", profile_runs=1)
    assert g.value_map["y"].size == g.value_map["z"].size == 2 * 8 * 4
    assert g.node_map["gelu"].cost > 0


def test_missing_symbolic_inference_is_named_not_swallowed(monkeypatch: pytest.MonkeyPatch) -> None:
    # sympy absent (as on a fresh machine before it was declared): the error says so
    monkeypatch.delitem(sys.modules, "onnxruntime.tools.symbolic_shape_infer", raising=False)
    monkeypatch.setitem(sys.modules, "sympy", None)  # import sympy -> ImportError
    m = make(
        [oh.make_node("Gelu", ["x"], ["y"], domain="com.microsoft", name="gelu")],
        [vi("x", [2, 8])],
        [vi("y", None)],
    )
    m.opset_import.append(oh.make_opsetid("com.microsoft", 1))
    with pytest.raises(
        GraphError,
        match=r"could not be inferred \(onnxruntime's symbolic shape inference is unavailable \(.*sympy",
    ):
        from_onnx_model(m, cost="unit")


def test_bad_input_shape_options() -> None:
    with pytest.raises(GraphError, match="'nope', which is not a graph input"):
        from_onnx_model(symbolic_model(), input_shapes={"nope": [1]})
    with pytest.raises(GraphError, match="rank 2"):
        from_onnx_model(symbolic_model(), input_shapes={"x": [1, 2, 3]})
    with pytest.raises(GraphError, match="fixed to 3"):
        from_onnx_model(symbolic_model(), input_shapes={"x": [1, 4]})


def test_external_data_is_not_read(tmp_path: Path) -> None:
    path = tmp_path / "ext.onnx"
    onnx.save_model(
        mlp(batch=2, widths=(64, 32, 8)),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    (tmp_path / "ext.data").unlink()  # the weights are gone; sizes must come from dims
    g = load_graph(path)
    assert g.value_map["W0"].role == "parameter" and g.value_map["W0"].size == 64 * 32 * 4
    assert g.value_map["m1"].size == 2 * 8 * 4
    assert g.name == "ext"
    timed = from_onnx_file(path, cost="profile", profile_runs=1)  # random weights stand in
    assert timed.cost_unit == "seconds" and all(n.cost > 0 for n in timed.nodes)


def test_external_data_small_int_initializers_feed_shape_inference(tmp_path: Path) -> None:
    m = make(
        [oh.make_node("Reshape", ["x", "s"], ["y"]), oh.make_node("MatMul", ["y", "W"], ["z"])],
        [vi("x", [2, 3, 4])],
        [vi("z", None)],
        [ints("s", [6, 4]), weight("W", 4, 5)],
    )
    path = tmp_path / "r.onnx"
    onnx.save_model(m, str(path), save_as_external_data=True, location="r.data", size_threshold=0)
    g = from_onnx_file(path)
    assert g.value_map["z"].size == 6 * 5 * 4
    (tmp_path / "r.data").unlink()  # now the Reshape target is unknown, so z's shape is too
    with pytest.raises(GraphError, match="'z'"):
        from_onnx_file(path)


def reshape_chain(with_views: bool) -> onnx.ModelProto:
    """x -> Relu a -> [Reshape -> Flatten -> Unsqueeze -> Squeeze -> Identity] -> Sigmoid -> out."""
    nodes = [oh.make_node("Relu", ["x"], ["a"], name="relu")]
    h = "a"
    if with_views:
        nodes += [
            oh.make_node("Reshape", ["a", "s"], ["v1"], name="reshape"),
            oh.make_node("Flatten", ["v1"], ["v2"], axis=1, name="flatten"),
            oh.make_node("Unsqueeze", ["v2", "ax"], ["v3"], name="unsq"),
            oh.make_node("Squeeze", ["v3", "ax"], ["v4"], name="sq"),
            oh.make_node("Identity", ["v4"], ["v5"], name="ident"),
        ]
        h = "v5"
    nodes += [
        oh.make_node("Sigmoid", [h], ["b"], name="sig"),
        oh.make_node("Neg", ["a"], ["c"], name="neg"),  # a second reader of the base
        oh.make_node("Add", ["b", "b"], ["d"], name="add"),
    ]
    return make(
        nodes, [vi("x", [16, 64])], [vi("d", None), vi("c", None)], [ints("s", [64, 16]), ints("ax", [0])]
    )


def test_views_are_not_double_counted() -> None:
    plain = from_onnx_model(reshape_chain(False))
    views = from_onnx_model(reshape_chain(True))
    assert [views.value_map[v].size for v in ("v1", "v2", "v3", "v4", "v5")] == [0] * 5
    # every reader of a view also reads its base, following the chain back to `a`
    assert views.node_map["sig"].inputs == ["v5", "a"]
    assert views.node_map["ident"].inputs == ["v4", "a"]
    assert views.node_map["flatten"].inputs == ["v1", "a"]
    assert baseline(views).peak_memory == baseline(plain).peak_memory
    # the Reshape chain keeps `a` alive until the Sigmoid, so the peak is the same as when
    # Sigmoid reads `a` directly; without the base edges it would be lower (a freed early)
    assert baseline(plain).peak_memory == views.resident_bytes + 3 * 16 * 64 * 4


def test_view_graph_output_keeps_its_base() -> None:
    m = make(
        [oh.make_node("Relu", ["x"], ["a"]), oh.make_node("Flatten", ["a"], ["y"], axis=1)],
        [vi("x", [2, 3, 4])],
        [vi("y", None)],
    )
    g = from_onnx_model(m)
    assert g.outputs == ["y", "a"]
    assert baseline(g).peak_memory == 2 * (2 * 3 * 4 * 4)


def test_flops_of_conv_matmul_gemm_by_hand() -> None:
    m = make(
        [
            oh.make_node("Conv", ["x", "w", "bias"], ["y"], pads=[1, 1, 1, 1], name="conv"),
            oh.make_node("Conv", ["x", "wg"], ["yg"], group=3, strides=[2, 2], name="gconv"),
            oh.make_node("MatMul", ["p", "q"], ["r"], name="mm"),
            oh.make_node("Gemm", ["a", "b", "c"], ["o"], transB=1, name="gemm"),
            oh.make_node("Relu", ["y"], ["yr"], name="relu"),
            oh.make_node("MaxPool", ["y"], ["mp"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
            oh.make_node("Softmax", ["r"], ["sm"], name="softmax"),
            oh.make_node("ReduceSum", ["y"], ["rs"], keepdims=0, name="rsum"),
        ],
        [vi("x", [1, 3, 8, 8]), vi("p", [2, 5, 3]), vi("a", [4, 6])],
        [vi(n, None) for n in ("yr", "yg", "sm", "o", "mp", "rs")],
        [weight("w", 4, 3, 3, 3), weight("bias", 4), weight("wg", 6, 1, 3, 3)]
        + [weight("q", 3, 7), weight("b", 5, 6), weight("c", 5)],
    )
    g = from_onnx_model(m)
    cost = {n.id: n.cost for n in g.nodes}
    y = 1 * 4 * 8 * 8
    assert cost["conv"] == 2 * y * 3 * 3 * 3 + y
    assert cost["gconv"] == 2 * (1 * 6 * 3 * 3) * (1 * 3 * 3)  # out 6x3x3 (stride 2, no pad)
    assert cost["mm"] == 2 * (2 * 5 * 7) * 3
    assert cost["gemm"] == 2 * 4 * 5 * 6 + 4 * 5
    assert cost["relu"] == y
    assert cost["pool"] == (4 * 4 * 4) * 4
    assert cost["softmax"] == 5 * 2 * 5 * 7
    assert cost["rsum"] == y
    unit = from_onnx_model(m, cost="unit")
    assert unit.cost_unit == "unit" and {n.cost for n in unit.nodes} == {1.0}


def test_profile_cost_is_positive_seconds() -> None:
    # The Reshape target is computed (Shape -> Gather -> Concat), so profiling must feed real
    # values forward from earlier nodes, not random ones.
    m = make(
        [
            oh.make_node("MatMul", ["x", "W"], ["h"], name="mm"),
            oh.make_node("Relu", ["h"], ["r"], name="relu"),
            oh.make_node("Shape", ["r"], ["shp"], name="shape"),
            oh.make_node("Gather", ["shp", "i0"], ["n"], axis=0, name="gather"),
            oh.make_node("Concat", ["n", "minus1"], ["tgt"], axis=0, name="concat"),
            oh.make_node("Reshape", ["r", "tgt"], ["y"], name="reshape"),
            oh.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.float32(2.0)), name="const"),
            oh.make_node("Mul", ["y", "k"], ["z"], name="mul"),
        ],
        [vi("x", [8, 16])],
        [vi("z", None)],
        [weight("W", 16, 32), ints("i0", [0]), ints("minus1", [-1])],
    )
    g = from_onnx_model(m, cost="profile", profile_runs=3)
    assert g.cost_unit == "seconds"
    assert all(0 < n.cost < 1 for n in g.nodes)
    assert g.node_map["const"].op == "Constant" and g.value_map["k"].role == "intermediate"


def training_step(*more: onnx.NodeProto, grad: str = "W_grad") -> onnx.ModelProto:
    """loss = mean((x W)^2); W_grad = x^T (2 (x W) / numel); `more` nodes after, `grad` output."""
    nodes = [
        oh.make_node("MatMul", ["x", "W"], ["y"], name="fw_mm"),
        oh.make_node("Mul", ["y", "y"], ["sq"], name="fw_sq"),
        oh.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0, name="loss_mean"),
        oh.make_node("Mul", ["y", "scale"], ["dy"], name="bw_dy"),
        oh.make_node("Transpose", ["x"], ["xt"], name="bw_t"),
        oh.make_node("MatMul", ["xt", "dy"], ["W_grad"], name="bw_mm"),
        *more,
    ]
    return make(
        nodes,
        [vi("x", [4, 3])],
        [vi("loss", None), vi(grad, None)],
        [weight("W", 3, 2), numpy_helper.from_array(np.float32(2 / 8), "scale")],
    )


def test_training_graph_phases() -> None:
    g = from_onnx_model(training_step())
    phase = {n.id: n.phase for n in g.nodes}
    assert phase == {
        "fw_mm": "forward",
        "fw_sq": "forward",
        "loss_mean": "loss",
        "bw_dy": "backward",
        "bw_t": "backward",
        "bw_mm": "backward",
    }


def test_grad_of_from_node_metadata() -> None:
    """``remat.grad_of`` on an ONNX node (remat export-torch writes it) is the backward node's
    grad_of where it names a forward or loss node; the H-ILP pairs by it. Other values (an
    unknown node, a backward node, metadata on a forward node) are ignored, and the H-ILP pairs
    those backward nodes with the layer they feed (bw_t) or, feeding only outputs, read (bw_id)."""
    m = training_step(oh.make_node("Identity", ["W_grad"], ["W_grad2"], name="bw_id"), grad="W_grad2")
    tags = {"fw_sq": "fw_mm", "bw_dy": "fw_sq", "bw_t": "no_such_node", "bw_mm": "fw_mm", "bw_id": "bw_mm"}
    for n in m.graph.node:
        if n.name in tags:
            n.metadata_props.add(key="remat.grad_of", value=tags[n.name])
    g = from_onnx_model(m)
    assert {n.id: n.grad_of for n in g.nodes if n.grad_of} == {"bw_dy": "fw_sq", "bw_mm": "fw_mm"}
    from remat_cli.solvers.hilp import grad_pairs

    assert grad_pairs(g) == {"bw_dy": "fw_sq", "bw_mm": "fw_mm", "bw_t": "fw_mm", "bw_id": "fw_mm"}


def test_empty_and_duplicate_node_names_get_generated_ids() -> None:
    m = make(
        [
            oh.make_node("Relu", ["x"], ["a"], name=""),
            oh.make_node("Relu", ["a"], ["b"], name="Relu_0"),
            oh.make_node("Neg", ["b"], ["c"], name="Relu_0"),
            oh.make_node("Constant", [], ["k"], value=numpy_helper.from_array(np.ones(3, np.float32))),
            oh.make_node("Add", ["c", "k"], ["d"], name="add"),
        ],
        [vi("x", [3])],
        [vi("d", None)],
    )
    ids = onnx_node_ids(m.graph)
    assert ids == ["Relu_0_", "Relu_0", "Neg_2", "Constant_3", "add"]
    g = from_onnx_model(m)
    assert [n.id for n in g.nodes] == ids and [n.source for n in g.nodes] == [[i] for i in ids]
    assert g.value_map["k"].size == 12 and g.node_map["Constant_3"].cost == 3


def test_subgraph_outer_scope_reads_and_random_ops() -> None:
    then_g = oh.make_graph([oh.make_node("Add", ["a", "w"], ["t"])], "then", [], [vi("t", [4])])
    else_g = oh.make_graph([oh.make_node("Sub", ["a", "w"], ["e"])], "else", [], [vi("e", [4])])
    m = make(
        [
            oh.make_node("Relu", ["x"], ["a"], name="relu"),
            oh.make_node("If", ["cond"], ["o"], then_branch=then_g, else_branch=else_g, name="if"),
            oh.make_node("RandomNormalLike", ["o"], ["noise"], name="rnd"),
            oh.make_node("Add", ["o", "noise"], ["out"], name="add"),
        ],
        [vi("x", [4]), vi("cond", [], T.BOOL)],
        [vi("out", None)],
        [weight("w", 4)],
    )
    g = from_onnx_model(m)
    assert g.node_map["if"].inputs == ["cond", "a", "w"]
    assert g.value_map["o"].size == 16
    assert not g.node_map["rnd"].recomputable and g.node_map["add"].recomputable


def test_corrupt_and_unsupported_models(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\xff\xff\xff\xff garbage \x00\x01")
    with pytest.raises(GraphError, match="is not an ONNX model"):
        load_graph(bad)
    txt = tmp_path / "notes.onnx"
    txt.write_text("hello world, not a model\n")
    with pytest.raises(GraphError, match="is not an ONNX model"):
        load_graph(txt)
    old = tmp_path / "old.onnx"
    onnx.save_model(
        make([oh.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [vi("y", [2])], opset=12), str(old)
    )
    with pytest.warns(UserWarning, match="opset 12 upgraded to 13"):  # tests/test_old_opsets.py
        assert load_graph(old).nodes[0].op == "Relu"
    with pytest.raises(GraphError, match="unknown cost model"):
        from_onnx_model(mlp(), cost="wall")


@pytest.mark.parametrize(
    "filename, fmt",
    [("model.onnx", "protobuf"), ("model.bin", "protobuf"), ("model.json", "protobuf"), ("model", "protobuf")]
    + [("model.json", "json"), ("model.onnx", "json"), ("model.txt", "textproto")],
)
def test_load_graph_detects_onnx_by_content(tmp_path: Path, filename: str, fmt: str) -> None:
    path = tmp_path / filename
    onnx.save_model(mlp(), str(path), format=fmt)
    g = load_graph(path, batch=None, cost="unit")
    assert isinstance(g, Graph) and g.cost_unit == "unit" and g.value_map["m0"].size == 2 * 4 * 4


GRAPHS = Path(__file__).resolve().parents[1] / "graphs"


def test_example_graphs_load() -> None:
    path = GRAPHS / "mlp_inference.onnx"
    assert path.stat().st_size < 200_000
    g = load_graph(path)
    assert g.cost_unit == "flops" and any(n.op == "Gemm" for n in g.nodes)
    assert g.value_map["x"].size == 0 and "image" in g.node_map["fc0"].inputs
    assert baseline(g).peak_memory > g.resident_bytes
    train = load_graph(GRAPHS / "mlp_train.onnx")
    phases = [n.phase for n in train.nodes]
    assert phases.count("loss") == 1 and train.node_map["loss"].phase == "loss"
    assert train.node_map["fw/gemm4"].phase == "forward" and train.node_map["bw/gemm0_dW"].phase == "backward"
    assert (
        phases.index("backward")
        > phases.index("loss")
        > max(i for i, p in enumerate(phases) if p == "forward")
    )
