"""What every solver implements, and what it gets and gives back.

A solver is a class with `name`, `method`, `paper`, declared `params`, `availability()`,
`supports(graph)` and `solve(graph, budget, options) -> SolverResult`. It returns steps; it
never touches files or the terminal. `remat_cli.execution.runner.run_solver` simulates what it
returns and builds the Schedule, so a solver's own bookkeeping never reaches the user.

Examples
--------
The least solver, the baseline that keeps every tensor (as ``checkpoint-all`` does):

>>> from remat_cli.importers import generators
>>> from remat_cli.schedule import baseline_steps, simulate
>>> class KeepAll(Solver):
...     name, method, paper = "keep-all", "no rematerialization", "-"
...     def solve(self, graph, budget, options):
...         steps = baseline_steps(graph)
...         if simulate(graph, steps).peak_memory <= budget:
...             return SolverResult(steps=steps, status="feasible")
...         return SolverResult(steps=None, status="infeasible")
>>> graph = generators.linear(5, seed=1)
>>> solver = KeepAll()
>>> solver.solve(graph, 36_000, solver.resolve(SolveOptions())).status
'feasible'
>>> solver.solve(graph, 30_000, solver.resolve(SolveOptions())).status
'infeasible'
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
from remat_cli.schedule import MemoryPlan, SimResult, Status, Step

Availability = Literal["available", "missing engine", "licence-limited"]


@dataclass(frozen=True)
class Param:
    """A solver-specific option, exposed on the command line as ``--name-with-dashes``.

    Parameters
    ----------
    name : str
        The Python name, the key of ``SolveOptions.params`` (``max_copies``).
    type : type
        int, float, str or bool (bools are flags: ``--x`` / ``--no-x``).
    default : Any
        The value when the option is not given; of `type`, among `choices`, within the bounds.
    help : str
        One line for ``remat solve --help`` and ``remat solvers``.
    choices : tuple of str, optional
        The values a str option may take.
    low, high : float, optional
        Inclusive bounds of an int or float option, required for them
        (:func:`remat_cli.testing.check_param_bounds`).

    Examples
    --------
    >>> p = Param("max_copies", int, 2, "copies of a node per stage", low=1, high=8)
    >>> p.flag
    '--max-copies'
    >>> p.parse("3")
    3
    >>> p.check(9)
    Traceback (most recent call last):
    ...
    remat_cli.solver.OptionError: --max-copies: 9 is above its maximum 8
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    low: float | None = None
    high: float | None = None

    @property
    def flag(self) -> str:
        """The command-line flag: ``--`` and the name with dashes for underscores.

        Examples
        --------
        >>> Param("lp_model", str, "full", "which LP", choices=("full", "live")).flag
        '--lp-model'
        """
        return "--" + self.name.replace("_", "-")

    def check(self, value: Any) -> Any:
        """A Python value checked against this option's type, choices and bounds.

        Parameters
        ----------
        value : Any
            The value, as given to :func:`remat_cli.api.solve` or in ``SolveOptions.params``.

        Returns
        -------
        Any
            `value`, an int converted to float for a float option.

        Raises
        ------
        OptionError
            `value` is of another type (a bool is not an int), not among the choices, NaN, or
            outside ``[low, high]``.

        Examples
        --------
        >>> p = Param("temperature", float, 1.0, "start temperature", low=0.0, high=10.0)
        >>> p.check(2)
        2.0
        >>> p.check(True)
        Traceback (most recent call last):
        ...
        remat_cli.solver.OptionError: --temperature: True is not a valid float
        >>> p.check(float("nan"))
        Traceback (most recent call last):
        ...
        remat_cli.solver.OptionError: --temperature: nan is not a number
        """
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
        """The command-line text of this option, converted to its type and checked.

        Parameters
        ----------
        text : str
            The text after the flag.

        Returns
        -------
        Any
            The value, of the option's type.

        Raises
        ------
        OptionError
            The text does not convert, or the value fails :meth:`check`.

        Examples
        --------
        >>> p = Param("strategy", str, "auto", "which greedy", choices=("auto", "dtr"))
        >>> p.parse("dtr")
        'dtr'
        >>> p.parse("best")
        Traceback (most recent call last):
        ...
        remat_cli.solver.OptionError: --strategy: 'best' is not one of auto, dtr
        """
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
    """The cores this process may run on, the default of ``SolveOptions.workers``.

    Its CPU affinity (taskset, a container's cpuset), not the machine's count: a portfolio that
    starts one helper per machine core on fewer usable cores starves its own members.

    Returns
    -------
    int
        At least 1.

    Examples
    --------
    >>> 1 <= usable_cores() <= (os.cpu_count() or 1)
    True
    """
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity on this platform (macOS, Windows)
        return os.cpu_count() or 1


class OptionError(ValueError):
    """A solver option with an unknown name, a wrong type or a value outside its choices.

    The command line reports it in one line and exits 2; :func:`remat_cli.api.solve` raises it
    as :class:`~remat_cli.api.InputError`.

    Examples
    --------
    >>> Param("seed_runs", int, 1, "runs", low=1, high=4).parse("many")
    Traceback (most recent call last):
    ...
    remat_cli.solver.OptionError: --seed-runs: 'many' is not a valid int
    """


@dataclass
class SolveOptions:
    """What a solve is given besides the graph and the budget.

    Parameters
    ----------
    time_limit : float, optional
        Seconds from `started`; None leaves the solver's own stopping rule.
    seed : int, default 0
        The seed of randomised solvers; with ``workers=1`` the same seed gives the same steps.
    workers : int, default :func:`usable_cores`
        Threads or processes the solver may use.
    hint : list of Step, optional
        Steps of a schedule of the same graph to warm-start from.
    params : dict of str to Any, default {}
        The solver's declared options by name; :meth:`Solver.resolve` checks them and fills in
        the defaults.
    on_incumbent : callable, optional
        Called with each new incumbent's steps, so an interrupt never loses a found schedule.
    on_progress : callable, optional
        Called with progress facts (elapsed, incumbent, bound, gap, ...) for the CLI to show.
    started : float, default time.monotonic()
        When the clock of `time_limit` started.
    budgets : dict of str to int, optional
        Multi-device graphs: each device's budget (the `budget` argument is then their largest).
    nominal_limit : float, optional
        The limit as the user gave it, when `time_limit` is what start-up and loading left of it
        (:mod:`remat_cli.execution.watchdog`); see :meth:`work_limit`.

    Examples
    --------
    >>> options = SolveOptions(time_limit=10.0, seed=3, workers=1)
    >>> 9.0 < options.remaining() <= 10.0
    True
    >>> SolveOptions().remaining() is None
    True
    """

    time_limit: float | None = None
    seed: int = 0
    workers: int = field(default_factory=usable_cores)
    hint: list[Step] | None = None
    params: dict[str, Any] = field(default_factory=dict)
    on_incumbent: Callable[[list[Step]], None] | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    started: float = field(default_factory=time.monotonic)
    budgets: dict[str, int] | None = None
    nominal_limit: float | None = None

    def remaining(self) -> float | None:
        """Seconds left of `time_limit` (never below 0), or None without a limit.

        Returns
        -------
        float or None
            ``time_limit`` minus the seconds since `started`, at least 0.
        """
        if self.time_limit is None:
            return None
        return max(0.0, self.time_limit - (time.monotonic() - self.started))

    def work_limit(self) -> float | None:
        """The limit a solver turns into a fixed amount of work (e.g. fastsa's iterations).

        The user's own limit, so that the same command with the same seed does the same work
        however long loading took; the wall clock still stops at `time_limit`.

        Returns
        -------
        float or None
            `nominal_limit` when set, else `time_limit`.

        Examples
        --------
        >>> SolveOptions(time_limit=7.5, nominal_limit=10.0).work_limit()
        10.0
        >>> SolveOptions(time_limit=7.5).work_limit()
        7.5
        """
        return self.nominal_limit if self.nominal_limit is not None else self.time_limit

    def incumbent(self, steps: list[Step]) -> None:
        """Report a new best schedule's steps to `on_incumbent`, if set.

        Parameters
        ----------
        steps : list of Step
            The incumbent's steps.

        Examples
        --------
        >>> seen = []
        >>> SolveOptions(on_incumbent=seen.append).incumbent([])
        >>> seen
        [[]]
        """
        if self.on_incumbent is not None:
            self.on_incumbent(steps)

    def progress(self, **facts: Any) -> None:
        """Report progress facts to `on_progress`, if set.

        Parameters
        ----------
        **facts
            What the solver knows now: ``elapsed``, ``incumbent``, ``bound``, ``gap``, ...

        Examples
        --------
        >>> seen = []
        >>> SolveOptions(on_progress=seen.append).progress(incumbent=107.0, bound=100.0)
        >>> seen
        [{'incumbent': 107.0, 'bound': 100.0}]
        """
        if self.on_progress is not None:
            self.on_progress(facts)


@dataclass
class SolverResult:
    """What a solver returns: its steps and what it claims about them.

    The contract suite (:mod:`remat_cli.testing`) checks every claim against the simulator.

    Parameters
    ----------
    steps : list of Step or None
        The schedule's steps, or None when there is none.
    status : {"optimal", "feasible", "infeasible", "unknown", "error"}
        What the steps are (see :meth:`Solver.solve`).
    backend : str, optional
        The engine that ran (``"highs"``, ``"cpsat"``, ...).
    objective : float, optional
        The cost of the returned steps (or their footprint, for ``minimises == "memory"``).
    lower_bound : float, optional
        A proven bound on the least objective within the budget.
    params : dict of str to Any, default {}
        The options the solve ran with.
    message : str, optional
        One line for the user (which member of a portfolio found it, a fallback taken).
    best_peak : int, optional
        When no schedule fits: the lowest peak the solver could establish.
    memory_plan : MemoryPlan, optional
        Byte offsets of the steps' buffers in one arena (remat-schedule `memory_plan`).

    Examples
    --------
    >>> SolverResult(steps=None, status="infeasible", best_peak=31_000).best_peak
    31000
    """

    steps: list[Step] | None
    status: Status
    backend: str | None = None
    objective: float | None = None
    lower_bound: float | None = None
    params: dict[str, Any] = field(default_factory=dict)
    message: str | None = None
    best_peak: int | None = None
    memory_plan: MemoryPlan | None = None


def cheapest_fitting(
    budget: int, tried: list[tuple[list[Step], SimResult, str]], options: SolveOptions
) -> SolverResult:
    """The result of a solver that builds a few candidate schedules and keeps one.

    The cheapest candidate whose peak fits `budget` is "feasible" (and the incumbent); when none
    fits, the one with the lowest peak is "infeasible" with that peak as `best_peak`.

    Parameters
    ----------
    budget : int
        The memory budget in bytes.
    tried : list of (steps, simulation, description)
        Each candidate's steps, their simulation and a short phrase saying how it was built.
    options : SolveOptions
        The solve's options (the feasible candidate is reported through ``options.incumbent``).

    Returns
    -------
    SolverResult

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> from remat_cli.schedule import baseline_steps, simulate
    >>> g = generators.linear(4, seed=0)
    >>> steps = baseline_steps(g)
    >>> sim = simulate(g, steps)
    >>> cheapest_fitting(sim.peak_memory - 1, [(steps, sim, "baseline")], SolveOptions()).status
    'infeasible'
    """
    fitting = [t for t in tried if t[1].peak_memory <= budget]
    if fitting:
        steps, sim, how = min(fitting, key=lambda t: (t[1].cost, t[1].peak_memory))
        options.incumbent(steps)
        return SolverResult(steps=steps, status="feasible", objective=sim.cost, message=how)
    steps, sim, how = min(tried, key=lambda t: (t[1].peak_memory, t[1].cost))
    return SolverResult(
        steps=steps,
        status="infeasible",
        objective=sim.cost,
        best_peak=sim.peak_memory,
        message=f"lowest peak {sim.peak_memory:,} B ({how}) is over the budget",
    )


class Solver(ABC):
    """The interface of every solver, built in or registered by entry point.

    Subclasses set the class attributes and implement :meth:`solve`; the registry
    (:mod:`remat_cli.registry`) instantiates them without arguments.

    Attributes
    ----------
    name : str
        The registry name (``remat solve --solver NAME``).
    method : str
        One line: what the method is.
    paper : str
        The paper it implements, with the section.
    exact : bool
        True when status "optimal" is a proof (:mod:`remat_cli.testing` checks it against brute
        force).
    exact_params : dict of str to Any
        Options under which an `exact` solver's space is the fixed-order stage space of the brute
        force (e.g. enough copies per node); used by :mod:`remat_cli.testing` only.
    warm_starts : bool
        True when :meth:`solve` starts from ``options.hint``: its result is then never worse.
    minimises : {"cost", "memory"}
        What ``SolverResult.objective`` measures: the schedule's compute cost, or its memory
        footprint (MODeL: resident bytes + arena; checked by its own brute force).
    multi_device : bool
        True when the solver places computes on the devices of a multi-device graph.
    params : tuple of Param
        The solver's own options.

    Examples
    --------
    >>> from remat_cli import registry
    >>> solver = registry.get("chen-greedy")
    >>> solver.exact, solver.warm_starts, solver.minimises
    (False, False, 'cost')
    """

    name: ClassVar[str]
    method: ClassVar[str]
    paper: ClassVar[str]
    exact: ClassVar[bool] = False
    exact_params: ClassVar[dict[str, Any]] = {}
    warm_starts: ClassVar[bool] = False
    minimises: ClassVar[Literal["cost", "memory"]] = "cost"
    multi_device: ClassVar[bool] = False
    params: ClassVar[tuple[Param, ...]] = ()

    def availability(self) -> tuple[Availability, str]:
        """Whether the engines this solver needs are installed, and why not.

        Returns
        -------
        tuple of (str, str)
            ``"available"``, ``"missing engine"`` or ``"licence-limited"``, and the reason
            (empty when available).

        Examples
        --------
        >>> from remat_cli import registry
        >>> registry.get("greedy").availability()
        ('available', '')
        """
        return "available", ""

    def supports(self, graph: Graph) -> str | None:
        """Whether the solver applies to `graph`.

        Parameters
        ----------
        graph : Graph
            The graph to schedule.

        Returns
        -------
        str or None
            None when it applies, else the reason it does not (by default: a graph with several
            devices, for a solver that schedules one).

        Examples
        --------
        >>> from remat_cli import registry
        >>> from remat_cli.importers import generators
        >>> registry.get("greedy").supports(generators.linear(5, seed=1)) is None
        True
        """
        if graph.devices and not self.multi_device:
            return "the graph has several devices and this solver schedules one (use --solver xengine)"
        return None

    def prepare(self) -> None:
        """Compile or load what solving needs (numba kernels) before the clock starts.

        The CLI calls it before ``--time-limit`` counts, so a first solve after install does not
        spend its time limit compiling; :meth:`solve` must work without it.
        """
        return None

    def notes(self) -> str:
        """Caveats shown by ``remat solvers`` (fallbacks, limits); empty by default.

        Returns
        -------
        str
            One paragraph, or "".
        """
        return ""

    def defaults(self) -> dict[str, Any]:
        """Every declared option's default.

        Returns
        -------
        dict of str to Any
            ``{param.name: param.default}`` over `params`.

        Examples
        --------
        >>> from remat_cli import registry
        >>> registry.get("greedy").defaults()
        {'strategy': 'auto'}
        """
        return {p.name: p.default for p in self.params}

    def resolve(self, options: SolveOptions) -> SolveOptions:
        """A copy of `options` whose `params` hold every declared option, checked, defaults filled in.

        :meth:`solve` reads ``options.params[name]`` from it; `options` itself is not changed.

        Parameters
        ----------
        options : SolveOptions
            The options as given, ``params`` holding only those set.

        Returns
        -------
        SolveOptions
            A copy with every declared option in ``params``.

        Raises
        ------
        OptionError
            An unknown option name, or a value that fails :meth:`Param.check`.

        Examples
        --------
        >>> from remat_cli import registry
        >>> greedy = registry.get("greedy")
        >>> greedy.resolve(SolveOptions(params={"strategy": "split"})).params
        {'strategy': 'split'}
        >>> greedy.resolve(SolveOptions(params={"depth": 3}))
        Traceback (most recent call last):
        ...
        remat_cli.solver.OptionError: unknown option 'depth' for solver 'greedy' (its options: --strategy)
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

        Never touch files or the terminal; report incumbents with ``options.incumbent`` and
        progress with ``options.progress``.

        Parameters
        ----------
        graph : Graph
            The graph; :meth:`supports` has accepted it.
        budget : int
            Bytes the peak may reach (for multi-device graphs the largest of ``options.budgets``).
        options : SolveOptions
            Resolved (:meth:`resolve`): ``options.params[name]`` holds every declared option.

        Returns
        -------
        SolverResult
            Its status says what the steps are:

            - "optimal": within budget, and proven least-cost in the solver's space (``exact``
              solvers);
            - "feasible": within budget, no proof;
            - "infeasible": no schedule within budget exists in the solver's space or none was
              found; `steps` may still hold the lowest-peak schedule found (over budget) or be
              None, and `best_peak` is the lowest peak the solver established, if any
              (> `budget`);
            - "unknown": nothing found in the time limit (steps None).

            `objective` (when set) is the cost of the returned steps, `lower_bound` a proven
            bound on the least cost within budget.

        Examples
        --------
        >>> from remat_cli import registry
        >>> from remat_cli.importers import generators
        >>> graph = generators.linear(5, seed=1)
        >>> solver = registry.get("chen-greedy")
        >>> result = solver.solve(graph, 28_800, solver.resolve(SolveOptions(seed=0)))
        >>> result.status
        'feasible'
        """
