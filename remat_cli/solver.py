"""What every solver implements, and what it gets and gives back.

A solver is a class with `name`, `method`, `paper`, declared `params`, `availability()`,
`supports(graph)` and `solve(graph, budget, options) -> SolverResult`. It returns steps; it
never touches files or the terminal. `remat_cli.execution.runner.run_solver` simulates what it returns and
builds the Schedule, so a solver's own bookkeeping never reaches the user.
"""

from __future__ import annotations

import dataclasses
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
    #: inclusive bounds of an int or float option (required for them: see testing.check_param_bounds)
    low: float | None = None
    high: float | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """`value` as this option's type (an int is a valid float), or OptionError."""
        ok = isinstance(value, self.type) and (self.type is bool or not isinstance(value, bool))
        if not ok and self.type is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise OptionError(f"{self.flag}: {value!r} is not a valid {self.type.__name__}")
        if self.choices and value not in self.choices:
            raise OptionError(f"{self.flag}: {value!r} is not one of {', '.join(self.choices)}")
        if self.type in (int, float):
            if value != value:
                raise OptionError(f"{self.flag}: {value!r} is not a number")
            if self.low is not None and value < self.low:
                raise OptionError(f"{self.flag}: {value!r} is below its minimum {_number(self.low)}")
            if self.high is not None and value > self.high:
                raise OptionError(f"{self.flag}: {value!r} is above its maximum {_number(self.high)}")
        return value

    def parse(self, text: str) -> Any:
        """The command-line text of this option, converted and checked."""
        try:
            value = self.type(text)
        except ValueError:
            raise OptionError(f"{self.flag}: {text!r} is not a valid {self.type.__name__}") from None
        if self.choices and value not in self.choices:
            raise OptionError(f"{self.flag}: {text!r} is not one of {', '.join(self.choices)}")
        return self.check(value)


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity (taskset, a container's cpuset), not
    the machine's count. Pinned to one core of two, the default of two workers put hilp's and
    auto's helpers on one core and they found nothing in 10 s where fastsa alone did."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


class OptionError(ValueError):
    """A solver option with an unknown name, a wrong type or a value outside its choices."""


@dataclass
class SolveOptions:
    time_limit: float | None = None  # seconds; None = the solver's own stopping rule
    seed: int = 0
    workers: int = field(default_factory=usable_cores)
    hint: list[Step] | None = None  # steps of a schedule to warm-start from
    params: dict[str, Any] = field(default_factory=dict)
    #: called with each new incumbent's steps, so Ctrl-C never loses a found schedule
    on_incumbent: Callable[[list[Step]], None] | None = None
    #: called with progress facts (elapsed, incumbent, bound, gap, ...) for the CLI to show
    on_progress: Callable[[dict[str, Any]], None] | None = None
    started: float = field(default_factory=time.monotonic)
    #: multi-device graphs: each device's budget (the `budget` argument is then their largest)
    budgets: dict[str, int] | None = None
    #: the limit as the user gave it, when `time_limit` is what start-up and loading left of it
    #: (remat_cli.execution.watchdog): see work_limit
    nominal_limit: float | None = None

    def remaining(self) -> float | None:
        if self.time_limit is None:
            return None
        return max(0.0, self.time_limit - (time.monotonic() - self.started))

    def work_limit(self) -> float | None:
        """The limit a solver turns into a fixed amount of work (e.g. fastsa's iterations): the
        user's own, so that the same command with the same seed does the same work however long
        loading took; the wall clock still stops at `time_limit`."""
        return self.nominal_limit if self.nominal_limit is not None else self.time_limit

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
    #: True when status "optimal" is a proof (remat_cli.testing checks it against brute force)
    exact: ClassVar[bool] = False
    #: options under which an `exact` solver's space is the fixed-order stage space of the brute
    #: force (e.g. enough copies per node); used by remat_cli.testing only
    exact_params: ClassVar[dict[str, Any]] = {}
    #: True when solve() starts from `options.hint`: its result is then never worse than the hint
    warm_starts: ClassVar[bool] = False
    #: what `SolverResult.objective` measures: the schedule's compute cost, or its memory footprint
    #: (MODeL: resident bytes + arena; its exactness is checked by its own brute force)
    minimises: ClassVar[Literal["cost", "memory"]] = "cost"
    #: True when the solver places computes on the devices of a multi-device graph
    multi_device: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()

    def availability(self) -> tuple[Availability, str]:
        """Whether the engines this solver needs are installed, and why not."""
        return "available", ""

    def supports(self, graph: Graph) -> str | None:
        """None when the solver applies to `graph`, else the reason it does not."""
        if graph.devices and not self.multi_device:
            return "the graph has several devices and this solver schedules one (use --solver xengine)"
        return None

    def prepare(self) -> None:
        """Compile or load what solving needs (numba kernels) before the clock starts. The CLI
        calls it before --time-limit counts, so a first solve after install does not spend its
        time limit compiling; solve() must work without it."""
        return None

    def notes(self) -> str:
        """Caveats shown by `remat solvers` (fallbacks, limits)."""
        return ""

    def defaults(self) -> dict[str, Any]:
        return {p.name: p.default for p in self.params}

    def resolve(self, options: SolveOptions) -> SolveOptions:
        """A copy of `options` whose `params` hold every declared option, checked, defaults filled
        in; `options` itself is not changed. `solve()` reads ``options.params[name]`` from it.
        """
        spec = {p.name: p for p in self.params}
        unknown = [k for k in options.params if k not in spec]
        if unknown:
            known = ", ".join(p.flag for p in self.params) or "none"
            raise OptionError(
                f"unknown option {unknown[0]!r} for solver {self.name!r} (its options: {known})"
            )
        params = self.defaults() | {k: spec[k].check(v) for k, v in options.params.items()}
        return dataclasses.replace(options, params=params)

    @abstractmethod
    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """A schedule of `graph` whose peak is at most `budget` bytes, at the least cost found.

        `options` come resolved (:meth:`resolve`): ``options.params[name]`` holds every declared
        option. The result's status says what the steps are:

        - "optimal": within budget, and proven least-cost in the solver's space (``exact`` solvers);
        - "feasible": within budget, no proof;
        - "infeasible": no schedule within budget exists in the solver's space or none was found;
          `steps` may still hold the lowest-peak schedule found (over budget) or be None, and
          `best_peak` is the lowest peak the solver established, if any (> `budget`);
        - "unknown": nothing found in the time limit (steps None).

        `objective` (when set) is the cost of the returned steps, `lower_bound` a proven bound on
        the least cost within budget. Never touch files or the terminal; report incumbents with
        ``options.incumbent`` and progress with ``options.progress``.
        """
