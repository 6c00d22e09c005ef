"""networkx node-link importer: both published variants, written by the test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from remat_cli.graph import GraphError
from remat_cli.importers import load_graph
from remat_cli.schedule import baseline


def random_layered_variant() -> dict:
    nodes = [
        {"out_cost": 10, "param_cost": 0, "duration": 0, "name": 0},
        {"out_cost": 20, "param_cost": 5, "duration": 3, "name": 2},
        {"out_cost": 30, "param_cost": 0, "duration": 4, "name": 1},
    ]
    return {
        "directed": True,
        "multigraph": False,
        "graph": {"name": "rl", "order": "[0, 2, 1]"},
        "nodes": nodes,
        "links": [{"0": 0, "1": 2}, {"0": 2, "1": 1}, {"0": 0, "1": 1}],
    }


def checkmate_variant() -> dict:
    nodes = [
        {"name": "conv", "backward": False, "cost_cpu": 2, "cost_ram": 100, "id": 0},
        {"name": "loss", "backward": False, "cost_cpu": 1, "cost_ram": 4, "id": 1},
        {"name": "conv_grad", "backward": True, "cost_cpu": 3, "cost_ram": 50, "id": 2},
    ]
    return {
        "directed": True,
        "multigraph": False,
        "graph": {"name": "cm"},
        "nodes": nodes,
        "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}, {"source": 0, "target": 2}],
    }


def write(tmp_path: Path, data: dict, name: str = "g.weird-extension") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def test_random_layered_variant(tmp_path: Path) -> None:
    g = load_graph(write(tmp_path, random_layered_variant()))
    assert g.topo_order == ["0", "2", "1"]
    assert g.value_map["p2"].role == "parameter" and g.value_map["p2"].size == 5
    assert g.node_map["2"].cost == 3 and g.value_map["v2"].size == 20
    assert g.outputs == ["v1"]
    # resident 5; node 1 runs with v0 (10), v2 (20) live plus its 30
    assert baseline(g).peak_memory == 5 + 10 + 20 + 30


def test_checkmate_variant(tmp_path: Path) -> None:
    g = load_graph(write(tmp_path, checkmate_variant()))
    assert [n.phase for n in g.nodes] == ["forward", "forward", "backward"]
    assert g.node_map["0"].op == "conv"
    assert g.outputs == ["v2"]
    assert baseline(g).peak_memory == 100 + 4 + 50
    assert baseline(g).cost == 6


def test_cycle_and_dangling_links_are_errors(tmp_path: Path) -> None:
    data = checkmate_variant()
    data["links"].append({"source": 2, "target": 0})
    with pytest.raises(GraphError, match="cycle"):
        load_graph(write(tmp_path, data))
    data = checkmate_variant()
    data["links"].append({"source": 0, "target": 9})
    with pytest.raises(GraphError, match="unknown node '9'"):
        load_graph(write(tmp_path, data))


BENCH = Path(__file__).resolve().parents[2] / "shared" / "benchmarks" / "moccasin"


@pytest.mark.skipif(not BENCH.exists(), reason="the shared benchmark folder is not beside this checkout")
@pytest.mark.parametrize(
    ("filename", "peak"),
    [
        ("random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json", 46_319),
        ("ResNet50 (MLSys)_256_(224, 224, 3)_train_nx.json", 38_059_356_160),
    ],
)
def test_published_baselines(filename: str, peak: int) -> None:
    assert baseline(load_graph(BENCH / filename)).peak_memory == peak
