"""xengine: rematerialization across devices (Schuler et al., XEngine, ACM TACO 2023).

Each operator (and each recomputation) runs on one of several devices, each with its own memory
budget; moving a tensor between devices is an explicit copy with its own cost. The modules follow
the paper: :mod:`.problem` (§3.1, the stages with a device index), :mod:`.milp` (§3.2, the model
made sound), :mod:`.baselines` (§4.1, Checkmate-like single-device schedules on each device) and
:mod:`.placement` (beyond the paper: a device-placement local search for graphs the MILP cannot
take). The solver runs the single-device baselines (and greedy at relaxed budgets, whose
sequences may fit once spread over the devices), improves the best by placement, and — when
the graph has at most ``milp_max_stages`` needed nodes — solves the MILP warm-started from the
best single-device schedule; it returns the cheapest schedule within every device's budget, so
never one worse than the best single device.

A graph without devices is solved as one device (then this is Checkmate's space, solved by the
same MILP with D = 1, and the steps carry no device).
"""

from __future__ import annotations

import time
from typing import Any

from remat_cli.devices import simulate_devices
from remat_cli.graph import Graph, GraphError
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.milp.engine import available_backends
from remat_cli.schedule import Step
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.xengine.baselines import (
    Candidate,
    decision_of_single,
    infeasible_operator,
    single_device_candidates,
)
from remat_cli.solvers.xengine.milp import build, decision_of, steps_of, vector_of
from remat_cli.solvers.xengine.placement import improve_placement, steps_from_placement
from remat_cli.solvers.xengine.problem import problem_of

PAPER = "Schuler, Membarth, Slusallek, XEngine, ACM TACO 20(1) 2023, §3 (MIQP made sound)"
ONE_DEVICE = "device"


def with_one_device(graph: Graph) -> Graph:
    data = graph.model_dump(exclude_none=True, by_alias=True)
    data["devices"] = [{"id": ONE_DEVICE}]
    return Graph(**data)


class XEngine(Solver):
    name = "xengine"
    method = "multi-device rematerialization: per-device MILP over Checkmate's stages + placement search"
    paper = PAPER
    multi_device = True
    params = (
        Param("method", str, "auto", "auto (MILP when small enough), milp, or heuristic (placement only)",
              choices=("auto", "milp", "heuristic")),
        Param("backend", str, "auto", "MILP engine (auto: gurobi when licensed, else highs)",
              choices=("auto", "highs", "scip", "cpsat", "gurobi")),
        Param("milp_max_stages", int, 60, "auto uses the MILP up to this many needed nodes", low=0, high=100000),
        Param("rel_gap", float, 1e-4, "relative MIP gap at which the MILP stops", low=0, high=1),
        Param("single", str, "auto", "single-device solvers for the baselines (comma list; auto: "
              "checkpoint-all, greedy, and checkmate up to milp_max_stages nodes)"),
    )  # fmt: skip

    def availability(self) -> tuple[str, str]:  # type: ignore[override]
        if any(ok for ok, _ in available_backends().values()):
            return "available", ""
        return "missing engine", "no MILP engine (ortools) installed"

    def notes(self) -> str:
        return (
            "costs are sequential (compute + copy, no overlap); the MILP is O(D²T²) binaries, "
            "the placement search takes 1,000+ nodes; never worse than the best single device"
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        t0 = time.monotonic()
        p = options.params
        wrapped = not graph.devices
        g = with_one_device(graph) if wrapped else graph
        budgets = dict(options.budgets) if options.budgets and not wrapped else None
        budgets = budgets or dict.fromkeys(g.device_model.ids, budget)
        params: dict[str, Any] = {k: p[k] for k in ("method", "backend", "milp_max_stages", "rel_gap")}
        limit = options.time_limit
        deadline = t0 + (limit if limit is not None else 3600.0)

        def share(fraction: float, default: float) -> float:
            left = deadline - time.monotonic()
            return max(0.0, min(left, fraction * limit if limit is not None else default))

        why = infeasible_operator(g, budgets)
        if why is not None:
            return SolverResult(steps=None, status="infeasible", params=params, message=why)
        T = len(g.needed_nodes)
        use_milp = p["method"] == "milp" or (p["method"] == "auto" and T <= int(p["milp_max_stages"]))
        notes: list[str] = []
        singles = single_device_candidates(
            g, budgets, options, str(p["single"]), int(p["milp_max_stages"]), share(0.3, 30.0), notes
        )
        feasible = [c for c in singles if c.over == 0]
        best: Candidate | None = min(feasible, key=lambda c: c.cost) if feasible else None
        if best is not None:
            params["best_single_device_cost"] = best.cost
            params["best_single_device"] = best.device
        for c in singles:
            params[f"single_cost_{c.device}"] = min(
                [x.cost for x in singles if x.device == c.device and x.over == 0] or [None],  # type: ignore[list-item]
                key=lambda v: v if v is not None else float("inf"),
            )
        heur_deadline = time.monotonic() + share(0.25 if use_milp else 0.9, 20.0 if use_milp else 600.0)
        best = _placement_search(g, singles, budgets, best, heur_deadline)
        status = "feasible"
        bound = None
        backend = None
        if use_milp and T > 0:
            milp = _milp(
                g, budgets, feasible, p, options, deadline if limit is not None else None, notes, best
            )
            if isinstance(milp, SolverResult):
                milp.params = params
                return milp
            best, status, bound, backend = milp
        if best is None:
            return SolverResult(
                steps=None,
                status="unknown",
                backend=backend,
                params=params,
                message="no schedule within every device's budget found"
                + (f"; {'; '.join(notes)}" if notes else ""),
            )
        steps = best.steps if best.steps is not None else steps_from_placement(g, best.seq, best.dev)
        sim = simulate_devices(g, steps)
        params["copies"] = sim.copies
        if status == "optimal" and bound is None:
            bound = sim.cost
        if wrapped:
            steps = [Step(op=s.op, node=s.node, value=s.value) for s in steps]
        options.incumbent(steps)
        return SolverResult(
            steps=steps,
            status=status,  # type: ignore[arg-type]
            backend=backend,
            objective=sim.cost,
            lower_bound=min(bound, sim.cost) if bound is not None else None,
            params=params,
            message=f"schedule from {best.device}" + (f"; {'; '.join(notes)}" if notes else ""),
        )


def _placement_search(
    g: Graph, singles: list[Candidate], budgets: dict[str, int], best: Candidate | None, heur_deadline: float
) -> Candidate | None:
    """The placement search (§3.3) from the best single-device schedules (the over-budget and
    relaxed ones too, whose search minimises the overflow first), each start an equal share of
    the time: one slow search must not starve the others (the search is time-bound on graphs of
    hundreds of nodes). The best plain start when one is within budget, besides the best relaxed
    one (a better sequence, often); else the relaxed ones, as the plain ones then rarely get
    within budget. Searches that stop early (a local optimum) leave time to the other candidates
    in turn. Returns the cheapest candidate within every budget."""
    ranked = sorted(singles, key=lambda c: (c.over, c.cost))
    plain = [c for c in ranked if not c.relaxed]
    relaxed = [c for c in ranked if c.relaxed]
    if plain and plain[0].over == 0:
        first = plain[:1] + relaxed[:1]
    else:
        first = relaxed[:2] or plain[:2]
    starts = first + [c for c in ranked if all(c is not f for f in first)]
    for k, c in enumerate(starts):
        slice_end = time.monotonic() + (heur_deadline - time.monotonic()) / max(len(first) - k, 1)
        dev, over, cost = improve_placement(g, c.seq, c.dev, budgets, slice_end)
        if over == 0 and (best is None or cost < best.cost - 1e-12):
            best = Candidate(device="placement", seq=c.seq, dev=dev, over=0.0, cost=cost)
        if time.monotonic() >= heur_deadline:
            break
    return best


def _milp(
    g: Graph,
    budgets: dict[str, int],
    feasible: list[Candidate],
    p: dict[str, Any],
    options: SolveOptions,
    deadline: float | None,
    notes: list[str],
    best: Candidate | None,
) -> tuple[Candidate | None, str, float | None, str | None] | SolverResult:
    """The per-device MILP over Checkmate's stages (§3.2), hinted with the cheapest single-device
    schedule it can express: (best candidate, status, bound, backend), or the result when it
    proves no schedule fits and nothing else was found."""
    prob = problem_of(g, budgets)
    xm = build(prob)
    hint = None
    for c in sorted(feasible, key=lambda c: c.cost):
        dec = decision_of_single(prob, c)
        if dec is not None:
            x0 = vector_of(xm, dec)
            if xm.model.violation(x0) <= 1e-6:
                hint = x0
                break
    settings = EngineSettings(
        backend="highs" if p["backend"] == "auto" else str(p["backend"]),
        auto_order=("gurobi", "highs", "scip", "cpsat"),
        time_limit=max(deadline - time.monotonic(), 1.0) if deadline is not None else None,
        threads=options.workers,
        seed=options.seed,
        rel_gap=float(p["rel_gap"]),
        hint=hint,
    )
    res = milp_solve(xm.model, settings)
    backend = res.backend
    bound = xm.real(res.bound)
    status = "feasible"
    notes.append(f"MILP {res.status} ({xm.model.num_vars} variables, {res.backend})")
    if res.x is not None:
        steps = steps_of(prob, decision_of(xm, res.x))
        sim = simulate_devices(g, steps)
        over = any(sim.peak_by_device[d] > budgets[d] for d in budgets)  # type: ignore[index]
        if over:
            notes.append("the MILP's schedule exceeds a budget by a tolerance; not used")
        elif best is None or sim.cost <= best.cost + 1e-9 * max(1.0, abs(best.cost)):
            best = Candidate(device="milp", seq=[], dev=[], over=0.0, cost=sim.cost, steps=steps)
            status = "optimal" if res.status == "optimal" else "feasible"
    elif res.status == "infeasible" and best is None:
        return SolverResult(
            steps=None, status="infeasible", backend=backend,
            message="the MILP proves no schedule of this stage space fits the budgets",
        )  # fmt: skip
    return best, status, bound, backend


__all__ = ["XEngine", "GraphError"]
