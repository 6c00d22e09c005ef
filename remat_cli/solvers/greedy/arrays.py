"""greedy: the graph as flat integer arrays (values and nodes indexed densely) for the passes of
`dtr` and `split`, and the low-memory order used when nothing fits in the graph's own order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph


@dataclass
class Arrays:
    """The graph as flat integer arrays (values and nodes indexed densely)."""

    size: np.ndarray  # float64 bytes per value
    evictable: np.ndarray  # bool per value
    producer: list[int]  # node index per value (-1 for inputs/parameters)
    resident: np.ndarray  # bool per value
    ins: list[list[int]]  # intermediate inputs per node (deduplicated)
    outs: list[list[int]]  # outputs per node
    out_size: list[int]
    workspace: list[int]
    cost: np.ndarray  # float64 per node
    program: list[int]  # needed nodes in order
    free_after: list[list[int]]  # values dead after program position i
    uses: list[list[int]]  # program positions reading each value, ascending
    consumers: list[list[int]]  # program nodes reading each value
    born: list[int]  # program position of each value's producer (-1: input or never produced)
    resident_bytes: int
    is_output: np.ndarray

    def __post_init__(self) -> None:
        # plain Python copies for the scalar-at-a-time loops of the split planner: indexing a numpy
        # array and computing with numpy scalars costs several times more there
        self.size_l: list[float] = self.size.tolist()
        self.cost_l: list[float] = self.cost.tolist()
        self.evictable_l: list[bool] = self.evictable.tolist()
        # the same as flat arrays for the split planner's numba kernels: node k's inputs are
        # ins_flat[ins_ptr[k]:ins_ptr[k + 1]], its outputs likewise
        self.ins_ptr, self.ins_flat = _flat(self.ins)
        self.outs_ptr, self.outs_flat = _flat(self.outs)
        self.workspace_a = np.array(self.workspace, dtype=np.float64)


def _flat(lists: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, concatenation) of `lists`: list k is flat[ptr[k]:ptr[k + 1]]."""
    ptr = np.zeros(len(lists) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(x) for x in lists])
    flat = np.fromiter((v for x in lists for v in x), dtype=np.int64, count=int(ptr[-1]))
    return ptr, flat


def low_memory_order(graph: Graph) -> list[str]:
    """A topological order of the needed nodes that keeps few bytes live: list scheduling that
    runs, among the ready nodes, the one whose outputs minus the inputs it is the last reader of
    add the fewest bytes (ties: the graph's order). Recomputation is cheaper from a lower peak;
    used when no strategy fits in the graph's own order."""
    vm = graph.value_map
    nm = graph.node_map
    topo = graph.needed_order
    rank = {n: i for i, n in enumerate(topo)}
    producer = {v: n for n in topo for v in nm[n].outputs}
    readers: dict[str, list[str]] = {}
    for n in topo:
        for v in dict.fromkeys(nm[n].inputs):
            readers.setdefault(v, []).append(n)
    waiting = {n: len({producer[v] for v in nm[n].inputs if v in producer}) for n in topo}
    unread = {v: len(r) for v, r in readers.items()}
    keep = set(graph.outputs) | {v.id for v in graph.values if v.resident}
    out_bytes = {n: sum(vm[v].size for v in nm[n].outputs) for n in topo}
    ready = {n for n in topo if waiting[n] == 0}
    order: list[str] = []

    def added(n: str) -> tuple[int, int]:
        freed = sum(vm[v].size for v in dict.fromkeys(nm[n].inputs) if unread[v] == 1 and v not in keep)
        return out_bytes[n] - freed, rank[n]

    while ready:
        n = min(ready, key=added)
        ready.remove(n)
        order.append(n)
        for v in dict.fromkeys(nm[n].inputs):
            unread[v] -= 1
        # once per consumer: `waiting` counts producers, and a consumer may read several outputs
        for c in dict.fromkeys(c for v in nm[n].outputs for c in readers.get(v, ())):
            waiting[c] -= 1
            if waiting[c] == 0:
                ready.add(c)
    return order


def build_arrays(graph: Graph, order: list[str] | None = None) -> Arrays:
    """`order`: the needed nodes' first computations (default: the graph's topological order)."""
    vids = [v.id for v in graph.values]
    vidx = {v: i for i, v in enumerate(vids)}
    nids = [n.id for n in graph.nodes]
    nidx = {n: i for i, n in enumerate(nids)}
    vm = graph.value_map
    size = np.array([v.size for v in graph.values], dtype=np.float64)
    resident = np.array([v.resident for v in graph.values], dtype=bool)
    is_output = np.zeros(len(vids), dtype=bool)
    for v in graph.outputs:
        is_output[vidx[v]] = True
    producer = [-1] * len(vids)
    ins: list[list[int]] = []
    outs: list[list[int]] = []
    for k, n in enumerate(graph.nodes):
        ins.append([vidx[v] for v in dict.fromkeys(n.inputs) if not vm[v].resident])
        outs.append([vidx[v] for v in n.outputs])
        for v in outs[-1]:
            producer[v] = k
    recomputable = [n.recomputable for n in graph.nodes]
    program = [nidx[n] for n in (order or graph.needed_order)]
    pos = {n: i for i, n in enumerate(program)}
    uses: list[list[int]] = [[] for _ in vids]
    for i, n in enumerate(program):
        for v in ins[n]:
            uses[v].append(i)
    # A non-recomputable node's outputs can never be rebuilt, so they stay live while any value
    # whose recomputation could need them (a descendant through recomputable nodes) is still used:
    # reach[v] = max(last use of v, reach of the outputs of v's recomputable consumers).
    last = [uses[v][-1] if uses[v] else pos.get(producer[v], -1) for v in range(len(vids))]
    reach = list(last)
    consumers: list[list[int]] = [[] for _ in vids]
    for n in program:
        for v in ins[n]:
            consumers[v].append(n)
    for n in reversed(program):
        for v in outs[n]:
            for c in consumers[v]:
                if recomputable[c]:
                    reach[v] = max(reach[v], max(reach[o] for o in outs[c]))
    fixed = [producer[v] >= 0 and not recomputable[producer[v]] for v in range(len(vids))]
    retain = [reach[v] if fixed[v] else last[v] for v in range(len(vids))]
    free_after: list[list[int]] = [[] for _ in program]
    for v in range(len(vids)):
        if resident[v] or is_output[v] or producer[v] not in pos:
            continue
        free_after[retain[v]].append(v)
    evictable = ~resident & ~is_output & (size > 0) & ~np.array(fixed, dtype=bool)
    return Arrays(
        size=size,
        evictable=evictable,
        producer=producer,
        resident=resident,
        ins=ins,
        outs=outs,
        out_size=[int(sum(vm[v].size for v in n.outputs)) for n in graph.nodes],
        workspace=[n.workspace for n in graph.nodes],
        cost=np.array([n.cost for n in graph.nodes], dtype=np.float64),
        program=program,
        free_after=free_after,
        uses=uses,
        consumers=consumers,
        born=[pos.get(p, -1) for p in producer],
        resident_bytes=graph.resident_bytes,
        is_output=is_output,
    )


class Abandon(Exception):
    pass
