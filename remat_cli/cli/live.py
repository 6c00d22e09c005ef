"""The live line of `remat solve` on a terminal: elapsed time against the limit, the incumbent's
peak and overhead, the best bound and which method found what.

As CP-SAT's and Gurobi's logs do, each improving incumbent prints one line that stays (time, the
method that found it, its peak and overhead); below them one line is redrawn a few times a second.
Everything goes to stderr through rich, and only when stderr is a terminal: stdout carries the
schedule alone.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import time
from multiprocessing.connection import Connection
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from remat_cli.execution.cost_bound import CostBound, cost_lower_bound
from remat_cli.execution.trace import TraceRecorder
from remat_cli.graph import Graph
from remat_cli.schedule import TracePoint
from remat_cli.util.files import to_devnull

#: redraws per second
REFRESH = 4


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


#: the background bound's niceness: it takes what CPU the solve leaves
NICE = 10


def _bound_child(conn: Connection, graph: Graph, budget: int, seconds: float) -> None:
    os.nice(NICE)
    to_devnull(1)  # HiGHS's own prints: stdout carries the schedule alone
    try:
        conn.send(cost_lower_bound(graph, budget, time_limit=seconds))
    finally:
        conn.close()


class BackgroundBound:
    """The cut bound (remat_cli/cost_bound.py) computed in a forked process at a lower priority
    while the solve runs, so that `--bound` costs no time after a solve long enough to cover it
    and the live line shows the bound as soon as it is proved."""

    def __init__(self, graph: Graph, budget: int, seconds: float) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conn, child = ctx.Pipe(duplex=False)
        self.proc = ctx.Process(target=_bound_child, args=(child, graph, budget, seconds), daemon=True)
        self.proc.start()
        child.close()
        self.bound: CostBound | None = None

    def poll(self, timeout: float = 0.0) -> CostBound | None:
        """The bound once it is known (waiting up to `timeout` seconds), else None."""
        if self.bound is None:
            try:
                if self.conn.poll(timeout):
                    self.bound = self.conn.recv()
            except (EOFError, OSError):  # the process died: no bound
                self.stop()
        return self.bound

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(2)
        self.conn.close()


class LiveLine:
    """A context manager showing the solve's progress on `console` while it runs."""

    def __init__(
        self,
        console: Console,
        solver: str,
        limit: float | None,
        recorder: TraceRecorder,
        baseline_peak: int,
        background: BackgroundBound | None = None,
    ) -> None:
        self.console = console
        self.solver = solver
        self.limit = limit
        self.recorder = recorder
        self.baseline_peak = baseline_peak
        #: the best lower bound on the overhead known so far (the cut bound, a solver's own)
        self.bound: float | None = None
        self.background = background
        self.facts: dict[str, Any] = {}
        self.spinner = Spinner("dots")
        self.live = Live(
            console=console, refresh_per_second=REFRESH, transient=True, get_renderable=self.render
        )

    def __enter__(self) -> LiveLine:
        self.recorder.listeners.append(self.log)
        self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.live.__exit__(kind, e, tb)
        self.recorder.listeners.remove(self.log)

    def progress(self, facts: dict[str, Any]) -> None:
        """A solver's progress facts: a bound it proved on the overhead is shown when higher."""
        self.facts = facts
        b = facts.get("bound_overhead")
        if isinstance(b, (int, float)) and (self.bound is None or b > self.bound):
            self.bound = float(b)

    def log(self, p: TracePoint) -> None:
        """One line per improving incumbent, kept above the live line."""
        self.live.console.print(
            f"{p.seconds:7.1f} s  {p.method or self.solver:<12} peak {self.peak(p.peak_memory):>7}  "
            f"overhead {_pct(p.overhead):>8}"
            + ("" if p.peak_memory <= self.recorder.budget else "  (over budget)"),
            highlight=False,
        )

    def peak(self, peak: int) -> str:
        return f"{100 * peak / self.baseline_peak:.1f}%" if self.baseline_peak else f"{peak:,} B"

    def render(self) -> Text:
        if not self.recorder.solving:
            return Text.assemble(
                self.spinner.render(time.monotonic()), " ", (self.solver, "bold"), "  preparing"
            )  # type: ignore[arg-type]
        cut = self.background.poll() if self.background is not None else None
        if cut is not None and math.isfinite(cut.extra_cost) and self.recorder.baseline_cost > 0:
            self.progress(self.facts | {"bound_overhead": cut.extra_cost / self.recorder.baseline_cost})
        elapsed = time.monotonic() - self.recorder.started
        clock = f"{elapsed:.1f}" + (f"/{self.limit:g} s" if self.limit is not None else " s")
        best = self.recorder.best()
        if best is None:
            found = "no schedule yet"
        else:
            over = "" if best.peak_memory <= self.recorder.budget else " over budget"
            found = f"best {_pct(best.overhead)} (peak {self.peak(best.peak_memory)}{over}, {best.method})"
        line = Text.assemble(
            self.spinner.render(time.monotonic()),  # type: ignore[arg-type]
            " ",
            (self.solver, "bold"),
            f"  {clock}  {found}  bound {_pct(self.bound)}",
        )
        return line
