"""checkmate-lp: Checkmate's LP relaxation with two-phase rounding (Jain et al., MLSys'20, §5;
as restated in Moccasin §1.1 and FastSA App. A.1).

1. Solve the LP relaxation of the Checkmate MILP (:mod:`remat_cli.solvers.checkmate`, all of
   R, S, FREE relaxed to [0, 1]) at a tightened budget, ``lp_budget`` × budget (0.9 by default,
   as the paper suggests, to leave room for the memory the rounding adds back).
2. Round S* — phase one: a deterministic threshold sweep S = [S* ≥ τ] for τ ∈ {0.1, …, 0.9},
   then ``roundings`` seeded randomized roundings S_ti ~ Bernoulli(S*_ti).
3. Phase two: R from S by the minimal-recompute rule (the least R with eqs. 11–12), decode the
   compute sequence with ``steps_from_sequence`` and simulate it; keep the cheapest schedule
   whose peak is within the real budget.
4. Beyond the paper, when no rounding fits: (a) ``retighten`` — solve the LP again at a budget
   tightened by the overshoot of the lowest-peak rounding and round that point (RL n250 at 90%:
   the threshold-0.1 rounding of the 0.9×budget LP peaks 1% over the budget, that of the
   0.883×budget LP fits at 2.01% overhead, where the paper's rounding ends 93% over the budget);
   (b) ``repairs`` — the over-budget roundings nearest the budget are repaired with the greedy
   checkpoint-dropping repair and the local search that build the MILP's warm start
   (:func:`~remat_cli.solvers.checkmate.greedy_repair_S`, :func:`~remat_cli.solvers.checkmate.improve_S`);
   when the LP gives no point at all, the baseline is repaired the same way. A repaired
   schedule fits the budget but can cost far more than the optimum (it drops checkpoints one at a
   time): the message says which candidate won.

The LP objective at the *real* budget is a valid lower bound on the fixed-order optimum and is
reported as ``lower_bound`` (a second LP solve, run before 4 so that it gets its time; the
tightened LP is not a bound for the real budget). Its point is rounded too when nothing fits.
When the LP at the real budget is infeasible, so is the budget for every schedule in this order.

Time (with ``--time-limit``): the first LP 40% of the time left (up to 70% when the engine needs
that to load the model, ``milp.engine.setup_seconds``; an LP whose share cannot cover its load
is not started), the rounding sweep at most 25% of what remains, the bound LP half of what then
remains, each re-solve half, the repairs half.

Which relaxation (``--lp-model``): the full MILP's (with the valid inequalities V1/V2 of
:mod:`remat_cli.solvers.checkmate`), or — by default above 150 nodes — a smaller relaxation of
the same MILP without FREE and U whose memory rows are the live-block bounds V2 at every compute
instant (``build_model(memory="live")``). Every MILP solution satisfies them, so its value is
still a lower bound; it is within 1% of the full LP's value on RL n100 (1.2024% vs 1.2115%
overhead at 80%).

Which LP engine (``--lp-engine``): HiGHS dual simplex up to 300 nodes; above, OR-Tools' PDLP
(first-order primal-dual, :mod:`remat_cli.milp.engine`), because simplex and barrier do not
finish these LPs in a usable time
(RL n500: 1.4 M rows, 5.1 M nonzeros — HiGHS returns nothing in 130 s, nor its IPX in 240 s;
CM2's 0.5 M rows likewise in 120 s). PDLP's point is approximate, which the rounding does not
mind, and its bound is the Lagrangian bound of its dual multipliers
(``milp.engine.lagrangian_bound``): valid whether or not it converged within its time share —
but far from the LP value when it did not (RL n500 at 120 s: no better than the baseline cost).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.milp.engine import EngineError, available_backends, setup_seconds
from remat_cli.schedule import Step, baseline_steps, simulate
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.checkmate.decode import (
    S_from_steps,
    greedy_repair_S,
    improve_S,
    repair_S,
    steps_from_S,
)
from remat_cli.solvers.checkmate.model import PAPER, CheckmateModel, Stages, build_model, stages_of

#: above this many stages checkmate-lp relaxes the "live" model, whose LP simplex still solves
#: where the full model's does not, at a value within about 1% of the full one's
LIVE_ABOVE_T = 150
#: above this many stages the LPs go to PDLP: HiGHS solves RL n250's live LP (T = 250) in
#: 14–42 s, but not CM2's (T = 353) or RL n500's in 120–240 s (dual simplex or IPX)
PDLP_ABOVE_T = 300
#: PDLP's relative and absolute optimality tolerance (its default, 1e-6, costs 10× the
#: iterations; rounding needs only a rough point and the bound is valid at any accuracy)
PDLP_EPS = 1e-3
#: candidate moves scored per greedy-repair step (greedy_repair_S's shortlist): scoring every
#: checkpoint does not finish one repair of RL n250 in 120 s, the shortlist takes ~20 s
REPAIR_MOVES = 6


@dataclass
class LPSolution:
    S: np.ndarray | None  # fractional S* with the virtual row T, or None
    objective: float | None  # total compute cost at the LP point
    bound: float | None  # a valid lower bound on the LP (and so the MILP) optimum, total cost
    note: str  # the engine that ran, or why there is no point
    status: str


def lp_S(
    cm: CheckmateModel, options: SolveOptions, engine: str = "highs", time_limit: float | None = None
) -> LPSolution:
    """The fractional S* of the LP relaxation on `engine` (highs or pdlp), its value and bound."""
    limit = options.remaining() if time_limit is None else time_limit
    if limit is not None and setup_seconds(cm.model, engine) > 0.8 * limit:
        # the engine would spend its whole share loading the model and overrun the time limit
        return LPSolution(None, None, None, f"LP relaxation: no time to load it on {engine}", "unknown")
    es = EngineSettings(
        backend=engine,
        time_limit=limit,
        relax=True,
        seed=options.seed,
        threads=max(1, options.workers),
    )
    if engine == "pdlp":
        es.engine_options = {"pdlp": {"eps_optimal_relative": PDLP_EPS, "eps_optimal_absolute": PDLP_EPS}}
    try:
        res = milp_solve(cm.model, es)
    except EngineError as e:
        return LPSolution(None, None, None, str(e), "unknown")
    bound = cm.real_cost(res.bound)
    if res.x is None or res.status not in ("optimal", "feasible"):
        return LPSolution(None, None, bound, f"LP relaxation: {res.status} ({res.message})", res.status)
    T = cm.stages.T
    S = np.zeros((T + 1, T))
    t, i = np.tril_indices(T + 1, -1)
    sel = t >= 1
    S[t[sel], i[sel]] = np.clip(res.x[cm.S[t[sel] * (t[sel] - 1) // 2 + i[sel]]], 0.0, 1.0)
    note = res.backend + (f", {res.message.split('; ')[-1]}" if res.status == "feasible" else "")
    return LPSolution(S, cm.real_cost(res.objective), bound, note, res.status)


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
    """Checkmate's §5 approximation: the LP relaxation at a fraction of the budget, rounded."""

    name = "checkmate-lp"
    method = "LP relaxation of the Checkmate MILP + two-phase (threshold / randomized) rounding"
    paper = PAPER + ", §5 (LP rounding)"
    exact = False
    params = (
        Param(
            "lp_budget",
            float,
            0.9,
            "solve the LP at this fraction of the budget (paper: 0.9)",
            low=0.01,
            high=1,
        ),
        Param(
            "roundings", int, 50, "seeded randomized roundings after the threshold sweep", low=0, high=100000
        ),
        Param(
            "lp_model",
            str,
            "auto",
            "relaxation: full (the MILP's rows), live (memory as live-block bounds, no FREE/U: "
            "~2× smaller), auto = live above 150 nodes",
            choices=("auto", "full", "live"),
        ),
        Param(
            "lp_engine",
            str,
            "auto",
            "LP engine: highs (dual simplex), pdlp (first-order, approximate point, valid bound); "
            "auto = pdlp above 300 nodes",
            choices=("auto", "highs", "pdlp"),
        ),
        Param(
            "retighten",
            int,
            3,
            "when no rounding fits, re-solve the LP at a budget tightened by the overshoot, up to this often",
            low=0,
            high=100,
        ),
        Param(
            "repairs",
            int,
            4,
            "over-budget roundings (nearest the budget first) repaired by greedy checkpoint dropping (0: off)",
            low=0,
            high=10000,
        ),
    )

    def availability(self) -> tuple[str, str]:  # type: ignore[override]
        ok, why = available_backends()["highs"]
        return ("available", "") if ok else ("missing engine", why)

    def notes(self) -> str:
        return (
            "A heuristic: the rounded schedule may miss the budget (then it is repaired); the LP "
            "value is a lower bound."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """The cheapest rounding of the LP point within budget ("feasible"; greedy-repaired when
        every rounding misses), with the LP value as `lower_bound`; else "infeasible" with the
        lowest rounded peak as `best_peak`. Never "optimal": the rounding proves nothing."""
        p = options.params
        frac = float(p["lp_budget"])
        n_round = int(p["roundings"])
        params: dict[str, Any] = {"lp_budget": frac, "roundings": n_round}
        st = stages_of(graph, budget)
        if st.T == 0:
            return SolverResult(steps=[], status="optimal", objective=0.0, lower_bound=0.0, params=params)
        memory = str(p["lp_model"])
        engine = lp_engine(st, str(p["lp_engine"]))
        params |= {
            "lp_model": memory,
            "lp_engine": engine,
            "retighten": int(p["retighten"]),
            "repairs": int(p["repairs"]),
        }
        rr = best_rounding(
            graph,
            budget,
            options,
            frac,
            n_round,
            report=True,
            memory=memory,
            engine=engine,
            repairs=int(p["repairs"]),
            retighten=int(p["retighten"]),
            bound=True,
        )
        bound = rr.bound
        if rr.best is None and rr.lowest is None:
            if rr.infeasible:
                # the relaxation of the MILP has no point, so no schedule of this order fits
                return SolverResult(
                    steps=None,
                    status="infeasible",
                    params=params,
                    message=f"{rr.note}: no schedule in the fixed order fits the budget",
                    best_peak=simulate(graph, baseline_steps(graph)).peak_memory,
                )
            return SolverResult(
                steps=None, status="unknown", params=params, lower_bound=bound, message=rr.note
            )
        msg = f"LP ({rr.note}) at {frac:g}×budget: {rr.lp_objective:.6g}"
        if rr.best is not None:
            return SolverResult(
                steps=rr.best[2],
                status="feasible",
                backend=rr.backend,
                objective=rr.best[0],
                lower_bound=bound,
                params=params,
                message=f"{msg}; best: {rr.best[3]}",
            )
        assert rr.lowest is not None
        return SolverResult(
            steps=rr.lowest[2],
            status="infeasible",
            backend=rr.backend,
            lower_bound=bound,
            params=params,
            message=f"{msg}; no rounding or repair fits the budget (lowest peak from {rr.lowest[3]})",
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
    bound: float | None = None  # the LP bound at the real budget (total cost), when asked for
    infeasible: bool = False  # the LP at the real budget is infeasible: so is every schedule


def _time_for_lp(options: SolveOptions, seconds: float, engine: str = "highs") -> bool:
    """Whether another LP like one that took `seconds` (model build included: it cannot be cut
    short) fits in the time left. PDLP stops on time with a valid bound, so it needs only the
    build and a little solving; HiGHS needs the whole previous time again."""
    left = options.remaining()
    return left is None or left > (0.3 * seconds if engine == "pdlp" else seconds)


def lp_engine(st: Stages, engine: str = "auto") -> str:
    """``auto``: PDLP above PDLP_ABOVE_T stages, where simplex does not finish (module docstring)."""
    if engine == "auto":
        return "pdlp" if st.T > PDLP_ABOVE_T else "highs"
    return engine


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
    engine: str = "auto",
    repairs: int = 0,
    retighten: int = 0,
    bound: bool = False,
) -> Rounding:
    """Steps 1–4 of the module docstring: the cheapest rounded (or repaired) schedule within
    `budget`. With a time limit the first LP gets 40% of the time left (HiGHS cannot be cut
    short mid-presolve, PDLP stops with its current point), the repairs 30% of what remains."""
    out = Rounding()
    st = stages_of(graph, budget)
    tight = stages_of(graph, int(frac * budget))
    tight.capacity = max(tight.capacity, 0)
    engine = lp_engine(st, engine)
    t0 = time.monotonic()
    first_model = lp_model(tight, memory)
    left = options.remaining()
    first = None
    if left is not None:
        # 40% of the time left, but enough to load the model and iterate 10 s when that fits in
        # 70% (RL n1000's PDLP spends ~50 s loading before its clock starts)
        first = 0.4 * left
        need = setup_seconds(first_model.model, engine) * 1.25 + 10.0
        if first < need <= 0.7 * left:
            first = need
    sol = lp_S(first_model, options, engine, time_limit=first)
    out.lp_seconds = time.monotonic() - t0
    if sol.S is None and sol.status == "infeasible" and _time_for_lp(options, out.lp_seconds, engine):
        # the tightened LP can be infeasible where the real budget is not
        if st.capacity >= 0:
            left = options.remaining()
            sol = lp_S(lp_model(st, memory), options, engine, time_limit=None if left is None else 0.5 * left)
            out.infeasible = sol.status == "infeasible"
    out.note = sol.note
    seen: set[bytes] = set()
    over: list[tuple[int, float, np.ndarray, str]] = []  # over-budget roundings: (peak, cost, S, how)

    def consider(S: np.ndarray, how: str) -> None:
        steps = steps_from_S(st, S)
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget and (out.best is None or sim.cost < out.best[0] - 1e-12):
            out.best = (sim.cost, sim.peak_memory, steps, how)
            if report:
                options.incumbent(steps)
                options.progress(elapsed=time.monotonic() - options.started, incumbent=sim.cost)
        elif sim.peak_memory > budget:
            over.append((sim.peak_memory, sim.cost, S, how))
        if out.lowest is None or (sim.peak_memory, sim.cost) < (out.lowest[0], out.lowest[1]):
            out.lowest = (sim.peak_memory, sim.cost, steps, how)

    def round_all(S_star: np.ndarray, label: str) -> None:
        # each rounding is decoded and simulated (~1 s at T = 500, mostly steps_from_sequence):
        # with a time limit the sweep gets a quarter of the time left, the thresholds first
        left = options.remaining()
        stop = None if left is None else time.monotonic() + 0.25 * left
        taus = [round(0.1 * k, 1) for k in range(1, 10)]
        for how, S in round_schedules(st, S_star, taus, roundings, options.seed):
            key = np.packbits(S).tobytes()
            if key in seen:
                continue
            seen.add(key)
            if stop is not None and time.monotonic() >= stop:
                break
            consider(S, how + label)

    if sol.S is not None:
        out.lp_objective = float(sol.objective) if sol.objective is not None else float("nan")
        out.backend = sol.note
        round_all(sol.S, "")
    if bound and st.capacity >= 0 and _time_for_lp(options, out.lp_seconds, engine):
        # the LP at the real budget: its value bounds the fixed-order optimum from below, and its
        # point is one more to round
        left = options.remaining()
        real = lp_S(lp_model(st, memory), options, engine, time_limit=None if left is None else 0.5 * left)
        out.bound = real.bound
        if real.S is not None and out.best is None:
            round_all(real.S, " of the LP at 1×budget")
    if sol.S is not None:
        cur = frac
        for _ in range(retighten):
            # step 4a: no rounding fits — solve the LP again at a budget tightened by the
            # overshoot of the lowest-peak rounding (each re-solve takes as long as the first)
            if (
                out.best is not None
                or out.lowest is None
                or not _time_for_lp(options, out.lp_seconds, "highs")
            ):
                break
            cur *= 0.99 * budget / out.lowest[0]
            tight = stages_of(graph, int(cur * budget))
            if tight.capacity < 0:
                break
            left = options.remaining()
            again = lp_S(
                lp_model(tight, memory), options, engine, time_limit=None if left is None else 0.5 * left
            )
            if again.S is None:
                break
            round_all(again.S, f" of the LP at {cur:.3f}×budget")
    if repairs > 0 and st.capacity >= 0:
        _repair(st, graph, budget, options, out, over, repairs, consider, lp_ok=sol.S is not None)
    return out


def _repair(
    st: Stages,
    graph: Graph,
    budget: int,
    options: SolveOptions,
    out: Rounding,
    over: list[tuple[int, float, np.ndarray, str]],
    repairs: int,
    consider: Any,
    lp_ok: bool,
) -> None:
    """Step 4: greedy repair + local search of the over-budget roundings nearest the budget (or
    of the baseline when the LP gave no point), sharing half the time left (30 s
    without a limit)."""
    left = options.remaining()
    total = 30.0 if left is None else 0.5 * left
    cands: list[tuple[np.ndarray, str]] = []
    best_cost = out.best[0] if out.best is not None else float("inf")
    for _, cost, S, how in sorted(over, key=lambda c: (c[0], c[1])):
        if cost < best_cost - 1e-12 and len(cands) < repairs:
            cands.append((S, how))
    if not lp_ok or out.best is None:
        base = S_from_steps(st, baseline_steps(graph))
        if base is not None:
            cands.append((base, "baseline"))
    end = time.monotonic() + total
    for n, (S, how) in enumerate(cands):
        # time a candidate leaves unused goes to the next ones
        deadline = time.monotonic() + max(end - time.monotonic(), 0.0) / (len(cands) - n)
        fixed = greedy_repair_S(st, S, budget, deadline, max_moves=REPAIR_MOVES)
        if fixed is None:
            continue
        fixed = improve_S(st, fixed, budget, max(deadline, time.monotonic() + 0.05 * total))
        consider(fixed, f"{how} + greedy repair")
