"""FastSA's peak repair (remat_cli/solvers/fastsa/repair.py, issue 18)."""

from __future__ import annotations

from remat_cli import registry
from remat_cli.graph import Graph, Node, Value
from remat_cli.schedule import simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.fastsa.repair import repair
from remat_cli.solvers.fastsa.rounds import run_rounds


def _graph(nodes: list[tuple[str, list[str], str]], sizes: dict[str, int], outputs: list[str]) -> Graph:
    values = [Value(id="in", size=1, role="input")] + [Value(id=v, size=s) for v, s in sizes.items()]
    return Graph(
        name="repair",
        values=values,
        nodes=[Node(id=n, inputs=ins, outputs=[out]) for n, ins, out in nodes],
        outputs=outputs,
    )


#: x is made first and read last: at h it is live beside y and z (11 bytes); made again after h,
#: the peak is 9
EVICT = _graph(
    [("f", ["in"], "x"), ("g", ["in"], "y"), ("h", ["y"], "z"), ("k", ["x", "z"], "out")],
    {"x": 2, "y": 4, "z": 4, "out": 1},
    ["out"],
)
#: m makes the graph output G (4 bytes) from a (1 byte): run before h it holds G across h (15
#: bytes); after h, only a (12)
DEFER = _graph(
    [("f", ["in"], "a"), ("m", ["a"], "G"), ("g", ["in"], "c"), ("h", ["c"], "d")],
    {"a": 1, "G": 4, "c": 5, "d": 5},
    ["G", "d"],
)


def _computes(steps) -> list[str]:  # noqa: ANN001
    return [s.node for s in steps if s.op == "compute"]


def test_a_value_live_across_the_peak_is_made_again_after_it() -> None:
    steps = steps_from_sequence(EVICT, ["f", "g", "h", "k"])
    assert simulate(EVICT, steps).peak_memory == 11
    fixed = repair(EVICT, steps, 9)
    assert fixed is not None
    assert simulate(EVICT, fixed).peak_memory <= 9
    assert _computes(fixed)[-2:] == ["f", "k"]  # x made again just before its next use


def test_an_output_operator_is_deferred_past_the_peak() -> None:
    steps = steps_from_sequence(DEFER, ["f", "m", "g", "h"])
    assert simulate(DEFER, steps).peak_memory == 15
    fixed = repair(DEFER, steps, 12)
    assert fixed is not None
    sim = simulate(DEFER, fixed)
    assert sim.peak_memory <= 12 and sim.recomputations == 0  # moved, not run twice
    order = _computes(fixed)
    assert order.index("m") > order.index("h")


def test_no_repair_below_what_the_moves_reach() -> None:
    # y, z and the input are live together at h whatever is moved: 9 bytes
    assert repair(EVICT, steps_from_sequence(EVICT, ["f", "g", "h", "k"]), 8) is None


def test_a_node_that_may_not_run_twice_is_not_made_again() -> None:
    once = Graph.model_validate(
        EVICT.model_dump() | {"nodes": [n.model_dump() | {"recomputable": n.id != "f"} for n in EVICT.nodes]}
    )
    assert repair(once, steps_from_sequence(once, ["f", "g", "h", "k"]), 9) is None


def test_rounds_start_from_the_repaired_schedule() -> None:
    """run_rounds with fastsa's own chain, given too few iterations to leave the topological
    order: the first round ends above the budget; repaired, its schedule fits, and the hinted
    round after it keeps within the budget. Without the repair nothing fits."""
    fastsa = registry.get("fastsa")

    def chain(opts: SolveOptions):  # noqa: ANN202
        return fastsa._chain(DEFER, 12, opts)

    params = {"iterations": 1, "iterations2": 1, "rescue": False, "greedy_start": False, "kicks": 0.0}
    got = {}
    for fix in (False, True):
        res = run_rounds(
            chain, DEFER, 12, SolveOptions(seed=0, workers=1, params=params), [None] * 3, repair=fix
        )
        got[fix] = (simulate(DEFER, res.steps or []).peak_memory, res.message or "")
    assert got[False][0] > 12
    assert got[True][0] <= 12 and "repaired at its peak" in got[True][1]


def test_a_graph_whose_operators_cost_nothing_is_repaired() -> None:
    free = Graph.model_validate(
        EVICT.model_dump() | {"nodes": [n.model_dump() | {"cost": 0} for n in EVICT.nodes]}
    )
    fixed = repair(free, steps_from_sequence(free, ["f", "g", "h", "k"]), 9)
    assert fixed is not None and simulate(free, fixed).peak_memory <= 9
