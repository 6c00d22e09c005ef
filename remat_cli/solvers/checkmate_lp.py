"""checkmate-lp: Checkmate's LP relaxation with two-phase rounding (Jain et al., MLSys'20, §5;
as restated in Moccasin §1.1 and FastSA App. A.1).

1. Solve the LP relaxation of the Checkmate MILP (:mod:`remat_cli.solvers.checkmate`, all of
   R, S, FREE relaxed to [0, 1]) at a tightened budget, ``lp_budget`` × budget (0.9 by default,
   as the paper suggests, to leave room for the memory the rounding adds back).
2. Round S* — phase one: a deterministic threshold sweep S = [S* ≥ τ] for τ ∈ {0.1, …, 0.9},
   then ``roundings`` seeded randomized roundings S_ti ~ Bernoulli(S*_ti).
3. Phase two: R from S by the minimal-recompute rule (the least R with eqs. 11–12), decode the
   compute sequence with ``steps_from_sequence`` and simulate it; keep the cheapest schedule
   whose peak is within the real budget (or, when none is, the lowest-peak one, reported as
   infeasible).

The LP objective at the *real* budget is a valid lower bound on the fixed-order optimum and is
reported as ``lower_bound`` (a second LP solve; the tightened LP is not a bound for the real
budget).

Which relaxation (``--lp-model``): the full MILP's (with the valid inequalities V1/V2 of
:mod:`remat_cli.solvers.checkmate`), or — by default above 150 nodes — a smaller relaxation of
the same MILP without FREE and U whose memory rows are the live-block bounds V2 at every compute
instant (``build_model(memory="live")``). Every MILP solution satisfies them, so its value is
still a lower bound; it is within 1% of the full LP's value on RL n100 (1.2024% vs 1.2115%
overhead at 80%) and is what makes RL n250 solvable on two cores (42 s; the full LP, with dual
simplex, barrier or PDLP, does not finish in 150 s).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.milp.engine import EngineError, available_backends
from remat_cli.schedule import Step, simulate
from remat_cli.solvers.base import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.checkmate import (
    PAPER,
    CheckmateModel,
    Stages,
    build_model,
    repair_S,
    stages_of,
    steps_from_S,
)

#: above this many stages checkmate-lp relaxes the "live" model: RL n250 at 81% (T = 250) solves
#: in 42 s with HiGHS dual simplex on the loaded 2-core machine, the full one not in 150 s
#: (barrier / PDLP: not in 150 s either); RL n100: LP value 1.2024% vs 1.2115% overhead.
LIVE_ABOVE_T = 150


def lp_S(cm: CheckmateModel, options: SolveOptions) -> tuple[np.ndarray | None, float | None, str, str]:
    """Fractional S* (with the virtual row T) of the LP relaxation, its objective, a note and
    the engine's status."""
    es = EngineSettings(backend="highs", time_limit=options.remaining(), relax=True, seed=options.seed)
    try:
        res = milp_solve(cm.model, es)
    except EngineError as e:
        return None, None, str(e), "unknown"
    if res.x is None or res.status != "optimal":
        return None, None, f"LP relaxation: {res.status} ({res.message})", res.status
    T = cm.stages.T
    S = np.zeros((T + 1, T))
    t, i = np.tril_indices(T + 1, -1)
    sel = t >= 1
    S[t[sel], i[sel]] = res.x[cm.S[t[sel] * (t[sel] - 1) // 2 + i[sel]]]
    return S, cm.real_cost(res.objective), res.backend, res.status


def round_schedules(
    st: Stages, S_star: np.ndarray, thresholds: list[float], roundings: int, seed: int
) -> list[tuple[str, np.ndarray]]:
    """Phase one: the rounded S matrices to try (deterministic sweep, then seeded random)."""
    T = st.T
    keep_row = st.keep.astype(bool)
    out = []

    def fix(S: np.ndarray) -> np.ndarray:
        S = np.tril(S, -1)
        S[T, :] = keep_row
        return repair_S(st, S)

    for tau in thresholds:
        out.append((f"threshold {tau:.1f}", fix(S_star >= tau - 1e-9)))
    rng = np.random.default_rng(seed)
    for r in range(roundings):
        out.append((f"random #{r}", fix(rng.random(S_star.shape) < S_star)))
    return out


class CheckmateLP(Solver):
    name = "checkmate-lp"
    method = "LP relaxation of the Checkmate MILP + two-phase (threshold / randomized) rounding"
    paper = PAPER + ", §5 (LP rounding)"
    exact = False
    params = (
        Param("lp_budget", float, 0.9, "solve the LP at this fraction of the budget (paper: 0.9)"),
        Param("roundings", int, 50, "seeded randomized roundings after the threshold sweep"),
        Param(
            "lp_model",
            str,
            "auto",
            "relaxation: full (the MILP's rows), live (memory as live-block bounds, no FREE/U: "
            "~2× smaller), auto = live above 150 nodes",
            choices=("auto", "full", "live"),
        ),
    )

    def availability(self) -> tuple[str, str]:  # type: ignore[override]
        ok, why = available_backends()["highs"]
        return ("available", "") if ok else ("missing engine", why)

    def notes(self) -> str:
        return "A heuristic: the rounded schedule may miss the budget; the LP value is a lower bound."

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        p = self.defaults() | options.params
        frac = float(p["lp_budget"])
        n_round = int(p["roundings"])
        params: dict[str, Any] = {"lp_budget": frac, "roundings": n_round}
        st = stages_of(graph, budget)
        if st.T == 0:
            return SolverResult(steps=[], status="optimal", objective=0.0, lower_bound=0.0, params=params)
        memory = str(p["lp_model"])
        params["lp_model"] = memory
        rr = best_rounding(graph, budget, options, frac, n_round, report=True, memory=memory)
        if rr.best is None and rr.lowest is None:
            return SolverResult(steps=None, status="unknown", params=params, message=rr.note)
        # the LP at the real budget bounds the fixed-order optimum from below
        bound = None
        if _time_for_lp(options, rr.lp_seconds) and st.capacity >= 0:
            _, bound, _, _ = lp_S(lp_model(st, memory), options)
        msg = f"LP ({rr.note}) at {frac:g}×budget: {rr.lp_objective:.6g}"
        if rr.best is not None:
            return SolverResult(
                steps=rr.best[2],
                status="feasible",
                backend=rr.backend,
                objective=rr.best[0],
                lower_bound=bound,
                params=params,
                message=f"{msg}; best rounding: {rr.best[3]}",
            )
        assert rr.lowest is not None
        return SolverResult(
            steps=rr.lowest[2],
            status="infeasible",
            backend=rr.backend,
            lower_bound=bound,
            params=params,
            message=f"{msg}; no rounding fits the budget (lowest peak from {rr.lowest[3]})",
            best_peak=rr.lowest[0],
        )


@dataclass
class Rounding:
    best: tuple[float, int, list[Step], str] | None = None  # (cost, peak, steps, how), in budget
    lowest: tuple[int, float, list[Step], str] | None = None  # (peak, cost, steps, how), any
    lp_objective: float = float("nan")
    backend: str | None = None
    note: str = ""
    lp_seconds: float = 0.0  # building and solving the first LP


def _time_for_lp(options: SolveOptions, seconds: float) -> bool:
    """Whether another LP like one that took `seconds` (model build included: it cannot be cut
    short, which on RL n1000 alone takes minutes) fits in the time left."""
    left = options.remaining()
    return left is None or left > seconds


def lp_model(st: Stages, memory: str = "auto") -> CheckmateModel:
    """The relaxation to solve: the full model, or (``live``, and ``auto`` above T = 150) the
    one whose memory rows are the live-block bounds V2 at every instant, without FREE and U."""
    if memory == "auto":
        memory = "live" if st.T > LIVE_ABOVE_T else "recurrence"
    return build_model(st, memory="live" if memory == "live" else "recurrence")


def best_rounding(
    graph: Graph,
    budget: int,
    options: SolveOptions,
    frac: float,
    roundings: int,
    report: bool = False,
    memory: str = "auto",
) -> Rounding:
    """Steps 1–3 of the module docstring: the cheapest rounded schedule within `budget`."""
    out = Rounding()
    tight = stages_of(graph, int(frac * budget))
    tight.capacity = max(tight.capacity, 0)
    t0 = time.monotonic()
    S_star, lp_obj, note, status = lp_S(lp_model(tight, memory), options)
    out.lp_seconds = time.monotonic() - t0
    if S_star is None and status == "infeasible" and _time_for_lp(options, out.lp_seconds):
        # the tightened LP can be infeasible where the real budget is not
        st = stages_of(graph, budget)
        if st.capacity >= 0:
            S_star, lp_obj, note, _ = lp_S(lp_model(st, memory), options)
    out.note = note
    if S_star is None:
        return out
    out.lp_objective = float(lp_obj) if lp_obj is not None else float("nan")
    out.backend = note
    st = stages_of(graph, budget)
    taus = [round(0.1 * k, 1) for k in range(1, 10)]
    seen: set[bytes] = set()
    for how, S in round_schedules(st, S_star, taus, roundings, options.seed):
        key = np.packbits(S).tobytes()
        if key in seen:
            continue
        seen.add(key)
        if options.time_limit is not None and (options.remaining() or 0) <= 0:
            break
        steps = steps_from_S(st, S)
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget and (out.best is None or sim.cost < out.best[0] - 1e-12):
            out.best = (sim.cost, sim.peak_memory, steps, how)
            if report:
                options.incumbent(steps)
                options.progress(elapsed=time.monotonic() - options.started, incumbent=sim.cost)
        if out.lowest is None or (sim.peak_memory, sim.cost) < (out.lowest[0], out.lowest[1]):
            out.lowest = (sim.peak_memory, sim.cost, steps, how)
    return out
