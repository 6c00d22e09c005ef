"""A deployable model of a hand-made schedule for the deployment tests: the model's own order
with a memory plan, turned into a model by `remat apply`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from click.testing import CliRunner

from remat_cli.cli.deploy import apply_command
from remat_cli.execution.runner import build_schedule
from remat_cli.graph import Graph
from remat_cli.planning.addresses import place
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.schedule import Schedule, steps_from_sequence
from remat_cli.solver import SolverResult


def apply_planned_order(
    model: Path, graph: Graph, schedule: Path, out: Path, *, spread: bool = False, budget: int | None = None
) -> Schedule:
    """Write the schedule that runs `graph`'s nodes in their order with a memory plan (64-byte
    alignment) to `schedule`, and `remat apply`'s model of it to `out`; that schedule.
    `spread`: every buffer at bytes of its own, none reused (a valid plan, the widest one);
    `budget`: the schedule's (none by default)."""
    steps = steps_from_sequence(graph, [n.id for n in graph.nodes])
    sched = build_schedule(graph, budget, "by-hand", SolverResult(steps=steps, status="feasible"), 0.0)
    bufs = buffers_of(graph, sched.steps)
    if spread:
        ends = np.cumsum([-(-b.size // 64) * 64 for b in bufs])
        offsets = [0, *(int(e) for e in ends[:-1])]
    else:
        offsets, _, _, _ = place(bufs, 64, 1.0, 1)
    sched.memory_plan = make_plan(bufs, offsets, 64)
    schedule.write_text(sched.to_json())
    res = CliRunner().invoke(apply_command, [str(model), str(schedule), "-o", str(out)])
    assert res.exit_code == 0, res.output
    return sched
