"""Proof of correctness for checkmate / checkmate-lp: the MILP optimum equals an exhaustive search
of the same fixed-order space (remat_cli.testing.instances.brute_force_min_cost), the LP value bounds it from below, and
every schedule passes the simulator (run_solver simulates and raises on an invalid one)."""

from __future__ import annotations

import importlib.util
import random

import numpy as np
import pytest

from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph, Node, Value
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, baseline_steps, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions
from remat_cli.solvers.checkmate import (
    S_from_steps,
    build_model,
    hint_vector,
    minimal_R,
    stages_of,
    steps_from_S,
)
from remat_cli.testing.instances import brute_force_min_cost


def random_graph(n: int, seed: int, multi: bool = False) -> Graph:
    """A random DAG of n single-output nodes (two outputs for some when `multi`)."""
    rng = random.Random(seed)
    values = [Value(id="x", size=rng.randint(1, 4), role="input")]
    nodes = []
    produced: list[str] = []
    for i in range(n):
        ins = [v for v in produced if rng.random() < 0.35] or (produced[-1:] if produced else [])
        if i == 0 or rng.random() < 0.3:
            ins.append("x")
        outs = [f"v{i}"] + ([f"w{i}"] if multi and rng.random() < 0.5 else [])
        for o in outs:
            values.append(Value(id=o, size=rng.randint(1, 6)))
        nodes.append(
            Node(
                id=f"n{i}",
                inputs=ins,
                outputs=outs,
                cost=rng.randint(0, 5),
                workspace=rng.choice([0, 0, 1, 3]),
                recomputable=rng.random() > 0.1,
            )
        )
        produced.extend(outs)
    outputs = [nodes[-1].outputs[0]] + ([f"v{rng.randrange(n - 1)}"] if n > 1 and rng.random() < 0.3 else [])
    return Graph(name=f"rand{seed}", values=values, nodes=nodes, outputs=outputs)


def hand_made() -> dict[str, Graph]:
    """Chain forward/backward (the classic checkpointing case), a diamond, a skip connection."""
    chain = G.linear(3, seed=5)  # 3 forward + loss + 3 backward nodes = 7
    v = [Value(id="x", size=2, role="input")] + [
        Value(id=f"d{i}", size=s) for i, s in enumerate([4, 3, 3, 2])
    ]
    diamond = Graph(
        name="diamond",
        values=v,
        nodes=[
            Node(id="a", inputs=["x"], outputs=["d0"], cost=2),
            Node(id="b", inputs=["d0"], outputs=["d1"], cost=1),
            Node(id="c", inputs=["d0"], outputs=["d2"], cost=3, workspace=2),
            Node(id="d", inputs=["d1", "d2"], outputs=["d3"], cost=1),
        ],
        outputs=["d3"],
    )
    v = [Value(id="x", size=1, role="input")] + [Value(id=f"s{i}", size=3) for i in range(6)]
    skip = Graph(
        name="skip",
        values=v,
        nodes=[
            Node(id="f0", inputs=["x"], outputs=["s0"], cost=4),
            Node(id="f1", inputs=["s0"], outputs=["s1"], cost=1),
            Node(id="f2", inputs=["s1"], outputs=["s2"], cost=1),
            Node(id="f3", inputs=["s2", "s0"], outputs=["s3"], cost=2),
            Node(id="f4", inputs=["s3", "s1"], outputs=["s4"], cost=1),
            Node(id="f5", inputs=["s4", "s0"], outputs=["s5"], cost=1),
        ],
        outputs=["s5", "s2"],
    )
    return {"chain": chain, "diamond": diamond, "skip": skip}


def budgets(g: Graph) -> list[int]:
    hi = baseline(g).peak_memory
    lo = peak_lower_bound(g)
    return sorted({lo, lo + 1, (lo + hi) // 2, hi - 1, hi})


CASES: list[tuple[str, Graph]] = [*hand_made().items()] + [
    (f"rand{s}", random_graph(random.Random(s).randint(3, 7), s)) for s in range(12)
]


def _cost(g: Graph, budget: int, solver: str, **params: object) -> tuple[float | None, object]:
    sched, res = run_solver(
        g, budget, solver, SolveOptions(time_limit=30, seed=0, workers=1, params=dict(params))
    )
    if sched is None or res.status not in ("optimal", "feasible"):
        return None, res
    assert sched.summary.peak_memory <= budget
    return sched.summary.cost, res


@pytest.mark.parametrize("name,g", CASES, ids=[c[0] for c in CASES])
def test_milp_optimum_equals_brute_force(name: str, g: Graph) -> None:
    for budget in budgets(g):
        ref = brute_force_min_cost(g, budget)
        got, res = _cost(g, budget, "checkmate")
        if ref is None:
            assert got is None and res.status == "infeasible", (name, budget, got)  # type: ignore[attr-defined]
            continue
        assert res.status == "optimal", (name, budget, res)  # type: ignore[attr-defined]
        assert got == pytest.approx(ref, abs=1e-9), (name, budget)
        assert res.objective == pytest.approx(ref, abs=1e-6)  # type: ignore[attr-defined]


@pytest.mark.parametrize("name,g", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_paper_hazard_form_and_other_engines_agree(name: str, g: Graph) -> None:
    for budget in budgets(g)[:3]:
        ref = brute_force_min_cost(g, budget)
        for params in ({"free_form": "hazard"}, {"backend": "scip"}, {"backend": "cpsat"}):
            got, _ = _cost(g, budget, "checkmate", **params)
            assert (got is None) == (ref is None), (name, budget, params)
            if ref is not None:
                assert got == pytest.approx(ref, abs=1e-6), (name, budget, params)


@pytest.mark.parametrize("name,g", CASES[::3], ids=[c[0] for c in CASES[::3]])
def test_valid_inequalities_keep_the_optimum_without_a_good_warm_start(name: str, g: Graph) -> None:
    # the default run starts from Moccasin's (often optimal) schedule; here the engine must find
    # the optimum itself, with every valid inequality in (V1, V2 at all instants) and with none
    for budget in budgets(g):
        ref = brute_force_min_cost(g, budget)
        for cuts in ("free_once,instant", "none"):
            got, res = _cost(g, budget, "checkmate", cuts=cuts, moccasin_share=0.0, lp_warm_start=False)
            assert (got is None) == (ref is None), (name, budget, cuts)
            if ref is not None:
                assert res.status == "optimal", (name, budget, cuts, res)  # type: ignore[attr-defined]
                assert got == pytest.approx(ref, abs=1e-9), (name, budget, cuts)


def test_moccasin_schedules_lie_in_the_checkmate_stage_space() -> None:
    g = G.random_layered(24, seed=4)
    base = baseline(g)
    for frac in (0.9, 0.75):
        budget = int(frac * base.peak_memory)
        sched, _ = run_solver(g, budget, "moccasin", SolveOptions(time_limit=10, seed=0, workers=1))
        assert sched is not None
        cm = build_model(stages_of(g, budget))
        x = hint_vector(cm, sched.steps)
        assert x is not None  # fits every row, the valid inequalities included
        assert cm.real_cost(cm.model.objective(x)) == pytest.approx(sched.summary.cost, rel=1e-9)


def test_multi_output_nodes_never_beat_brute_force() -> None:
    # blocks are kept and freed together, so the MILP optimum is ≥ the value-level optimum
    compared = 0
    for seed in range(5):
        g = random_graph(5, 100 + seed, multi=True)
        for budget in budgets(g):
            ref = brute_force_min_cost(g, budget)
            got, res = _cost(g, budget, "checkmate")
            if ref is None:  # the block space is a subset: only a warm start outside it fits
                assert got is None or "outside the fixed order" in (res.message or ""), (seed, budget)
            elif got is not None:
                assert got >= ref - 1e-9, (seed, budget)
                compared += 1
    assert compared >= 10  # most budgets have a block schedule: the comparison ran


@pytest.mark.parametrize("name,g", CASES[:8], ids=[c[0] for c in CASES[:8]])
def test_lp_bound_below_optimum_and_roundings_valid(name: str, g: Graph) -> None:
    for budget in budgets(g):
        ref = brute_force_min_cost(g, budget)
        sched, res = run_solver(g, budget, "checkmate-lp", SolveOptions(time_limit=20, seed=3, workers=1))
        if sched is not None:
            simulate(g, sched.steps)  # valid (run_solver has simulated it too)
            if res.status == "feasible":
                assert ref is not None and sched.summary.cost >= ref - 1e-9
        if ref is not None and res.lower_bound is not None:
            assert res.lower_bound <= ref + 1e-6, (name, budget, res.lower_bound, ref)


@pytest.mark.parametrize("name,g", CASES[:12:3], ids=[c[0] for c in CASES[:12:3]])
def test_live_relaxation_is_a_lower_bound(name: str, g: Graph) -> None:
    for budget in budgets(g):
        ref = brute_force_min_cost(g, budget)
        opts = SolveOptions(time_limit=20, seed=3, workers=1, params={"lp_model": "live"})
        sched, res = run_solver(g, budget, "checkmate-lp", opts)
        if ref is not None and res.lower_bound is not None:
            assert res.lower_bound <= ref + 1e-6, (name, budget, res.lower_bound, ref)
        if sched is not None and res.status == "feasible":
            assert ref is not None and sched.summary.cost >= ref - 1e-9


def test_baseline_is_a_feasible_warm_start_and_decodes_to_itself() -> None:
    g = G.random_layered(16, seed=9)
    budget = baseline(g).peak_memory
    st = stages_of(g, budget)
    cm = build_model(st)
    x = hint_vector(cm, baseline_steps(g))
    assert x is not None and cm.model.violation(x) <= 1e-9
    S = S_from_steps(st, baseline_steps(g))
    assert S is not None
    S2, R = minimal_R(st, S)
    assert R.sum() == st.T  # no recomputation
    assert simulate(g, steps_from_S(st, S2)).peak_memory == budget


@pytest.mark.slow
def test_infeasible_budget_reports_lowest_peak() -> None:
    # budgets at or above the lower bound where the stage space has no schedule (brute force):
    # the MILP says infeasible and reports a lowest peak that is over the budget yet real, unless
    # a warm start outside the fixed order (greedy) fits, which is then returned as feasible
    infeasible = outside = 0
    for name, g in CASES:
        lo, hi = peak_lower_bound(g), baseline(g).peak_memory
        for budget in [b for b in range(lo, hi) if brute_force_min_cost(g, b) is None][-2:]:
            sched, res = run_solver(g, budget, "checkmate", SolveOptions(time_limit=10, workers=1))
            if res.status == "feasible":
                assert sched is not None and sched.summary.peak_memory <= budget, (name, budget)
                assert "outside the fixed order" in (res.message or ""), (name, budget)
                outside += 1
                continue
            assert sched is None and res.status == "infeasible", (name, budget, res.status)
            assert res.best_peak is not None and lo <= res.best_peak, (name, budget)
            assert res.best_peak > budget, (name, budget, res.best_peak)
            infeasible += 1
    assert infeasible >= 3, "too few cases with an infeasible budget above the lower bound"


def test_incumbents_and_progress_are_reported() -> None:
    g = G.linear(5, seed=1)
    budget = int(0.8 * baseline(g).peak_memory)
    seen: list[int] = []
    facts: list[dict[str, object]] = []
    opts = SolveOptions(time_limit=20, workers=1)
    opts.on_incumbent = lambda steps: seen.append(len(steps))
    opts.on_progress = facts.append
    sched, res = run_solver(g, budget, "checkmate", opts)
    assert sched is not None and seen and res.status == "optimal"
    assert res.backend and "ran" in (res.message or "")
    assert sched.summary.cost > baseline(g).cost  # 80% needs recomputation
    assert np.isfinite(sched.summary.cost)


def test_gurobi_under_the_licence_limit_or_open_engine_with_the_reason() -> None:
    # the `test` extra installs gurobipy, whose bundled licence stops at 2,000 variables and
    # 2,000 constraints: the diamond's model fits, a 12-layer chain's (1,755 × 4,591) does not
    gurobi = importlib.util.find_spec("gurobipy") is not None
    g = hand_made()["diamond"]
    budget = budgets(g)[2]
    cm = build_model(stages_of(g, budget))
    assert cm.model.num_vars <= 2000 and cm.model.num_constraints <= 2000
    got, res = _cost(g, budget, "checkmate", backend="gurobi")
    assert got == pytest.approx(brute_force_min_cost(g, budget), abs=1e-9)
    assert res.status == "optimal"  # type: ignore[attr-defined]
    if gurobi:
        assert res.backend == "gurobi" and "gurobi ran" in res.message  # type: ignore[attr-defined]
    else:
        assert res.backend != "gurobi"  # type: ignore[attr-defined]
        assert "gurobi: gurobipy is not installed" in res.message  # type: ignore[attr-defined]
    big = G.linear(12, seed=1)
    budget = int(0.8 * baseline(big).peak_memory)
    cm = build_model(stages_of(big, budget))
    assert cm.model.num_constraints > 2000
    sched, res = run_solver(big, budget, "checkmate", SolveOptions(time_limit=30, seed=0, workers=1))
    assert sched is not None and res.status == "optimal"
    assert res.backend == "scip" and "scip ran" in (res.message or "")
    why = "gurobi refused the model" if gurobi else "gurobi: gurobipy is not installed"
    assert why in (res.message or "")


@pytest.mark.parametrize("name,g", CASES[:6], ids=[c[0] for c in CASES[:6]])
def test_pdlp_relaxation_bound_is_valid(name: str, g: Graph) -> None:
    # PDLP's point is approximate; its bound is the Lagrangian bound of its dual multipliers
    for budget in budgets(g):
        ref = brute_force_min_cost(g, budget)
        opts = SolveOptions(
            time_limit=20, seed=1, workers=1, params={"lp_engine": "pdlp", "lp_model": "live"}
        )
        sched, res = run_solver(g, budget, "checkmate-lp", opts)
        if ref is None:
            assert res.status != "feasible"
            continue
        if res.lower_bound is not None:
            assert res.lower_bound <= ref + 1e-6, (name, budget, res.lower_bound, ref)
        if sched is not None and res.status == "feasible":
            assert sched.summary.cost >= ref - 1e-9


@pytest.mark.slow
def test_repair_brings_an_over_budget_rounding_within_the_budget() -> None:
    # a budget where every rounding of the LP point misses (the paper's procedure alone reports
    # infeasible); the greedy repair of the nearest one fits
    g = G.random_layered(40, seed=3)
    lo, hi = peak_lower_bound(g), baseline(g).peak_memory
    budget = lo + (hi - lo) // 2
    paper = {"retighten": 0, "repairs": 0}
    _, res = run_solver(
        g, budget, "checkmate-lp", SolveOptions(time_limit=30, seed=0, workers=1, params=paper)
    )
    assert res.status == "infeasible" and res.best_peak is not None and res.best_peak > budget
    sched, res = run_solver(g, budget, "checkmate-lp", SolveOptions(time_limit=30, seed=0, workers=1))
    assert sched is not None and res.status == "feasible" and "greedy repair" in (res.message or "")
    assert sched.summary.peak_memory <= budget
    assert res.lower_bound is not None and res.lower_bound <= sched.summary.cost + 1e-9


@pytest.mark.slow
def test_no_model_is_built_once_the_warm_starts_used_the_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's build and warm start are not clocked: with the limit spent by the warm starts
    (greedy with one worker runs to its end) the solve stops before building it, and a warm
    start within the budget is still the answer."""
    from remat_cli.solvers.checkmate import solver as cm_solver

    built: list[int] = []
    build = cm_solver.build_model

    def spy(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        built.append(1)
        return build(*args, **kwargs)

    monkeypatch.setattr(cm_solver, "build_model", spy)
    g = G.random_layered(40, seed=2)
    b = int(0.8 * baseline(g).peak_memory)
    s, r = run_solver(g, b, "checkmate", SolveOptions(time_limit=1e-3, seed=0, workers=1))
    assert not built, r.message
    assert "before the MILP model was built" in (r.message or "")
    assert s is None or s.summary.peak_memory <= b
    s, r = run_solver(g, b, "checkmate", SolveOptions(time_limit=30, seed=0, workers=1))
    assert built and s is not None and s.summary.peak_memory <= b  # with time, the model is built
