"""Pinned rounds: some fresh rounds anneal the graph with one terminal node pinned last.

A deviation from Imanishi et al. (NeurIPS'23), whose annealing (§2.2) moves one node a step at a
time. On a training export, a weight gradient reads two large values at once: on
torch_unet_train, ``convolution_11`` (the gradient of ``merges.0``'s weight) reads
``permute_5`` (8.4 MB, a transpose of the 8.4 MB concatenation ``cat_1``) and ``permute_6``
(4.2 MB, a transpose of the gradient ``mul_2``), 12.6 MB of a 24.2 MB budget at 50%. Where the
topological order puts it, in the middle of the backward pass, everything the rest of the
backward pass still needs is live beside it, and every round pays 7.87% to make room
(encoder convolutions recomputed). Run last, when the other gradients are done, it needs only
``cat_1`` and ``mul_2`` made again, at about half the overhead. No single move of the annealing gets
there: moving the node late while its inputs stay early holds 12.6 MB for the whole backward
pass, far above the budget.

So a pinned round anneals a copy of the graph in which a *terminal* node must run after the
last operator of the topological order (on a training step the last gradient, which needs most
of the backward pass): a 0-byte value made by that operator becomes one more input of it, and
the node with what follows it goes to the end of the order (the start of the annealing). Any
schedule of the copy, without the free of that value, is a schedule of the graph (same
operators, same bytes), so a pinned round's result competes with the others as is.

Terminal nodes: a needed node whose descendants are at most ``TAIL`` operators that only make
graph outputs or feed each other (a weight gradient and the transposes or reshapes after it),
with a working set of at least ``MIN_SHARE`` of the budget above the resident bytes. Nodes that
reach the same graph outputs are one candidate, the one with the largest working set (for
``convolution_11``: ``permute_5``, which pins the transpose, the convolution and the transpose
after it). Candidates are tried largest working set first, each in two pinned rounds.
"""

from __future__ import annotations

from remat_cli.graph import Graph
from remat_cli.schedule import Step, working_set

#: the 0-byte value that pins a node (a graph that has a value of that id gets no pinned rounds)
PIN_VALUE = "__fastsa_pin__"
#: most operators after a terminal node (a weight gradient's transpose and reshape)
TAIL = 3
#: a terminal node is pinned only when its working set is at least this share of the budget
#: above the resident bytes (gpt_b8 and vit_b16 at 50%, 60 s: pinning their attention
#: transposes, 0.19-0.20 of it, with 0.15 here, left both results as they were)
MIN_SHARE = 0.25


def _tail(graph: Graph, node: str) -> set[str] | None:
    """The needed nodes after `node`, when they are at most TAIL and only make graph outputs
    or feed each other; None otherwise."""
    consumers, outputs = graph.consumers, set(graph.outputs)
    seen: set[str] = set()
    stack = [node]
    while stack:
        for v in graph.node_map[stack.pop()].outputs:
            for c in consumers[v]:
                if c in graph.needed_nodes and c not in seen:
                    if len(seen) == TAIL:
                        return None
                    seen.add(c)
                    stack.append(c)
    for n in seen | {node}:
        for v in graph.node_map[n].outputs:
            if v not in outputs and not all(c in seen for c in consumers[v] if c in graph.needed_nodes):
                return None
    return seen


def candidates(graph: Graph, budget: int) -> list[str]:
    """The terminal nodes worth pinning, largest working set first (module docstring)."""
    if PIN_VALUE in graph.value_map:
        return []
    room = budget - graph.resident_bytes
    best: dict[frozenset[str], tuple[int, int, str]] = {}
    for rank, n in enumerate(graph.needed_order):
        tail = _tail(graph, n)
        if tail is None or len(tail) + 1 == len(graph.needed_order):  # nothing to run it after
            continue
        ws = working_set(graph, n)
        if ws < MIN_SHARE * room:
            continue
        reach = frozenset(v for m in tail | {n} for v in graph.node_map[m].outputs if v in graph.outputs)
        if reach not in best or (ws, -rank) > best[reach][:2]:
            best[reach] = (ws, -rank, n)
    return [n for *_, n in sorted(best.values(), reverse=True)]


def pinned(graph: Graph, node: str) -> Graph:
    """A copy of `graph` in which `node` runs after the last other needed operator of the
    topological order (and so after everything that operator needs)."""
    # `node` and everything after it, needed or not, go to the end of the order (a consumer no
    # output needs would stay before it: a fuzzed two-output producer)
    after, stack = {node}, [node]
    while stack:
        for v in graph.node_map[stack.pop()].outputs:
            for c in graph.consumers[v]:
                if c not in after:
                    after.add(c)
                    stack.append(c)
    last = [n for n in graph.needed_order if n not in after][-1]
    data = graph.model_dump(by_alias=True)  # a new graph, validated (no cached lookups copied)
    for n in data["nodes"]:
        if n["id"] == last:
            n["outputs"].append(PIN_VALUE)
        elif n["id"] == node:
            n["inputs"].append(PIN_VALUE)
    data["values"].append({"id": PIN_VALUE, "size": 0})
    order = graph.topo_order
    data["order"] = [n for n in order if n not in after] + [n for n in order if n in after]
    return Graph.model_validate(data)


def unpinned(steps: list[Step]) -> list[Step]:
    """A pinned graph's schedule as a schedule of the graph: without the pin value's free."""
    return [s for s in steps if not (s.op == "free" and s.value == PIN_VALUE)]
