"""The contract every solver meets, shipped with the package.

As scikit-learn ships ``utils/estimator_checks.py``, so that an out-of-tree solver registered by
entry point runs the same checks as the built-ins::

    from remat_cli.testing import parametrize_with_checks

    @parametrize_with_checks(["my-solver"])
    def test_contract(solver, check):
        check(solver)

or, without pytest, ``check_solver(MySolver())``. Each property is one ``check_*`` function that
takes a solver instance and raises ``AssertionError`` whose message starts with the check's name.
The checks look at the solver's own :class:`~remat_cli.solver.SolverResult` (status, steps,
objective, bounds, `best_peak`), never at the Schedule that ``run_solver`` builds from it, because
``build_schedule`` re-simulates and normalises the status and would hide a wrong claim.

Capability flags select the checks, as scikit-learn's estimator tags do: ``Solver.exact`` adds
the comparison with :func:`brute_force_min_cost` on tiny graphs, ``Solver.warm_starts`` the
"never worse than its --hint" check, and ``Solver.supports(graph)`` picks the graphs.

Only :func:`parametrize_with_checks` needs pytest; it is imported there, not here.

Examples
--------
>>> from remat_cli.testing import check_solver
>>> check_solver("checkpoint-all")  # every applicable check passes: nothing raised
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from typing import Any

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.solver import OptionError, SolveOptions, Solver
from remat_cli.testing.claims import (
    FRACTIONS,
    SLACK,
    TIME_LIMIT,
    TOLERANCE,
    applicable_graphs,
    check_claims,
    fail,
    run_raw,
)
from remat_cli.testing.instances import (
    brute_force_min_cost,
    budget_for,
    contract_graphs,
    tiny_budgets,
    tiny_graph,
    tiny_graphs,
)

Check = Callable[[Solver], None]

__all__ = [
    "Check",
    "all_checks",
    "brute_force_min_cost",
    "budget_for",
    "check_costless_graph",
    "check_describes_itself",
    "check_deterministic",
    "check_exact_matches_brute_force",
    "check_hint_never_worse",
    "check_non_recomputable_run_once",
    "check_options_not_mutated",
    "check_param_bounds",
    "check_param_defaults",
    "check_param_extremes",
    "check_registry_entry",
    "check_solver",
    "check_time_limit",
    "check_valid_within_budget",
    "contract_graphs",
    "parametrize_with_checks",
    "tiny_budgets",
    "tiny_graph",
    "tiny_graphs",
]


# ---- the checks ----
def check_describes_itself(solver: Solver) -> None:
    """The solver's name, method and paper are set; its parameter names are unique.

    Parameters
    ----------
    solver : Solver
        The solver under test, as for every ``check_*`` function.

    Raises
    ------
    AssertionError
        Its message starts with the check's name, as for every ``check_*`` function.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_describes_itself(registry.get("greedy"))
    """
    if not (solver.name and solver.method and solver.paper):
        raise fail("check_describes_itself", "name, method and paper must be set")
    names = [p.name for p in solver.params]
    if len(names) != len(set(names)):
        raise fail("check_describes_itself", f"duplicate parameter names in {names}")


def check_registry_entry(solver: Solver) -> None:
    """The registry's table (what ``remat solvers`` lists without importing) matches the class.

    Parameters
    ----------
    solver : Solver
        A built-in (an out-of-tree solver has no row to drift from and passes).

    Raises
    ------
    AssertionError
        The row's path, method, paper or exactness differs from the class's.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_registry_entry(registry.get("checkmate"))
    """
    entry = registry.BUILTIN.get(solver.name)
    if entry is None:
        return  # an out-of-tree solver: the registry reads its class
    cls = type(solver)
    if entry.path != f"{cls.__module__}:{cls.__name__}" and not entry.path.endswith(f":{cls.__name__}"):
        raise fail("check_registry_entry", f"registry path {entry.path} is not {cls.__name__}")
    theirs = (entry.method, entry.paper, entry.exact)
    if theirs != (solver.method, solver.paper, solver.exact):
        raise fail("check_registry_entry", f"registry says {theirs}, the class says otherwise")


def check_param_defaults(solver: Solver) -> None:
    """Each declared default has the declared type and is one of the declared choices.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        A type other than int, float, str or bool, a default its own :meth:`Param.check
        <remat_cli.solver.Param.check>` refuses, or ``resolve()`` not filling in every option.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_param_defaults(registry.get("greedy"))
    """
    for p in solver.params:
        if p.type not in (int, float, str, bool):
            raise fail("check_param_defaults", f"{p.name}: type {p.type} is not int, float, str or bool")
        try:
            p.check(p.default)
        except OptionError as e:
            raise fail("check_param_defaults", f"default of {e}") from None
    resolved = solver.resolve(SolveOptions())
    if set(resolved.params) != {p.name for p in solver.params}:
        raise fail("check_param_defaults", "resolve() does not fill in every declared option")


def check_param_bounds(solver: Solver) -> None:
    """Every int or float option declares its range, the default inside, and refuses values outside.

    A value outside the range (or NaN) is an option error (exit 2) before the solver runs.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        An option without ``low``/``high``, a default outside them, or a value outside accepted.

    Examples
    --------
    >>> from remat_cli.solver import Param
    >>> from remat_cli import registry
    >>> solver = registry.get("checkpoint-all")
    >>> solver.params = (Param("rounds", int, 3, "rounds"),)  # no range declared
    >>> check_param_bounds(solver)
    Traceback (most recent call last):
    ...
    AssertionError: check_param_bounds: rounds: declare low <= default <= high (got None, 3, None)
    """
    name = "check_param_bounds"
    for p in solver.params:
        if p.type not in (int, float):
            continue
        if p.low is None or p.high is None or not p.low <= p.default <= p.high:
            raise fail(name, f"{p.name}: declare low <= default <= high (got {p.low}, {p.default}, {p.high})")
        outside = [p.low - 1, p.high + 1] + ([float("nan"), float("inf")] if p.type is float else [])
        for value in outside:
            try:
                p.check(p.type(value) if p.type is int else value)
            except OptionError:
                continue
            raise fail(name, f"{p.name}: {value!r} is outside [{p.low:g}, {p.high:g}] but accepted")


def check_param_extremes(solver: Solver) -> None:
    """The solver runs and keeps its claims honest with each number option at either end of its range.

    Each int or float option at its lowest and at its highest allowed value (the others at their
    defaults), on a small graph.

    Parameters
    ----------
    solver : Solver
        The solver under test; each run has half of :data:`TIME_LIMIT`.

    Raises
    ------
    AssertionError
        A run raised (its exception is the message) or its claims disagree with the simulator.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_param_extremes(registry.get("checkpoint-all"))  # no options: nothing to run
    """
    name = "check_param_extremes"
    g = next(applicable_graphs(solver, name, [contract_graphs()["layered"], *contract_graphs().values()]))
    budget = budget_for(g, 0.8)
    for p in solver.params:
        if p.type not in (int, float) or p.low is None or p.high is None:
            continue
        for value in (p.low, p.high):
            params = {p.name: p.type(value)}
            try:
                result, _ = run_raw(
                    solver, g, budget, time_limit=TIME_LIMIT / 2, seed=0, workers=1, params=params
                )
            except Exception as e:  # noqa: BLE001 - any exception is the finding
                raise fail(name, f"--{p.name.replace('_', '-')} {value:g}: {type(e).__name__}: {e}") from None
            check_claims(name, g, budget, result, solver.minimises)


def check_valid_within_budget(solver: Solver) -> None:
    """Every claim of a solve agrees with the simulator, and at the baseline peak a schedule is found.

    Every schedule simulates; "optimal"/"feasible" means within budget; "infeasible" is honest;
    the objective, bound and best_peak agree with the simulator. On each contract graph at 100%,
    80% and 60% of its baseline peak.

    Parameters
    ----------
    solver : Solver
        The solver under test, given :data:`TIME_LIMIT` seconds a solve.

    Raises
    ------
    AssertionError
        The first claim that the simulator contradicts, with the graph and the budget.

    Examples
    --------
    A solver that says "feasible" whatever the budget:

    >>> from remat_cli.schedule import baseline_steps
    >>> from remat_cli.solver import Solver, SolverResult
    >>> class Boastful(Solver):
    ...     name, method, paper = "boastful", "the baseline, always 'feasible'", "-"
    ...     def solve(self, graph, budget, options):
    ...         return SolverResult(steps=baseline_steps(graph), status="feasible")
    >>> check_valid_within_budget(Boastful())
    Traceback (most recent call last):
    ...
    AssertionError: check_valid_within_budget: linear_n5_s1 at budget 28,800: 'feasible' but the ...
    """
    name = "check_valid_within_budget"
    for g in applicable_graphs(solver, name, contract_graphs().values()):
        _check_fractions(solver, name, g, FRACTIONS)


def _check_fractions(solver: Solver, name: str, g: Graph, fractions: Iterable[float]) -> None:
    """At each fraction of the baseline peak the solver's claims hold (_check_claims).

    At the baseline peak itself it finds a schedule.
    """
    for fraction in fractions:
        budget = budget_for(g, fraction)
        result, _ = run_raw(solver, g, budget, time_limit=TIME_LIMIT, seed=0)
        check_claims(name, g, budget, result, solver.minimises)
        if fraction == 1.0 and result.status not in ("optimal", "feasible"):
            raise fail(name, f"{g.name}: no schedule at the baseline peak ({result.status})")


def check_costless_graph(solver: Solver) -> None:
    """On a graph whose costs are all 0 the claims hold as on any other and nothing divides by 0.

    Costs of 0 are valid (a graph written without a cost model); at the baseline peak a schedule
    is found, and nothing divides by the baseline's cost of 0 (a ZeroDivisionError, exit 3).

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        A claim the simulator contradicts, or no schedule at the baseline peak.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_costless_graph(registry.get("chen-sqrtn"))
    """
    name = "check_costless_graph"
    data = contract_graphs()["unet"].model_dump(by_alias=True, exclude_none=True)
    data["name"] = "unet_costless"
    for n in data["nodes"]:
        n["cost"] = 0.0
    g = Graph.model_validate(data)
    for _ in applicable_graphs(solver, name, [g]):
        _check_fractions(solver, name, g, (1.0, 0.7))


def check_time_limit(solver: Solver) -> None:
    """A solve returns within ``--time-limit`` plus a fixed slack.

    On a graph too big to finish early, with :data:`TIME_LIMIT` and :data:`SLACK` seconds.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        The solve took longer, or its claims disagree with the simulator.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_time_limit(registry.get("checkpoint-all"))
    """
    name = "check_time_limit"
    limit = TIME_LIMIT
    for g in applicable_graphs(solver, name, [G.random_layered(80, seed=5), *contract_graphs().values()]):
        result, seconds = run_raw(solver, g, budget_for(g, 0.7), time_limit=limit, seed=0)
        if seconds > limit + SLACK:
            raise fail(name, f"{g.name}: {seconds:.1f}s with --time-limit {limit:g}")
        check_claims(name, g, budget_for(g, 0.7), result, solver.minimises)
        return


def check_deterministic(solver: Solver) -> None:
    """The same seed (one worker) gives the same status and steps, three runs on two graphs.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        Two of the three runs differ.

    Examples
    --------
    A solver that keeps state from one solve to the next:

    >>> from remat_cli.solver import Solver, SolverResult
    >>> class Restless(Solver):
    ...     name, method, paper, runs = "restless", "nothing, said two ways", "-", 0
    ...     def solve(self, graph, budget, options):
    ...         self.runs += 1
    ...         return SolverResult(steps=None, status=("unknown", "infeasible")[self.runs % 2])
    >>> check_deterministic(Restless())
    Traceback (most recent call last):
    ...
    AssertionError: check_deterministic: random_layered_n24_...: three runs with seed 7 differ
    """
    name = "check_deterministic"
    graphs = contract_graphs()
    for g in list(applicable_graphs(solver, name, [graphs["layered"], graphs["unet"]])):
        budget = budget_for(g, 0.8)
        runs = [run_raw(solver, g, budget, time_limit=TIME_LIMIT, seed=7, workers=1)[0] for _ in range(3)]
        if any((r.status, r.steps) != (runs[0].status, runs[0].steps) for r in runs[1:]):
            raise fail(name, f"{g.name}: three runs with seed 7 differ")


def check_options_not_mutated(solver: Solver) -> None:
    """``solve()`` leaves the options it is given (params, hint, limits) as they were.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        An option was changed.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_options_not_mutated(registry.get("chen-greedy"))
    """
    name = "check_options_not_mutated"
    for g in applicable_graphs(solver, name, contract_graphs().values()):
        budget = budget_for(g, 0.8)
        opts = solver.resolve(SolveOptions(time_limit=TIME_LIMIT, seed=3, workers=1, hint=None))
        before = copy.deepcopy((opts.time_limit, opts.seed, opts.workers, opts.hint, opts.params))
        solver.solve(g, budget, opts)
        if (opts.time_limit, opts.seed, opts.workers, opts.hint, opts.params) != before:
            raise fail(name, f"{g.name}: the options were changed")
        return


def check_non_recomputable_run_once(solver: Solver) -> None:
    """A node with ``recomputable=False`` is computed at most once.

    On a chain with one such node and the tiny graphs that have one, at 70% of the baseline
    peak and the two lowest budgets of :func:`tiny_budgets`.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        Such a node ran twice, or a claim the simulator contradicts.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_non_recomputable_run_once(registry.get("chen-greedy"))
    """
    name = "check_non_recomputable_run_once"
    chain = G.linear(8, seed=4)
    chain = Graph.model_validate(
        chain.model_dump() | {"nodes": [n.model_dump() | {"recomputable": n.id != "f2"} for n in chain.nodes]}
    )
    graphs = [chain, *(g for g in tiny_graphs() if not all(n.recomputable for n in g.nodes))]
    for g in applicable_graphs(solver, name, graphs):
        for budget in (budget_for(g, 0.7), *tiny_budgets(g)[:2]):
            result, _ = run_raw(solver, g, budget, time_limit=TIME_LIMIT, seed=0, workers=1)
            check_claims(name, g, budget, result, solver.minimises)
            runs = [s.node for s in result.steps or () if s.op == "compute"]
            for n in g.nodes:
                if not n.recomputable and runs.count(n.id) > 1:
                    raise fail(name, f"{g.name}: {n.id} (not recomputable) ran {runs.count(n.id)} times")


def check_hint_never_worse(solver: Solver) -> None:
    """With a schedule within budget as ``--hint``, the result costs no more than the hint.

    For solvers that declare ``warm_starts``; the hint is the solver's own first schedule at 80%
    of the baseline peak.

    Parameters
    ----------
    solver : Solver
        The solver under test.

    Raises
    ------
    AssertionError
        The warm-started result costs more, or there was no schedule to use as a hint.

    Examples
    --------
    >>> from remat_cli import registry
    >>> check_hint_never_worse(registry.get("checkpoint-all"))  # it never fits 80%
    Traceback (most recent call last):
    ...
    AssertionError: check_hint_never_worse: no schedule within budget to use as a hint
    """
    name = "check_hint_never_worse"
    for g in applicable_graphs(solver, name, [contract_graphs()["unet"], *contract_graphs().values()]):
        budget = budget_for(g, 0.8)
        first, _ = run_raw(solver, g, budget, time_limit=TIME_LIMIT, seed=1, workers=1)
        sim = check_claims(name, g, budget, first, solver.minimises)
        if sim is None or sim.peak_memory > budget:
            continue
        again, _ = run_raw(solver, g, budget, time_limit=TIME_LIMIT, seed=2, workers=1, hint=first.steps)
        sim2 = check_claims(name, g, budget, again, solver.minimises)
        if sim2 is None or sim2.peak_memory > budget or sim2.cost > sim.cost * (1 + TOLERANCE):
            got = "nothing within budget" if sim2 is None or sim2.peak_memory > budget else sim2.cost
            raise fail(name, f"{g.name}: hint of cost {sim.cost}, result {got}")
        return
    raise fail(name, "no schedule within budget to use as a hint")


def check_exact_matches_brute_force(solver: Solver) -> None:
    """For an ``exact`` solver, "optimal" is a proof: checked against :func:`brute_force_min_cost`.

    On tiny graphs (single-output nodes) its cost equals the exhaustive optimum of the
    fixed-order stage space, a schedule is found wherever that space has one, and "optimal" is
    never claimed where it has none. ``exact_params`` set the options under which its space is
    that space.

    Parameters
    ----------
    solver : Solver
        The solver under test, given 30 s a solve.

    Raises
    ------
    AssertionError
        A claim of "optimal" that brute force contradicts, or a missed schedule.

    Examples
    --------
    A solver that calls the baseline optimal:

    >>> from remat_cli.schedule import baseline_steps
    >>> from remat_cli.solver import Solver, SolverResult
    >>> class Proud(Solver):
    ...     name, method, paper, exact = "proud", "the baseline, 'optimal'", "-", True
    ...     def solve(self, graph, budget, options):
    ...         return SolverResult(steps=baseline_steps(graph), status="optimal")
    >>> check_exact_matches_brute_force(Proud())
    Traceback (most recent call last):
    ...
    AssertionError: check_exact_matches_brute_force: linear_n3_s5 at budget 16,000: 'optimal' but ...
    """
    name = "check_exact_matches_brute_force"
    for g in applicable_graphs(solver, name, tiny_graphs()):
        for budget in tiny_budgets(g):
            ref = brute_force_min_cost(g, budget)
            result, _ = run_raw(
                solver, g, budget, time_limit=30.0, seed=0, workers=1, params=solver.exact_params
            )
            sim = check_claims(name, g, budget, result, solver.minimises)
            where = f"{g.name} at budget {budget:,}"
            if ref is None:  # a schedule outside the stage space may still fit: no proof of one
                if result.status == "optimal":
                    raise fail(name, f"{where}: 'optimal' where the stage space has no schedule")
                continue
            if result.status != "optimal" or sim is None:
                raise fail(name, f"{where}: {result.status!r}, the optimum {ref} exists")
            if abs(sim.cost - ref) > TOLERANCE * max(1.0, ref):
                raise fail(name, f"{where}: 'optimal' at cost {sim.cost}, brute force {ref}")


def all_checks(solver: Solver) -> list[Check]:
    """The checks that apply to `solver`, by its capability flags.

    ``warm_starts`` adds :func:`check_hint_never_worse`; ``exact`` (with a cost objective) adds
    :func:`check_exact_matches_brute_force`.

    Parameters
    ----------
    solver : Solver
        The solver.

    Returns
    -------
    list of callable
        The ``check_*`` functions, in the order they run.

    Examples
    --------
    >>> from remat_cli import registry
    >>> len(all_checks(registry.get("checkpoint-all")))
    11
    >>> [c.__name__ for c in all_checks(registry.get("checkmate"))][-2:]
    ['check_hint_never_worse', 'check_exact_matches_brute_force']
    """
    checks: list[Check] = [
        check_describes_itself,
        check_registry_entry,
        check_param_defaults,
        check_param_bounds,
        check_param_extremes,
        check_valid_within_budget,
        check_costless_graph,
        check_time_limit,
        check_deterministic,
        check_options_not_mutated,
        check_non_recomputable_run_once,
    ]
    if solver.warm_starts:
        checks.append(check_hint_never_worse)
    if solver.exact and solver.minimises == "cost":  # a memory objective has its own brute force
        checks.append(check_exact_matches_brute_force)
    return checks


def _instance(solver: Solver | str) -> Solver:
    return registry.get(solver) if isinstance(solver, str) else solver


def check_solver(solver: Solver | str) -> None:
    """Run every applicable check (:func:`all_checks`) without pytest.

    Parameters
    ----------
    solver : Solver or str
        An instance, or a registry name.

    Raises
    ------
    AssertionError
        The first failure, its message starting with its check's name.

    Examples
    --------
    >>> check_solver("checkpoint-all")
    """
    s = _instance(solver)
    for check in all_checks(s):
        check(s)


def parametrize_with_checks(
    solvers: Iterable[Solver | str], marks: Callable[[Solver, Check], Iterable[Any]] | None = None
) -> Any:
    """A pytest mark that parametrizes a test over every (solver, applicable check).

    Parameters
    ----------
    solvers : iterable of Solver or str
        Instances, or registry names.
    marks : callable, optional
        ``marks(solver, check)`` gives the pytest marks of that case (e.g. ``[pytest.mark.slow]``
        for a solver that searches until its time limit), so a fast tier can leave it out.

    Returns
    -------
    pytest.MarkDecorator
        ``pytest.mark.parametrize("solver, check", ...)`` with ids ``NAME-check_name``.

    Examples
    --------
    >>> mark = parametrize_with_checks(["checkpoint-all"])
    >>> [case.id for case in mark.args[1]][:2]
    ['checkpoint-all-check_describes_itself', 'checkpoint-all-check_registry_entry']
    """
    import pytest

    cases = [
        pytest.param(s, c, id=f"{s.name}-{c.__name__}", marks=list(marks(s, c)) if marks else ())
        for s in map(_instance, solvers)
        for c in all_checks(s)
    ]
    return pytest.mark.parametrize("solver, check", cases)
