"""Module scopes: export-torch writes each node's module path as ONNX node metadata
(``remat.scope``) and the importer keeps it as ``Node.scope``; ONNX files without it import as
before."""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto as T
from onnx import helper as oh

from remat_cli.importers.onnx import SCOPE_KEY, from_onnx_file, from_onnx_model

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"


def test_scope_metadata_becomes_node_scope_and_its_absence_none() -> None:
    nodes = [
        oh.make_node("Relu", ["x"], ["a"], name="r"),
        oh.make_node("Neg", ["a"], ["b"], name="n"),
        oh.make_node("Neg", ["b"], ["c"], name="e"),
    ]
    nodes[0].metadata_props.add(key=SCOPE_KEY, value="blocks.0.act")
    nodes[1].metadata_props.add(key=SCOPE_KEY, value="blocks.1")
    nodes[2].metadata_props.add(key=SCOPE_KEY, value="")
    g = oh.make_graph(
        nodes,
        "g",
        [oh.make_tensor_value_info("x", T.FLOAT, [4])],
        [oh.make_tensor_value_info("c", T.FLOAT, [4])],
    )
    m = oh.make_model(g, ir_version=10, opset_imports=[oh.make_opsetid("", 17)])
    graph = from_onnx_model(m)
    assert {n.id: n.scope for n in graph.nodes} == {"r": "blocks.0.act", "n": "blocks.1", "e": None}
    assert "scope" in graph.to_json()


def test_an_export_without_scopes_imports_without_them() -> None:
    g = from_onnx_file(GRAPHS / "torch_mlp_train.onnx")
    assert g.nodes and all(n.scope is None for n in g.nodes)
    assert '"scope"' not in g.to_json()


@pytest.mark.slow
def test_export_torch_records_each_nodes_module(tmp_path: Path) -> None:
    """Forward nodes carry the innermost module that ran them, backward nodes their forward
    node's; the loss function's nodes carry none."""
    torch = pytest.importorskip("torch")
    from torch import nn

    from remat_cli.importers.torch_export import export_training_graph

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + torch.tanh(self.fc(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(3))
            self.head = nn.Linear(8, 2)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for b in self.blocks:
                x = b(x)
            return self.head(x)

    torch.manual_seed(0)
    spec = (Net(), (torch.randn(4, 8), torch.randint(0, 2, (4,))), nn.functional.cross_entropy)
    g = from_onnx_file(export_training_graph(spec, tmp_path / "net.onnx"))
    nm = g.node_map
    forward = [n for n in g.nodes if n.phase == "forward"]
    scopes = {n.scope for n in forward}
    assert {"blocks.0.fc", "blocks.1.fc", "blocks.2.fc", "head"} <= scopes
    assert {"blocks.0", "blocks.1", "blocks.2"} <= scopes  # tanh and the residual add
    assert all(s is None or s.startswith(("blocks.", "head")) for s in scopes)
    assert nm[g.producer[next(n for n in g.nodes if n.phase == "loss").outputs[0]]].scope is None
    paired = [n for n in g.nodes if n.grad_of is not None]
    assert paired and all(n.scope == nm[n.grad_of].scope for n in paired)
    # every gemm of a block's Linear is in that block's scope
    gemms = [n for n in forward if n.op in ("Gemm", "MatMul")]
    assert len(gemms) == 4 and all(n.scope is not None and n.scope.endswith(("fc", "head")) for n in gemms)
