"""The `checkmate` solver: builds the model (:mod:`.model`), hands it a warm start
(:mod:`.warm_start`) and runs a MILP engine, then decodes S (:mod:`.decode`)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np

from remat_cli.graph import Graph
from remat_cli.milp import EngineSettings, MilpResult
from remat_cli.milp import solve as milp_solve
from remat_cli.milp.engine import EngineError, available_backends
from remat_cli.schedule import Step, relative_gap, simulate
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.checkmate.decode import steps_from_S
from remat_cli.solvers.checkmate.model import PAPER, CheckmateModel, build_model, parse_cuts, stages_of
from remat_cli.solvers.checkmate.warm_start import model_warm_start, warm_start_steps

#: with the V1/V2 cuts and the Moccasin warm start SCIP proves the bench optima fastest (HiGHS
#: slower, CP-SAT proves few bounds)
AUTO_ORDER = ("gurobi", "scip", "highs", "cpsat")
#: SCIP's probing presolve takes most of its presolve time on these models and finds almost
#: nothing ("50/50 successive totally useless probings"): off before the root.
ENGINE_OPTIONS: dict[str, dict[str, Any]] = {"scip": {"propagating/probing/maxprerounds": 0}}


def engine_settings(options: SolveOptions, backend: str) -> EngineSettings:
    return EngineSettings(
        backend=backend,
        auto_order=AUTO_ORDER,
        time_limit=options.remaining(),
        threads=max(1, options.workers),
        seed=options.seed,
        deterministic=options.workers == 1,
    )


class Checkmate(Solver):
    """The exact MILP of :mod:`.model` on a MILP engine, warm-started (:mod:`.warm_start`)."""

    name = "checkmate"
    method = "MILP over frontier-advancing stages (R, S, FREE, U) in the fixed `order`"
    paper = PAPER
    exact = True
    warm_starts = True
    params = (
        Param(
            "backend",
            str,
            "auto",
            "MILP engine (auto = gurobi when licensed for the model, else scip)",
            choices=("auto", "highs", "scip", "cpsat", "gurobi"),
        ),
        Param(
            "rel_gap", float, 1e-4, "relative MIP gap at which a solution counts as optimal", low=0, high=1
        ),
        Param(
            "free_form",
            str,
            "product",
            "FREE linearisation: product (one bound per factor, tighter) or hazard (the paper's κ form)",
            choices=("product", "hazard"),
        ),
        Param("lp_warm_start", bool, True, "when no schedule fits, warm-start from Checkmate's LP rounding"),
        Param(
            "cuts",
            str,
            "free_once,stage_end",
            "valid inequalities (comma list of free_once, stage_end, instant; or none): see build_model",
        ),
        Param(
            "moccasin_share",
            float,
            0.2,
            "fraction of the time limit (≤ 30 s) for a staged Moccasin run as the warm start (0: off)",
            low=0,
            high=1,
        ),
    )

    def availability(self) -> tuple[str, str]:  # type: ignore[override]
        avail = available_backends()
        if any(ok for ok, _ in avail.values()):
            return "available", ""
        return "missing engine", "; ".join(f"{b}: {why}" for b, (ok, why) in avail.items())

    def notes(self) -> str:
        return (
            "O(T²) binaries: proves optima up to a few hundred nodes; Gurobi is used when gurobipy's "
            "licence accepts the model, else SCIP. SCIP and HiGHS report only their final incumbent."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """An optimal schedule of the stage space (status "optimal", within `options.params
        ["rel_gap"]`), else the best found in the time ("feasible"). When the MILP finds nothing
        ("infeasible": the stage space has no schedule within budget; "unknown": none found in
        the time) but a warm start outside the fixed order (the hint, greedy) fits the budget,
        that one is returned as "feasible"; else no steps, with `best_peak` the lowest peak of
        the warm starts."""
        notes: list[str] = []
        warm = warm_start_steps(graph, budget, options, options.params["moccasin_share"], notes)
        res = self._solve(graph, budget, options, warm)
        if res.steps is None and res.status in ("infeasible", "unknown"):
            fits = [
                (sim.cost, src, s) for src, s in warm if (sim := simulate(graph, s)).peak_memory <= budget
            ]
            if fits:
                cost, src, steps = min(fits, key=lambda f: f[0])
                why = "the stage space has none" if res.status == "infeasible" else "the MILP found none"
                res = dataclasses.replace(
                    res, steps=steps, status="feasible", objective=cost, best_peak=None, lower_bound=None
                )
                notes.append(f"within budget: the {src} schedule, outside the fixed order ({why})")
        if notes:  # a helper failed or a warm start was the answer: say so
            res.message = "; ".join(m for m in (res.message, *notes) if m)
        return res

    def _solve(
        self, graph: Graph, budget: int, options: SolveOptions, warm: list[tuple[str, list[Step]]]
    ) -> SolverResult:
        p = options.params
        st = stages_of(graph, budget)
        backend = str(p["backend"])
        integer_u = backend == "cpsat"
        params = {
            "backend": backend,
            "rel_gap": float(p["rel_gap"]),
            "free_form": str(p["free_form"]),
            "moccasin_share": float(p["moccasin_share"]),
            "cuts": str(p["cuts"]),
        }
        cuts = parse_cuts(str(p["cuts"]))
        fallback_peak = min(simulate(graph, s).peak_memory for _, s in warm)
        if st.capacity < 0 or st.T == 0:
            if st.T == 0:
                return SolverResult(steps=[], status="optimal", objective=0.0, lower_bound=0.0, params=params)
            return SolverResult(
                steps=None,
                status="infeasible",
                params=params,
                message="budget is below the resident inputs and parameters",
                best_peak=fallback_peak,
            )

        def no_time_left() -> bool:
            return options.time_limit is not None and (options.remaining() or 0.0) < 1.0

        if no_time_left():
            # the warm starts used the time (greedy with one worker runs every strategy to its
            # end): the model's build and warm start are not clocked and would overrun by their
            # whole length (one core, mobilenet_v2_b1 at 50%, 13 s: 13 s of build and 12 s of
            # warm start after a 13.5 s warm start, which auto's next solvers then lacked)
            return SolverResult(
                steps=None,
                status="unknown",
                params=params,
                message="time limit reached before the MILP model was built",
                best_peak=fallback_peak,
            )
        cm = build_model(st, integer_u=integer_u, free_form=str(p["free_form"]), cuts=cuts)
        hint, hint_src = model_warm_start(graph, budget, options, cm, warm, p["lp_warm_start"])
        if no_time_left():
            # no time left for the engine: hand back the warm start (HiGHS overruns tiny limits)
            if hint is None:
                return SolverResult(
                    steps=None, status="unknown", params=params, message="time limit reached before the MILP"
                )
            return SolverResult(
                steps=steps_from_S(st, cm.S_matrix(hint)),
                status="feasible",
                params=params,
                message=f"time limit reached before the MILP; warm start: {hint_src}",
            )
        res = run_checkmate(cm, options, backend, params, hint, hint_src, fallback_peak)
        # memory is normalised for the engines; a tolerance-sized overshoot of the byte budget is
        # possible in principle: tighten the capacity by the overshoot and solve again
        for _ in range(3):
            if res.steps is None or simulate(graph, res.steps).peak_memory <= budget:
                break
            over = simulate(graph, res.steps).peak_memory - budget
            st.capacity -= -(-over // st.scale)
            if st.capacity < 0 or (options.remaining() is not None and options.remaining() <= 0):
                break
            cm = build_model(st, integer_u=integer_u, free_form=str(p["free_form"]), cuts=cuts)
            res = run_checkmate(cm, options, backend, params, None, "", fallback_peak)
            res.message = (
                res.message or ""
            ) + "; re-solved with the capacity tightened by a tolerance overshoot"
        return res


def run_checkmate(
    cm: CheckmateModel,
    options: SolveOptions,
    backend: str,
    params: dict[str, Any],
    hint: np.ndarray | None,
    hint_src: str,
    fallback_peak: int | None,
) -> SolverResult:
    st = cm.stages

    def on_solution(x: np.ndarray, obj: float) -> None:
        options.incumbent(steps_from_S(st, cm.S_matrix(x)))

    base = st.base_cost

    def on_progress(facts: dict[str, Any]) -> None:
        inc = cm.real_cost(facts.get("objective"))
        bnd = cm.real_cost(facts.get("bound"))
        options.progress(
            elapsed=time.monotonic() - options.started,
            incumbent=inc,
            overhead=None if inc is None else inc / base - 1.0,
            bound=bnd,
            bound_overhead=None if bnd is None else bnd / base - 1.0,
            # on the total cost, as the schedule's solver block reports it (the engine's own gap
            # is on the recomputation cost alone)
            gap=relative_gap(inc, bnd),
        )

    es = engine_settings(options, backend)
    es.rel_gap = float(params.get("rel_gap", 1e-4))
    es.hint = hint
    es.engine_options = {b: dict(o) for b, o in ENGINE_OPTIONS.items()}
    for b, o in dict(params.get("engine_options", {})).items():
        es.engine_options.setdefault(b, {}).update(o)
    es.on_solution = on_solution
    es.on_progress = on_progress
    try:
        res: MilpResult = milp_solve(cm.model, es)
    except EngineError as e:
        return SolverResult(
            steps=None, status="unknown", message=str(e), params=params, best_peak=fallback_peak
        )
    msg = res.message + (f"; warm start: {hint_src}" if hint_src else "; no warm start fitted the model")
    if res.x is None:
        return SolverResult(
            steps=None,
            status=res.status,
            backend=res.backend,
            lower_bound=cm.real_cost(res.bound),
            params=params,
            message=msg,
            best_peak=fallback_peak,
        )
    steps = steps_from_S(st, cm.S_matrix(res.x))
    return SolverResult(
        steps=steps,
        status=res.status,
        backend=res.backend,
        objective=cm.real_cost(res.objective),
        lower_bound=cm.real_cost(res.bound),
        params=params,
        message=msg + (f"; gap {res.gap:.2e} of the recomputation cost" if res.gap is not None else ""),
    )
