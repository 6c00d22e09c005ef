"""The remat-graph v1 format (docs/FORMATS.md §1): pydantic models, validation and the canonical hash.

A graph is bipartite: *values* (tensors) and *nodes* (operators). Solvers that think of one
output per node (Checkmate, Moccasin, FastSA) use :class:`NodeView`, which folds each node's
outputs into one block of memory that is kept and freed together.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Role = Literal["input", "parameter", "intermediate"]
Phase = Literal["forward", "backward", "loss", "other"]

GRAPH_FORMAT = "remat-graph"
GRAPH_VERSION = 1
#: sizes are int64 in every engine (numpy, OR-Tools, HiGHS); a graph whose bytes overflow it is refused
MAX_BYTES = 2**63 - 1
#: the most the node costs may add up to, times the number of nodes: a schedule recomputes nodes
#: and the solvers sum costs (Checkmate's objective over T^2 terms), and past it those sums
#: overflow a float (two costs of 1e308: overhead nan, checkmate a ZeroDivisionError)
MAX_COST_TOTAL = 1e300


class GraphError(ValueError):
    """A graph that breaks the contract; the message names the offending id."""


class Value(BaseModel):
    """One tensor."""

    model_config = ConfigDict(extra="forbid")

    id: str
    size: int = Field(ge=0, description="bytes")
    role: Role = "intermediate"
    dtype: str | None = None
    shape: list[int | str] | None = None

    @property
    def resident(self) -> bool:
        return self.role != "intermediate"


class Node(BaseModel):
    """One operator."""

    model_config = ConfigDict(extra="forbid")

    id: str
    inputs: list[str] = Field(default_factory=list)
    outputs: list[str] = Field(min_length=1)
    cost: float = Field(default=1.0, ge=0, allow_inf_nan=False)
    workspace: int = Field(default=0, ge=0, description="temporary bytes while it runs")
    op: str | None = None
    phase: Phase | None = None
    grad_of: str | None = None
    scope: str | None = Field(
        default=None, description="the module the node belongs to, e.g. blocks.7.attn (from export-torch)"
    )
    recomputable: bool = True
    device_costs: dict[str, Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = None
    source: list[str] | None = Field(default=None, description="runtime names it stands for")


class Device(BaseModel):
    """One device of a multi-device graph (XEngine §3.1): its own memory and compute costs."""

    model_config = ConfigDict(extra="forbid")

    id: str
    budget: int | None = Field(default=None, ge=0, description="bytes; the CLI's --budget overrides it")
    kind: str | None = Field(default=None, description="what runs it, e.g. cpu or cuda (for remat run)")


class Link(BaseModel):
    """A one-way link: copying a value of `size` bytes costs latency + size / bandwidth."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    source: str = Field(alias="from")
    target: str = Field(alias="to")
    latency: float = Field(default=0.0, ge=0, description="cost units per copy")
    bandwidth: float = Field(gt=0, description="bytes per cost unit")


class CopyCost(BaseModel):
    """The measured cost of copying one value in one direction; it wins over the link's formula."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    value: str
    source: str = Field(alias="from")
    target: str = Field(alias="to")
    cost: float = Field(ge=0)


class Graph(BaseModel):
    """A dataflow graph: remat-graph v1."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["remat-graph"] = GRAPH_FORMAT
    version: Literal[1] = GRAPH_VERSION
    name: str = "graph"
    cost_unit: str | None = None
    values: list[Value]
    nodes: list[Node]
    outputs: list[str]
    order: list[str] | None = None
    #: multi-device graphs (XEngine): without `devices` the graph is one device, as always
    devices: list[Device] | None = None
    home: str | None = Field(
        default=None, description="device holding inputs and parameters (default: first)"
    )
    links: list[Link] | None = None
    copy_costs: list[CopyCost] | None = None

    @model_validator(mode="after")
    def _check(self) -> Graph:
        _validate(self)
        return self

    # ---- lookups (graphs are treated as immutable once built) ----
    @cached_property
    def value_map(self) -> dict[str, Value]:
        return {v.id: v for v in self.values}

    @cached_property
    def node_map(self) -> dict[str, Node]:
        return {n.id: n for n in self.nodes}

    @cached_property
    def producer(self) -> dict[str, str]:
        return {v: n.id for n in self.nodes for v in n.outputs}

    @cached_property
    def consumers(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {v.id: [] for v in self.values}
        for n in self.nodes:
            for v in dict.fromkeys(n.inputs):
                out[v].append(n.id)
        return out

    @cached_property
    def topo_order(self) -> list[str]:
        """`order` if given, else the order of `nodes` (validated to be topological)."""
        return list(self.order) if self.order is not None else [n.id for n in self.nodes]

    @cached_property
    def resident_bytes(self) -> int:
        return sum(v.size for v in self.values if v.resident)

    @cached_property
    def needed_nodes(self) -> set[str]:
        """Nodes some graph output depends on; the others never need to run."""
        needed: set[str] = set()
        stack = [self.producer[v] for v in self.outputs if v in self.producer]
        while stack:
            n = stack.pop()
            if n in needed:
                continue
            needed.add(n)
            stack.extend(self.producer[v] for v in self.node_map[n].inputs if v in self.producer)
        return needed

    @cached_property
    def needed_order(self) -> list[str]:
        """The needed nodes in `topo_order`: what the baseline runs, and every solver's program."""
        needed = self.needed_nodes
        return [n for n in self.topo_order if n in needed]

    @cached_property
    def node_view(self) -> NodeView:
        return NodeView(self)

    def canonical_json(self) -> str:
        return json.dumps(
            self.model_dump(mode="json", exclude_none=True, by_alias=True),
            sort_keys=True,
            separators=(",", ":"),
        )

    def sha256(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    def to_json(self) -> str:
        return self.model_dump_json(indent=1, exclude_none=True, by_alias=True)

    @cached_property
    def device_model(self) -> DeviceModel:
        """Per-device costs of a multi-device graph."""
        return DeviceModel(self)

    @cached_property
    def home_device(self) -> str | None:
        """Where inputs and parameters live: `home`, else the first device (None: no devices)."""
        if not self.devices:
            return None
        return self.home or self.devices[0].id


def _validate(g: Graph) -> None:
    def dup(ids: Iterable[str], what: str) -> None:
        seen: set[str] = set()
        for i in ids:
            if i in seen:
                raise GraphError(f"duplicate {what} id {i!r}")
            seen.add(i)

    _check_sizes(g)
    _check_costs(g)
    dup((v.id for v in g.values), "value")
    dup((n.id for n in g.nodes), "node")
    values = {v.id: v for v in g.values}
    producer: dict[str, str] = {}
    for n in g.nodes:
        for v in n.inputs:
            if v not in values:
                raise GraphError(f"node {n.id!r} reads unknown value {v!r}")
        for v in n.outputs:
            if v not in values:
                raise GraphError(f"node {n.id!r} writes unknown value {v!r}")
            if v in producer:
                raise GraphError(f"value {v!r} is produced by both {producer[v]!r} and {n.id!r}")
            if values[v].resident:
                raise GraphError(f"value {v!r} is a {values[v].role} but node {n.id!r} produces it")
            producer[v] = n.id
        if len(set(n.outputs)) != len(n.outputs):
            raise GraphError(f"node {n.id!r} lists an output twice")
        if set(n.inputs) & set(n.outputs):
            raise GraphError(f"node {n.id!r} reads its own output")
    for v in g.values:
        if not v.resident and v.id not in producer:
            raise GraphError(f"intermediate value {v.id!r} has no producer")
    for v in g.outputs:
        if v not in values:
            raise GraphError(f"graph output {v!r} is not a value")
    node_ids = {n.id for n in g.nodes}
    if g.order is not None:
        dup(g.order, "order entry")
        for n in g.order:
            if n not in node_ids:
                raise GraphError(f"order names unknown node {n!r}")
        missing = node_ids - set(g.order)
        if missing:
            raise GraphError(f"order misses node {sorted(missing)[0]!r}")
    _check_acyclic_and_order(g, producer)
    _check_devices(g, values)


def _check_devices(g: Graph, values: dict[str, Value]) -> None:
    if not g.devices:
        for what in ("home", "links", "copy_costs"):
            if getattr(g, what):
                raise GraphError(f"{what!r} needs a 'devices' list")
        return
    ids = [d.id for d in g.devices]
    if len(set(ids)) != len(ids):
        raise GraphError(f"duplicate device id {next(d for d in ids if ids.count(d) > 1)!r}")
    if g.home is not None and g.home not in ids:
        raise GraphError(f"home device {g.home!r} is not in 'devices'")
    for n in g.nodes:
        for d in n.device_costs or {}:
            if d not in ids:
                raise GraphError(f"node {n.id!r} has a cost for unknown device {d!r}")
    for link in g.links or []:
        for d in (link.source, link.target):
            if d not in ids:
                raise GraphError(f"link names unknown device {d!r}")
    for c in g.copy_costs or []:
        if c.value not in values:
            raise GraphError(f"copy cost for unknown value {c.value!r}")
        for d in (c.source, c.target):
            if d not in ids:
                raise GraphError(f"copy cost of {c.value!r} names unknown device {d!r}")


def _check_costs(g: Graph) -> None:
    """The node costs (each node's dearest device on several devices) add up to a float that
    the schedules' recomputations and the solvers' sums keep finite (MAX_COST_TOTAL)."""
    total = 0.0
    for n in g.nodes:
        total += max([n.cost, *(n.device_costs or {}).values()])
    if total * max(1, len(g.nodes)) > MAX_COST_TOTAL:
        raise GraphError(
            f"the node costs add up to {total:.3g}, too large for the sums of recomputed costs "
            f"(at most {MAX_COST_TOTAL:.0e} divided by the {len(g.nodes)} nodes): use a larger cost unit"
        )


def _check_sizes(g: Graph) -> None:
    """Every size and their sum fit int64 (checked before anything allocates by them)."""
    total = 0
    for v in g.values:
        if v.size > MAX_BYTES:
            raise GraphError(f"value {v.id!r} has size {v.size} bytes, which overflows int64")
        total += v.size
    for n in g.nodes:
        if n.workspace > MAX_BYTES:
            raise GraphError(f"node {n.id!r} has workspace {n.workspace} bytes, which overflows int64")
        total += n.workspace
    if total > MAX_BYTES:
        raise GraphError(f"the graph's sizes add up to {total} bytes, which overflows int64")


def _check_acyclic_and_order(g: Graph, producer: dict[str, str]) -> None:
    nodes = {n.id: n for n in g.nodes}
    preds = {n.id: {producer[v] for v in n.inputs if v in producer} for n in g.nodes}
    # Kahn's algorithm; whatever is left over lies on a cycle.
    indeg = {n: len(p) for n, p in preds.items()}
    succs: dict[str, list[str]] = {n: [] for n in nodes}
    for n, ps in preds.items():
        for p in ps:
            succs[p].append(n)
    ready = [n for n, d in indeg.items() if d == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for s in succs[n]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    if seen != len(nodes):
        stuck = sorted(n for n, d in indeg.items() if d > 0)
        raise GraphError(f"graph has a cycle through node {stuck[0]!r}")
    if g.order is not None:
        pos = {n: i for i, n in enumerate(g.order)}
        for n, ps in preds.items():
            for p in ps:
                if pos[p] > pos[n]:
                    raise GraphError(f"order is not topological: {p!r} must come before {n!r}")


class NodeView:
    """The graph folded to one memory block per node, indexed 0..N-1 in topological `order`.

    Used by the solvers whose papers assume one output per operator. ``mem[i]`` is the sum of
    node i's output sizes, ``preds[i]`` the nodes producing its intermediate inputs, and
    ``keep[i]`` whether one of its outputs is a graph output (so it is live at the end).
    """

    def __init__(self, g: Graph):
        self.graph = g
        self.ids: list[str] = [n for n in g.topo_order]
        self.index: dict[str, int] = {n: i for i, n in enumerate(self.ids)}
        nodes = [g.node_map[n] for n in self.ids]
        vm = g.value_map
        self.mem: list[int] = [sum(vm[v].size for v in n.outputs) for n in nodes]
        self.cost: list[float] = [n.cost for n in nodes]
        self.workspace: list[int] = [n.workspace for n in nodes]
        self.recomputable: list[bool] = [n.recomputable for n in nodes]
        self.preds: list[list[int]] = [
            sorted({self.index[g.producer[v]] for v in n.inputs if v in g.producer}) for n in nodes
        ]
        self.succs: list[list[int]] = [[] for _ in nodes]
        for i, ps in enumerate(self.preds):
            for p in ps:
                self.succs[p].append(i)
        outs = set(g.outputs)
        self.keep: list[bool] = [any(v in outs for v in n.outputs) for n in nodes]
        self.needed: list[bool] = [n in g.needed_nodes for n in self.ids]
        #: positions of the needed nodes, in order (the columns of the Checkmate and MOCCASIN models)
        self.needed_index: list[int] = [i for i, x in enumerate(self.needed) if x]
        self.resident: int = g.resident_bytes

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def edges(self) -> list[tuple[int, int]]:
        return [(p, i) for i, ps in enumerate(self.preds) for p in ps]


@dataclass(frozen=True, eq=False)
class DeviceModel:
    """Per-device costs of one multi-device graph, looked up by the simulator and the solvers."""

    graph: Graph

    @cached_property
    def ids(self) -> list[str]:
        return [d.id for d in self.graph.devices or []]

    @cached_property
    def home(self) -> str:
        assert self.graph.home_device is not None, "a multi-device graph"
        return self.graph.home_device

    def cost(self, node: str, device: str) -> float:
        n = self.graph.node_map[node]
        if n.device_costs and device in n.device_costs:
            return n.device_costs[device]
        return n.cost

    @cached_property
    def _explicit(self) -> dict[tuple[str, str, str], float]:
        return {(c.value, c.source, c.target): c.cost for c in self.graph.copy_costs or []}

    @cached_property
    def _links(self) -> dict[tuple[str, str], tuple[float, float]]:
        return {(k.source, k.target): (k.latency, k.bandwidth) for k in self.graph.links or []}

    def copy_cost(self, value: str, source: str, target: str) -> float | None:
        """Cost of copying `value` from `source` to `target`; None when no copy is possible."""
        c = self._explicit.get((value, source, target))
        if c is not None:
            return c
        link = self._links.get((source, target))
        if link is None:
            return None
        latency, bandwidth = link
        return latency + self.graph.value_map[value].size / bandwidth
