"""The memory-plan checker: is a `memory_plan` a valid placement for a schedule's steps?

Independent of every planner (MODeL, Steiner et al., ICML 2023, §4.3 states the property it
must have: two tensors may share bytes only if they are never resident together). It walks the
steps with the simulator's liveness rules (DESIGN.md §2) and keeps its own table of placed live
buffers, so a bug in how a planner derives lifetimes cannot hide here.
"""

from __future__ import annotations

from bisect import insort
from dataclasses import dataclass

from remat_cli.graph import Graph
from remat_cli.schedule import MemoryPlan, PlacedBuffer, ScheduleError, Step


class PlanError(ScheduleError):
    """A memory plan that places two live buffers on the same bytes, or outside its arena."""


@dataclass(frozen=True)
class PlanReport:
    arena: int
    #: the schedule's peak of arena-held bytes (intermediates + workspace; resident values excluded)
    peak: int
    #: arena / peak - 1: the bytes the layout wastes beyond what is live at the worst step
    fragmentation: float
    buffers: int


def check_plan(graph: Graph, steps: list[Step], plan: MemoryPlan) -> PlanReport:
    """Raise PlanError unless every buffer lies in [0, arena), is aligned, has its value's size,
    and overlaps no buffer live at the same time. Returns arena, peak and fragmentation."""
    vm = graph.value_map
    nodes = graph.node_map
    by_step: dict[tuple[int, str], PlacedBuffer] = {}
    for b in plan.offsets:
        if (b.value is None) == (b.node is None):
            raise PlanError(f"plan entry at step {b.step}: give exactly one of 'value' and 'node'")
        key = (b.step, b.value if b.value is not None else f"workspace:{b.node}")
        if key in by_step:
            raise PlanError(f"plan places {key[1]!r} of step {b.step} twice")
        by_step[key] = b
        if b.offset % plan.alignment:
            raise PlanError(
                f"{key[1]!r} (step {b.step}) at offset {b.offset} breaks alignment {plan.alignment}"
            )
        if b.offset + b.size > plan.arena:
            raise PlanError(
                f"{key[1]!r} (step {b.step}) ends at {b.offset + b.size:,} B, outside the arena of {plan.arena:,} B"
            )
    live: dict[str, PlacedBuffer] = {}  # value id -> its placed buffer
    intervals: list[tuple[int, int, str]] = []  # (offset, end, value) of live buffers, sorted
    used = 0
    peak = 0
    consumed: set[tuple[int, str]] = set()

    def need(step: int, name: str, size: int) -> PlacedBuffer:
        b = by_step.get((step, name))
        if b is None:
            raise PlanError(f"plan has no offset for {name!r} produced at step {step}")
        if b.size < size:
            raise PlanError(f"{name!r} (step {step}) needs {size:,} B but the plan gives {b.size:,} B")
        consumed.add((step, name))
        return b

    def clash(b: PlacedBuffer, name: str, step: int, against: list[tuple[int, int, str]]) -> None:
        lo, hi = b.offset, b.offset + b.size
        if lo == hi:
            return
        for o, e, other in against:
            if o >= hi:
                break
            if e > lo and o < e:
                raise PlanError(
                    f"step {step}: {name!r} at [{lo:,}, {hi:,}) overlaps live {other!r} at [{o:,}, {e:,})"
                )

    for k, step in enumerate(steps):
        if step.op == "compute":
            n = nodes.get(step.node or "")
            if n is None:
                raise ScheduleError(f"step {k}: unknown node {step.node!r}")
            new: list[tuple[int, int, str]] = []
            size_now = 0
            for v in n.outputs:
                b = need(k, v, vm[v].size)
                clash(b, v, k, intervals)
                clash(b, v, k, sorted(new))
                new.append((b.offset, b.offset + vm[v].size, v))
                size_now += vm[v].size
            if n.workspace:
                w = need(k, f"workspace:{n.id}", n.workspace)
                clash(w, f"workspace of {n.id}", k, intervals)
                clash(w, f"workspace of {n.id}", k, sorted(new))
                size_now += n.workspace
            peak = max(peak, used + size_now)
            for o, e, v in new:
                if v in live:
                    raise ScheduleError(f"step {k}: computing {n.id!r} but its output {v!r} is live")
                live[v] = by_step[(k, v)]
                insort(intervals, (o, e, v))
                used += e - o
        else:
            v = step.value or ""
            if v in live:
                b = live.pop(v)
                intervals.remove((b.offset, b.offset + vm[v].size, v))
                used -= vm[v].size
            elif v not in vm or not vm[v].resident:
                raise ScheduleError(f"step {k}: freeing {v!r}, which is not live")
    unused = set(by_step) - consumed
    if unused:
        step, name = min(unused)
        raise PlanError(f"plan places {name!r} at step {step}, which does not produce it")
    frag = plan.arena / peak - 1.0 if peak else 0.0
    return PlanReport(arena=plan.arena, peak=peak, fragmentation=frag, buffers=len(plan.offsets))
