"""How a CP-SAT model is run: MODeL's (Steiner et al., ICML 2023) §4.2 order, §4.3 addresses
(`remat_cli.planning.addresses`) and §4.4 joint programs, solved as §4.5 describes.

One place for the solver's limits and for reading what it found, so the three programs stop and
report alike: a time limit of at least 50 ms, at least one worker, a fixed seed, the relative gap
at which to stop (`--gap`), and a solution only when CP-SAT has a feasible one.

A stall limit (not in the paper; the paper's Gurobi runs stop on the gap or the time limit only)
ends a search that no longer improves: the model is solved in rounds of `stall` units of CP-SAT's
deterministic time, each warm-started from the best solution so far, and the rounds end after one
without a smaller objective. Deterministic time, not the wall clock, so that a seed with one
worker gives the same result twice. Without it, a full address or order model on a large step
spends most of its time limit after its last improvement, time that the placement's repair
search then lacks.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ortools.sat.python import cp_model


def run(
    m: cp_model.CpModel,
    time_limit: float,
    workers: int,
    seed: int,
    gap: float = 0.0,
    stall: float | None = None,
    incumbent: float | None = None,
) -> tuple[cp_model.CpSolver, bool, float] | None:
    """Solve `m`: (the solver of the best round, to read values from; proven optimal; the best
    bound of all rounds), or None without a solution.
    Stops once (objective - bound) <= gap x objective; "proven optimal" still means a zero gap.
    `stall`: rounds of that much deterministic time while each improves (module docstring) on the
    last, the first on `incumbent` (the warm start's objective) when given."""
    deadline = time.monotonic() + max(0.05, time_limit)
    best: cp_model.CpSolver | None = None
    bound = float("-inf")
    rounds = 0
    while True:
        solver = cp_model.CpSolver()
        solver.parameters.max_time_in_seconds = max(0.05, deadline - time.monotonic())
        solver.parameters.relative_gap_limit = gap
        solver.parameters.num_workers = max(1, workers)
        solver.parameters.random_seed = seed + rounds
        if stall is not None:
            solver.parameters.max_deterministic_time = stall
        status = solver.solve(m)
        rounds += 1
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            break
        bound = max(bound, solver.best_objective_bound)
        last = incumbent if best is None else best.objective_value
        improved = last is None or solver.objective_value < last
        if best is None or solver.objective_value < best.objective_value:
            best = solver
        if (
            stall is None
            or status == cp_model.OPTIMAL
            or not improved
            or best.objective_value - bound <= gap * abs(best.objective_value)
            or time.monotonic() >= deadline
        ):
            break
        _hint(m, best)
    if best is None:
        return None
    return best, bound >= best.objective_value, bound


def _hint(m: cp_model.CpModel, solver: cp_model.CpSolver) -> None:
    """The whole of `solver`'s solution as `m`'s hint, for the next round."""
    values = list(solver.response_proto.solution)
    m.clear_hints()
    m.proto.solution_hint.vars.extend(range(len(values)))
    m.proto.solution_hint.values.extend(values)


def offsets(solver: cp_model.CpSolver, a_vars: Sequence[cp_model.IntVar | None], alignment: int) -> list[int]:
    """The addresses A_e in bytes from their variables in units of `alignment` (None: an empty tensor, 0)."""
    return [0 if a is None else solver.value(a) * alignment for a in a_vars]
