"""hilp context: the graph's lookups, and forward/backward pairing of training graphs.

Gusak et al., *HiREmate*, App. B.1.1 (layers: F_j and B_j).
"""

from __future__ import annotations

import math
from collections import defaultdict

from remat_cli.graph import Graph

LOSS = "__hilp_loss__"
TOKEN = "__hilp_token__"

# ------------------------------------------------------------------------------------------------
# Context: the graph's lookups restricted to the nodes some output needs


class Ctx:
    def __init__(self, graph: Graph, training: bool):
        self.graph = graph
        self.needed = graph.needed_nodes
        self.pos = {n: i for i, n in enumerate(graph.topo_order)}
        self.nodes = graph.node_map
        self.values = graph.value_map
        self.producer = graph.producer
        self.consumers = {v: [c for c in cs if c in self.needed] for v, cs in graph.consumers.items()}
        self.resident = {v.id for v in graph.values if v.resident}
        self.outputs = set(graph.outputs)
        self.forward: set[str] = set()
        self.grads: dict[str, list[str]] = defaultdict(list)
        if training:
            for n in graph.nodes:
                if n.id in self.needed and n.phase == "forward":
                    self.forward.add(n.id)
            pairs = grad_pairs(graph)
            for n in graph.nodes:
                f = pairs.get(n.id)
                if n.id in self.needed and f in self.forward:
                    self.grads[f].append(n.id)

    def size(self, v: str) -> int:
        return self.values[v].size

    def crossing(self, v: str, owned: set[str] | frozenset[str]) -> bool:
        """Value v leaves the unit owning `owned`: a graph output or read outside it."""
        return v in self.outputs or any(c not in owned for c in self.consumers[v])


def grad_pairs(graph: Graph) -> dict[str, str]:
    """Backward node -> the forward node it differentiates: ``grad_of`` where the graph says it;
    otherwise (Checkmate/Moccasin networkx data carry ``phase`` only) the forward node whose op
    is the backward op without its ``_backward`` suffix, when that op is unique; otherwise (ONNX
    training graphs: ``phase`` but neither) :func:`structural_pairs`."""
    out = {n.id: n.grad_of for n in graph.nodes if n.grad_of is not None and n.phase != "forward"}
    if out:
        return _joined(graph, out)
    by_op: dict[str, list[str]] = defaultdict(list)
    for n in graph.nodes:
        if n.phase == "forward" and n.op:
            by_op[n.op].append(n.id)
    for n in graph.nodes:
        if n.phase == "backward" and n.op and n.op.endswith("_backward"):
            fw = by_op.get(n.op.removesuffix("_backward"), [])
            if len(fw) == 1:
                out[n.id] = fw[0]
    if out:
        return out
    return structural_pairs(graph)


def _joined(graph: Graph, pairs: dict[str, str]) -> dict[str, str]:
    """`pairs` (the graph's ``grad_of``) with the backward nodes it leaves out paired too: a
    node autograd runs outside any op's backward (the sum of a gradient from several uses) joins
    the layer of the backward node it feeds, the deepest one (as :func:`structural_pairs` does);
    one feeding only graph outputs, the shallowest layer it reads from. Left out, such a node is
    a unit of its own between two operators of one layer's B_j (a transformer block's grouped
    layer: the H-ILP's F -> loss -> B quotient then has a cycle, and hilp falls back to plain
    subgraphs)."""
    order = graph.topo_order
    pos = {n: i for i, n in enumerate(order)}
    nodes = graph.node_map
    out = dict(pairs)
    free = [n for n in order if nodes[n].phase == "backward" and n not in out]
    for b in reversed(free):
        fed = [out[c] for v in nodes[b].outputs for c in graph.consumers.get(v, ()) if c in out]
        if fed:
            out[b] = max(fed, key=pos.__getitem__)
    for b in free:
        if b not in out:
            read = [out[p] for v in nodes[b].inputs if (p := graph.producer.get(v)) in out]
            if read:
                out[b] = min(read, key=pos.__getitem__)
    return out


def structural_pairs(graph: Graph) -> dict[str, str]:
    """Pair backward nodes with forward nodes from the dataflow alone (no names needed).

    A backward chain starts where it reads layer j's activations (App. B.1.1: what a layer keeps
    from F_j to B_j): such a node, with no paired backward predecessor, is paired with the
    deepest forward node whose output it reads. Every other backward node continues gradients
    and is paired with the shallowest of its backward predecessors' partners: gradients flow
    from deep layers to shallow ones, so along every backward edge the pairing never gets
    deeper (this keeps the F_j -> loss -> B_j quotient acyclic for chains of layers). Backward
    nodes reading neither (e.g. a transposed weight) take the pairing of their backward
    successors, the deepest one (so the edge to it stays monotone)."""
    order = graph.topo_order
    pos = {n: i for i, n in enumerate(order)}
    nodes = graph.node_map
    producer = graph.producer
    forward = {n.id for n in graph.nodes if n.phase == "forward"}
    backward = [n for n in order if nodes[n].phase not in ("forward", "loss")]
    if not forward or not backward:
        return {}
    bset = set(backward)
    depth: dict[str, float] = {}
    for b in backward:
        # the gradient it continues (its paired backward predecessors) decides first: a weight
        # gradient reads layer j's *input* activation but belongs to layer j, whose output
        # gradient it reads
        d = min((depth[p] for v in nodes[b].inputs if (p := producer.get(v)) in bset), default=math.inf)
        if math.isinf(d):
            reads = [pos[p] for v in nodes[b].inputs if (p := producer.get(v)) in forward]
            d = float(max(reads)) if reads else math.inf
        depth[b] = d
    succs: dict[str, list[str]] = defaultdict(list)
    for b in backward:
        for v in nodes[b].inputs:
            p = producer.get(v)
            if p in bset:
                succs[p].append(b)
    for b in reversed(backward):
        if math.isinf(depth[b]):
            ds = [depth[s] for s in succs[b] if not math.isinf(depth[s])]
            if ds:
                depth[b] = max(ds)
    return {b: order[int(d)] for b, d in depth.items() if not math.isinf(d)}
