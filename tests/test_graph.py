"""Graph validation, canonical hash and budgets."""

from __future__ import annotations

import pytest

from remat_cli.budget import BudgetError, parse_budget
from remat_cli.graph import Graph, GraphError
from remat_cli.importers import graph_from_data


def raw(**over: object) -> dict:
    data = {
        "format": "remat-graph",
        "version": 1,
        "name": "g",
        "values": [{"id": "x", "size": 4, "role": "input"}, {"id": "a", "size": 8}, {"id": "b", "size": 8}],
        "nodes": [
            {"id": "n1", "inputs": ["x"], "outputs": ["a"]},
            {"id": "n2", "inputs": ["a"], "outputs": ["b"]},
        ],
        "outputs": ["b"],
    }
    data.update(over)
    return data


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"values": [{"id": "x", "size": 4, "role": "input"}, {"id": "x", "size": 8}, {"id": "b", "size": 8}]},
         "duplicate value id 'x'"),
        ({"nodes": [{"id": "n1", "inputs": ["x"], "outputs": ["a"]}, {"id": "n2", "inputs": ["q"], "outputs": ["b"]}]},
         "unknown value 'q'"),
        ({"nodes": [{"id": "n1", "inputs": ["b"], "outputs": ["a"]}, {"id": "n2", "inputs": ["a"], "outputs": ["b"]}]},
         "cycle"),
        ({"values": [{"id": "x", "size": -1, "role": "input"}, {"id": "a", "size": 8}, {"id": "b", "size": 8}]},
         "greater than or equal to 0"),
        ({"outputs": ["zz"]}, "graph output 'zz'"),
        ({"order": ["n2", "n1"]}, "not topological"),
        ({"nodes": [{"id": "n1", "inputs": ["x"], "outputs": ["a"]}]}, "'b' has no producer"),
        ({"nodes": [{"id": "n1", "inputs": ["x"], "outputs": ["a"]}, {"id": "n1", "inputs": ["a"], "outputs": ["b"]}]},
         "duplicate node id 'n1'"),
    ],
)  # fmt: skip
def test_invalid_graphs_name_the_offender(change: dict, message: str) -> None:
    with pytest.raises(GraphError, match=message):
        graph_from_data(raw(**change))


def test_costs_whose_sums_overflow_are_refused_and_large_ones_pass() -> None:
    """Two costs of 1e308 add up to inf (overheads nan, checkmate a ZeroDivisionError): refused
    with one line saying what to do; 1e290 each, far beyond any FLOP count, still passes."""

    def nodes(cost: float) -> list[dict]:
        return [
            {"id": "n1", "inputs": ["x"], "outputs": ["a"], "cost": cost},
            {"id": "n2", "inputs": ["a"], "outputs": ["b"], "cost": cost},
        ]

    with pytest.raises(GraphError, match="node costs add up to inf.*use a larger cost unit"):
        graph_from_data(raw(nodes=nodes(1e308)))
    assert graph_from_data(raw(nodes=nodes(1e290))).nodes[0].cost == 1e290


def test_canonical_hash_ignores_key_order_and_whitespace() -> None:
    a = Graph.model_validate(raw())
    b = Graph.model_validate_json(Graph.model_validate(raw()).model_dump_json(indent=3))
    assert a.sha256() == b.sha256()
    c = Graph.model_validate(raw(name="other"))
    assert a.sha256() != c.sha256()


@pytest.mark.parametrize(
    ("text", "expected"),
    [("4GB", 4 * 10**9), ("3.5GiB", int(3.5 * 2**30)), ("512 MiB", 512 * 2**20), ("1000", 1000),
     ("2kb", 2000), ("90%", 41687)],
)  # fmt: skip
def test_budgets(text: str, expected: int) -> None:
    assert parse_budget(text, baseline_peak=46319) == expected


@pytest.mark.parametrize("text", ["", "four GB", "4XB", "-1GB", "80%%"])
def test_bad_budgets(text: str) -> None:
    with pytest.raises(BudgetError):
        parse_budget(text, baseline_peak=100)
