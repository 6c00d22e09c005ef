"""MODeL §4.5: how every CP-SAT model of this package (§4.2 order, §4.3 addresses, §4.4 joint) is run.

One place for the solver's limits and for reading what it found, so the three programs stop and
report alike: a time limit of at least 50 ms, at least one worker, a fixed seed, the relative gap
at which to stop (`--gap`), and a solution only when CP-SAT has a feasible one.
"""

from __future__ import annotations

from collections.abc import Sequence

from ortools.sat.python import cp_model


def run(
    m: cp_model.CpModel, time_limit: float, workers: int, seed: int, gap: float = 0.0
) -> tuple[cp_model.CpSolver, bool] | None:
    """Solve `m`: (the solver, to read values from; proven optimal), or None without a solution.
    Stops once (objective - bound) <= gap x objective; "proven optimal" still means a zero gap."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(0.05, time_limit)
    solver.parameters.relative_gap_limit = gap
    solver.parameters.num_workers = max(1, workers)
    solver.parameters.random_seed = seed
    status = solver.solve(m)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    proven = status == cp_model.OPTIMAL and solver.best_objective_bound >= solver.objective_value
    return solver, proven


def offsets(solver: cp_model.CpSolver, a_vars: Sequence[cp_model.IntVar | None], alignment: int) -> list[int]:
    """The addresses A_e in bytes from their variables in units of `alignment` (None: an empty tensor, 0)."""
    return [0 if a is None else solver.value(a) * alignment for a in a_vars]
