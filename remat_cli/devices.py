"""Multi-device graphs (XEngine, Schuler et al., TACO 2023, §3.1): the simulator's rules, budgets
and synthetic profiles. (The per-device costs are :class:`remat_cli.graph.DeviceModel`; the
simulator is :func:`remat_cli.schedule.simulate_devices`, re-exported here.)

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

from remat_cli.budget import BudgetError, parse_budget, parse_device_budgets
from remat_cli.graph import Graph
from remat_cli.schedule import SimResult, simulate_devices


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


__all__ = ["resolve_device_budgets", "simulate_devices", "synthetic_devices", "over_budget"]
