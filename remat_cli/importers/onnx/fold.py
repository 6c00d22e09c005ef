"""Shape arithmetic folded to constants, for the shape inference of stage 2 (:mod:`.shapes`).

Exporters compute Reshape and Slice targets at run time from ``Shape`` of a tensor and small
integer arithmetic. ``onnx.shape_inference``'s data propagation follows only a few of those
ops, and onnxruntime's symbolic inference gives up on others: a ``torch.nn.TransformerEncoder``
exported by ``torch.onnx.export`` (TorchScript, opset 17) slices ``Shape(q)`` up to a
``Reshape(Mod(c1, c2))`` and every attention tensor after it stayed "size unknown" with the
input shapes fixed. Here such values are evaluated once the inputs' shapes are fixed: from
constants, small int initializers and ``Shape``/``Size`` of tensors whose shape is known, by
onnx's reference evaluator, one node at a time, only for an allow-list of shape-arithmetic ops
and only while every tensor stays at most ``SMALL_INT_ELEMENTS`` elements (never a weight, never
a tensor that depends on input data). Shape inference then runs again on a copy of the model
in which the folded values are initializers; the import itself keeps the original graph.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import ModelProto, NodeProto, numpy_helper
from onnx import helper as oh

from remat_cli.importers.onnx.common import DEFAULT_DOMAINS, INT_TYPES, SMALL_INT_ELEMENTS

#: ops whose outputs are a function of their (small) inputs' values, evaluated here
SHAPE_OPS = frozenset(
    {"Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Floor", "Ceil", "Min", "Max", "Pow", "Sqrt"}
    | {"Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or", "Where"}
    | {"Gather", "GatherElements", "Slice", "Concat", "Squeeze", "Unsqueeze", "Reshape", "Flatten"}
    | {"Cast", "Identity", "Transpose", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin"}
    | {"Range", "ConstantOfShape", "Expand", "Tile", "Sign", "Split", "Constant"}
)


def _small(a: np.ndarray) -> bool:
    return a.size <= SMALL_INT_ELEMENTS


def _output_elements(node: NodeProto, ins: list[np.ndarray | None]) -> int | None:
    """Elements of the output of an op that may allocate more than its inputs, before running it."""
    op = node.op_type
    try:
        if op == "Constant":  # a weight written as a Constant node is never copied here
            sizes = [math.prod(a.t.dims) for a in node.attribute if a.name == "value" and a.HasField("t")]
            sizes += [len(a.ints) + len(a.floats) + len(a.strings) for a in node.attribute]
            return max(sizes, default=0)
        if op == "ConstantOfShape":
            return math.prod(int(d) for d in np.asarray(ins[0]).ravel())
        if op == "Range":
            start, limit, delta = (float(np.asarray(x)) for x in ins[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
        if op == "Expand":
            return math.prod(np.broadcast_shapes(ins[0].shape, tuple(int(d) for d in ins[1])))  # type: ignore[union-attr]
        if op == "Tile":
            return int(ins[0].size) * math.prod(int(r) for r in np.asarray(ins[1]).ravel())  # type: ignore[union-attr]
    except (TypeError, ValueError, OverflowError):
        return None
    return 0


def _evaluate(node: NodeProto, ins: list[np.ndarray | None], opsets: list) -> list[np.ndarray] | None:
    from onnx.reference import ReferenceEvaluator

    names = [f"i{k}" if x is not None else "" for k, x in enumerate(ins)]
    inputs = [
        oh.make_tensor_value_info(n, oh.np_dtype_to_tensor_dtype(x.dtype), x.shape)
        for n, x in zip(names, ins, strict=True)
        if x is not None
    ]
    outs = [f"o{k}" for k in range(len(node.output))]
    one = oh.make_node(node.op_type, names, outs, domain=node.domain)
    one.attribute.extend(node.attribute)
    graph = oh.make_graph([one], "fold", inputs, [oh.make_empty_tensor_value_info(o) for o in outs])
    try:
        model = oh.make_model(graph, opset_imports=opsets)
        feeds = {n: x for n, x in zip(names, ins, strict=True) if x is not None}
        # a hostile model's integer division by zero or overflow is its problem, not a warning
        # line on the user's terminal
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            got = ReferenceEvaluator(model).run(None, feeds)
    except Exception:  # an op or attribute the reference evaluator does not take: not folded
        return None
    return [np.asarray(a) for a in got]


def fold_shape_arithmetic(model: ModelProto, shapes: Mapping[str, list[int]]) -> ModelProto | None:
    """A copy of ``model`` in which the shape arithmetic computable from constants and the
    concrete ``shapes`` (tensor name -> dims) are initializers, or None when nothing folds."""
    g = model.graph
    known: dict[str, np.ndarray] = {}
    for t in g.initializer:
        if t.data_type in INT_TYPES and not t.external_data and math.prod(t.dims) <= SMALL_INT_ELEMENTS:
            known[t.name] = numpy_helper.to_array(t)
    opsets = list(model.opset_import)
    folded: set[int] = set()
    for k, n in enumerate(g.node):
        if n.domain not in DEFAULT_DOMAINS or n.op_type not in SHAPE_OPS | {"Shape", "Size"}:
            continue
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            continue
        if n.op_type in ("Shape", "Size"):
            dims = shapes.get(n.input[0]) if n.input else None
            if dims is None:
                continue
            attrs = {a.name: oh.get_attribute_value(a) for a in n.attribute}
            if n.op_type == "Size":
                out = [np.array(math.prod(dims), dtype=np.int64)]
            else:
                start, end = attrs.get("start", 0), attrs.get("end", len(dims))
                out = [np.array(dims[start:end], dtype=np.int64)]
        else:
            ins = [known.get(i) if i else None for i in n.input]
            if any(i and known.get(i) is None for i in n.input):
                continue
            elements = _output_elements(n, ins)
            if elements is None or elements > SMALL_INT_ELEMENTS:
                continue
            got = _evaluate(n, ins, opsets)
            if got is None or len(got) != len(n.output) or not all(_small(a) for a in got):
                continue
            out = got
        for name, a in zip(n.output, out, strict=True):
            if name:
                known[name] = a
        folded.add(k)
    if not folded:
        return None
    copy = ModelProto()
    copy.CopyFrom(model)
    nodes = [n for k, n in enumerate(g.node) if k not in folded]
    del copy.graph.node[:]
    copy.graph.node.extend(nodes)
    have = {t.name for t in g.initializer}
    for k in sorted(folded):
        for name in g.node[k].output:
            if name and name not in have:
                copy.graph.initializer.append(numpy_helper.from_array(known[name], name))
    return copy


def folded_value_infos(folded: ModelProto, original: ModelProto) -> list[onnx.ValueInfoProto]:
    """Value infos for the original model's node outputs that became initializers when folded."""
    produced = {o for n in original.graph.node for o in n.output if o}
    was = {t.name for t in original.graph.initializer}
    return [
        oh.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in folded.graph.initializer
        if t.name in produced and t.name not in was
    ]
