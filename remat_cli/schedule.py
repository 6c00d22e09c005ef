"""The remat-schedule v1 format and the simulator that defines what a schedule means (DESIGN.md §2).

`simulate()` is the single source of truth: every solver's steps go through it and the
`summary` of a written schedule comes from it, never from a solver's own bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from remat_cli.graph import Graph

SCHEDULE_FORMAT = "remat-schedule"
SCHEDULE_VERSION = 1

Status = Literal["optimal", "feasible", "infeasible", "unknown", "error"]


class ScheduleError(ValueError):
    """A schedule that the simulator rejects; the message names the step."""


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid")

    op: Literal["compute", "free"]
    node: str | None = None
    value: str | None = None
    device: str | None = None

    @model_validator(mode="after")
    def _target(self) -> Step:
        if self.op == "compute" and self.node is None:
            raise ValueError("a compute step needs 'node'")
        if self.op == "free" and self.value is None:
            raise ValueError("a free step needs 'value'")
        return self


def compute(node: str) -> Step:
    return Step(op="compute", node=node)


def free(value: str) -> Step:
    return Step(op="free", value=value)


class GraphRef(BaseModel):
    name: str
    sha256: str


class SolverInfo(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str
    backend: str | None = None
    status: Status
    seconds: float = 0.0
    objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = Field(default=None, description="(objective - lower_bound) / objective")
    params: dict[str, Any] = Field(default_factory=dict)
    message: str | None = None


class Summary(BaseModel):
    peak_memory: int
    cost: float
    baseline_peak_memory: int
    baseline_cost: float
    overhead: float = Field(description="cost / baseline_cost - 1")
    recomputations: int


class PlacedBuffer(BaseModel):
    """One buffer of a memory plan: a production of `value` (or the workspace of `node`) at `step`."""

    model_config = ConfigDict(extra="forbid")

    value: str | None = Field(default=None, description="the value produced at `step`")
    node: str | None = Field(default=None, description="set instead of `value` for a node's workspace")
    step: int = Field(ge=0, description="index in `steps` of the compute step that allocates it")
    offset: int = Field(ge=0, description="bytes from the arena's start")
    size: int = Field(ge=0, description="bytes")


class MemoryPlan(BaseModel):
    """Byte offsets of every intermediate buffer inside one arena (resident values live outside)."""

    model_config = ConfigDict(extra="forbid")

    arena: int = Field(ge=0, description="bytes of the one preallocated buffer")
    alignment: int = Field(default=1, ge=1, description="every offset is a multiple of this")
    offsets: list[PlacedBuffer]


class Schedule(BaseModel):
    """remat-schedule v1. Extra optional keys (memory_plan, per-device budgets) are allowed."""

    model_config = ConfigDict(extra="allow")

    format: Literal["remat-schedule"] = SCHEDULE_FORMAT
    version: Literal[1] = SCHEDULE_VERSION
    graph: GraphRef
    budget: int | None
    solver: SolverInfo
    steps: list[Step]
    summary: Summary
    memory_plan: MemoryPlan | None = None

    def to_json(self) -> str:
        return self.model_dump_json(indent=1, exclude_none=True)


@dataclass(frozen=True)
class SimResult:
    peak_memory: int
    cost: float
    computes: int
    recomputations: int
    #: memory at each step (after frees, at the compute instant for computes)
    profile: tuple[int, ...] = ()


def simulate(graph: Graph, steps: Iterable[Step], *, keep_profile: bool = False) -> SimResult:
    """Run `steps` on `graph` by the rules of DESIGN.md §2; raise ScheduleError when invalid."""
    nodes = graph.node_map
    values = graph.value_map
    live: set[str] = {v.id for v in graph.values if v.resident}
    mem = graph.resident_bytes
    peak = mem
    cost = 0.0
    computes = 0
    seen: set[str] = set()
    recomputations = 0
    profile: list[int] = []
    for k, step in enumerate(steps):
        if step.op == "compute":
            n = nodes.get(step.node or "")
            if n is None:
                raise ScheduleError(f"step {k}: unknown node {step.node!r}")
            for v in n.inputs:
                if v not in live:
                    raise ScheduleError(f"step {k}: computing {n.id!r} needs {v!r}, which is not live")
            out = 0
            for v in n.outputs:
                if v in live:
                    raise ScheduleError(f"step {k}: computing {n.id!r} but its output {v!r} is live")
                out += values[v].size
            peak = max(peak, mem + out + n.workspace)
            if keep_profile:
                profile.append(mem + out + n.workspace)
            mem += out
            live.update(n.outputs)
            cost += n.cost
            computes += 1
            if n.id in seen:
                recomputations += 1
            seen.add(n.id)
        else:
            v = values.get(step.value or "")
            if v is None:
                raise ScheduleError(f"step {k}: unknown value {step.value!r}")
            if v.id not in live:
                raise ScheduleError(f"step {k}: freeing {v.id!r}, which is not live")
            if v.resident:
                raise ScheduleError(f"step {k}: freeing {v.id!r}, which is a {v.role}")
            live.remove(v.id)
            mem -= v.size
            if keep_profile:
                profile.append(mem)
    for v in graph.outputs:
        if v not in live:
            raise ScheduleError(f"graph output {v!r} is not live at the end")
    return SimResult(peak, cost, computes, recomputations, tuple(profile))


def steps_from_sequence(graph: Graph, sequence: Sequence[str]) -> list[Step]:
    """Compute steps for `sequence` (node ids, repeats allowed), each value freed right after
    its last use before its producer runs again (right after production when unused).

    This is the memory-minimal way to run a fixed compute sequence, and the common decoder of
    every solver that decides *what* to compute and *when* (Checkmate's R, FastSA's sequence,
    Moccasin's interval starts). Outputs of the final production of a graph output stay live.
    """
    nodes = graph.node_map
    outputs = set(graph.outputs)
    resident = {v.id for v in graph.values if v.resident}
    free_after: dict[int, list[str]] = {}
    last_pos: dict[str, int] = {}  # value -> position of its current production or last use

    def close(v: str) -> None:
        free_after.setdefault(last_pos.pop(v), []).append(v)

    for k, n_id in enumerate(sequence):
        n = nodes[n_id]
        for v in n.inputs:
            if v not in resident:
                last_pos[v] = k
        for v in n.outputs:
            if v in last_pos:
                close(v)
            last_pos[v] = k
    for v in list(last_pos):
        if v not in outputs:
            close(v)
    steps: list[Step] = []
    for k, n_id in enumerate(sequence):
        steps.append(compute(n_id))
        steps.extend(free(v) for v in free_after.get(k, ()))
    return steps


def baseline_steps(graph: Graph) -> list[Step]:
    """ "No rematerialization": run `order` (nodes some output needs), free each value after its
    last consumer, or right after its producer when nothing consumes it."""
    needed = graph.needed_nodes
    return steps_from_sequence(graph, [n for n in graph.topo_order if n in needed])


def baseline(graph: Graph) -> SimResult:
    return simulate(graph, baseline_steps(graph))


def peak_lower_bound(graph: Graph) -> int:
    """A bound no schedule can go below: the resident bytes plus the larger of (a) all graph
    outputs, which are live together at the end, and (b) any needed node's working set."""
    vm = graph.value_map
    resident = graph.resident_bytes
    outs = sum(vm[v].size for v in set(graph.outputs) if not vm[v].resident)
    working = 0
    for n_id in graph.needed_nodes:
        n = graph.node_map[n_id]
        ins = {v for v in n.inputs if not vm[v].resident}
        working = max(working, sum(vm[v].size for v in ins | set(n.outputs)) + n.workspace)
    return resident + max(outs, working)
