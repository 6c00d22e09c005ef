"""What every solver implements, and what it gets and gives back.

A solver is a class with `name`, `method`, `paper`, declared `params`, `availability()`,
`supports(graph)` and `solve(graph, budget, options) -> SolverResult`. It returns steps; it
never touches files or the terminal. `remat_cli.solve.run_solver` simulates what it returns and
builds the Schedule, so a solver's own bookkeeping never reaches the user.
"""

from __future__ import annotations

import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from remat_cli.graph import Graph
from remat_cli.schedule import MemoryPlan, Status, Step

Availability = Literal["available", "missing engine", "licence-limited"]


@dataclass(frozen=True)
class Param:
    """A solver-specific option, exposed on the command line as ``--name-with-dashes``."""

    name: str
    type: type  # int, float, str or bool (bools are flags: --x / --no-x)
    default: Any
    help: str
    choices: tuple[str, ...] | None = None


@dataclass
class SolveOptions:
    time_limit: float | None = None  # seconds; None = the solver's own stopping rule
    seed: int = 0
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    hint: list[Step] | None = None  # steps of a schedule to warm-start from
    params: dict[str, Any] = field(default_factory=dict)
    #: called with each new incumbent's steps, so Ctrl-C never loses a found schedule
    on_incumbent: Callable[[list[Step]], None] | None = None
    #: called with progress facts (elapsed, incumbent, bound, gap, ...) for the CLI to show
    on_progress: Callable[[dict[str, Any]], None] | None = None
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float | None:
        if self.time_limit is None:
            return None
        return max(0.0, self.time_limit - (time.monotonic() - self.started))

    def incumbent(self, steps: list[Step]) -> None:
        if self.on_incumbent is not None:
            self.on_incumbent(steps)

    def progress(self, **facts: Any) -> None:
        if self.on_progress is not None:
            self.on_progress(facts)


@dataclass
class SolverResult:
    steps: list[Step] | None
    status: Status
    backend: str | None = None
    objective: float | None = None
    lower_bound: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    #: when no schedule fits: the lowest peak the solver could establish, if any
    best_peak: int | None = None
    #: byte offsets of the steps' buffers in one arena (remat-schedule `memory_plan`), if planned
    memory_plan: MemoryPlan | None = None


class Solver(ABC):
    name: ClassVar[str]
    method: ClassVar[str]
    paper: ClassVar[str]
    #: True when status "optimal" is a proof (checked against brute force in the tests)
    exact: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()

    def availability(self) -> tuple[Availability, str]:
        """Whether the engines this solver needs are installed, and why not."""
        return "available", ""

    def supports(self, graph: Graph) -> str | None:
        """None when the solver applies to `graph`, else the reason it does not."""
        return None

    def notes(self) -> str:
        """Caveats shown by `remat solvers` (fallbacks, limits)."""
        return ""

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    @abstractmethod
    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult: ...
