"""The H-ILP's windows over a whole-graph schedule (remat_cli.solvers.hilp.windows): exact
Checkmate ILPs over stretches of the schedule's order, the rest of it fixed."""

from __future__ import annotations

import numpy as np
import pytest

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.milp.model import LinearModel
from remat_cli.schedule import baseline, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions
from remat_cli.solvers.hilp.windows import in_order, sweep

CASES = [
    ("unet", G.unet(depth=2, convs=1, seed=0)),
    ("transformer", G.transformer(layers=2, seed=1)),
    ("linear", G.linear(n=12, seed=2)),
]


def _checkmate(g: Graph, budget: int, **opts: object) -> tuple[float, list] | None:
    r = registry.get("checkmate")
    o = SolveOptions(seed=0, workers=1, **opts)  # type: ignore[arg-type]
    o.params = r.defaults() | {"backend": "highs", "moccasin_share": 0.0}
    res = r.solve(g, budget, o)
    if res.steps is None:
        return None
    return simulate(g, res.steps).cost, res.steps


def _poor_start(g: Graph) -> tuple[int, list, int] | None:
    """A budget, a schedule within it that recomputes more than it must in its own order (the
    fixed-order optimum at a tighter budget), and that tighter budget."""
    lo, hi = peak_lower_bound(g), baseline(g).peak_memory
    for f_tight, f_loose in ((0.55, 0.8), (0.65, 0.85), (0.75, 0.9)):
        tight = int(lo + f_tight * (hi - lo))
        got = _checkmate(g, tight)
        if got is None:
            continue
        loose = int(lo + f_loose * (hi - lo))
        steps = got[1]
        seq = [s.node for s in steps if s.op == "compute"]
        best = _checkmate(in_order(g, seq), loose)
        if best is not None and best[0] < got[0] - 1e-9:
            return loose, steps, tight
    return None


@pytest.mark.slow
@pytest.mark.parametrize("name,g", CASES, ids=[c[0] for c in CASES])
def test_one_window_over_everything_reaches_the_fixed_order_optimum(name: str, g: Graph) -> None:
    """A window covering every stage is Checkmate's whole model in the schedule's order: the sweep
    ends at that order's proven optimum, below the start's cost (red when a window's result
    is not taken, or when the window leaves a stage of the schedule fixed)."""
    found = _poor_start(g)
    assert found is not None, "no start costlier than its order's optimum"
    budget, start, _ = found
    seq = [s.node for s in start if s.op == "compute"]
    optimum = _checkmate(in_order(g, seq), budget)
    assert optimum is not None
    w = sweep(g, budget, start, size=10_000, time_limit=60, seed=0, deterministic=False)
    assert w.steps is not None and w.improved == 1
    sim = simulate(g, w.steps)
    assert sim.peak_memory <= budget
    assert sim.cost == pytest.approx(optimum[0], rel=1e-9)
    assert sim.cost < simulate(g, start).cost


@pytest.mark.slow
@pytest.mark.parametrize("name,g", CASES, ids=[c[0] for c in CASES])
def test_small_windows_never_cost_more_and_repeat(name: str, g: Graph) -> None:
    """Windows of a few stages: a schedule within budget, never costlier than the start, never
    cheaper than the order's optimum, and the same twice with one worker."""
    found = _poor_start(g)
    assert found is not None
    budget, start, _ = found
    seq = [s.node for s in start if s.op == "compute"]
    optimum = _checkmate(in_order(g, seq), budget)
    assert optimum is not None
    runs = [sweep(g, budget, start, size=4, time_limit=60, seed=0, deterministic=True) for _ in range(2)]
    assert runs[0].tried > 1
    costs = [r.cost for r in runs]
    assert costs[0] == costs[1]
    assert [s.model_dump() for s in runs[0].steps or []] == [s.model_dump() for s in runs[1].steps or []]
    assert optimum[0] - 1e-6 <= costs[0] <= simulate(g, start).cost
    if runs[0].steps is not None:
        assert simulate(g, runs[0].steps).peak_memory <= budget


def test_restricted_model_solutions_extend_to_the_whole_model() -> None:
    """LinearModel.restricted: a solution of the restricted model, with the fixed columns at
    their values, satisfies the whole model, and the restricted optimum is the whole model's
    with those columns fixed (red when the fixed part is left out of the row bounds)."""
    rng = np.random.default_rng(0)
    for _ in range(20):
        n, m = 12, 10
        M = LinearModel("random")
        M.add_vars(n, lb=0, ub=3, integer=True, cost=rng.integers(-5, 5, n).astype(float))
        A = rng.integers(-2, 3, (m, n)).astype(float)
        x0 = rng.integers(0, 4, n).astype(float)
        r, c = np.nonzero(A)
        M.add_constraints(r, c, A[r, c], -np.inf, A @ x0 + rng.integers(0, 3, m), count=m)
        free = rng.random(n) < 0.5
        sub = M.restricted(free, x0)
        res = milp_solve(sub, EngineSettings(backend="highs"))
        assert res.x is not None
        x = x0.copy()
        x[free] = res.x
        assert M.violation(x) <= 1e-6
        fixed = LinearModel("fixed")
        fixed.add_vars(n, lb=np.where(free, 0, x0), ub=np.where(free, 3, x0), integer=True, cost=M.cost)
        fixed.add_constraints(r, c, A[r, c], M.row_lb, M.row_ub, count=m)
        whole = milp_solve(fixed, EngineSettings(backend="highs"))
        assert whole.objective is not None
        assert M.objective(x) == pytest.approx(whole.objective, abs=1e-6)
