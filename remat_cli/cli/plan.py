"""`remat plan GRAPH SCHEDULE`: add a memory_plan (byte offsets in one arena) to any schedule."""

from __future__ import annotations

import click

from remat_cli import registry
from remat_cli.cli.common import (
    SECONDS,
    BadInput,
    emit,
    err,
    friendly_errors,
    graph_options,
    human_bytes,
    native_stdout_to_stderr,
    read_graph,
    read_schedule,
)
from remat_cli.graph import Graph
from remat_cli.planning.check import check_plan
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.schedule import Schedule, simulate
from remat_cli.solver import SolveOptions, usable_cores


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.argument("schedule_path", metavar="SCHEDULE", type=click.Path(dir_okay=False))
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False),
    help="Write the planned schedule here (default: stdout).",
)
@click.option(
    "--alignment",
    type=int,
    default=64,
    show_default=True,
    help="Offsets and sizes are multiples of this (bytes).",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(min=0.0),
    default=10.0,
    show_default=True,
    help="Seconds for perturbed best fit (size and breadth orders), the big buffers placed exactly first, "
    "ruin and recreate and MODeL's exact address model (CP-SAT) after the greedy best fit; ends early "
    "once the arena is the schedule's peak; 0 = greedy only.",
)
@click.option(
    "--workers",
    type=click.IntRange(min=1),
    default=None,
    help="CP-SAT's threads (default: the cores this process may run on).",
)
@click.option(
    "--fit",
    is_flag=True,
    help="Where the resident bytes and the arena pass the schedule's budget, level the schedule (its "
    "operators reordered under its peak, at no cost; a little recomputation where that is not "
    "enough) and place it again, then solve again with its solver and options at a budget lowered "
    "by the excess (at most twice); the first plan that fits is written, else the schedule's own.",
)
@click.option(
    "--solve-time-limit",
    type=SECONDS,
    default=60.0,
    show_default=True,
    help="With --fit: seconds for each solve.",
)
@graph_options
@friendly_errors
def plan(
    graph_path: str,
    schedule_path: str,
    output: str | None,
    alignment: int,
    time_limit: float,
    workers: int | None,
    fit: bool,
    solve_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Give every buffer of SCHEDULE an offset in one arena (each production of a value is its own
    buffer; resident inputs and parameters stay outside). Best fit in seven buffer orders, then, with
    --time-limit, perturbed best fit, ruin and recreate and MODeL's address model with the order fixed."""
    if alignment < 1:
        raise BadInput("--alignment must be at least 1")
    g = read_graph(graph_path, input_shapes, batch, cost)
    s = read_schedule(schedule_path)
    if s.graph.sha256 != g.sha256():
        raise BadInput("the schedule was made for another graph (graph.sha256 differs)")
    simulate(g, s.steps)
    n_workers = workers or usable_cores()
    if fit:
        s = fitted(g, s, alignment, time_limit, solve_time_limit, n_workers)
        memory_plan, note = s.memory_plan, ""
    else:
        # imported here: `remat --help` and `remat solvers` load no solver module (registry.py)
        from remat_cli.planning.addresses import place

        bufs = buffers_of(g, s.steps)
        offsets, arena, bound, optimal = place(bufs, alignment, time_limit, n_workers)
        memory_plan = make_plan(bufs, offsets, alignment)
        note = " (optimal)" if optimal else f" (bound {bound:,} B)"
    assert memory_plan is not None
    report = check_plan(g, s.steps, memory_plan)
    arena = memory_plan.arena
    err.print(
        f"arena {human_bytes(arena)} ({arena:,} B) for {len(memory_plan.offsets)} buffers, schedule's peak of "
        f"arena bytes {human_bytes(report.peak)}: fragmentation {100 * report.fragmentation:.2f}%{note}"
    )
    emit(s.model_copy(update={"memory_plan": memory_plan}).to_json(), output)


def fitted(
    g: Graph, s: Schedule, alignment: int, place_time: float, solve_time: float, workers: int
) -> Schedule:
    """`s` with a memory plan fitted to its budget: its own, its own levelled (reordered, and
    where that is not enough a little recomputed), or that of the schedule its solver finds
    below the budget (:func:`remat_cli.execution.fit.fit_plan`)."""
    if s.budget is None:
        raise BadInput("--fit needs a schedule with a budget")
    if s.solver.name not in registry.names():
        raise BadInput(f"--fit solves again with the schedule's solver, and {s.solver.name!r} is not one")
    from remat_cli.execution.fit import LEVELLED, fit_plan

    solver = registry.get(s.solver.name)
    declared = {p.name for p in solver.params}
    params = {k: v for k, v in (s.solver.params or {}).items() if k in declared}
    options = SolveOptions(time_limit=solve_time, seed=0, params=params, workers=workers)
    with native_stdout_to_stderr():
        best, _ = fit_plan(
            g, s.budget, s.solver.name, options, alignment=alignment, place_time=place_time, start=s
        )
    assert best is not None  # fit_plan places `start` at least
    if best.steps != s.steps:
        how = "levelled" if LEVELLED in (best.solver.message or "") else "solved again below the budget"
        err.print(
            f"--fit: {how}: peak {best.summary.peak_memory:,} B (was "
            f"{s.summary.peak_memory:,} B), overhead {best.summary.overhead:.2%} (was {s.summary.overhead:.2%})"
        )
    fits = g.resident_bytes + best.memory_plan.arena <= s.budget if best.memory_plan else False
    if not fits:
        err.print("--fit: no plan found fits the budget; the plan executor hands dead pages back to keep it")
    return best
