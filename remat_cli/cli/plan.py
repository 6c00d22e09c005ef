"""`remat plan GRAPH SCHEDULE`: add a memory_plan (byte offsets in one arena) to any schedule."""

from __future__ import annotations

import click

from remat_cli.cli.common import (
    BadInput,
    emit,
    err,
    friendly_errors,
    graph_options,
    human_bytes,
    read_graph,
    read_schedule,
)
from remat_cli.planning.check import check_plan
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.schedule import simulate
from remat_cli.solver import usable_cores


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
@graph_options
@friendly_errors
def plan(
    graph_path: str,
    schedule_path: str,
    output: str | None,
    alignment: int,
    time_limit: float,
    workers: int | None,
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
    bufs = buffers_of(g, s.steps)
    # imported here: `remat --help` and `remat solvers` load no solver module (registry.py)
    from remat_cli.planning.addresses import place

    offsets, arena, bound, optimal = place(bufs, alignment, time_limit, workers or usable_cores())
    memory_plan = make_plan(bufs, offsets, alignment)
    report = check_plan(g, s.steps, memory_plan)
    err.print(
        f"arena {human_bytes(arena)} ({arena:,} B) for {len(bufs)} buffers, schedule's peak of arena bytes "
        f"{human_bytes(report.peak)}: fragmentation {100 * report.fragmentation:.2f}%"
        + (" (optimal)" if optimal else f" (bound {bound:,} B)")
    )
    emit(s.model_copy(update={"memory_plan": memory_plan}).to_json(), output)
