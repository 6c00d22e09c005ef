"""XEngine §3.1 (problem definition): the stages of Checkmate with a device index.

:class:`Problem` holds what the MILP (§3.2) and the placement heuristic read: the needed nodes
in `order` as T stages (one memory block per node, as :class:`~remat_cli.graph.NodeView`), the
compute cost c[d,i] of every block on every device, the copy cost w[e,d,i] of every block from
device e to d (eq. 1's w_{e,d,d'}, per block and direction; inf when no copy is possible), the
resident values (inputs, parameters) that some needed node reads with their copy costs from the
home device, and each device's budget.

:func:`single_device_graph` projects a multi-device graph onto one device (its costs, no copies)
for the single-device solvers that give XEngine's baselines and warm starts (§4.1: Checkmate on
the CPU and on the GPU).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph, Node
from remat_cli.solvers.checkmate import Stages, stages_of


@dataclass
class Problem:
    graph: Graph  #: the multi-device graph
    stages: Stages  #: the single-device stages (costs of the home device)
    devices: list[str]
    home: int  #: index of the home device
    cost: np.ndarray  #: D × T compute cost of block i on device d
    copy: np.ndarray  #: D × D × T cost of copying block i from e to d (inf: impossible)
    resident: list[str]  #: resident values some needed node reads
    res_size: np.ndarray  #: bytes of each
    res_copy: np.ndarray  #: D × R cost of copying resident r from home to d (inf: impossible)
    readers: list[list[int]]  #: blocks reading each resident value
    budgets: np.ndarray  #: D bytes
    scale: int  #: bytes per memory unit of mem / ws / res_mem (gcd, exact)
    mem: np.ndarray  #: T block sizes in units
    ws: np.ndarray  #: T workspaces in units
    res_mem: np.ndarray  #: R resident sizes in units

    @property
    def T(self) -> int:
        return self.stages.T

    @property
    def D(self) -> int:
        return len(self.devices)

    def capacity(self, d: int) -> int:
        """Units of device d free for intermediates (the home device holds every resident value)."""
        resident = self.graph.resident_bytes if d == self.home else 0
        return (int(self.budgets[d]) - resident) // self.scale


def problem_of(graph: Graph, budgets: dict[str, int]) -> Problem:
    dm = graph.device_model
    devices = dm.ids
    home = devices.index(dm.home)
    st = stages_of(single_device_graph(graph, dm.home), max(budgets.values()))
    T, D = st.T, len(devices)
    vm = graph.value_map
    blocks = [graph.node_map[n].outputs for n in st.ids]
    cost = np.array([[dm.cost(n, d) for n in st.ids] for d in devices], dtype=float)
    copy = np.full((D, D, T), math.inf)
    for e, de in enumerate(devices):
        for d, dd in enumerate(devices):
            if e == d:
                continue
            for i, outs in enumerate(blocks):
                costs = [dm.copy_cost(v, de, dd) for v in outs]
                if all(c is not None for c in costs):
                    copy[e, d, i] = float(sum(costs))  # type: ignore[arg-type]
    index = {n: i for i, n in enumerate(st.ids)}
    readers: dict[str, list[int]] = {}
    for n in st.ids:
        for v in dict.fromkeys(graph.node_map[n].inputs):
            if vm[v].resident:
                readers.setdefault(v, []).append(index[n])
    resident = list(readers)
    res_size = np.array([vm[v].size for v in resident], dtype=np.int64)
    res_copy = np.full((D, len(resident)), math.inf)
    for d, dd in enumerate(devices):
        for r, v in enumerate(resident):
            c = 0.0 if d == home else dm.copy_cost(v, dm.home, dd)
            if c is not None:
                res_copy[d, r] = c
    mem_bytes = st.mem * st.scale
    ws_bytes = st.ws * st.scale
    g = 0
    for m in (*mem_bytes.tolist(), *ws_bytes.tolist(), *res_size.tolist()):
        g = math.gcd(g, int(m))
    g = max(g, 1)
    return Problem(
        graph=graph,
        stages=st,
        devices=devices,
        home=home,
        cost=cost,
        copy=copy,
        resident=resident,
        res_size=res_size,
        res_copy=res_copy,
        readers=[readers[v] for v in resident],
        budgets=np.array([budgets[d] for d in devices], dtype=np.int64),
        scale=g,
        mem=mem_bytes // g,
        ws=ws_bytes // g,
        res_mem=res_size // g,
    )


def single_device_graph(graph: Graph, device: str) -> Graph:
    """`graph` on `device` alone: its costs there, no devices (inputs and parameters resident there)."""
    dm = graph.device_model
    data = graph.model_dump(exclude_none=True, by_alias=True)
    for key in ("devices", "home", "links", "copy_costs"):
        data.pop(key, None)
    nodes = []
    for n in graph.nodes:
        d = n.model_dump(exclude_none=True)
        d["cost"] = dm.cost(n.id, device)
        d.pop("device_costs", None)
        nodes.append(Node(**d))
    data["nodes"] = nodes
    data["name"] = f"{graph.name}@{device}"
    return Graph(**data)
