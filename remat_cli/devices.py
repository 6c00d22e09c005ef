"""Multi-device graphs (XEngine, Schuler et al., TACO 2023, §3.1): costs, copies, the simulator.

A graph with a ``devices`` list is one step of a network spread over several devices, each with
its own memory. The rules (DESIGN.md §2, extended per device):

- Start: every input and parameter is live on the *home* device (``graph.home``, default the
  first device) and stays there; other devices start empty.
- ``compute n`` on device d (``device``, default home) needs every input of n live **on d** and
  none of n's outputs live on d. Memory of d at that instant = live bytes on d + n's outputs +
  n's workspace. Cost += n's cost on d (``device_costs[d]``, else ``cost``).
- ``copy v from a to b`` needs v live on a and not on b; at that instant b holds its live bytes
  plus v's buffer. v is then live on both until freed. Cost += the copy cost of v from a to b:
  an explicit ``copy_costs`` entry, else the link's ``latency + size / bandwidth``; no entry and
  no link means the copy is impossible.
- ``free v`` on d: v live on d, and not an input or parameter on its home device (copies of
  them elsewhere may be freed).
- End: every graph output is live on some device.

Everything is sequential: the schedule's cost is the sum of all compute and copy costs, with no
overlap of copies and computes or of two devices (as XEngine's objective, eq. 1). A device's
peak is the largest of its instants; ``peak_memory`` is the largest device peak.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property

from remat_cli.budget import BudgetError, parse_budget, parse_device_budgets
from remat_cli.graph import Graph
from remat_cli.schedule import ScheduleError, SimResult, Step


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


def device_model(graph: Graph) -> DeviceModel:
    return graph.device_model  # cached on the graph


def simulate_devices(graph: Graph, steps: Iterable[Step], *, keep_profile: bool = False) -> SimResult:
    """The per-device simulator (rules in the module docstring); raise ScheduleError when invalid."""
    dm = device_model(graph)
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


def over_budget(sim: SimResult, budgets: dict[str, int]) -> list[str]:
    """The devices whose peak exceeds their budget."""
    return [d for d, p in (sim.peak_by_device or {}).items() if d in budgets and p > budgets[d]]


def resolve_device_budgets(graph: Graph, text: str, baseline_peak: int) -> dict[str, int]:
    """Each device's budget from ``--budget``: ``cpu=16GB,cuda:0=4GB`` (devices not named keep
    their budget in the graph) or one budget for every device. Percentages are of the baseline
    peak (everything on the home device, no rematerialization)."""
    ids = [d.id for d in graph.devices or []]
    named = parse_device_budgets(text, baseline_peak)
    if named is None:
        one = parse_budget(text, baseline_peak)
        return dict.fromkeys(ids, one)
    for d in named:
        if d not in ids:
            raise BudgetError(f"--budget names unknown device {d!r} (devices: {', '.join(ids)})")
    out: dict[str, int] = {}
    for dev in graph.devices or []:
        b = named.get(dev.id, dev.budget)
        if b is None:
            raise BudgetError(
                f"no budget for device {dev.id!r}: name it in --budget or give it one in the graph"
            )
        out[dev.id] = b
    return out


#: PCIe 3.0 x16 as measured by copies of large tensors: ~12 GB/s, ~10 µs per transfer
PCIE_BANDWIDTH = 12e9
PCIE_LATENCY = 1e-5


def synthetic_devices(
    graph: Graph,
    *,
    speedup: float = 10.0,
    memory_fraction: float = 0.25,
    copy_ratio: float = 1.0,
    accelerator: str = "accel",
    host: str = "cpu",
) -> Graph:
    """`graph` on a host (home, the graph's costs) and an accelerator `speedup`× faster with
    `memory_fraction` of the host's memory (budgets: the baseline peak and that fraction of it),
    joined by a PCIe-like link both ways. Costs in seconds get PCIe's bandwidth and latency;
    other cost units get a bandwidth at which copying the mean intermediate value costs
    `copy_ratio` × the mean accelerator node cost — for tests and benches."""
    from remat_cli.schedule import baseline  # noqa: PLC0415 - schedule imports this module lazily

    data = graph.model_dump(exclude_none=True, by_alias=True)
    for k in ("devices", "home", "links", "copy_costs"):
        data.pop(k, None)
    for n in data["nodes"]:
        n.pop("device_costs", None)
        n["device_costs"] = {host: n.get("cost", 1.0), accelerator: n.get("cost", 1.0) / speedup}
    peak = baseline(graph).peak_memory
    sizes = [v.size for v in graph.values if not v.resident]
    costs = [n.cost for n in graph.nodes]
    if graph.cost_unit in ("s", "seconds"):
        bandwidth, latency = PCIE_BANDWIDTH, PCIE_LATENCY
    else:
        mean_size = sum(sizes) / max(len(sizes), 1) or 1.0
        mean_cost = sum(costs) / max(len(costs), 1) / speedup or 1.0
        bandwidth, latency = mean_size / (copy_ratio * mean_cost), 0.0
    data["devices"] = [
        {"id": host, "budget": peak, "kind": "cpu"},
        {"id": accelerator, "budget": int(memory_fraction * peak), "kind": "accelerator"},
    ]
    data["home"] = host
    data["links"] = [
        {"from": host, "to": accelerator, "latency": latency, "bandwidth": bandwidth},
        {"from": accelerator, "to": host, "latency": latency, "bandwidth": bandwidth},
    ]
    return Graph(**data)
