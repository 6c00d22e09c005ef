"""checkpoint-all: the baseline itself — run `order`, keep everything until its last use,
never recompute (docs/FORMATS.md §2, "Baseline")."""

from __future__ import annotations

from remat_cli.graph import Graph
from remat_cli.schedule import baseline_steps, simulate
from remat_cli.solver import SolveOptions, Solver, SolverResult


class CheckpointAll(Solver):
    """The baseline as a solver: the reference every overhead is measured against."""

    name = "checkpoint-all"
    method = "no rematerialization (baseline)"
    paper = "—"

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """The baseline schedule: "feasible" when its peak fits `budget`, else "infeasible" with
        the baseline's steps and its peak as `best_peak` (the only schedule this solver knows)."""
        steps = baseline_steps(graph)
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget:
            return SolverResult(steps=steps, status="feasible", objective=sim.cost)
        return SolverResult(steps=steps, status="infeasible", objective=sim.cost, best_peak=sim.peak_memory)
