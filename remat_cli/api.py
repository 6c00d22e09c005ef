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

    ``str(e)`` is the one line the CLI prints after ``remat: error:``. Every function of this
    module raises it, rather than the library's own errors (GraphError, BudgetError,
    ScheduleError, OptionError, pydantic's ValidationError), which it chains as ``__cause__``.

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> graph = generators.linear(5, seed=1)
    >>> try:
    ...     budget_bytes(graph, "lots")
    ... except InputError as e:
    ...     print(e)
    cannot parse budget 'lots' (examples: 4GB, 3.5GiB, 80%, 1000000)
    """


class NoSchedule(RuntimeError):
    """No schedule within the budget was found (the CLI's exit 1).

    Parameters
    ----------
    message : str
        What was tried: the budget, the solver, the lowest peak reached and the lower bound.
    schedule : Schedule or None, optional
        The best schedule the solver returned when it is over the budget (simulated, so its
        ``summary.peak_memory`` is its real peak), else None. Kept as ``self.schedule``.

    Examples
    --------
    Chen's sqrt(n) checkpoints cannot bring this chain down to 80% of its peak:

    >>> from remat_cli.importers import generators
    >>> graph = generators.linear(5, seed=1)
    >>> try:
    ...     solve(graph, "80%", solver="chen-sqrtn")
    ... except NoSchedule as e:
    ...     print(e.schedule.summary.peak_memory > e.schedule.budget)
    True
    """

    def __init__(self, message: str, schedule: Schedule | None = None) -> None:
        super().__init__(message)
        self.schedule = schedule


def user_message(e: BaseException) -> str | None:
    """The one-line message for an error a user causes, or None when it is not one (a bug).

    The CLI prints it after ``remat: error:`` and exits 2; anything else is an internal error.

    Parameters
    ----------
    e : BaseException
        The error.

    Returns
    -------
    str or None
        The message, without the quotes a KeyError adds and without pydantic's wrapping.

    Examples
    --------
    >>> from remat_cli.solver import OptionError
    >>> user_message(OptionError("--seed: 'x' is not a valid int"))
    "--seed: 'x' is not a valid int"
    >>> user_message(ZeroDivisionError("division by zero")) is None
    True
    """
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
    """Read a graph: ONNX, remat-graph JSON or networkx node-link JSON, detected from the content.

    The same importers as ``remat solve GRAPH``; an ONNX training graph becomes one node per
    operator, its weights resident and its activations the values a schedule frees and recomputes.

    Parameters
    ----------
    path : str or Path
        The file to read.
    input_shapes : mapping of str to sequence of int, optional
        ONNX only: the shape of each named graph input whose dimensions are symbolic, as the
        CLI's ``--input-shape NAME=DIMS`` (``{"input": [1, 3, 224, 224]}``).
    batch : int, optional
        ONNX only: the value of a symbolic batch dimension (``--batch``).
    cost : {"flops", "unit", "profile"}, default "flops"
        ONNX only: each node's cost model (``--cost``).

    Returns
    -------
    Graph
        The validated graph.

    Raises
    ------
    InputError
        The file is missing or unreadable, in no known format, or not a valid graph.

    Examples
    --------
    >>> import pathlib, tempfile
    >>> from remat_cli.importers import generators
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "chain.json"
    >>> _ = path.write_text(generators.linear(5, seed=1).to_json())
    >>> graph = load_graph(path)
    >>> graph.name, len(graph.nodes)
    ('linear_n5_s1', 11)
    >>> load_graph(path.with_name("missing.json"))
    Traceback (most recent call last):
    ...
    remat_cli.api.InputError: cannot read ...missing.json: No such file or directory
    """
    options: dict[str, Any] = {"cost": cost}
    if input_shapes:
        options["input_shapes"] = {k: list(v) for k, v in input_shapes.items()}
    if batch is not None:
        options["batch"] = batch
    with _as_input_error():
        return _load_any(path, **options)


def budget_bytes(graph: Graph, budget: int | str) -> int:
    """A memory budget in bytes, from bytes or from text as on the command line.

    Parameters
    ----------
    graph : Graph
        The graph the budget is for: a percentage is of its peak without rematerialization.
    budget : int or str
        Bytes, or text: ``"4GB"``, ``"3.5GiB"``, ``"80%"``, ``"1000000"``.

    Returns
    -------
    int
        The budget in bytes.

    Raises
    ------
    InputError
        The text does not parse, or the budget is below the peak any schedule needs (resident
        bytes plus the largest working set or the graph outputs).

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> graph = generators.linear(5, seed=1)  # peak 36,000 B without rematerialization
    >>> budget_bytes(graph, "80%")
    28800
    >>> budget_bytes(graph, 30_000)
    30000
    >>> budget_bytes(graph, "10%")
    Traceback (most recent call last):
    ...
    remat_cli.api.InputError: budget 3,600 B is below what any schedule can reach (lower bound 23,000 B: ...)
    """
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
    """A schedule for `graph` whose peak is within `budget`, as ``remat solve`` computes it.

    The schedule returned has been replayed by the simulator: its ``summary`` (peak memory,
    cost, overhead, recomputations) is the simulator's, not the solver's claim.

    Parameters
    ----------
    graph : Graph, str or Path
        The graph, or a file that :func:`load_graph` reads.
    budget : int or str
        Bytes, or text as on the command line (:func:`budget_bytes`).
    solver : str, optional
        A registry name (``remat solvers``); default :func:`default_solver`.
    time_limit : float, optional
        Seconds; None leaves the solver's own stopping rule.
    seed : int, default 0
        The seed of randomised solvers: with one worker the same seed gives the same schedule.
    workers : int, optional
        Threads or processes the solver may use; default the cores this process may run on.
    hint : Schedule or sequence of Step, optional
        A schedule of the same graph to warm-start from.
    **params
        The solver's own options by their Python names (``max_copies=3`` for
        ``--max-copies 3``), checked against its declared :class:`~remat_cli.solver.Param`.

    Returns
    -------
    Schedule
        A schedule whose simulated peak is at most the budget.

    Raises
    ------
    InputError
        Bad input: the graph, the budget, an unknown or unavailable solver, one that does not
        apply to the graph, an unknown option or a value out of its range, a hint for another
        graph.
    NoSchedule
        The solver found nothing within the budget; ``e.schedule`` is its best over-budget
        schedule, if it returned one.

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> graph = generators.linear(5, seed=1)
    >>> schedule = solve(graph, "80%", solver="chen-greedy")
    >>> schedule.budget, schedule.summary.peak_memory <= schedule.budget
    (28800, True)
    >>> schedule.summary.recomputations > 0
    True
    >>> solve(graph, "80%", solver="chen-greedy", no_such=1)
    Traceback (most recent call last):
    ...
    remat_cli.api.InputError: unknown option 'no_such' for solver 'chen-greedy' (its options: ...)
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
    """Replay a schedule on `graph` by the simulator's rules (docs/FORMATS.md).

    Parameters
    ----------
    graph : Graph
        The graph the schedule is for.
    schedule : Schedule or sequence of Step
        The schedule, or its steps.

    Returns
    -------
    SimResult
        Peak memory, total compute cost and recomputations of the steps, as measured by replay.

    Raises
    ------
    InputError
        The steps are not a valid schedule of `graph`: the message names the first bad step.

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> graph = generators.linear(5, seed=1)
    >>> schedule = solve(graph, "80%", solver="chen-greedy")
    >>> result = simulate(graph, schedule)
    >>> result.peak_memory == schedule.summary.peak_memory, result.cost == schedule.summary.cost
    (True, True)
    >>> simulate(graph, schedule.steps[1:])
    Traceback (most recent call last):
    ...
    remat_cli.api.InputError: step 0: computing 'f1' needs 'a0', which is not live
    """
    steps = schedule.steps if isinstance(schedule, Schedule) else schedule
    with _as_input_error():
        return _simulate(graph, steps)
