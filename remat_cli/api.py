"""remat as a Python library, for toolchains that should not shell out to the CLI.

    from remat_cli import load_graph, simulate, solve

    graph = load_graph("model.onnx", batch=8)          # ONNX, remat-graph or node-link JSON
    schedule = solve(graph, "70%", solver="fastsa", time_limit=30)
    print(schedule.summary.peak_memory, simulate(graph, schedule).recomputations)

The same checks as ``remat solve`` / ``validate``: bad input raises :class:`InputError`, whose
text is the line the CLI prints after ``remat: error:`` (exit 2); a solve that finds nothing
within the budget raises :class:`NoSchedule` (the CLI's exit 1). Every schedule returned has
been replayed by the simulator. Nothing here prints; an ONNX model older than opset 13 is
upgraded with an :class:`~remat_cli.importers.notes.OpsetUpgraded` warning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from remat_cli import registry
from remat_cli.budget import BudgetError, parse_budget
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph, GraphError
from remat_cli.importers import load_graph as _load_any
from remat_cli.schedule import (
    Schedule,
    ScheduleError,
    SimResult,
    Step,
    baseline,
    check_hint,
    peak_lower_bound,
)
from remat_cli.schedule import simulate as _simulate
from remat_cli.solver import OptionError, SolveOptions

__all__ = ["InputError", "NoSchedule", "budget_bytes", "load_graph", "simulate", "solve", "user_message"]


class InputError(ValueError):
    """Bad input: a graph, budget, solver, option or schedule the CLI would reject with exit 2.
    ``str(e)`` is the CLI's message."""


class NoSchedule(RuntimeError):
    """No schedule within the budget was found (the CLI's exit 1). ``schedule`` is the best one
    the solver returned when it is over the budget, else None."""

    def __init__(self, message: str, schedule: Schedule | None = None) -> None:
        super().__init__(message)
        self.schedule = schedule


def user_message(e: BaseException) -> str | None:
    """The one-line message for an error a user causes, or None when it is not one (a bug)."""
    if isinstance(e, (InputError, GraphError, BudgetError, ScheduleError, OptionError)):
        return str(e)
    if isinstance(e, registry.UnknownSolver):  # a KeyError: str() would add quotes
        return str(e.args[0])
    if isinstance(e, ValidationError):
        first = e.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        msg = str(first.get("msg", e)).removeprefix("Value error, ")  # pydantic's wrapping of ours
        return f"{where}: {msg}" if where else msg
    return None


@contextmanager
def _as_input_error() -> Iterator[None]:
    try:
        yield
    except InputError:
        raise
    except Exception as e:
        message = user_message(e)
        if message is None:
            raise
        raise InputError(message) from e


def load_graph(
    path: str | Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    cost: str = "flops",
) -> Graph:
    """ONNX, remat-graph JSON or networkx node-link JSON, detected from the content.

    The ONNX options are the CLI's ``--input-shape NAME=DIMS`` (``{"NAME": [1, 3, 224, 224]}``),
    ``--batch`` and ``--cost flops|unit|profile``."""
    options: dict[str, Any] = {"cost": cost}
    if input_shapes:
        options["input_shapes"] = {k: list(v) for k, v in input_shapes.items()}
    if batch is not None:
        options["batch"] = batch
    with _as_input_error():
        return _load_any(path, **options)


def budget_bytes(graph: Graph, budget: int | str) -> int:
    """`budget` in bytes: an int, or text as on the command line ("4GB", "3.5GiB", "80%").
    A budget below the peak any schedule needs is an InputError."""
    with _as_input_error():
        value = parse_budget(str(budget), baseline(graph).peak_memory)
    bound = peak_lower_bound(graph)
    if value < bound:
        raise InputError(
            f"budget {value:,} B is below what any schedule can reach "
            f"(lower bound {bound:,} B: resident bytes + largest working set or graph outputs)"
        )
    return value


def default_solver() -> str:
    """The CLI's default: the ``auto`` portfolio where it is registered, else ``greedy``."""
    return "auto" if "auto" in registry.names() else "greedy"


def solve(
    graph: Graph | str | Path,
    budget: int | str,
    *,
    solver: str | None = None,
    time_limit: float | None = None,
    seed: int = 0,
    workers: int | None = None,
    hint: Schedule | Sequence[Step] | None = None,
    **params: Any,
) -> Schedule:
    """A schedule for `graph` (a Graph or a file) whose peak is within `budget`.

    `solver` is a registry name (``remat solvers``; default :func:`default_solver`); `params`
    are its options by their Python names (``max_copies=3`` for ``--max-copies 3``).
    Raises InputError for bad input, NoSchedule when nothing within the budget was found.
    """
    if not isinstance(graph, Graph):
        graph = load_graph(graph)
    name = solver or default_solver()
    with _as_input_error():
        s = registry.get(name)
    spec = {p.name: p for p in s.params}
    for key, value in params.items():
        p = spec.get(key)
        if p is None:
            known = ", ".join(spec) or "none"
            raise InputError(f"unknown option {key!r} for solver {name!r} (its options: {known})")
        try:
            p.check(value)  # its type, choices and range, as the command line checks them
        except OptionError as e:
            raise InputError(str(e)) from None
    state, reason = s.availability()
    if state != "available":
        raise InputError(f"solver {name!r} is unavailable: {reason}")
    why_not = s.supports(graph)
    if why_not is not None:
        raise InputError(f"solver {name!r} does not apply to this graph: {why_not}")
    limit = budget_bytes(graph, budget)
    hint_steps = None
    if hint is not None:
        hint_steps = list(hint.steps if isinstance(hint, Schedule) else hint)
        with _as_input_error():
            check_hint(graph, hint_steps)  # a hint for another graph is bad input
    options = SolveOptions(time_limit=time_limit, seed=seed, hint=hint_steps, params=dict(params))
    if workers is not None:
        options.workers = workers
    schedule, result = run_solver(graph, limit, name, options)
    if schedule is None:
        peak = f"; lowest peak reached {result.best_peak:,} B" if result.best_peak else ""
        raise NoSchedule(
            f"no schedule within {limit:,} B found by {name} ({result.status}{peak}; "
            f"lower bound {peak_lower_bound(graph):,} B){': ' + result.message if result.message else ''}"
        )
    if schedule.solver.status == "infeasible":
        raise NoSchedule(
            f"no schedule within {limit:,} B found by {name}: lowest peak reached "
            f"{schedule.summary.peak_memory:,} B (lower bound {peak_lower_bound(graph):,} B)",
            schedule,
        )
    return schedule


def simulate(graph: Graph, schedule: Schedule | Sequence[Step]) -> SimResult:
    """Replay `schedule` (a Schedule or its steps) on `graph` by the simulator's rules: peak
    memory, cost, recomputations. An invalid schedule is an InputError saying why."""
    steps = schedule.steps if isinstance(schedule, Schedule) else schedule
    with _as_input_error():
        return _simulate(graph, steps)
