"""`remat solve`: one solver on one graph and budget, under the watchdog; the schedule to a file or stdout."""

from __future__ import annotations

import time

import click

from remat_cli import registry
from remat_cli.budget import BUDGET_HELP
from remat_cli.cli.common import (
    BOUND_TIME_LIMIT,
    POSITIVE_INT,
    SECONDS,
    BadInput,
    check_writable,
    device_budgets,
    emit,
    err,
    fail,
    friendly_errors,
    graph_options,
    native_stdout_to_stderr,
    parse_solver_args,
    print_summary,
    read_graph,
    read_schedule,
    resolve_budget,
)
from remat_cli.cli.live import BackgroundBound, LiveLine
from remat_cli.execution import watchdog
from remat_cli.execution.exit_codes import EXIT_INFEASIBLE, EXIT_OK
from remat_cli.execution.runner import with_cost_bound
from remat_cli.execution.trace import TraceRecorder
from remat_cli.execution.watchdog import run_guarded
from remat_cli.schedule import baseline, check_hint, peak_lower_bound
from remat_cli.solver import SolveOptions


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", required=True, help=BUDGET_HELP)
@click.option("--solver", "-s", "solver_name", default="auto", show_default=True, help="See `remat solvers`.")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write the schedule here (default: stdout)."
)
@click.option(
    "--time-limit",
    type=SECONDS,
    default=None,
    help="Seconds; the best schedule so far is returned (default for auto and hilp: 60).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workers",
    type=POSITIVE_INT,
    default=None,
    help="Threads for solvers that use them (default: the cores this process may run on).",
)
@click.option("--hint", type=click.Path(exists=True, dir_okay=False), help="A schedule to warm-start from.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
@click.option(
    "--bound",
    is_flag=True,
    help="After the solve, the least overhead any schedule within the budget needs (remat info "
    "--budget) becomes the schedule's lower bound; status optimal when the schedule meets it.",
)
@BOUND_TIME_LIMIT
@graph_options
@click.pass_context
@friendly_errors
def solve(
    ctx: click.Context,
    graph_path: str,
    budget: str,
    solver_name: str,
    output: str | None,
    time_limit: float | None,
    seed: int,
    workers: int | None,
    hint: str | None,
    quiet: bool,
    bound: bool,
    bound_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Find a schedule for GRAPH within --budget.

    Solver-specific options follow the common ones, e.g. `--solver moccasin --max-copies 3`;
    `remat solvers NAME` lists them.
    """
    begun = watchdog.command_started(time.monotonic())
    watchdog.exit_on_sigterm()
    check_writable(output)
    if not quiet and registry.numba_cache_cold(solver_name):
        click.echo(  # not err.print: rich would wrap the line
            f"remat: note: {solver_name} compiles its numba kernels on first use (about a minute, "
            "not counted in --time-limit); later runs load them from numba's cache",
            err=True,
        )
    solver = registry.get(solver_name)
    params = parse_solver_args(solver, ctx.args)
    state, reason = solver.availability()
    if state != "available":
        raise BadInput(f"solver {solver_name!r} is unavailable: {reason}")
    graph = read_graph(graph_path, input_shapes, batch, cost)
    why_not = solver.supports(graph)
    if why_not is not None:
        raise BadInput(f"solver {solver_name!r} does not apply to this graph: {why_not}")
    budgets = device_budgets(graph, budget) if graph.devices else None
    budget_bytes = max(budgets.values()) if budgets else resolve_budget(graph, budget)
    hint_steps = None
    if hint:
        hint_schedule = read_schedule(hint)
        check_hint(graph, hint_schedule.steps)  # a hint for another graph is bad input
        hint_steps = hint_schedule.steps
    if time_limit is None and solver_name == "auto":
        time_limit = 60.0
    options = SolveOptions(time_limit=time_limit, seed=seed, hint=hint_steps, params=params, budgets=budgets)
    if workers is not None:
        options.workers = workers
    base = baseline(graph)
    recorder = TraceRecorder(budget_bytes, base.cost, begun)
    # --bound: the cut bound beside the solve, at a lower priority (shown live, used after it)
    background = None
    if bound and not graph.devices and solver.minimises == "cost":
        background = BackgroundBound(graph, budget_bytes, (time_limit or 0.0) + bound_time_limit)
    try:
        if quiet or not err.is_terminal:
            outcome = run_guarded(graph, budget_bytes, solver_name, options, begun, recorder)
        else:
            with LiveLine(err, solver_name, time_limit, recorder, base.peak_memory, background) as live:
                options.on_progress = live.progress
                outcome = run_guarded(graph, budget_bytes, solver_name, options, begun, recorder)
        solved = outcome.schedule is not None and outcome.schedule.solver.status != "infeasible"
        cut = (
            background.poll(bound_time_limit)
            if background is not None and solved and not outcome.signal
            else None
        )
    finally:
        if background is not None:
            background.stop()
    schedule, result = outcome.schedule, outcome.result
    # SIGINT/SIGTERM: the best schedule so far is written as usual, then exit 128 + signal
    code = EXIT_INFEASIBLE if outcome.signal is None else 128 + outcome.signal
    if schedule is None:
        peak = f"; lowest peak reached {result.best_peak:,} B" if result.best_peak else ""
        fail(
            f"no schedule within {budget_bytes:,} B found by {solver_name} ({result.status}{peak}; "
            f"lower bound {peak_lower_bound(graph):,} B){': ' + result.message if result.message else ''}",
            code,
            exit=watchdog.exit_fast,
        )
    if bound and schedule.solver.status != "infeasible":
        try:
            with native_stdout_to_stderr():  # HiGHS's own prints
                schedule = with_cost_bound(graph, schedule, bound_time_limit, cut)
        except KeyboardInterrupt:  # the schedule found is still written, without the bound
            click.echo("remat: note: --bound interrupted; the schedule is written without it", err=True)
    if not quiet:
        print_summary(schedule)
    if schedule.solver.status == "infeasible":
        # Keep the user's output file untouched: nothing within budget was found.
        if schedule.memory_plan is not None:  # the footprint is resident bytes + the planned arena
            fail(
                f"no schedule within {budget_bytes:,} B found by {solver_name}: smallest arena "
                f"{schedule.memory_plan.arena:,} B + resident {graph.resident_bytes:,} B = "
                f"{graph.resident_bytes + schedule.memory_plan.arena:,} B (lower bound "
                f"{int(schedule.solver.lower_bound or peak_lower_bound(graph)):,} B)",
                code,
                exit=watchdog.exit_fast,
            )
        fail(
            f"no schedule within {budget_bytes:,} B found by {solver_name}: lowest peak reached "
            f"{schedule.summary.peak_memory:,} B (lower bound {peak_lower_bound(graph):,} B)",
            code,
            exit=watchdog.exit_fast,
        )
    emit(schedule.to_json(), output)
    watchdog.exit_fast(EXIT_OK if outcome.signal is None else 128 + outcome.signal)
