"""ratio never runs an operator that must not run twice (``recomputable: false``) again, even
when the value it drops can only be made again through such an operator."""

import pytest

from remat_cli import NoSchedule, solve
from remat_cli.graph import Graph
from remat_cli.solvers.ratio import Candidate, sequence


def chain_through_a_fixed_node() -> Graph:
    # u is made by a node that must not run twice and is used only by p; dropping v across
    # the peak (w) needs p again, hence u again, hence n again
    return Graph.model_validate(
        {
            "name": "fixed-chain",
            "values": [
                {"id": "x", "size": 1, "role": "input"},
                {"id": "u", "size": 10},
                {"id": "v", "size": 100},
                {"id": "w", "size": 100},
                {"id": "z", "size": 1},
                {"id": "o", "size": 1},
            ],
            "nodes": [
                {"id": "n", "inputs": ["x"], "outputs": ["u"], "cost": 1.0, "recomputable": False},
                {"id": "p", "inputs": ["u"], "outputs": ["v"], "cost": 1.0},
                {"id": "q", "inputs": ["x"], "outputs": ["w"], "cost": 1.0},
                {"id": "r", "inputs": ["w"], "outputs": ["z"], "cost": 1.0},
                {"id": "s", "inputs": ["v", "z"], "outputs": ["o"], "cost": 1.0},
            ],
            "outputs": ["o"],
            "order": ["n", "p", "q", "r", "s"],
        }
    )


def test_ratio_does_not_remake_through_a_node_that_must_not_run_twice():
    g = chain_through_a_fixed_node()
    with pytest.raises(NoSchedule):  # every schedule below 200 B runs n twice
        solve(g, 1 + 150, solver="ratio", time_limit=5)
    schedule = solve(g, 1 + 201, solver="ratio", time_limit=5)
    computed = [s.node for s in schedule.steps if s.op == "compute"]
    assert computed.count("n") == 1


def test_a_value_remade_from_a_node_that_must_not_run_twice_keeps_that_nodes_output():
    # v dropped across the peak: p runs again before s and reads u, past u's last use in the
    # baseline order; n may not run again (a random draw's saved generator state), so u stays
    # live until p's second run instead of n running twice
    g = chain_through_a_fixed_node()
    order = ["n", "p", "q", "r", "s"]
    seq = sequence(g, order, {"v": Candidate("v", "p", 1, 4, 0.0)})
    assert seq == ["n", "p", "q", "r", "p", "s"]
