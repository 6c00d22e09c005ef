"""simulate() and baseline() against peaks computed by hand (docs/FORMATS.md §2)."""

from __future__ import annotations

import pytest

from remat_cli.graph import Graph, Node, Value
from remat_cli.schedule import (
    ScheduleError,
    baseline,
    baseline_steps,
    compute,
    free,
    peak_lower_bound,
    simulate,
    steps_from_sequence,
)


def g_of(values: list[Value], nodes: list[Node], outputs: list[str], order: list[str] | None = None) -> Graph:
    return Graph(name="t", values=values, nodes=nodes, outputs=outputs, order=order)


@pytest.fixture
def chain() -> Graph:
    # x(10, input) -> a(100) -> b(20) -> c(5, output); w(7) parameter read by a
    return g_of(
        [
            Value(id="x", size=10, role="input"),
            Value(id="w", size=7, role="parameter"),
            Value(id="va", size=100),
            Value(id="vb", size=20),
            Value(id="vc", size=5),
        ],
        [
            Node(id="a", inputs=["x", "w"], outputs=["va"], cost=1),
            Node(id="b", inputs=["va"], outputs=["vb"], cost=2, workspace=50),
            Node(id="c", inputs=["vb", "va"], outputs=["vc"], cost=4),
        ],
        ["vc"],
    )


def test_peak_counts_resident_outputs_and_workspace(chain: Graph) -> None:
    steps = [compute("a"), compute("b"), compute("c"), free("va"), free("vb")]
    sim = simulate(chain, steps)
    # resident 17; a: 17+100; b: 117+20+50 = 187; c: 137+5 = 142
    assert sim.peak_memory == 187
    assert sim.cost == 7
    assert sim.recomputations == 0


def test_baseline_frees_after_last_consumer(chain: Graph) -> None:
    steps = baseline_steps(chain)
    assert steps[:3] == [compute("a"), compute("b"), compute("c")]
    assert sorted(s.value for s in steps[3:]) == ["va", "vb"]
    assert baseline(chain).peak_memory == 187


def test_recompute_after_free(chain: Graph) -> None:
    steps = [compute("a"), compute("b"), free("va"), compute("a"), compute("c"), free("va"), free("vb")]
    sim = simulate(chain, steps)
    # b instant: 17+100+20+50 = 187; a again: 17+20+100 = 137
    assert sim.peak_memory == 187
    assert sim.cost == 1 + 2 + 1 + 4
    assert sim.recomputations == 1


def test_multi_output_node_and_unused_output() -> None:
    g = g_of(
        [
            Value(id="x", size=1, role="input"),
            Value(id="o1", size=30),
            Value(id="o2", size=40),
            Value(id="y", size=5),
        ],
        [Node(id="split", inputs=["x"], outputs=["o1", "o2"]), Node(id="use", inputs=["o1"], outputs=["y"])],
        ["y"],
    )
    # Baseline: o2 has no consumer, so it is freed right after its producer.
    steps = baseline_steps(g)
    assert steps == [compute("split"), free("o2"), compute("use"), free("o1")]
    sim = simulate(g, steps)
    assert sim.peak_memory == 1 + 30 + 40  # both outputs at the split instant


def test_errors_name_the_step(chain: Graph) -> None:
    with pytest.raises(ScheduleError, match="needs 'va'"):
        simulate(chain, [compute("b")])
    with pytest.raises(ScheduleError, match="output 'va' is live"):
        simulate(chain, [compute("a"), compute("a")])
    with pytest.raises(ScheduleError, match="not live"):
        simulate(chain, [free("va")])
    with pytest.raises(ScheduleError, match="parameter"):
        simulate(chain, [free("w")])
    with pytest.raises(ScheduleError, match="graph output 'vc'"):
        simulate(chain, [compute("a"), compute("b"), compute("c"), free("vc")])
    with pytest.raises(ScheduleError, match="unknown node"):
        simulate(chain, [compute("zz")])


def test_dead_nodes_need_not_run() -> None:
    g = g_of(
        [Value(id="x", size=1, role="input"), Value(id="y", size=5), Value(id="dead", size=1000)],
        [Node(id="f", inputs=["x"], outputs=["y"]), Node(id="d", inputs=["x"], outputs=["dead"])],
        ["y"],
    )
    assert g.needed_nodes == {"f"}
    assert baseline(g).peak_memory == 6
    assert simulate(g, [compute("f")]).peak_memory == 6


def test_graph_output_that_is_an_input_is_live() -> None:
    g = g_of(
        [Value(id="x", size=3, role="input"), Value(id="y", size=5)],
        [Node(id="f", inputs=["x"], outputs=["y"])],
        ["x", "y"],
    )
    assert simulate(g, [compute("f")]).peak_memory == 8


def test_steps_from_sequence_frees_before_recompute(chain: Graph) -> None:
    steps = steps_from_sequence(chain, ["a", "b", "a", "c"])
    # va is used by b, then produced again: freed right after b.
    assert steps[:3] == [compute("a"), compute("b"), free("va")]
    simulate(chain, steps)


def test_lower_bound(chain: Graph) -> None:
    # resident 17 + largest working set (c: vb + va + vc = 125; b: va + vb + ws 50 = 170)
    assert peak_lower_bound(chain) == 17 + 170
