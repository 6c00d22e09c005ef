"""Stage 3 of the ONNX import: the remat graph's nodes and values, and training phases.

- **Nodes.** One remat node per ONNX node of the main graph, in topological order. Its id is
  the ONNX node name; an empty or repeated name becomes ``f"{op_type}_{index}"`` (index = the
  node's position in ``graph.node``; ``_`` is appended while that id is taken).
  :func:`onnx_node_ids` is that rule, and ``source`` is ``[id]``, so ``remat run`` finds the
  ONNX node back. ``op`` is the ``op_type``. Nodes with subgraphs (If, Loop, Scan) also read
  the outer-scope tensors their bodies use. Nodes no graph output needs are kept (the
  simulator and the baseline never run them).
- **Views.** Reshape, Flatten, Squeeze, Unsqueeze and Identity alias their data input (as
  ONNX Runtime's allocation planner does). Their output value has size 0, and every node
  that reads a view output also reads the view's *base* — the non-view tensor it aliases,
  following chains of views — as an extra input that is not an ONNX input. So the base stays
  live exactly as long as any view of it is used, and its bytes are counted once. When a
  view output is a graph output, its base is added to ``outputs`` too (it must survive to
  the end). The runtime replays ONNX nodes by ``source`` and keeps a value's tensor alive
  while it is live, so the extra inputs need no special care there.
- **Constants.** Constant and ConstantOfShape stay ordinary nodes (recomputable, cost =
  elements written under ``flops``); they are not folded into resident values, so a
  tiny shape constant costs nothing resident and a large one can be freed and recomputed.
- **Phases.** A graph is a training graph when an output name contains ``grad`` or a node
  is a gradient op (``Gradient``, ``*Grad``). Its loss is the graph output with one element
  named like ``loss`` (else any output named like ``loss``, else the first one-element
  output, else the first output); the node producing it is ``loss``, the nodes the loss
  needs are ``forward``, all others ``backward``. Inference graphs get no phases.
- **grad_of.** A backward node whose ONNX node carries the metadata ``remat.grad_of`` (written
  by ``remat export-torch`` from autograd's pairing of each backward op with the forward op it
  differentiates) gets that node as ``grad_of`` when it names a forward or loss node; other
  values are ignored (the solvers then pair from the dataflow).
- **scope.** A node whose ONNX node carries the metadata ``remat.scope`` (written by ``remat
  export-torch``: the path of the module that ran it, ``blocks.7.attn``) keeps it as ``scope``;
  models from other exporters have none.
- **Control flow.** If, Loop and Scan are single nodes: their bodies' temporaries are not
  counted and their ``flops`` cost is the elements they write.
- **Recomputable.** False for random ops (RandomNormal[Like], RandomUniform[Like],
  Multinomial, Bernoulli) and for Dropout with a ``training_mode`` input.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import onnx
from onnx import GraphProto, NodeProto

from remat_cli.graph import GraphError, Node, Phase, Value
from remat_cli.importers.onnx.common import DEFAULT_DOMAINS, RANDOM_OPS, VIEW_OPS, subgraphs
from remat_cli.importers.onnx.shapes import TensorType, dtype_name, shape_of, tensor_bytes

#: ONNX node metadata naming the forward node a backward node differentiates (``grad_of``)
GRAD_OF_KEY = "remat.grad_of"
#: ONNX node metadata naming the module the node belongs to, e.g. ``blocks.7.attn`` (``scope``)
SCOPE_KEY = "remat.scope"


def onnx_node_ids(graph: GraphProto) -> list[str]:
    """The remat node id of each node of `graph`, in `graph.node` order.

    The ONNX name when it is non-empty and not used by an earlier node; otherwise
    ``f"{op_type}_{index}"``, with ``_`` appended while that is already taken by a name.
    """
    names = [n.name for n in graph.node]
    taken: set[str] = set()
    first: set[int] = set()
    for i, nm in enumerate(names):
        if nm and nm not in taken:
            taken.add(nm)
            first.add(i)
    ids: list[str] = []
    for i, n in enumerate(graph.node):
        if i in first:
            ids.append(n.name)
            continue
        nid = f"{n.op_type}_{i}"
        while nid in taken:
            nid += "_"
        taken.add(nid)
        ids.append(nid)
    return ids


def _outer_refs(g: GraphProto) -> list[str]:
    """Names a subgraph reads from enclosing scopes."""
    defined = {i.name for i in g.input} | {t.name for t in g.initializer}
    defined |= {t.values.name for t in g.sparse_initializer}
    defined |= {o for n in g.node for o in n.output if o}
    refs: dict[str, None] = {}
    for n in g.node:
        for i in n.input:
            if i and i not in defined:
                refs[i] = None
        for sub in subgraphs(n):
            for r in _outer_refs(sub):
                if r not in defined:
                    refs[r] = None
    return list(refs)


def node_reads(n: NodeProto) -> list[str]:
    """ONNX inputs (empty optionals skipped) then outer-scope reads of subgraphs, deduplicated."""
    names = dict.fromkeys(i for i in n.input if i)
    for sub in subgraphs(n):
        names.update(dict.fromkeys(_outer_refs(sub)))
    return list(names)


def _is_view(n: NodeProto) -> bool:
    return n.op_type in VIEW_OPS and n.domain in DEFAULT_DOMAINS and bool(n.input) and bool(n.input[0])


def topological_order(g: GraphProto, ids: Sequence[str]) -> list[int]:
    """Node indices in a topological order, ONNX order where it already is one (it should be)."""
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    preds = [{producer[i] for i in node_reads(n) if i in producer} for n in g.node]
    done: set[int] = set()
    order: list[int] = []
    visiting: set[int] = set()
    for start in range(len(g.node)):
        stack: list[tuple[int, bool]] = [(start, False)]
        while stack:
            k, expanded = stack.pop()
            if k in done:
                continue
            if expanded:
                visiting.discard(k)
                done.add(k)
                order.append(k)
                continue
            if k in visiting:
                raise GraphError(f"ONNX graph has a cycle through node {ids[k]!r}")
            visiting.add(k)
            stack.append((k, True))
            stack.extend((p, False) for p in sorted(preds[k], reverse=True) if p not in done)
    return order


@dataclass
class NodeInfo:
    index: int  # position in graph.node
    proto: NodeProto
    reads: list[str]  # ONNX reads (no view bases)


class Builder:
    def __init__(
        self,
        g: GraphProto,
        ids: Sequence[str],
        types: Mapping[str, TensorType | str],
        no_symbolic: str | None = None,
    ):
        self.g = g
        self.no_symbolic = no_symbolic
        self.ids = ids
        self.types = types
        self.producer_id = {o: ids[k] for k, n in enumerate(g.node) for o in n.output if o}
        self.producer_node = {o: n for n in g.node for o in n.output if o}

    @cached_property
    def _hint(self) -> str:
        """What to do about an unknown size: fix the inputs, unless they are all fixed already."""
        inits = {t.name for t in self.g.initializer}
        for vi in self.g.input:
            t = self.types.get(vi.name)
            if vi.name not in inits and not (isinstance(t, TensorType) and t.concrete is not None):
                return "give --input-shape NAME=DIMS or --batch N"
        return "all input shapes are fixed, so it depends on tensor values that shape inference cannot see"

    def _value(self, name: str, role: str, size_zero: bool = False) -> Value:
        t = self.types.get(name)
        tensor = isinstance(t, TensorType)
        dtype = dtype_name(t.elem_type) if isinstance(t, TensorType) else None
        shape = t.concrete if isinstance(t, TensorType) else None
        if size_zero:  # a view: its size does not depend on its shape
            return Value(id=name, size=0, role=role, dtype=dtype, shape=shape)  # type: ignore[arg-type]
        where = f"tensor {name!r}"
        if name in self.producer_id:
            where += f" (output of node {self.producer_id[name]!r})"
        if isinstance(t, str):
            raise GraphError(f"{where} is a {t.replace('_type', '')}, not a tensor; its size is unknown")
        if not tensor or t.shape is None:  # type: ignore[union-attr]
            unknown = _unknown_op(self.producer_node.get(name))
            if unknown and not (self.no_symbolic and "unavailable" in self.no_symbolic):
                raise GraphError(
                    f"shape of {where} could not be inferred: unknown operator {unknown!r}; "
                    "declare the output's shape in the model's value_info"
                )
            cause = f" ({self.no_symbolic})" if self.no_symbolic else ""
            raise GraphError(f"shape of {where} could not be inferred{cause}; {self._hint}")
        if shape is None:
            dims = ["?" if d is None else d for d in t.shape]  # type: ignore[union-attr]
            unknown = next(d for d in dims if not isinstance(d, int))
            raise GraphError(
                f"size of {where} is unknown: shape {dims} has symbolic dim {unknown!r}; {self._hint}"
            )
        if any(d < 0 for d in shape):
            raise GraphError(f"{where} has a negative dimension: shape {list(shape)}")
        try:
            size = tensor_bytes(t.elem_type, shape)  # type: ignore[union-attr]
        except GraphError as e:
            raise GraphError(f"{where} {e}") from None
        return Value(id=name, size=size, role=role, dtype=dtype, shape=list(shape))  # type: ignore[arg-type]

    def build(self, order: Sequence[int]) -> tuple[list[Value], list[Node], list[str], list[NodeInfo]]:
        g = self.g
        inits = [t.name for t in g.initializer] + [t.values.name for t in g.sparse_initializer]
        init_set = set(inits)
        values: dict[str, Value] = {}
        for vi in g.input:
            if vi.name not in init_set and vi.name not in values:
                values[vi.name] = self._value(vi.name, "input")
        for name in inits:
            if name not in values:
                values[name] = self._value(name, "parameter")
        base: dict[str, str] = {}  # view output -> the non-view tensor it aliases
        nodes: list[Node] = []
        infos: list[NodeInfo] = []
        for k in order:
            n = g.node[k]
            nid = self.ids[k]
            reads = node_reads(n)
            outs = [o for o in n.output if o]
            if not outs:
                continue  # a node with no named output has nothing to schedule
            view = _is_view(n)
            if view:
                src = n.input[0]
                for o in outs[:1]:
                    base[o] = base.get(src, src)
            for o in outs:
                if o in values:
                    raise GraphError(f"tensor {o!r} (output of node {nid!r}) is defined twice")
                values[o] = self._value(o, "intermediate", size_zero=view and o == outs[0])
            inputs = list(dict.fromkeys([*reads, *(base[i] for i in reads if i in base)]))
            for i in inputs:
                if i not in values:
                    raise GraphError(f"node {nid!r} reads tensor {i!r}, which nothing defines")
            nodes.append(
                Node(
                    id=nid,
                    op=n.op_type,
                    inputs=inputs,
                    outputs=outs,
                    source=[nid],
                    recomputable=_recomputable(n),
                    scope=_scope(n),
                )
            )
            infos.append(NodeInfo(k, n, reads))
        outputs: list[str] = []
        for o in g.output:
            if o.name not in values:
                raise GraphError(f"graph output {o.name!r} is not produced by any node or input")
            outputs.append(o.name)
            b = base.get(o.name)
            if b is not None and values[b].role == "intermediate":
                outputs.append(b)  # a view output at the end needs the tensor it aliases
        return list(values.values()), nodes, list(dict.fromkeys(outputs)), infos


def _unknown_op(n: NodeProto | None) -> str | None:
    """`domain.op` when no registered ONNX schema defines node n's operator, else None."""
    if n is None:
        return None
    try:
        if onnx.defs.has(n.op_type, n.domain):
            return None
    except Exception:  # an onnx without this lookup: say nothing rather than guess
        return None
    return f"{n.domain}.{n.op_type}" if n.domain else n.op_type


def draws_random(n: NodeProto) -> bool:
    """A node whose outputs are random draws: a random op, or Dropout with a training_mode input."""
    if n.domain not in DEFAULT_DOMAINS:
        return False
    return n.op_type in RANDOM_OPS or (n.op_type == "Dropout" and len(n.input) >= 3 and bool(n.input[2]))


def _recomputable(n: NodeProto) -> bool:
    return not draws_random(n)


def _scope(n: NodeProto) -> str | None:
    """The module path the node's ``SCOPE_KEY`` metadata names, if any."""
    return next((p.value for p in n.metadata_props if p.key == SCOPE_KEY and p.value), None)


# ---------------------------------------------------------------------------------------------
# phases


def infer_phases(
    g: GraphProto, ids: Sequence[str], nodes: Sequence[Node], types: Mapping[str, TensorType | str]
) -> dict[str, Phase] | None:
    out_names = [o.name for o in g.output]
    training = any("grad" in o.lower() for o in out_names) or any(
        n.op_type == "Gradient" or n.op_type.endswith("Grad") for n in g.node
    )
    if not training or not out_names:
        return None

    def scalar(name: str) -> bool:
        s = shape_of(types, name)
        return s is not None and math.prod(s) == 1

    loss = (
        next((o for o in out_names if "loss" in o.lower() and scalar(o)), None)
        or next((o for o in out_names if "loss" in o.lower()), None)
        or next((o for o in out_names if scalar(o)), None)
        or out_names[0]
    )
    producer = {v: n.id for n in nodes for v in n.outputs}
    if loss not in producer:
        return None
    by_id = {n.id: n for n in nodes}
    forward: set[str] = set()
    stack = [producer[v] for v in by_id[producer[loss]].inputs if v in producer]
    while stack:
        nid = stack.pop()
        if nid in forward:
            continue
        forward.add(nid)
        stack.extend(producer[v] for v in by_id[nid].inputs if v in producer)
    phases: dict[str, Phase] = {}
    for n in nodes:
        phases[n.id] = "loss" if n.id == producer[loss] else "forward" if n.id in forward else "backward"
    return phases


def grad_of_links(g: GraphProto, ids: Sequence[str], phases: Mapping[str, Phase]) -> dict[str, str]:
    """Backward node -> the forward (or loss) node its ``remat.grad_of`` metadata names."""
    out: dict[str, str] = {}
    for nid, n in zip(ids, g.node, strict=True):
        target = next((p.value for p in n.metadata_props if p.key == GRAD_OF_KEY), None)
        if target is not None and phases.get(nid) == "backward" and phases.get(target) in ("forward", "loss"):
            out[nid] = target
    return out
