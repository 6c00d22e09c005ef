"""xengine's placement search: the fast score against the simulator, and the relaxed starts."""

from __future__ import annotations

import random

import pytest

from remat_cli.devices import synthetic_devices
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, baseline_steps, peak_lower_bound, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.xengine.baselines import RELAX, single_device_candidates
from remat_cli.solvers.xengine.placement import evaluate, improve_placement, placement_score
from remat_cli.solvers.xengine.problem import single_device_graph


@pytest.mark.parametrize("seed", range(6))
def test_fast_score_is_the_simulators(seed: int) -> None:
    """The search ranks placements by placement_score; it must be the simulator's (over, cost)."""
    rng = random.Random(seed)
    g0 = G.unet(depth=2, convs=2, seed=seed) if seed % 2 else G.transformer(2, seed=seed)
    g = synthetic_devices(g0, speedup=rng.choice([2.0, 10.0]), memory_fraction=rng.choice([0.2, 0.5]))
    seq = [s.node for s in baseline_steps(g) if s.op == "compute" and s.node is not None]
    peak = baseline(g0).peak_memory
    budgets = {"cpu": int(rng.uniform(0.3, 1.0) * peak), "accel": int(rng.uniform(0.1, 0.6) * peak)}
    for _ in range(20):
        dev = [rng.choice(["cpu", "accel"]) for _ in seq]
        over, cost, _ = evaluate(g, seq, dev, budgets)
        assert placement_score(g, seq, dev, budgets) == pytest.approx((over, cost), rel=1e-12, abs=1e-9)


def test_relaxed_starts_are_greedy_above_the_budget_and_no_baselines() -> None:
    """Each device also gets greedy's schedules at RELAX x its budget: over that budget on one
    device (what the placement search spreads over both), never counted as a baseline."""
    g0 = G.linear(12, seed=0)
    g = synthetic_devices(g0, speedup=10.0)
    peak = baseline(g0).peak_memory
    B = max(int(0.3 * peak), peak_lower_bound(g0))
    budgets = {"cpu": B, "accel": B}
    cands = single_device_candidates(g, budgets, SolveOptions(seed=0), "checkpoint-all,greedy", 60, 20.0)
    relaxed = [c for c in cands if c.relaxed]
    assert {c.device for c in relaxed} == {"cpu", "accel"} and len(relaxed) <= 2 * len(RELAX)
    for c in relaxed:
        assert c.single_steps is None  # not a warm start or reference
        proj_peak = simulate(single_device_graph(g, c.device), steps_from_sequence(g0, c.seq)).peak_memory
        assert B < proj_peak <= max(RELAX) * B
        dev, over, _ = improve_placement(g, c.seq, c.dev, budgets, float("inf"))
        assert over == 0 and set(dev) == {"cpu", "accel"}  # spread over both, within both budgets
