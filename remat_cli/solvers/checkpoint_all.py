"""checkpoint-all: the baseline itself — run `order`, keep everything until its last use,
never recompute (DESIGN.md §2, "Baseline")."""

from __future__ import annotations

from remat_cli.graph import Graph
from remat_cli.schedule import baseline_steps
from remat_cli.solver import SolveOptions, Solver, SolverResult


class CheckpointAll(Solver):
    name = "checkpoint-all"
    method = "no rematerialization (baseline)"
    paper = "—"

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        return SolverResult(steps=baseline_steps(graph), status="feasible")
