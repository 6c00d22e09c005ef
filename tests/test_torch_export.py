"""The training-step exporter's own machinery (remat_cli.importers.torch_export): the step is
traced on fake tensors, and onnxscript's optimizer gives the same graph with the guard that
keeps its multi-output pattern matching linear."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from onnx import helper as oh


@pytest.mark.slow
def test_the_step_is_traced_on_fake_tensors_and_the_models_buffers_stay_real(tmp_path: Path) -> None:
    """The forward sees only fake tensors while the step is traced (no activation is computed
    or kept); a buffer the forward reads (Llama's rotary tables) is real and is exported."""
    torch = pytest.importorskip("torch")
    from torch import nn
    from torch._subclasses.fake_tensor import is_fake

    from remat_cli.importers.onnx import from_onnx_file
    from remat_cli.importers.torch_export import export_training_graph

    seen: list[bool] = []

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 24)
            self.register_buffer("scale", torch.linspace(0.5, 1.5, 8), persistent=False)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seen.append(is_fake(x))
            q, k, v = self.fc(x).chunk(3, dim=-1)
            return (q * k + v) * self.scale

    torch.manual_seed(0)
    spec = (Net(), (torch.randn(4, 8), torch.randn(4, 8)), nn.functional.mse_loss)
    path = export_training_graph(spec, tmp_path / "net.onnx", check=False)
    assert seen and all(seen)
    # the same export, checked against autograd on real tensors
    seen.clear()
    g = from_onnx_file(export_training_graph(spec, tmp_path / "checked.onnx"))
    assert seen == [True, False]  # traced, then the check's own forward on real tensors
    assert Path(path).read_bytes() == (tmp_path / "checked.onnx").read_bytes()
    scale = np.linspace(0.5, 1.5, 8, dtype=np.float32)
    inits = [numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer]
    assert any(a.shape == (8,) and np.allclose(a, scale) for a in inits)
    assert {"forward", "backward"} <= {n.phase for n in g.nodes}


def two_slices_model() -> onnx.ModelProto:
    """x (4, 8) -> two Slices of its last axis (its two halves) -> their Relus and a Concat:
    the SlicesSplit pattern, among nodes that cannot start it."""

    def const(name: str, v: list[int]) -> TensorProto:
        return numpy_helper.from_array(np.array(v, dtype=np.int64), name)

    nodes = [
        oh.make_node("Relu", ["x"], ["r"], name="r"),
        # the upper half first: onnxscript 0.7 pairs each Slice with the first Slice of the graph
        # that fits the pattern, before checking the halves
        oh.make_node("Slice", ["r", "b1", "e1", "ax"], ["s1"], name="s1"),
        oh.make_node("Slice", ["r", "b0", "e0", "ax"], ["s0"], name="s0"),
        oh.make_node("Relu", ["s0"], ["t0"], name="t0"),
        oh.make_node("Relu", ["s1"], ["t1"], name="t1"),
        oh.make_node("Concat", ["t1", "t0"], ["y"], name="y", axis=-1),
    ]
    inits = [const("b0", [0]), const("e0", [4]), const("b1", [4]), const("e1", [8]), const("ax", [-1])]
    graph = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [oh.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])],
        initializer=inits,
        value_info=[oh.make_tensor_value_info("r", TensorProto.FLOAT, [4, 8])],
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def test_multi_output_patterns_checked_first_rewrite_as_before() -> None:
    """onnxscript's optimizer fuses the two Slices into one Split with the guard on, exactly as
    without it (the same serialized model), and the matcher is its own again afterwards."""
    pytest.importorskip("onnxscript")
    import onnx_ir as ir
    from onnxscript import optimizer
    from onnxscript.rewriter import _matcher

    from remat_cli.importers.torch_export import _multi_output_patterns_checked_first

    def optimized() -> bytes:
        model = ir.serde.deserialize_model(two_slices_model())
        optimizer.optimize_ir(model)
        return ir.serde.serialize_model(model).SerializeToString()

    match = _matcher.SimplePatternMatcher.match
    plain = optimized()
    with _multi_output_patterns_checked_first():
        assert _matcher.SimplePatternMatcher.match is not match
        guarded = optimized()
    assert _matcher.SimplePatternMatcher.match is match
    assert guarded == plain
    ops = [n.op_type for n in onnx.load_from_string(guarded).graph.node]
    assert "Split" in ops and "Slice" not in ops
