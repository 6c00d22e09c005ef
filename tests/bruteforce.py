"""Exhaustive reference for the fixed-order ("Checkmate") search space, for tests only.

``brute_force_min_cost(graph, budget) -> float | None`` returns the least total compute cost of
any schedule in the space below whose peak memory (by the simulator's rules, DESIGN.md §2) is at
most `budget`, or None when there is none. It shares no code with the solvers: it explores
explicit memory states with Dijkstra's algorithm.

The space searched, precisely. Let n_0 … n_{T−1} be the nodes some graph output needs, in the
graph's `order`. A schedule is T stages; stage t visits positions 0 … t in increasing order and at
each position p may compute n_p, and must compute n_t at position t (the "frontier-advancing"
stages of Checkmate: R[t,t] = 1, R[t,p] = 0 for p > t). So each node runs first in stage t = its
index, and any earlier node may be recomputed in any later stage, at most once per stage, in
`order`. A node with ``recomputable=False`` runs only at its own stage. Between any two positions
(and before the first / after the last) any set of live intermediate values may be freed. A
compute needs all its inputs live and none of its outputs live; the memory at that instant is the
live bytes (inputs and parameters always included) + its outputs + its workspace and must not
exceed `budget`. At the end every graph output must be live.

This works on values, not on the per-node blocks of ``Graph.node_view``: for graphs whose nodes
have one output each the two coincide, so a per-node-block MILP (Checkmate, Moccasin) must reach
exactly this optimum there; with multi-output nodes this optimum can only be lower or equal.
The state space is (stage, position, live set): use it on graphs of up to ~8 nodes.
"""

from __future__ import annotations

import heapq
import itertools

from remat_cli.graph import Graph


def brute_force_min_cost(graph: Graph, budget: int) -> float | None:
    order = [n for n in graph.topo_order if n in graph.needed_nodes]
    nodes = [graph.node_map[n] for n in order]
    T = len(nodes)
    vm = graph.value_map
    resident = graph.resident_bytes
    if resident > budget:
        return None
    if T == 0:
        return 0.0
    # intermediate values of the needed nodes, as bit positions
    vals = [v for n in nodes for v in n.outputs]
    bit = {v: 1 << k for k, v in enumerate(vals)}
    size = [vm[v].size for v in vals]
    ins = [sum(bit[v] for v in n.inputs if v in bit) for n in nodes]
    outs = [sum(bit[v] for v in n.outputs) for n in nodes]
    out_bytes = [sum(vm[v].size for v in n.outputs) for n in nodes]
    final = sum(bit[v] for v in graph.outputs if v in bit)

    def live_bytes(live: int) -> int:
        return resident + sum(size[k] for k in range(len(vals)) if live >> k & 1)

    start = (0, 0, 0)  # (stage, position, live bitmask)
    dist = {start: 0.0}
    heap: list[tuple[float, int, tuple[int, int, int]]] = [(0.0, 0, start)]
    tick = itertools.count(1)

    def push(state: tuple[int, int, int], c: float) -> None:
        if c < dist.get(state, float("inf")) - 1e-12:
            dist[state] = c
            heapq.heappush(heap, (c, next(tick), state))

    while heap:
        c, _, state = heapq.heappop(heap)
        if c > dist.get(state, float("inf")) + 1e-12:
            continue
        t, p, live = state
        if t == T:
            if live & final == final:
                return c
            continue
        # free one live value (sets of frees are sequences of single frees)
        rest = live
        while rest:
            low = rest & -rest
            push((t, p, live & ~low), c)
            rest &= rest - 1
        nxt = (t, p + 1) if p < t else (t + 1, 0)
        # skip position p (only before the frontier)
        if p < t:
            push((*nxt, live), c)
        # compute n_p
        if p == t or nodes[p].recomputable:
            ok = ins[p] & live == ins[p] and not (outs[p] & live)
            if ok and live_bytes(live) + out_bytes[p] + nodes[p].workspace <= budget:
                push((*nxt, live | outs[p]), c + nodes[p].cost)
    return None
