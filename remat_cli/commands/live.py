"""The live line of `remat solve` on a terminal: elapsed time against the limit, the incumbent's
peak and overhead, the best bound and which method found what.

As CP-SAT's and Gurobi's logs do, each improving incumbent prints one line that stays (time, the
method that found it, its peak and overhead); below them one line is redrawn a few times a second.
Everything goes to stderr through rich, and only when stderr is a terminal: stdout carries the
schedule alone.
"""

from __future__ import annotations

import time
from types import TracebackType
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.spinner import Spinner
from rich.text import Text

from remat_cli.solve_trace import TracePoint, TraceRecorder

#: redraws per second
REFRESH = 4


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.2f}%"


class LiveLine:
    """A context manager showing the solve's progress on `console` while it runs."""

    def __init__(
        self,
        console: Console,
        solver: str,
        limit: float | None,
        recorder: TraceRecorder,
        baseline_peak: int,
        bound: float | None = None,
    ) -> None:
        self.console = console
        self.solver = solver
        self.limit = limit
        self.recorder = recorder
        self.baseline_peak = baseline_peak
        #: the best lower bound on the overhead known so far (the cut bound, a solver's own)
        self.bound = bound
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
