"""Stage 2 of the ONNX import: fixing symbolic input dims, shape inference, tensor types and sizes.

- **Values.** One value per ONNX tensor name (empty optional inputs/outputs are skipped).
  Size = prod(shape) x itemsize (sub-byte types packed), shapes from ``onnx.shape_inference``
  with data propagation, then onnxruntime's symbolic shape inference for what is still
  missing (contrib ops), never from tensor data: initializer sizes come from their ``dims``,
  so weights kept in external data files are never read (only int32/int64 initializers of
  at most 1024 elements are read, when their file is present, for shape inference of
  Reshape/Expand/Slice targets). Initializers (and graph inputs that have one) are
  ``parameter``, other graph inputs ``input``; both are resident. Graph outputs are
  ``outputs``. A size that stays unknown or symbolic is a GraphError naming the tensor.
- **Shape arithmetic.** Where inference leaves shapes unknown, Reshape/Slice targets computed
  from ``Shape()`` and small int ops are folded to constants and inference runs again
  (:mod:`.fold`).
- **Symbolic dims.** ``input_shapes`` fixes whole input shapes; ``batch`` fixes the first dim
  of every graph input whose first dim is symbolic. A fixed ``dim_param`` takes that value
  everywhere it occurs, and shape inference runs again on the fixed model. A dim the model
  fixes to a different number is an error (it is not overridden).
"""

from __future__ import annotations

import ast
import math
import operator
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, TensorProto, TypeProto
from onnx import helper as oh

from remat_cli.graph import GraphError
from remat_cli.importers.onnx.common import DEFAULT_DOMAINS, SUB_BYTE_BITS, Dim
from remat_cli.importers.onnx.fold import fold_shape_arithmetic, folded_value_infos

#: rounds of shape inference and folding of shape arithmetic (each may resolve a Shape() more)
FOLD_ROUNDS = 4


def fix_input_dims(
    g: GraphProto, input_shapes: Mapping[str, Sequence[int]], batch: int | None
) -> dict[str, int]:
    """Set the graph inputs' dims from `input_shapes` / `batch`; return dim_param -> value."""
    inits = {t.name for t in g.initializer}
    graph_inputs = {i.name: i for i in g.input}
    symbols: dict[str, int] = {}

    def assign(inp: str, k: int, dim: onnx.TensorShapeProto.Dimension, value: int) -> None:
        if value < 0:
            raise GraphError(f"input {inp!r} dim {k}: {value} is negative")
        if dim.HasField("dim_value"):
            if dim.dim_value != value:
                raise GraphError(
                    f"input {inp!r} dim {k} is fixed to {dim.dim_value} in the model, not {value}"
                )
            return
        if dim.HasField("dim_param"):
            sym = dim.dim_param
            if symbols.setdefault(sym, value) != value:
                raise GraphError(f"dim {sym!r} is given two values: {symbols[sym]} and {value}")
        dim.dim_value = value

    for inp, shape in input_shapes.items():
        vi = graph_inputs.get(inp)
        if inp in inits:
            raise GraphError(f"input shape given for {inp!r}, which is an initializer (its shape is fixed)")
        if vi is None:
            known = ", ".join(i for i in graph_inputs if i not in inits) or "none"
            raise GraphError(f"input shape given for {inp!r}, which is not a graph input (inputs: {known})")
        tt = vi.type.tensor_type
        shape = [int(d) for d in shape]
        if not tt.HasField("shape"):  # rank unknown: the given shape says it
            tt.shape.Clear()
            for _ in shape:
                tt.shape.dim.add()
        if len(tt.shape.dim) != len(shape):
            raise GraphError(
                f"input {inp!r} has rank {len(tt.shape.dim)}, but the shape given has {len(shape)} dims"
            )
        for k, (dim, value) in enumerate(zip(tt.shape.dim, shape, strict=True)):
            assign(inp, k, dim, value)
    if batch is not None:
        if batch < 1:
            raise GraphError(f"batch must be at least 1, not {batch}")
        for vi in g.input:
            if vi.name in inits or vi.name in input_shapes:
                continue
            tt = vi.type.tensor_type
            if tt.HasField("shape") and len(tt.shape.dim) > 0 and not tt.shape.dim[0].HasField("dim_value"):
                assign(vi.name, 0, tt.shape.dim[0], batch)
    if symbols:
        # The same symbol elsewhere (other inputs, declared outputs and value_info) is that value,
        # and so is an expression of fixed symbols (torch.onnx's dynamo exporter declares
        # value_info such as '4*batch' or 'seq*batch'; left symbolic, it hid the shape inferred)
        for vi in [*g.input, *g.output, *g.value_info]:
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                for dim in tt.shape.dim:
                    if dim.HasField("dim_param"):
                        value = symbols.get(dim.dim_param, dim_expression(dim.dim_param, symbols))
                        if value is not None:
                            dim.dim_value = value
    return symbols


_DIM_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}
_DIM_CALLS = {"Max": max, "Min": min, "max": max, "min": min}


def dim_expression(text: str, symbols: Mapping[str, int]) -> int | None:
    """The value of a dim_param that is integer arithmetic (+ - * // %, Max, Min) of fixed
    symbols, e.g. '4*batch'; None for anything else (an unknown name, '/', a huge text)."""

    def value(e: ast.expr) -> int:
        if isinstance(e, ast.Constant) and type(e.value) is int:
            return e.value
        if isinstance(e, ast.Name) and e.id in symbols:
            return symbols[e.id]
        if isinstance(e, ast.BinOp) and type(e.op) in _DIM_OPS:
            return _DIM_OPS[type(e.op)](value(e.left), value(e.right))
        if isinstance(e, ast.UnaryOp) and isinstance(e.op, ast.USub):
            return -value(e.operand)
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Name) and e.func.id in _DIM_CALLS and e.args:
            return _DIM_CALLS[e.func.id](value(a) for a in e.args)
        raise ValueError(text)

    if len(text) > 200:
        return None
    try:
        v = value(ast.parse(text, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return None
    return v if v >= 0 else None


def infer_shapes(model: ModelProto) -> tuple[ModelProto, str | None]:
    """onnx shape inference (with data propagation when it works), then onnxruntime's symbolic
    shape inference for tensors still without a full shape. Failures are partial, not fatal:
    the second item says why the symbolic inference could not help (None when it ran), so a
    shape that stays unknown is reported with the real cause."""
    inferred = _onnx_inference(model)
    for _ in range(FOLD_ROUNDS):
        if not _missing_shapes(inferred.graph):
            return inferred, None
        # Reshape/Slice targets computed from Shape() and small int arithmetic (see fold.py);
        # each round may fold a Shape() whose input the last round's inference resolved
        folded = fold_shape_arithmetic(model, _concrete_shapes(inferred.graph))
        if folded is None:
            break
        again = _onnx_inference(folded)
        have = {vi.name for vi in _value_infos(inferred.graph) if _complete(vi.type)}
        extra = [
            vi
            for vi in [*_value_infos(again.graph), *folded_value_infos(folded, model)]
            if vi.name not in have and _complete(vi.type)
        ]
        if not extra:
            break
        merged = ModelProto()
        merged.CopyFrom(inferred)
        merged.graph.value_info.extend(extra)
        inferred = merged
    if not _missing_shapes(inferred.graph):
        return inferred, None
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except ImportError as e:  # it needs sympy (a declared dependency): say so, never a wrong hint
        return inferred, (f"onnxruntime's symbolic shape inference is unavailable ({e}; pip install sympy)")
    try:
        # When it gives up it saves "sym_shape_infer_temp.onnx" (and its external data) into the
        # working directory: let it do so in a temporary folder, never in the user's.
        with tempfile.TemporaryDirectory(prefix="remat-shape-") as tmp:
            here = os.getcwd()
            os.chdir(tmp)  # contextlib.chdir is 3.11+
            try:
                sym = SymbolicShapeInference.infer_shapes(inferred)
            finally:
                os.chdir(here)
    except Exception as e:  # unknown ops, external data it cannot read: keep onnx's result
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        return inferred, f"onnxruntime's symbolic shape inference failed: {first[:200]}"
    if sym is None:
        return inferred, "onnxruntime's symbolic shape inference returned nothing"
    have = {vi.name for vi in _value_infos(inferred.graph) if _complete(vi.type)}
    extra = [vi for vi in _value_infos(sym.graph) if vi.name not in have and _complete(vi.type)]
    out = ModelProto()
    out.CopyFrom(inferred)
    out.graph.value_info.extend(extra)
    return out, None


def _onnx_inference(model: ModelProto) -> ModelProto:
    """onnx shape inference, with data propagation when it works; the model as declared when
    neither pass can handle a node."""
    for data_prop in (True, False):
        try:
            return onnx.shape_inference.infer_shapes(
                model, check_type=False, strict_mode=False, data_prop=data_prop
            )
        except Exception:  # a node the inference cannot handle
            continue
    return model


def _value_infos(g: GraphProto) -> Iterable[onnx.ValueInfoProto]:
    yield from g.input
    yield from g.output
    yield from g.value_info


def _concrete_shapes(g: GraphProto) -> dict[str, list[int]]:
    """Tensor name -> dims, for every value info with a complete shape and every initializer."""
    out = {
        vi.name: [int(d.dim_value) for d in vi.type.tensor_type.shape.dim]
        for vi in _value_infos(g)
        if _complete(vi.type)
    }
    out.update({t.name: [int(d) for d in t.dims] for t in g.initializer})
    return out


def _complete(t: TypeProto) -> bool:
    if not t.HasField("tensor_type"):
        return False
    tt = t.tensor_type
    return tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim)


def _known_or_symbolic(t: TypeProto) -> bool:
    """A tensor type whose every dim is a number or a named symbol from the model: a second
    inference pass cannot do better (only --input-shape / --batch can)."""
    if not t.HasField("tensor_type"):
        return False
    tt = t.tensor_type
    return tt.HasField("shape") and all(
        d.HasField("dim_value") or (d.HasField("dim_param") and not d.dim_param.startswith("unk__"))
        for d in tt.shape.dim
    )


def _missing_shapes(g: GraphProto) -> bool:
    """Whether some node output lacks a shape that another inference pass could find (not
    when a graph input's shape is unknown: then the error must name that input)."""
    known = {vi.name for vi in _value_infos(g) if _known_or_symbolic(vi.type)}
    known |= {t.name for t in g.initializer}
    if any(i.name not in known for i in g.input):
        return False
    return any(o and o not in known for n in g.node for o in n.output)


@dataclass
class TensorType:
    elem_type: int
    shape: list[Dim] | None  # None: rank unknown; None entries: unknown dims

    @property
    def concrete(self) -> list[int] | None:
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return [int(d) for d in self.shape]  # type: ignore[arg-type]


def collect_types(g: GraphProto, symbols: Mapping[str, int]) -> dict[str, TensorType | str]:
    """name -> TensorType, or a string naming the non-tensor kind (sequence, map, ...)."""
    out: dict[str, TensorType | str] = {}

    def score(t: TensorType | str) -> int:
        if isinstance(t, str):
            return 0
        if t.shape is None:
            return 1
        return 3 if t.concrete is not None else 2

    def put(name: str, t: TensorType | str) -> None:
        old = out.get(name)
        if old is None or score(t) > score(old):
            out[name] = t

    for vi in _value_infos(g):
        kind = vi.type.WhichOneof("value")
        if kind != "tensor_type":
            if kind is not None:
                put(vi.name, kind)
            continue
        tt = vi.type.tensor_type
        shape: list[Dim] | None = None
        if tt.HasField("shape"):
            shape = []
            for d in tt.shape.dim:
                if d.HasField("dim_value"):
                    shape.append(int(d.dim_value))
                elif d.HasField("dim_param"):
                    shape.append(symbols.get(d.dim_param, d.dim_param))
                else:
                    shape.append(None)
        put(vi.name, TensorType(tt.elem_type, shape))
    for t in g.initializer:
        out[t.name] = TensorType(t.data_type, [int(d) for d in t.dims])
    for st in g.sparse_initializer:
        out[st.values.name] = TensorType(st.values.data_type, [int(d) for d in st.dims])
    for n in g.node:
        if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == AttributeProto.TENSOR:
                    put(n.output[0], TensorType(a.t.data_type, [int(d) for d in a.t.dims]))
    return out


def shape_of(types: Mapping[str, TensorType | str], name: str) -> list[int] | None:
    t = types.get(name)
    return t.concrete if isinstance(t, TensorType) else None


def dtype_name(elem_type: int) -> str | None:
    try:
        return np.dtype(oh.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # UNDEFINED or a type numpy has no name for
        return None


def tensor_bytes(elem_type: int, shape: Sequence[int]) -> int:
    """Bytes of a dense tensor; sub-byte types packed. GraphError for types without a size."""
    n = math.prod(shape)
    if elem_type in SUB_BYTE_BITS:
        return (n * SUB_BYTE_BITS[elem_type] + 7) // 8
    if elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise GraphError("has no fixed element size")
    return n * np.dtype(oh.tensor_dtype_to_np_dtype(elem_type)).itemsize
