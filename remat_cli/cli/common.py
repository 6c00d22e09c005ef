"""What every `remat` command shares: exit codes, one-line errors, atomic output, graph and
schedule reading, budgets.

Every command module of this package imports from here; nothing here imports a
command, so the imports only point downward.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import sys
import tempfile
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console

from remat_cli import registry
from remat_cli.api import InputError, budget_bytes, user_message
from remat_cli.budget import BudgetError
from remat_cli.devices import resolve_device_budgets
from remat_cli.execution.cost_bound import MAX_NODES, CostBound, cost_lower_bound
from remat_cli.execution.exit_codes import EXIT_BAD_INPUT, EXIT_INFEASIBLE, EXIT_INTERNAL, EXIT_READER_GONE
from remat_cli.execution.runner import SolverBug
from remat_cli.graph import Graph, GraphError
from remat_cli.importers import load_graph
from remat_cli.importers.notes import ImportNote
from remat_cli.schedule import Schedule, ScheduleError, baseline
from remat_cli.solver import OptionError, Param, Solver
from remat_cli.util.files import in_place, to_devnull, write_atomic


class ReaderGone:
    """stderr that outlives its reader. Human output is a courtesy: where stderr is a pipe whose
    reader has quit (``remat solve g.onnx -b 50% -o s.json 2>&1 | head -1``), a write raised
    BrokenPipeError in the summary and the schedule file was never written (exit 1). On the
    first broken pipe the descriptor is pointed at /dev/null, and the command carries on."""

    def __init__(self, stream: Any):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return int(self._stream.write(text))
        except BrokenPipeError:
            self._silence()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._silence()

    def _silence(self) -> None:
        # the buffered text that failed is dropped with the descriptor's new target: the
        # interpreter's own flush at exit then succeeds too
        with contextlib.suppress(OSError, ValueError):
            to_devnull(self._stream.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def guard_stderr() -> None:
    """Install :class:`ReaderGone` as ``sys.stderr`` (once per process)."""
    if not isinstance(sys.stderr, ReaderGone) and sys.stderr is not None:
        sys.stderr = ReaderGone(sys.stderr)  # type: ignore[assignment]


# Logs and pipelines get wide tables; a terminal keeps its own width.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)
F = TypeVar("F", bound=Callable[..., Any])


class BadInput(click.ClickException):
    """One line on stderr, exit 2."""

    exit_code = EXIT_BAD_INPUT

    def show(self, file: Any = None) -> None:
        click.echo(f"remat: error: {self.message}", err=True)


def fail(message: str, code: int = EXIT_INFEASIBLE, exit: Callable[[int], Any] = sys.exit) -> NoReturn:
    click.echo(f"remat: {message}", err=True)
    exit(code)
    raise SystemExit(code)  # for an `exit` that returns


def friendly_errors(fn: F) -> F:
    """Turn the errors users cause into one line and exit 2; anything else is our bug (exit 3)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (
            InputError,
            GraphError,
            BudgetError,
            ScheduleError,
            registry.UnknownSolver,
            OptionError,
            ValidationError,
        ) as e:
            raise BadInput(user_message(e) or str(e)) from None
        except SolverBug as e:
            fail(f"internal error: {e}", EXIT_INTERNAL)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except BrokenPipeError:
            if not stdout_reader_gone():
                raise
            # `remat solve ... | head -1`: the reader has what it wanted; end quietly with the
            # status a process killed by SIGPIPE has (Python ignores the signal), not as our bug
            to_devnull(sys.stdout.fileno())
            sys.exit(EXIT_READER_GONE)
        except Exception as e:  # noqa: BLE001 - a user never sees a traceback
            if os.environ.get("REMAT_DEBUG"):
                raise
            fail(
                f"internal error: {type(e).__name__}: {e} (set REMAT_DEBUG=1 for a traceback)", EXIT_INTERNAL
            )

    return wrapper  # type: ignore[return-value]


def stdout_reader_gone() -> bool:
    """Whether stdout is a pipe whose reader has closed it (poll reports an error on it)."""
    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(event & select.POLLERR for _, event in poller.poll(0))
    except (OSError, ValueError, AttributeError):
        return False


def check_writable(output: str | None) -> None:
    """Before a long solve: fail now, not after it, when the output cannot be written."""
    if output is None or output == "-":
        return
    if in_place(output):
        if not os.access(output, os.W_OK):
            raise BadInput(f"cannot write {output}: Permission denied")
        return
    folder = Path(os.path.realpath(output)).parent
    if not folder.is_dir():
        raise BadInput(f"cannot write {output}: No such file or directory")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise BadInput(f"cannot write {output}: Permission denied")


def emit(text: str, output: str | None) -> None:
    if output is None or output == "-":
        click.echo(text)
        return
    try:
        write_atomic(output, text)
    except OSError as e:  # a missing folder, no permission, a full disk: the user's to fix
        raise BadInput(f"cannot write {output}: {e.strerror or e}") from None


def human_bytes(n: float | None) -> str:
    if n is None:
        return "—"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1000
    return str(n)


# ---- graph loading shared by the commands ----
def graph_options(fn: F) -> F:
    fn = click.option(
        "--input-shape",
        "input_shapes",
        multiple=True,
        metavar="NAME=DxDx...",
        help="ONNX: fix an input's symbolic shape, e.g. input=1x3x224x224 (repeatable).",
    )(fn)
    fn = click.option("--batch", type=int, default=None, help="ONNX: value for a symbolic batch dimension.")(
        fn
    )
    fn = click.option(
        "--cost",
        type=click.Choice(["flops", "unit", "profile"]),
        default="flops",
        show_default=True,
        help="ONNX: node cost model (analytic FLOPs, 1 per node, or measured with onnxruntime).",
    )(fn)
    return fn


#: the input path that stands for stdin, as ``-o -`` stands for stdout
STDIN = "-"


def read_graph(
    path: str, input_shapes: tuple[str, ...] = (), batch: int | None = None, cost: str = "flops"
) -> Graph:
    """A graph file of any format :func:`load_graph` reads; ``-`` reads it from stdin
    (``remat convert model.onnx | remat solve - --budget 50%``)."""
    if path == STDIN:
        # the ONNX importer reads a path (and its folder, for external data): a private copy
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder, "stdin")
            copy.write_bytes(sys.stdin.buffer.read())
            try:
                return read_graph(str(copy), input_shapes, batch, cost)
            except (InputError, GraphError) as e:
                raise BadInput((user_message(e) or str(e)).replace(str(copy), "stdin")) from None
    shapes: dict[str, list[int]] = {}
    for spec in input_shapes:
        name, sep, dims = spec.rpartition("=")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.lower().split("x")]
        except ValueError:
            raise BadInput(f"--input-shape {spec!r}: expected NAME=1x3x224x224") from None
    options: dict[str, Any] = {"cost": cost}
    if shapes:
        options["input_shapes"] = shapes
    if batch is not None:
        options["batch"] = batch
    with notes_on_stderr():
        return load_graph(path, **options)


@contextlib.contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """While a native engine runs in this process: its own prints (HiGHS has a few that no option
    silences) go to stderr, as every human line does, so stdout keeps only the JSON."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


@contextlib.contextmanager
def notes_on_stderr() -> Iterator[None]:
    """The importer (an upgraded opset) and export-torch (values not compared) report notes as
    ImportNote warnings; the CLI shows each as one ``remat: note:`` line."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ImportNote)  # other warnings keep their filters
        yield
    for w in caught:
        if issubclass(w.category, ImportNote):
            click.echo(f"remat: note: {w.message}", err=True)
        else:  # not ours to judge: pass it on unchanged
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)


def resolve_budget(graph: Graph, text: str) -> int:
    """Bytes for `text`; a budget below the lower bound is bad input (the API's message)."""
    try:
        return budget_bytes(graph, text)
    except InputError as e:
        raise BadInput(str(e)) from None


def fmt_value(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def print_summary(s: Schedule) -> None:
    sm = s.summary
    pct = 100.0 * sm.peak_memory / sm.baseline_peak_memory if sm.baseline_peak_memory else 0.0
    backend = f" ({s.solver.backend})" if s.solver.backend else ""
    err.print(
        f"[bold]{s.solver.name}[/]{backend}: {s.solver.status} in {s.solver.seconds:.2f}s — "
        f"peak {human_bytes(sm.peak_memory)} ({pct:.1f}% of baseline), "
        f"overhead {100 * sm.overhead:.2f}%, {sm.recomputations} recomputations"
    )
    if sm.peak_memory_by_device is not None:
        budgets = s.budgets or {}
        err.print(
            "  per device: "
            + ", ".join(
                f"{d} {human_bytes(p)}" + (f" / {human_bytes(budgets[d])}" if d in budgets else "")
                for d, p in sm.peak_memory_by_device.items()
            )
            + f"; {sm.copies} copies costing {sm.copy_cost:.6g} of {sm.cost:.6g}"
        )
    if s.solver.message:
        err.print(f"  {s.solver.message}")


def read_schedule(path: str) -> Schedule:
    """A remat-schedule file (:meth:`Schedule.load`), ``-`` for stdin; inside `friendly_errors` a
    bad one is exit 2."""
    return Schedule.load("/dev/stdin" if path == STDIN else path)


# ---- numeric options: refused while parsing, as one line ----
class FiniteFloatRange(click.FloatRange):
    """click.FloatRange that also refuses nan and ±inf (every comparison with nan is false, so a
    plain FloatRange lets ``nan`` through as a silent wrong value)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        rv = super().convert(value, param, ctx)
        if rv != rv or rv in (float("inf"), float("-inf")):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return rv


#: --time-limit: seconds, positive and finite
SECONDS = FiniteFloatRange(min=0, min_open=True)
#: --workers, generator sizes
POSITIVE_INT = click.IntRange(min=1)
#: `remat generate` refuses graphs larger than this: the pure-Python generators and the pydantic
#: graph take tens of seconds and most of a gigabyte per few hundred thousand nodes, so a
#: 10^8-node request would run for hours and exhaust memory; no solver handles such a graph anyway
MAX_GENERATED_NODES = 500_000
#: random-layered draws O(n^1.5) edges one by one (above this, minutes)
MAX_RANDOM_LAYERED_NODES = 50_000


class OneLineErrors(click.Group):
    """A group whose bad option values (click.BadParameter, e.g. out of an IntRange) end as one
    `remat: error:` line with exit 2, like every other bad input, instead of click's usage block."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.BadParameter as e:
            raise BadInput(e.format_message()) from None


# ---- solver-specific options: --name-with-dashes after the solver is known ----
def parse_solver_args(solver: Solver, args: list[str]) -> dict[str, Any]:
    spec: dict[str, Param] = {f"--{p.name.replace('_', '-')}": p for p in solver.params}
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, inline = arg.partition("=")
        negated = key.startswith("--no-") and f"--{key[5:]}" in spec and spec[f"--{key[5:]}"].type is bool
        p = spec.get(f"--{key[5:]}" if negated else key)
        if p is None:
            known = ", ".join(spec) or "none"
            raise BadInput(f"unknown option {key!r} for solver {solver.name!r} (its options: {known})")
        if p.type is bool:
            if eq:
                raise BadInput(f"{key} is a flag and takes no value")
            out[p.name] = not negated
            i += 1
            continue
        if eq:
            raw = inline
            i += 1
        elif i + 1 < len(args):
            raw = args[i + 1]
            i += 2
        else:
            raise BadInput(f"{key} needs a value")
        try:
            value = p.parse(raw)
        except OptionError as e:
            raise BadInput(str(e)) from None
        out[p.name] = value
    return out


def device_budgets(graph: Graph, text: str) -> dict[str, int]:
    """--budget for a multi-device graph: {device: bytes}."""
    return resolve_device_budgets(graph, text, baseline(graph).peak_memory)


#: --bound-time-limit of solve, info and validate
BOUND_TIME_LIMIT = click.option(
    "--bound-time-limit",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds for the compute bound (0, the trivial bound, where they do not suffice to build "
    f"its ancestor matrix, or above {MAX_NODES:,} nodes).",
)


def compute_bound(g: Graph, budget: int, seconds: float) -> CostBound:
    """The cut bound (remat_cli/execution/cost_bound.py), HiGHS's own prints kept off stdout."""
    with native_stdout_to_stderr():
        return cost_lower_bound(g, budget, time_limit=seconds)
