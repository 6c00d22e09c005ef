"""What every `remat` command shares: exit codes, one-line errors, atomic output, graph and
schedule reading, budgets.

Command modules (cli.py and the ones it registers) import from here; nothing here imports a
command, so the imports only point downward.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import click
from pydantic import ValidationError
from rich.console import Console

from remat_cli.budget import BudgetError, parse_budget
from remat_cli.graph import Graph, GraphError
from remat_cli.importers import load_graph
from remat_cli.schedule import Schedule, ScheduleError, baseline, peak_lower_bound
from remat_cli.solve import SolverBug
from remat_cli.solvers import registry

# Logs and pipelines get wide tables; a terminal keeps its own width.
err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 140)
F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK, EXIT_INFEASIBLE, EXIT_BAD_INPUT, EXIT_INTERNAL = 0, 1, 2, 3


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
        except (GraphError, BudgetError, ScheduleError) as e:
            raise BadInput(str(e)) from None
        except registry.UnknownSolver as e:
            raise BadInput(e.args[0]) from None
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ()))
            raise BadInput(f"{where}: {first.get('msg')}") from None
        except SolverBug as e:
            fail(f"internal error: {e}", EXIT_INTERNAL)
        except (click.ClickException, click.exceptions.Exit, click.Abort, SystemExit):
            raise
        except KeyboardInterrupt:
            fail("interrupted", 130)
        except Exception as e:  # noqa: BLE001 - a user never sees a traceback
            if os.environ.get("REMAT_DEBUG"):
                raise
            fail(
                f"internal error: {type(e).__name__}: {e} (set REMAT_DEBUG=1 for a traceback)", EXIT_INTERNAL
            )

    return wrapper  # type: ignore[return-value]


def write_atomic(path: str, text: str) -> None:
    """Write via a temp file in the same folder and rename, so a failed run never truncates."""
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent if str(target.parent) else ".")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text if text.endswith("\n") else text + "\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def emit(text: str, output: str | None) -> None:
    if output is None or output == "-":
        click.echo(text)
    else:
        write_atomic(output, text)


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


def read_graph(
    path: str, input_shapes: tuple[str, ...] = (), batch: int | None = None, cost: str = "flops"
) -> Graph:
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
    return load_graph(path, **options)


def resolve_budget(graph: Graph, text: str) -> int:
    budget = parse_budget(text, baseline(graph).peak_memory)
    bound = peak_lower_bound(graph)
    if budget < bound:
        raise BadInput(
            f"budget {budget:,} B is below what any schedule can reach "
            f"(lower bound {bound:,} B: resident bytes + largest working set or graph outputs)"
        )
    return budget


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
    if s.solver.message:
        err.print(f"  {s.solver.message}")


def read_schedule(path: str) -> Schedule:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadInput(f"cannot read schedule {path}: {e}") from None
    except RecursionError:
        raise BadInput(f"cannot read schedule {path}: JSON is nested too deeply") from None
    if not isinstance(data, dict) or data.get("format") != "remat-schedule":
        raise BadInput(f"{path} is not a remat-schedule file")
    return Schedule.model_validate(data)
