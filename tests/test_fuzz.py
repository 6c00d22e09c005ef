"""Fuzzing every registered solver on random valid graphs (issue 20, part 5): the CI slice.

bench/fuzz.py runs the same checks on ≥ 10,000 graphs (bench/results/fuzz.json).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.solvers.greedy import low_memory_order
from remat_cli.solvers.greedy.dtr import smallest
from remat_cli.testing.instances import brute_force_min_cost
from tests.fuzzgraphs import budget_between, check, random_graph

SOLVERS = [n for n in registry.names() if registry.get(n).availability()[0] == "available"]


@st.composite
def graph_and_budget(draw: st.DrawFn):  # noqa: ANN201
    g = random_graph(lambda lo, hi: draw(st.integers(lo, hi)))
    return g, budget_between(g, draw(st.integers(0, 4)))


@pytest.mark.slow
@pytest.mark.parametrize("solver", SOLVERS)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=graph_and_budget())
def test_solver_keeps_its_promises(solver: str, case) -> None:  # noqa: ANN001
    g, budget = case
    if registry.get(solver).supports(g) is not None:
        return
    broken = check(g, budget, solver, brute_force_min_cost(g, budget))
    assert broken is None, f"{solver} at budget {budget} on {g.to_json()}: {broken}"


#: found by bench/fuzz.py (graph 778, seed 0): moccasin claimed "optimal" at cost 28 where
#: freeing n2's unused 73-byte output apart from its other output gives 20
MOCCASIN_SPLIT_OUTPUTS = json.loads(
    '{"format": "remat-graph", "version": 1, "name": "fuzz", "values": [{"id": "x0", "size": 28, "role": "input"}, {"id": "x1", "size": 38, "role": "input"}, {"id": "v0_0", "size": 74, "role": "intermediate"}, {"id": "v1_0", "size": 7, "role": "intermediate"}, {"id": "v2_0", "size": 73, "role": "intermediate"}, {"id": "v2_1", "size": 25, "role": "intermediate"}, {"id": "v3_0", "size": 24, "role": "intermediate"}, {"id": "v4_0", "size": 0, "role": "intermediate"}, {"id": "v4_1", "size": 26, "role": "intermediate"}, {"id": "v5_0", "size": 18, "role": "intermediate"}, {"id": "v5_1", "size": 10, "role": "intermediate"}], "nodes": [{"id": "n0", "inputs": [], "outputs": ["v0_0"], "cost": 8.0, "workspace": 24, "recomputable": true}, {"id": "n1", "inputs": [], "outputs": ["v1_0"], "cost": 4.0, "workspace": 7, "recomputable": true}, {"id": "n2", "inputs": ["v0_0"], "outputs": ["v2_0", "v2_1"], "cost": 1.0, "workspace": 20, "recomputable": false}, {"id": "n3", "inputs": ["x0", "v2_1"], "outputs": ["v3_0"], "cost": 7.0, "workspace": 0, "recomputable": true}, {"id": "n4", "inputs": ["v2_1"], "outputs": ["v4_0", "v4_1"], "cost": 1.0, "workspace": 0, "recomputable": false}, {"id": "n5", "inputs": ["v0_0", "v4_1"], "outputs": ["v5_0", "v5_1"], "cost": 10.0, "workspace": 0, "recomputable": true}], "outputs": ["v5_0"]}'
)


def test_found_by_the_fuzzer_moccasin_multi_output_optimality() -> None:
    g = Graph.model_validate(MOCCASIN_SPLIT_OUTPUTS)
    budget = 258
    assert brute_force_min_cost(g, budget) == 20.0
    assert check(g, budget, "moccasin", 20.0) is None


#: found by bench/fuzz.py (graph 2197, seed 3): n0's two outputs both feed n2, and the low-memory
#: order counted n2's wait once per producer but released it once per value, so n2 ran before n1
#: (greedy, and every solver warm-started by it, crashed with KeyError)
MULTI_OUTPUT_PRODUCER = json.loads(
    '{"format": "remat-graph", "version": 1, "name": "fuzz", "values": [{"id": "x0", "size": 18, "role": "input"}, {"id": "w", "size": 13, "role": "parameter"}, {"id": "v0_0", "size": 8, "role": "intermediate"}, {"id": "v0_1", "size": 68, "role": "intermediate"}, {"id": "v1_0", "size": 24, "role": "intermediate"}, {"id": "v1_1", "size": 64, "role": "intermediate"}, {"id": "v2_0", "size": 49, "role": "intermediate"}, {"id": "v3_0", "size": 51, "role": "intermediate"}, {"id": "v3_1", "size": 17, "role": "intermediate"}], "nodes": [{"id": "n0", "inputs": [], "outputs": ["v0_0", "v0_1"], "cost": 9.0, "workspace": 0, "recomputable": true}, {"id": "n1", "inputs": ["x0"], "outputs": ["v1_0", "v1_1"], "cost": 4.0, "workspace": 27, "recomputable": true}, {"id": "n2", "inputs": ["v0_0", "v0_1", "v1_0"], "outputs": ["v2_0"], "cost": 6.0, "workspace": 0, "recomputable": true}, {"id": "n3", "inputs": ["v1_0", "x0", "w"], "outputs": ["v3_0", "v3_1"], "cost": 6.0, "workspace": 0, "recomputable": true}], "outputs": ["v2_0", "v1_1"]}'
)


@pytest.mark.parametrize("solver", ["greedy", "auto", "fastsa", "hilp"])
def test_found_by_the_fuzzer_low_memory_order_with_a_two_output_producer(solver: str) -> None:
    g = Graph.model_validate(MULTI_OUTPUT_PRODUCER)
    order = low_memory_order(g)
    assert order.index("n1") < order.index("n2")
    assert check(g, 228, solver, brute_force_min_cost(g, 228), 5.0) is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    h=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, np.inf, np.nan]), min_size=1, max_size=40),
    k=st.integers(1, 20),
)
def test_greedy_top_k_matches_a_stable_sort(h: list[float], k: int) -> None:
    a = np.array(h)
    assert list(smallest(a, k)) == list(np.argsort(a, kind="stable")[:k])
