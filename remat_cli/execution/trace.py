"""The solve trace (`solver.trace` of a schedule, remat_cli/schedule.py): each improving incumbent of a solve, when it came and which method found it.

Anytime solvers are judged by how early a good answer comes, not only by the last one (the
primal integral of Berthold, "Measuring the impact of primal heuristics", Oper. Res. Lett. 41,
2013; CP-SAT's and Gurobi's logs print one line per improving solution). The watchdog records
a point for every schedule that ranks before the best one so far (within the budget first, then
the cheaper; over it, the lower peak), timed from where the time limit counts (the command's
start, the solver's preparation such as numba compiling left out); the schedule's
`solver.trace` holds them and the time of the first within the budget.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from remat_cli.schedule import SolveTrace, TracePoint


class TraceRecorder:
    """Collects a solve's trace while it runs; thread-safe, so a live display can read it."""

    def __init__(self, budget: int, baseline_cost: float, started: float | None = None) -> None:
        self.budget = budget
        self.baseline_cost = baseline_cost
        self.started = time.monotonic() if started is None else started
        #: set once the solver's clock runs (after its preparation, e.g. numba compiling)
        self.solving = False
        self.lock = threading.Lock()
        self.trace = SolveTrace()
        self._rank: tuple[int, float] | None = None
        #: called (in the thread that offered it) with each point recorded
        self.listeners: list[Callable[[TracePoint], None]] = []

    def offer(self, peak: int, cost: float, method: str | None, at: float | None = None) -> bool:
        """Record the schedule (peak, cost) found by `method` now (or at monotonic time `at`)
        when it ranks before every one so far; True when it did."""
        rank = (0, cost) if peak <= self.budget else (1, float(peak))
        with self.lock:
            if self._rank is not None and rank >= self._rank:
                return False
            self._rank = rank
            seconds = round((time.monotonic() if at is None else at) - self.started, 3)
            over = cost / self.baseline_cost - 1.0 if self.baseline_cost > 0 else 0.0
            point = TracePoint(
                seconds=seconds, peak_memory=peak, cost=cost, overhead=over, method=method or None
            )
            self.trace.incumbents.append(point)
            if peak <= self.budget and self.trace.first_within_budget is None:
                self.trace.first_within_budget = seconds
        for listen in self.listeners:
            listen(point)
        return True

    def best(self) -> TracePoint | None:
        with self.lock:
            return self.trace.incumbents[-1] if self.trace.incumbents else None

    def snapshot(self) -> SolveTrace:
        with self.lock:
            return self.trace.model_copy(deep=True)
