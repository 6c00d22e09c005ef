"""The graphs and budgets the contract suite checks solvers on, and its exhaustive reference.

:mod:`remat_cli.testing` runs its checks on these; its exactness check compares with
:func:`brute_force_min_cost`.

The graphs are small and generated (a chain, a random DAG, long skips, a transformer; tiny random
DAGs for brute force), so the checks are about what a solver claims, not how good it is.
:func:`brute_force_min_cost` shares no code with the solvers.
"""

from __future__ import annotations

import heapq
import itertools
import random
from functools import cache

from remat_cli.graph import Graph, Node, Value
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, peak_lower_bound


@cache
def contract_graphs() -> dict[str, Graph]:
    """Small generated graphs of every family: a chain, a random DAG, long skips, a transformer.

    Returns
    -------
    dict of str to Graph
        ``"linear"``, ``"layered"``, ``"unet"`` and ``"transformer"``; built once and cached.

    Examples
    --------
    >>> sorted(contract_graphs())
    ['layered', 'linear', 'transformer', 'unet']
    """
    return {
        "linear": G.linear(5, seed=1),
        "layered": G.random_layered(24, seed=2),
        "unet": G.unet(depth=2, convs=1, seed=3),
        "transformer": G.transformer(layers=1, seed=4),
    }


def tiny_graph(n: int, seed: int) -> Graph:
    """A random DAG of single-output nodes, small enough for :func:`brute_force_min_cost`.

    With parameters, workspaces, a non-recomputable node now and then and sometimes a second
    graph output.

    Parameters
    ----------
    n : int
        The number of nodes (up to ~8 for the brute force).
    seed : int
        The seed: the same seed gives the same graph.

    Returns
    -------
    Graph
        Named ``tiny<seed>``.

    Examples
    --------
    >>> g = tiny_graph(8, seed=0)
    >>> g.name, len(g.nodes), all(len(n.outputs) == 1 for n in g.nodes)
    ('tiny0', 8, True)
    """
    rng = random.Random(seed)
    values = [Value(id="x", size=rng.randint(1, 4), role="input")]
    nodes = []
    for i in range(n):
        ins = [f"v{p}" for p in range(i) if rng.random() < 0.35] or ([f"v{i - 1}"] if i else [])
        if i == 0 or rng.random() < 0.3:
            ins.append("x")
        if rng.random() < 0.15:
            values.append(Value(id=f"w{i}", size=rng.randint(1, 3), role="parameter"))
            ins.append(f"w{i}")
        values.append(Value(id=f"v{i}", size=rng.randint(1, 6)))
        nodes.append(
            Node(
                id=f"n{i}",
                inputs=ins,
                outputs=[f"v{i}"],
                cost=rng.randint(0, 5),
                workspace=rng.choice([0, 0, 1, 3]),
                recomputable=rng.random() > 0.15,
            )
        )
    outputs = [f"v{n - 1}"] + ([f"v{rng.randrange(n - 1)}"] if n > 1 and rng.random() < 0.3 else [])
    return Graph(name=f"tiny{seed}", values=values, nodes=nodes, outputs=outputs)


@cache
def tiny_graphs() -> tuple[Graph, ...]:
    """The graphs of the exact check: a chain and random DAGs (:func:`tiny_graph`).

    Seeds 0 and 95 (8 nodes) have budgets where the greedy heuristic misses the optimum, so a
    heuristic that claims "optimal" fails the exact check.

    Returns
    -------
    tuple of Graph
        Built once and cached.

    Examples
    --------
    >>> [g.name for g in tiny_graphs()]
    ['linear_n3_s5', 'tiny0', 'tiny95', 'tiny1', 'tiny2']
    """
    return (G.linear(3, seed=5), tiny_graph(8, 0), tiny_graph(8, 95), tiny_graph(5, 1), tiny_graph(6, 2))


def budget_for(graph: Graph, fraction: float) -> int:
    """A budget: `fraction` of the baseline peak, raised to the lower bound no schedule goes below.

    Parameters
    ----------
    graph : Graph
        The graph.
    fraction : float
        Of the peak without rematerialization.

    Returns
    -------
    int
        Bytes.

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> g = generators.linear(5, seed=1)  # peak 36,000 B, lower bound 23,000 B
    >>> budget_for(g, 0.8), budget_for(g, 0.1)
    (28800, 23000)
    """
    return max(int(fraction * baseline(graph).peak_memory), peak_lower_bound(graph))


def tiny_budgets(graph: Graph) -> list[int]:
    """The budgets of the exact check, from the lower bound to the baseline peak.

    Every one of them when there are few, else five (both ends, one above the bound, the middle,
    one below the peak).

    Parameters
    ----------
    graph : Graph
        A tiny graph.

    Returns
    -------
    list of int
        Bytes, ascending.

    Examples
    --------
    >>> tiny_budgets(tiny_graph(8, seed=0))
    [22, 23, 24, 25]
    >>> from remat_cli.importers import generators
    >>> tiny_budgets(generators.linear(3, seed=5))
    [16000, 16001, 17502, 19003, 19004]
    """
    lo, hi = peak_lower_bound(graph), baseline(graph).peak_memory
    if hi - lo <= 8:
        return list(range(lo, hi + 1))
    return sorted({lo, lo + 1, (lo + hi) // 2, hi - 1, hi})


# ---- the exhaustive reference of the exact checks ----
def brute_force_min_cost(graph: Graph, budget: int) -> float | None:
    """The least cost of any schedule of the fixed-order stage space within `budget`, by brute force.

    None when there is none. Dijkstra's algorithm over explicit memory states; it shares no code
    with the solvers. Use it on graphs of up to ~8 nodes.

    The space, precisely. Let n_0 … n_{T−1} be the nodes some graph output needs, in the graph's
    `order`. A schedule is T stages; stage t visits positions 0 … t in increasing order and at
    each position p may compute n_p, and must compute n_t at position t (the "frontier-advancing"
    stages of Checkmate: R[t,t] = 1, R[t,p] = 0 for p > t). So each node runs first in stage t =
    its index, and any earlier node may be recomputed in any later stage, at most once per stage,
    in `order`. A node with ``recomputable=False`` runs only at its own stage. Between any two
    positions (and before the first / after the last) any set of live intermediate values may be
    freed. A compute needs all its inputs live and none of its outputs live; the memory at that
    instant is the live bytes (inputs and parameters always included) + its outputs + its
    workspace and must not exceed `budget`. At the end every graph output must be live.

    This works on values, not on the per-node blocks of ``Graph.node_view``: for graphs whose
    nodes have one output each the two coincide, so a per-node-block MILP (Checkmate, Moccasin)
    must reach exactly this optimum there; with multi-output nodes this optimum can only be lower.

    Parameters
    ----------
    graph : Graph
        A graph of up to ~8 nodes (the states grow as 2 to the number of values).
    budget : int
        Bytes.

    Returns
    -------
    float or None
        The least total cost, or None when no schedule of the space fits.

    Examples
    --------
    >>> g = tiny_graph(8, seed=0)
    >>> [brute_force_min_cost(g, b) for b in tiny_budgets(g)]
    [None, 39.0, 34.0, 25.0]
    """
    order = graph.needed_order
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
