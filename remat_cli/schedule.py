"""The remat-schedule v1 format and the simulator that defines what a schedule means (docs/FORMATS.md §2).

`simulate()` is the single source of truth: every solver's steps go through it and the
`summary` of a written schedule comes from it, never from a solver's own bookkeeping.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from remat_cli.graph import Graph

SCHEDULE_FORMAT = "remat-schedule"
SCHEDULE_VERSION = 1

Status = Literal["optimal", "feasible", "infeasible", "unknown", "error"]


class ScheduleError(ValueError):
    """A schedule that the simulator rejects; the message names the step."""


class Step(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    op: Literal["compute", "free", "copy"]
    node: str | None = None
    value: str | None = None
    #: multi-device graphs: where a compute runs / a free happens (default: the home device)
    device: str | None = None
    #: copy steps: the value moves from `from` to `to` (and stays live on `from`)
    source: str | None = Field(default=None, alias="from")
    target: str | None = Field(default=None, alias="to")

    @model_validator(mode="after")
    def _target(self) -> Step:
        if self.op == "compute" and self.node is None:
            raise ValueError("a compute step needs 'node'")
        if self.op == "free" and self.value is None:
            raise ValueError("a free step needs 'value'")
        if self.op == "copy" and (self.value is None or self.source is None or self.target is None):
            raise ValueError("a copy step needs 'value', 'from' and 'to'")
        return self


def compute(node: str) -> Step:
    return Step(op="compute", node=node)


def free(value: str, device: str | None = None) -> Step:
    return Step(op="free", value=value, device=device)


def copy(value: str, source: str, target: str) -> Step:
    return Step(op="copy", value=value, source=source, target=target)


class GraphRef(BaseModel):
    name: str
    sha256: str


class TracePoint(BaseModel):
    """One improving incumbent."""

    seconds: float = Field(description="since the time limit's clock started")
    peak_memory: int
    cost: float
    overhead: float = Field(description="cost / baseline cost - 1")
    method: str | None = Field(
        default=None, description="the solver (a portfolio: the lane's solver) that found it"
    )


class SolveTrace(BaseModel):
    """A solve's improving incumbents, in the order they came."""

    first_within_budget: float | None = Field(
        default=None,
        description="seconds from the time limit's start to the first schedule within the budget",
    )
    solver_started: float | None = Field(
        default=None,
        description="seconds from the time limit's start to the solver's (reading the graph and starting up before it)",
    )
    incumbents: list[TracePoint] = Field(default_factory=list)


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
    trace: SolveTrace | None = Field(
        default=None,
        description="`remat solve`: each improving incumbent, and when the first within budget came",
    )


def relative_gap(objective: float | None, bound: float | None) -> float | None:
    """(objective − bound) / objective, the `gap` of a schedule's solver block and of every
    progress line; None unless both are known and finite, 0 for a zero objective."""
    if objective is None or bound is None or not (math.isfinite(objective) and math.isfinite(bound)):
        return None
    return max(0.0, objective - bound) / abs(objective) if objective else 0.0


class Summary(BaseModel):
    peak_memory: int
    cost: float
    baseline_peak_memory: int
    baseline_cost: float
    overhead: float = Field(description="cost / baseline_cost - 1")
    recomputations: int
    #: multi-device graphs only (XEngine): each device's peak, the copy steps and their cost
    #: (`cost` includes `copy_cost`)
    peak_memory_by_device: dict[str, int] | None = None
    copies: int | None = None
    copy_cost: float | None = None


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
    budget: int | None = None  # None: no budget (to_json leaves the key out)
    #: multi-device graphs: the budget of each device (`budget` is then their largest)
    budgets: dict[str, int] | None = None
    solver: SolverInfo
    steps: list[Step]
    summary: Summary
    memory_plan: MemoryPlan | None = None

    def to_json(self) -> str:
        return self.model_dump_json(indent=1, exclude_none=True, by_alias=True)

    @classmethod
    def load(cls, path: str | Path) -> Schedule:
        """Read a remat-schedule file; ScheduleError when it is not one (pydantic's
        ValidationError when its fields are wrong)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ScheduleError(f"cannot read schedule {path}: {e}") from None
        except RecursionError:
            raise ScheduleError(f"cannot read schedule {path}: JSON is nested too deeply") from None
        if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
            raise ScheduleError(f"{path} is not a remat-schedule file")
        return cls.model_validate(data)


@dataclass(frozen=True)
class SimResult:
    peak_memory: int
    cost: float
    recomputations: int
    #: memory at each step (after frees, at the compute instant for computes)
    profile: tuple[int, ...] = ()
    #: multi-device graphs (remat_cli.devices): peak per device (peak_memory is their largest),
    #: copy steps and their total cost (included in `cost`)
    peak_by_device: dict[str, int] | None = None
    copies: int = 0
    copy_cost: float = 0.0
    #: multi-device graphs with keep_profile: each device's live bytes at each step (the step's
    #: instant on the device it acts on, the device's live bytes on the others)
    device_profile: dict[str, tuple[int, ...]] | None = None


def simulate(graph: Graph, steps: Iterable[Step], *, keep_profile: bool = False) -> SimResult:
    """Run `steps` on `graph` by the rules of docs/FORMATS.md §2; raise ScheduleError when invalid.

    A graph with `devices` is simulated per device by :func:`simulate_devices` (docs/FORMATS.md §3).
    """
    if graph.devices:
        return simulate_devices(graph, steps, keep_profile=keep_profile)
    nodes = graph.node_map
    values = graph.value_map
    live: set[str] = {v.id for v in graph.values if v.resident}
    mem = graph.resident_bytes
    peak = mem
    cost = 0.0
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
            if n.id in seen:
                recomputations += 1
            seen.add(n.id)
        elif step.op == "copy":
            raise ScheduleError(f"step {k}: a copy step needs a graph with devices")
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
    return SimResult(peak, cost, recomputations, tuple(profile))


def overhead(cost: float, base_cost: float) -> float:
    """cost / baseline cost − 1 (0 for a graph that costs nothing: costs of 0 are valid)."""
    return cost / base_cost - 1.0 if base_cost > 0 else 0.0


def check_hint(graph: Graph, steps: Iterable[Step]) -> None:
    """A warm start (--hint, ``api.solve(hint=...)``) is a valid schedule of `graph`; else
    ScheduleError saying that it is the hint that is not (the simulator's own message named only
    a step, as if the graph or the output were at fault)."""
    try:
        simulate(graph, steps)
    except ScheduleError as e:
        raise ScheduleError(f"the hint is not a valid schedule of this graph: {e}") from None


@dataclass(frozen=True)
class Evaluation:
    """A schedule's steps simulated and measured against a budget and the baseline: what
    `remat validate` reports and what a written schedule's summary holds."""

    sim: SimResult
    base: SimResult
    budget: int | None
    #: several devices: each device's budget (None: `budget` applies to every device)
    budgets: dict[str, int] | None = None

    @property
    def over_budget_devices(self) -> list[str]:
        """Devices whose peak exceeds their budget (empty for a single-device graph)."""
        if self.sim.peak_by_device is None:
            return []
        limits = self.budgets or {}
        return [
            d
            for d, peak in self.sim.peak_by_device.items()
            if (limit := limits.get(d, self.budget)) is not None and peak > limit
        ]

    @property
    def within_budget(self) -> bool:
        if self.sim.peak_by_device is not None:
            return not self.over_budget_devices
        return self.budget is None or self.sim.peak_memory <= self.budget

    @property
    def overhead(self) -> float:
        return overhead(self.sim.cost, self.base.cost)

    def summary(self) -> Summary:
        multi = self.sim.peak_by_device is not None
        return Summary(
            peak_memory=self.sim.peak_memory,
            cost=self.sim.cost,
            baseline_peak_memory=self.base.peak_memory,
            baseline_cost=self.base.cost,
            overhead=self.overhead,
            recomputations=self.sim.recomputations,
            peak_memory_by_device=self.sim.peak_by_device,
            copies=self.sim.copies if multi else None,
            copy_cost=self.sim.copy_cost if multi else None,
        )


def evaluate(
    graph: Graph,
    steps: Iterable[Step],
    budget: int | None,
    base: SimResult | None = None,
    budgets: dict[str, int] | None = None,
) -> Evaluation:
    """Simulate `steps` (ScheduleError when invalid) and measure them against `budget` (and,
    on a multi-device graph, each device against `budgets`)."""
    return Evaluation(simulate(graph, steps), base or baseline(graph), budget, budgets)


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
    return steps_from_sequence(graph, graph.needed_order)


def baseline(graph: Graph) -> SimResult:
    return simulate(graph, baseline_steps(graph))


def working_set(graph: Graph, node: str) -> int:
    """The bytes live while `node` runs in every schedule, resident ones aside: its inputs, its
    outputs and its workspace."""
    vm = graph.value_map
    n = graph.node_map[node]
    ins = {v for v in n.inputs if not vm[v].resident}
    return sum(vm[v].size for v in ins | set(n.outputs)) + n.workspace


def peak_lower_bound(graph: Graph) -> int:
    """A bound no schedule can go below: the resident bytes plus the larger of (a) all graph
    outputs, which are live together at the end, and (b) any needed node's working set."""
    vm = graph.value_map
    outs = sum(vm[v].size for v in set(graph.outputs) if not vm[v].resident)
    working = max((working_set(graph, n_id) for n_id in graph.needed_nodes), default=0)
    return graph.resident_bytes + max(outs, working)


def simulate_devices(graph: Graph, steps: Iterable[Step], *, keep_profile: bool = False) -> SimResult:
    """The per-device simulator (rules in :mod:`remat_cli.devices` and docs/FORMATS.md §3); raise
    ScheduleError when invalid."""
    dm = graph.device_model
    nodes, values = graph.node_map, graph.value_map
    home = dm.home
    live: dict[str, set[str]] = {d: set() for d in dm.ids}
    live[home] = {v.id for v in graph.values if v.resident}
    mem = dict.fromkeys(dm.ids, 0)
    mem[home] = graph.resident_bytes
    peak = dict(mem)
    cost = copy_cost = 0.0
    recomputations = copies = 0
    seen: set[str] = set()
    profile: list[int] = []
    by_device: dict[str, list[int]] = {d: [] for d in dm.ids}

    def where(k: int, d: str | None) -> str:
        d = d or home
        if d not in live:
            raise ScheduleError(f"step {k}: unknown device {d!r}")
        return d

    def elsewhere(v: str, d: str) -> str:
        on = [e for e in dm.ids if e != d and v in live[e]]
        return f" (it is live on {', '.join(on)})" if on else ""

    for k, step in enumerate(steps):
        if step.op == "compute":
            n = nodes.get(step.node or "")
            if n is None:
                raise ScheduleError(f"step {k}: unknown node {step.node!r}")
            d = where(k, step.device)
            here = live[d]
            for v in n.inputs:
                if v not in here:
                    raise ScheduleError(
                        f"step {k}: computing {n.id!r} on {d!r} needs {v!r}, which is not live on {d!r}"
                        + elsewhere(v, d)
                    )
            out = 0
            for v in n.outputs:
                if v in here:
                    raise ScheduleError(f"step {k}: computing {n.id!r} on {d!r} but its output {v!r} is live")
                out += values[v].size
            instant = mem[d] + out + n.workspace
            peak[d] = max(peak[d], instant)
            mem[d] += out
            here.update(n.outputs)
            cost += dm.cost(n.id, d)
            if n.id in seen:
                recomputations += 1
            seen.add(n.id)
        elif step.op == "copy":
            v = values.get(step.value or "")
            if v is None:
                raise ScheduleError(f"step {k}: unknown value {step.value!r}")
            a, b = where(k, step.source), where(k, step.target)
            if a == b:
                raise ScheduleError(f"step {k}: copying {v.id!r} from {a!r} to itself")
            if v.id not in live[a]:
                raise ScheduleError(f"step {k}: copying {v.id!r} from {a!r}, where it is not live")
            if v.id in live[b]:
                raise ScheduleError(f"step {k}: copying {v.id!r} to {b!r}, where it is already live")
            c = dm.copy_cost(v.id, a, b)
            if c is None:
                raise ScheduleError(f"step {k}: no link and no copy cost for {v.id!r} from {a!r} to {b!r}")
            instant = mem[b] + v.size
            peak[b] = max(peak[b], instant)
            mem[b] += v.size
            live[b].add(v.id)
            cost += c
            copy_cost += c
            copies += 1
        else:
            v = values.get(step.value or "")
            if v is None:
                raise ScheduleError(f"step {k}: unknown value {step.value!r}")
            d = where(k, step.device)
            if v.id not in live[d]:
                raise ScheduleError(f"step {k}: freeing {v.id!r} on {d!r}, where it is not live")
            if v.resident and d == home:
                raise ScheduleError(f"step {k}: freeing {v.id!r}, which is a {v.role}")
            live[d].remove(v.id)
            mem[d] -= v.size
            instant = mem[d]
        if keep_profile:
            profile.append(instant)
            acted = step.target if step.op == "copy" else step.device
            acted = acted or home
            for d in dm.ids:
                by_device[d].append(instant if d == acted else mem[d])
    for v in graph.outputs:
        if not any(v in s for s in live.values()):
            raise ScheduleError(f"graph output {v!r} is not live at the end")
    return SimResult(
        peak_memory=max(peak.values()),
        cost=cost,
        recomputations=recomputations,
        profile=tuple(profile),
        peak_by_device=peak,
        copies=copies,
        copy_cost=copy_cost,
        device_profile={d: tuple(p) for d, p in by_device.items()} if keep_profile else None,
    )
