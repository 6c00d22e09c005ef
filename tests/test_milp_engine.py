"""The engine layer: every backend solves the same model to the same optimum, hints and callbacks
work, LP relaxations bound the MILP, and a missing or licence-limited Gurobi falls back with a
message that says which engine ran and why."""

from __future__ import annotations

import importlib.util
import time

import numpy as np
import pytest

from remat_cli.milp import EngineSettings, LinearModel, available_backends, solve
from remat_cli.milp.engine import EngineError, lagrangian_bound


def knapsack(n: int = 30, seed: int = 0) -> tuple[LinearModel, float]:
    """max v·x s.t. w·x ≤ W, as a minimisation; the optimum by dynamic programming."""
    rng = np.random.default_rng(seed)
    v = rng.integers(1, 60, n)
    w = rng.integers(1, 40, n)
    cap = int(w.sum() // 3)
    m = LinearModel("knapsack")
    x = m.add_vars(n, cost=-v.astype(float))
    m.add_constraints(np.zeros(n, dtype=int), x, w, -np.inf, float(cap), count=1)
    best = np.zeros(cap + 1)
    for vi, wi in zip(v, w, strict=True):
        best[wi:] = np.maximum(best[wi:], best[: cap + 1 - wi] + vi)
    return m, -float(best[cap])


@pytest.mark.parametrize("backend", ["highs", "scip", "cpsat"])
def test_backends_reach_the_dp_optimum(backend: str) -> None:
    m, opt = knapsack()
    sols: list[float] = []
    res = solve(
        m,
        EngineSettings(backend=backend, time_limit=20, rel_gap=0.0, on_solution=lambda x, o: sols.append(o)),
    )
    assert res.status == "optimal" and res.backend == backend
    assert res.objective == pytest.approx(opt)
    assert res.bound is not None and res.bound <= opt + 1e-6
    assert res.x is not None and m.violation(res.x) <= 1e-6
    assert m.objective(res.x) == pytest.approx(opt)
    assert sols and sols[-1] == pytest.approx(opt)  # the final incumbent at least is reported
    assert f"{backend} ran" in res.message


def test_lp_relaxation_bounds_the_milp() -> None:
    m, opt = knapsack(seed=2)
    lp = solve(m, EngineSettings(backend="highs", relax=True))
    assert lp.status == "optimal" and lp.objective is not None
    assert lp.objective <= opt + 1e-9
    assert lp.x is not None and np.any(np.abs(lp.x - np.round(lp.x)) > 1e-6)  # fractional item


def test_hint_is_accepted_and_equalities_hold() -> None:
    # x0 + x1 + x2 = 2, min x0 + 2 x1 + 3 x2 → (1, 1, 0)
    m = LinearModel()
    x = m.add_vars(3, cost=np.array([1.0, 2.0, 3.0]))
    m.add_constraints([0, 0, 0], x, 1.0, 2.0, 2.0)
    for b in ("highs", "scip", "cpsat"):
        res = solve(m, EngineSettings(backend=b, hint=np.array([0.0, 1.0, 1.0])))
        assert res.status == "optimal" and res.x is not None
        assert np.allclose(res.x, [1, 1, 0])


def test_infeasible_is_proved() -> None:
    m = LinearModel()
    x = m.add_vars(2)
    m.add_constraints([0, 0], x, 1.0, 3.0, np.inf)
    for b in ("highs", "scip", "cpsat"):
        assert solve(m, EngineSettings(backend=b)).status == "infeasible"


def test_cpsat_refuses_fractional_models_and_falls_back() -> None:
    m = LinearModel()
    x = m.add_vars(2, cost=1.0)
    y = m.add_vars(1, lb=0.0, ub=10.0, integer=False, cost=1.0)
    m.add_constraints([0, 0, 0], np.r_[x, y], [1.0, 1.0, 0.5], 1.25, np.inf)
    res = solve(m, EngineSettings(backend="cpsat"))
    assert res.backend != "cpsat" and "cpsat: needs an all-integer model" in res.message
    assert res.status == "optimal"


def test_gurobi_runs_or_falls_back_with_the_reason() -> None:
    m, opt = knapsack(n=20, seed=4)  # 20 variables: within gurobipy's size-limited pip licence
    res = solve(m, EngineSettings(backend="gurobi", rel_gap=0.0))
    assert res.status == "optimal" and res.objective == pytest.approx(opt)
    assert res.x is not None and m.violation(res.x) <= 1e-6
    if importlib.util.find_spec("gurobipy") is None:
        assert available_backends()["gurobi"] == (False, "gurobipy is not installed")
        assert res.backend != "gurobi"
        assert "gurobi: gurobipy is not installed" in res.message
    else:  # the `test` extra installs gurobipy: its bundled licence takes this model
        assert res.backend == "gurobi" and "gurobi ran" in res.message
        assert res.bound is not None and res.bound <= opt + 1e-6


def test_gurobi_over_the_licence_limit_falls_back_and_says_why() -> None:
    # 2,500 variables: over the 2,000 of gurobipy's size-limited pip licence (when installed)
    m, opt = knapsack(n=2500, seed=5)
    res = solve(m, EngineSettings(backend="auto", rel_gap=1e-9, time_limit=60))
    assert res.objective == pytest.approx(opt, rel=1e-6)
    assert res.backend in ("highs", "scip", "cpsat")
    assert f"{res.backend} ran" in res.message
    if importlib.util.find_spec("gurobipy") is None:
        assert "gurobi: gurobipy is not installed" in res.message
    else:
        assert "gurobi: gurobi refused the model (2500 variables" in res.message


def test_unknown_backend_and_no_engine() -> None:
    m, _ = knapsack(n=5)
    with pytest.raises(ValueError):
        solve(m, EngineSettings(backend="cplex"))
    with pytest.raises(EngineError):  # CP-SAT has no LP relaxation and nothing else may run
        solve(m, EngineSettings(backend="cpsat", auto_order=("cpsat",), relax=True))


def test_pdlp_point_and_lagrangian_bounds() -> None:
    m, opt = knapsack(n=40, seed=6)
    lp = solve(m, EngineSettings(backend="highs", relax=True))
    assert lp.objective is not None
    pd = solve(m, EngineSettings(backend="pdlp", relax=True, time_limit=20))
    assert pd.backend == "pdlp" and pd.x is not None and pd.bound is not None
    assert pd.bound <= lp.objective + 1e-9 <= opt + 2e-9
    assert pd.bound == pytest.approx(lp.objective, rel=1e-3)
    # weak duality holds for any multipliers, of either sign, on any row
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.normal(size=m.num_constraints) * rng.choice([0.0, 0.1, 10.0])
        assert lagrangian_bound(m, y) <= lp.objective + 1e-9
    with pytest.raises(EngineError):  # PDLP solves LP relaxations only, and nothing else may run
        solve(m, EngineSettings(backend="pdlp", auto_order=("pdlp",)))


def _market_split(m: int = 4, n: int = 30, seed: int = 0) -> LinearModel:
    """Cornuéjols-Dawande market split: m equalities over n binaries with slack, hard for branch
    and bound (HiGHS had not closed its gap after 30 s)."""
    rng = np.random.default_rng(seed)
    a = rng.integers(0, 100, size=(m, n))
    model = LinearModel("market-split")
    model.add_vars(n, lb=0, ub=1, integer=True, cost=0.0)
    model.add_vars(2 * m, lb=0, ub=1e4, integer=False, cost=1.0)
    rows, cols, vals = [], [], []
    for i in range(m):
        rows += [i] * (n + 2)
        cols += [*range(n), n + 2 * i, n + 2 * i + 1]
        vals += [*a[i].astype(float), 1.0, -1.0]
    rhs = np.floor(a.sum(axis=1) / 2)
    model.add_constraints(rows, cols, vals, rhs, rhs)
    return model


def test_a_hard_deadline_kills_the_engine() -> None:
    """With ``hard_deadline`` the engine runs in a child process that is killed then, whatever
    its own time limit: the result is "unknown", without a solution, and says so."""
    res = solve(
        _market_split(),
        EngineSettings(backend="highs", time_limit=600, rel_gap=0, hard_deadline=time.monotonic() + 1.0),
    )
    assert res.status == "unknown" and res.x is None
    assert "killed at the hard deadline" in res.message


def test_a_hard_deadline_keeps_a_result_in_time() -> None:
    """A solve that ends before the hard deadline returns its result from the child unchanged."""
    model = _market_split(m=1, n=8)
    plain = solve(model, EngineSettings(backend="highs", rel_gap=0))
    child = solve(model, EngineSettings(backend="highs", rel_gap=0, hard_deadline=time.monotonic() + 60))
    assert child.status == plain.status == "optimal"
    assert child.objective == pytest.approx(plain.objective)
    assert model.violation(child.x) < 1e-6
