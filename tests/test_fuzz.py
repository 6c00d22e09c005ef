"""Fuzzing every registered solver on random valid graphs (issue 20, part 5): the CI slice.

bench/fuzz.py runs the same checks on ≥ 10,000 graphs (bench/results/fuzz.json).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from remat_cli.solvers import registry
from remat_cli.solvers.greedy import _smallest
from tests.bruteforce import brute_force_min_cost
from tests.fuzzgraphs import budget_between, check, random_graph

SOLVERS = [n for n in registry.names() if registry.get(n).availability()[0] == "available"]


@st.composite
def graph_and_budget(draw: st.DrawFn):  # noqa: ANN201
    g = random_graph(lambda lo, hi: draw(st.integers(lo, hi)))
    return g, budget_between(g, draw(st.integers(0, 4)))


@pytest.mark.parametrize("solver", SOLVERS)
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(case=graph_and_budget())
def test_solver_keeps_its_promises(solver: str, case) -> None:  # noqa: ANN001
    g, budget = case
    if registry.get(solver).supports(g) is not None:
        return
    broken = check(g, budget, solver, brute_force_min_cost(g, budget))
    assert broken is None, f"{solver} at budget {budget} on {g.to_json()}: {broken}"


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    h=st.lists(st.sampled_from([0.0, 1.0, 2.0, 3.5, np.inf, np.nan]), min_size=1, max_size=40),
    k=st.integers(1, 20),
)
def test_greedy_top_k_matches_a_stable_sort(h: list[float], k: int) -> None:
    a = np.array(h)
    assert list(_smallest(a, k)) == list(np.argsort(a, kind="stable")[:k])
