"""ONNX models (inference or training graphs) as remat graphs.

How an ONNX model becomes a remat-graph (DESIGN.md §1):

- **Opsets.** A model older than opset 13 (``MIN_OPSET``) is upgraded to 13 with
  ``onnx.version_converter`` first (:func:`upgrade_opset`, an :class:`OpsetUpgraded` warning
  says so); everything below describes the upgraded model. ``remat run`` upgrades it the same
  way, so the node ids match, and compares with the original model's outputs.

- **Nodes.** One remat node per ONNX node of the main graph, in topological order. Its id is
  the ONNX node name; an empty or repeated name becomes ``f"{op_type}_{index}"`` (index = the
  node's position in ``graph.node``; ``_`` is appended while that id is taken).
  :func:`onnx_node_ids` is that rule, and ``source`` is ``[id]``, so ``remat run`` finds the
  ONNX node back. ``op`` is the ``op_type``. Nodes with subgraphs (If, Loop, Scan) also read
  the outer-scope tensors their bodies use. Nodes no graph output needs are kept (the
  simulator and the baseline never run them).
- **Values.** One value per ONNX tensor name (empty optional inputs/outputs are skipped).
  Size = prod(shape) x itemsize (sub-byte types packed), shapes from ``onnx.shape_inference``
  with data propagation, then onnxruntime's symbolic shape inference for what is still
  missing (contrib ops), never from tensor data: initializer sizes come from their ``dims``,
  so weights kept in external data files are never read (only int32/int64 initializers of
  at most 1024 elements are read, when their file is present, for shape inference of
  Reshape/Expand/Slice targets). Initializers (and graph inputs that have one) are
  ``parameter``, other graph inputs ``input``; both are resident. Graph outputs are
  ``outputs``. A size that stays unknown or symbolic is a GraphError naming the tensor.
- **Symbolic dims.** ``input_shapes`` fixes whole input shapes; ``batch`` fixes the first dim
  of every graph input whose first dim is symbolic. A fixed ``dim_param`` takes that value
  everywhere it occurs, and shape inference runs again on the fixed model. A dim the model
  fixes to a different number is an error (it is not overridden).
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
  ``grad_of`` is not set.
- **Control flow.** If, Loop and Scan are single nodes: their bodies' temporaries are not
  counted and their ``flops`` cost is the elements they write.
- **Recomputable.** False for random ops (RandomNormal[Like], RandomUniform[Like],
  Multinomial, Bernoulli) and for Dropout with a ``training_mode`` input.
- **Costs** (``cost_unit``): ``flops`` (default; see :func:`node_flops`: 2 x MACs for Conv,
  ConvTranspose, Gemm, MatMul, LSTM/GRU/RNN; window x outputs for pooling; 4 per element
  for BatchNormalization in inference, 8 for the other normalisations and training-mode
  BatchNorm, 5 for Softmax; elements read for reductions, elements written for everything
  else; 0 for views and 1 for Shape/Size), ``unit`` (1 each), ``profile`` (seconds: each
  node alone in a one-node model on onnxruntime's CPU provider, median of ``profile_runs``
  runs after one warm-up; inputs are the values computed by the earlier one-node runs where
  they are small or integer, else random data of the right dtype and shape).
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, GraphProto, ModelProto, NodeProto, TensorProto, TypeProto, numpy_helper
from onnx import helper as oh
from pydantic import ValidationError

from remat_cli.graph import Graph, GraphError, Node, Phase, Value
from remat_cli.importers.notes import OpsetUpgraded

MIN_OPSET = 13
COST_MODELS = ("flops", "unit", "profile")
COST_UNITS = {"flops": "flops", "unit": "unit", "profile": "seconds"}
VIEW_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"})
RANDOM_OPS = frozenset(
    {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial", "Bernoulli"}
)
DEFAULT_DOMAINS = ("", "ai.onnx")
#: int initializers up to this many elements are read from external data for shape inference
SMALL_INT_ELEMENTS = 1024
#: outputs of profiled nodes kept as inputs for later ones: non-float, or at most this many bytes
PROFILE_KEEP_BYTES = 1 << 16
PROFILE_KEEP_INT_BYTES = 1 << 26

_SUB_BYTE_BITS = {
    getattr(TensorProto, name): bits
    for name, bits in (
        ("INT4", 4),
        ("UINT4", 4),
        ("FLOAT4E2M1", 4),
        ("INT2", 2),
        ("UINT2", 2),
        ("FLOAT6E2M3", 6),
        ("FLOAT6E3M2", 6),
    )
    if hasattr(TensorProto, name)
}
_INT_TYPES = frozenset(
    {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64}
    | {TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
)

Dim = int | str | None


# ---------------------------------------------------------------------------------------------
# entry points


def from_onnx_file(
    path: str | Path,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    cost: str = "flops",
    profile_runs: int = 5,
) -> Graph:
    """Read an ONNX file (external data files are not loaded) into a Graph named after it."""
    path = Path(path)
    model = read_model(path)
    return from_onnx_model(
        model,
        input_shapes=input_shapes,
        batch=batch,
        cost=cost,
        profile_runs=profile_runs,
        name=path.stem,
        base_dir=path.parent,
    )


def read_model(path: str | Path) -> ModelProto:
    """The ModelProto in `path` (binary protobuf, or the text format onnx writes for
    ``.textproto``), without its external data; GraphError when it is not ONNX."""
    from google.protobuf import text_format

    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise GraphError(f"cannot read {path}: {e.strerror}") from None
    model = ModelProto()
    try:
        model.ParseFromString(raw)
        _check_is_model(model, str(path))
        return model
    except Exception:  # protobuf's DecodeError and friends, or no graph: maybe text format
        pass
    model = ModelProto()
    try:
        text_format.Parse(raw.decode("utf-8"), model)
    except Exception:
        raise GraphError(f"{path} is not an ONNX model (protobuf parse failed)") from None
    _check_is_model(model, str(path))
    return model


def _check_is_model(model: ModelProto, where: str) -> None:
    if not model.HasField("graph") or not model.opset_import:
        raise GraphError(f"{where} is not an ONNX model (no graph or no opset_import)")


def looks_like_onnx_json(data: Any) -> bool:
    """Whether parsed JSON is an ONNX model in protobuf's JSON mapping (onnx saves ``.json`` so)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("graph"), dict)
        and any(k in data for k in ("opset_import", "opsetImport", "ir_version", "irVersion"))
    )


def from_onnx_json(data: Mapping[str, Any], **options: Any) -> Graph:
    """An ONNX model in protobuf's JSON mapping; `options` as for :func:`from_onnx_model`."""
    from google.protobuf import json_format

    model = ModelProto()
    try:
        json_format.ParseDict(data, model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"ONNX JSON does not parse: {first}") from None
    _check_is_model(model, "ONNX JSON")
    return from_onnx_model(model, **options)


def from_onnx_model(
    model: ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    batch: int | None = None,
    cost: str = "flops",
    profile_runs: int = 5,
    name: str | None = None,
    base_dir: str | Path | None = None,
) -> Graph:
    """The remat Graph of an ONNX ModelProto (the module docstring says how it is modelled).

    `base_dir` is where external data files would be; only small int initializers are read
    from them, and only when present. The caller's `model` is not modified.
    """
    if cost not in COST_MODELS:
        raise GraphError(f"unknown cost model {cost!r} (choose from {', '.join(COST_MODELS)})")
    if cost == "profile" and profile_runs < 1:
        raise GraphError("profile_runs must be at least 1")
    upgraded, old_opset = upgrade_opset(model)
    if old_opset is not None:
        warnings.warn(
            OpsetUpgraded(
                f"ONNX opset {old_opset} upgraded to {MIN_OPSET} on import (onnx.version_converter)"
            ),
            stacklevel=2,
        )
    m = ModelProto()
    m.CopyFrom(upgraded)
    if base_dir is not None:
        check_external_data(m, Path(base_dir))
        _inline_small_int_initializers(m.graph, Path(base_dir))
    symbols = _fix_input_dims(m.graph, input_shapes or {}, batch)
    inferred, no_symbolic = _infer_shapes(m)
    types = _collect_types(inferred.graph, symbols)
    g = m.graph
    ids = onnx_node_ids(g)
    order = _topological(g, ids)
    builder = _Builder(g, ids, types, no_symbolic)
    values, nodes, outputs, node_infos = builder.build(order)
    phases = _infer_phases(g, ids, nodes, types)
    if phases is not None:
        for n in nodes:
            n.phase = phases[n.id]
    if cost == "unit":
        for n in nodes:
            n.cost = 1.0
    elif cost == "flops":
        for n, info in zip(nodes, node_infos, strict=True):
            n.cost = float(node_flops(info.proto, lambda t: _shape_of(types, t)))
    else:
        costs = _profile(m, ids, types, node_infos, profile_runs, base_dir)
        for n in nodes:
            n.cost = costs[n.id]
    graph_name = name or g.name or "onnx"
    try:
        return Graph(name=graph_name, cost_unit=COST_UNITS[cost], values=values, nodes=nodes, outputs=outputs)
    except ValidationError as e:  # pydantic wraps the GraphError raised by validation
        msg = str(e.errors()[0].get("msg", e))
        raise GraphError(msg.removeprefix("Value error, ")) from None


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


# ---------------------------------------------------------------------------------------------
# model checks and shape inference


def upgrade_opset(model: ModelProto) -> tuple[ModelProto, int | None]:
    """`model` itself and None when its default-domain opset is ``MIN_OPSET`` or newer; else a
    copy converted to ``MIN_OPSET`` by ``onnx.version_converter`` and the old opset.

    The importer and ``remat run`` both call this, so node ids (:func:`onnx_node_ids`) of the
    upgraded model are the graph's. A model the converter cannot upgrade is a GraphError naming
    the operator that stopped it.
    """
    default = [o.version for o in model.opset_import if o.domain in DEFAULT_DOMAINS]
    if not default:
        if any(n.domain in DEFAULT_DOMAINS for n in model.graph.node):
            raise GraphError("ONNX model imports no default-domain opset")
        return model, None
    old = max(default)
    if old >= MIN_OPSET:
        return model, None
    from onnx import version_converter

    try:
        new = version_converter.convert_version(model, MIN_OPSET)
    except Exception as e:  # the converter's C++ errors arrive as RuntimeError/ValueError/...
        raise GraphError(
            f"ONNX opset {old} could not be upgraded to {MIN_OPSET} (onnx.version_converter): "
            f"{_converter_culprit(model, old, e)}"
        ) from None
    if model.ir_version < 4:
        # Before IR 4 every initializer had to be a graph input too, and onnxruntime treats them
        # as constants there; from IR 4 on such an input is an overridable default, which stops
        # e.g. Conv from pre-packing its weights and changes the rounding. Constants they stay.
        inits = {t.name for t in new.graph.initializer}
        kept = [i for i in new.graph.input if i.name not in inits]
        del new.graph.input[:]
        new.graph.input.extend(kept)
    # The IR version must be new enough for the opset (onnxruntime checks it).
    new.ir_version = max(new.ir_version, oh.find_min_ir_version_for(list(new.opset_import), True))
    return new, old


def _converter_culprit(model: ModelProto, old: int, e: Exception) -> str:
    """The operator the converter stopped at: each op type is converted alone in a one-node
    model (the converter's message names an adapter, not always the op), else its message."""
    # The converter's assertions carry a C++ source location before the reason.
    detail = (str(e).strip().splitlines() or [type(e).__name__])[-1].strip()
    detail = detail.split(" failed: ", 1)[-1]
    if "no registered schema" in detail:  # its printf-style message arrives unformatted
        detail = f"no such operator in the default domain at opset {old}"
    from onnx import version_converter

    seen: set[tuple[str, str]] = set()
    for n in model.graph.node:
        if (n.domain, n.op_type) in seen or n.domain not in DEFAULT_DOMAINS:
            continue
        seen.add((n.domain, n.op_type))
        # Untyped inputs and outputs: the converter needs them declared, not typed.
        ins = [oh.make_empty_tensor_value_info(i) for i in dict.fromkeys(n.input) if i]
        outs = [oh.make_empty_tensor_value_info(o) for o in n.output if o]
        probe = oh.make_model(
            oh.make_graph([n], "probe", ins, outs), opset_imports=[oh.make_opsetid("", old)]
        )
        try:
            version_converter.convert_version(probe, MIN_OPSET)
        except Exception:  # this op type is the one
            name = f" (node {n.name!r})" if n.name else ""
            return f"operator {n.op_type}{name} has no upgrade path: {detail}"
    return detail


def _inline_small_int_initializers(g: GraphProto, base_dir: Path) -> None:
    """Read small int initializers from external data so shape inference sees Reshape targets.

    Weights are never read; a missing file simply leaves the tensor external."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    for t in g.initializer:
        if (
            uses_external_data(t)
            and t.data_type in (TensorProto.INT64, TensorProto.INT32)
            and math.prod(t.dims) <= SMALL_INT_ELEMENTS
        ):
            try:
                load_external_data_for_tensor(t, str(base_dir))
            except Exception:  # missing or short file: the tensor stays external
                continue
            del t.external_data[:]
            t.data_location = TensorProto.DEFAULT


def _all_tensors(g: GraphProto) -> Iterable[TensorProto]:
    """Initializers and attribute tensors of `g` and its subgraphs: all that may be external."""
    yield from g.initializer
    for n in g.node:
        for a in n.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
        for sub in _subgraphs(n):
            yield from _all_tensors(sub)


def check_external_data(model: ModelProto, base_dir: Path, *, require_files: bool = False) -> None:
    """Refuse external-data locations that leave the model's folder (``../``, absolute paths,
    symlinks out) or name something that is not a file; with `require_files` (running the
    model needs its weights) also missing files and ranges past a file's end. GraphError names
    the tensor. Reading nothing, this is safe to call before onnx or onnxruntime open anything."""
    from onnx.external_data_helper import uses_external_data

    folder = base_dir.resolve()
    for t in _all_tensors(model.graph):
        if not uses_external_data(t):
            continue
        info = {e.key: e.value for e in t.external_data}
        location = info.get("location", "")
        where = f"external data of tensor {t.name!r} ({location!r})"
        if not location:
            raise GraphError(f"external data of tensor {t.name!r} has no location")
        target = (folder / location).resolve()  # absolute locations replace the folder
        if Path(location).is_absolute() or not target.is_relative_to(folder):
            raise GraphError(f"{where} points outside the model's folder {str(folder)!r}; refused")
        if target.exists() and not target.is_file():
            raise GraphError(f"{where} is not a file")
        if not require_files:
            continue
        if not target.exists():
            raise GraphError(f"{where} is missing: {location} is not in {str(folder)!r}")
        try:
            end = int(info.get("offset", 0)) + int(info.get("length", 0))
        except ValueError:
            raise GraphError(f"{where} has a non-integer offset or length") from None
        if end > target.stat().st_size:
            raise GraphError(f"{where} ends at byte {end}, past the end of {location}")


def _fix_input_dims(
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
        # The same symbol elsewhere (other inputs, declared outputs and value_info) is that value.
        for vi in [*g.input, *g.output, *g.value_info]:
            tt = vi.type.tensor_type
            if tt.HasField("shape"):
                for dim in tt.shape.dim:
                    if dim.HasField("dim_param") and dim.dim_param in symbols:
                        dim.dim_value = symbols[dim.dim_param]
    return symbols


def _infer_shapes(model: ModelProto) -> tuple[ModelProto, str | None]:
    """onnx shape inference (with data propagation when it works), then onnxruntime's symbolic
    shape inference for tensors still without a full shape. Failures are partial, not fatal:
    the second item says why the symbolic inference could not help (None when it ran), so a
    shape that stays unknown is reported with the real cause."""
    inferred = model
    for data_prop in (True, False):
        try:
            inferred = onnx.shape_inference.infer_shapes(
                model, check_type=False, strict_mode=False, data_prop=data_prop
            )
            break
        except Exception:  # a node the inference cannot handle; keep what the model declares
            continue
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


def _value_infos(g: GraphProto) -> Iterable[onnx.ValueInfoProto]:
    yield from g.input
    yield from g.output
    yield from g.value_info


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
class _TensorType:
    elem_type: int
    shape: list[Dim] | None  # None: rank unknown; None entries: unknown dims

    @property
    def concrete(self) -> list[int] | None:
        if self.shape is None or any(not isinstance(d, int) for d in self.shape):
            return None
        return [int(d) for d in self.shape]  # type: ignore[arg-type]


def _collect_types(g: GraphProto, symbols: Mapping[str, int]) -> dict[str, _TensorType | str]:
    """name -> _TensorType, or a string naming the non-tensor kind (sequence, map, ...)."""
    out: dict[str, _TensorType | str] = {}

    def score(t: _TensorType | str) -> int:
        if isinstance(t, str):
            return 0
        if t.shape is None:
            return 1
        return 3 if t.concrete is not None else 2

    def put(name: str, t: _TensorType | str) -> None:
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
        put(vi.name, _TensorType(tt.elem_type, shape))
    for t in g.initializer:
        out[t.name] = _TensorType(t.data_type, [int(d) for d in t.dims])
    for st in g.sparse_initializer:
        out[st.values.name] = _TensorType(st.values.data_type, [int(d) for d in st.dims])
    for n in g.node:
        if n.op_type == "Constant" and n.domain in DEFAULT_DOMAINS and n.output:
            for a in n.attribute:
                if a.name == "value" and a.type == AttributeProto.TENSOR:
                    put(n.output[0], _TensorType(a.t.data_type, [int(d) for d in a.t.dims]))
    return out


def _shape_of(types: Mapping[str, _TensorType | str], name: str) -> list[int] | None:
    t = types.get(name)
    return t.concrete if isinstance(t, _TensorType) else None


def dtype_name(elem_type: int) -> str | None:
    try:
        return np.dtype(oh.tensor_dtype_to_np_dtype(elem_type)).name
    except Exception:  # UNDEFINED or a type numpy has no name for
        return None


def tensor_bytes(elem_type: int, shape: Sequence[int]) -> int:
    """Bytes of a dense tensor; sub-byte types packed. GraphError for types without a size."""
    n = math.prod(shape)
    if elem_type in _SUB_BYTE_BITS:
        return (n * _SUB_BYTE_BITS[elem_type] + 7) // 8
    if elem_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        raise GraphError("has no fixed element size")
    return n * np.dtype(oh.tensor_dtype_to_np_dtype(elem_type)).itemsize


# ---------------------------------------------------------------------------------------------
# graph building


def _subgraphs(n: NodeProto) -> Iterable[GraphProto]:
    for a in n.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs


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
        for sub in _subgraphs(n):
            for r in _outer_refs(sub):
                if r not in defined:
                    refs[r] = None
    return list(refs)


def _reads(n: NodeProto) -> list[str]:
    """ONNX inputs (empty optionals skipped) then outer-scope reads of subgraphs, deduplicated."""
    names = dict.fromkeys(i for i in n.input if i)
    for sub in _subgraphs(n):
        names.update(dict.fromkeys(_outer_refs(sub)))
    return list(names)


def _is_view(n: NodeProto) -> bool:
    return n.op_type in VIEW_OPS and n.domain in DEFAULT_DOMAINS and bool(n.input) and bool(n.input[0])


def _topological(g: GraphProto, ids: Sequence[str]) -> list[int]:
    """Node indices in a topological order, ONNX order where it already is one (it should be)."""
    producer = {o: k for k, n in enumerate(g.node) for o in n.output if o}
    preds = [{producer[i] for i in _reads(n) if i in producer} for n in g.node]
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
class _NodeInfo:
    index: int  # position in graph.node
    proto: NodeProto
    reads: list[str]  # ONNX reads (no view bases)


class _Builder:
    def __init__(
        self,
        g: GraphProto,
        ids: Sequence[str],
        types: Mapping[str, _TensorType | str],
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
            if vi.name not in inits and not (isinstance(t, _TensorType) and t.concrete is not None):
                return "give --input-shape NAME=DIMS or --batch N"
        return "all input shapes are fixed, so it depends on tensor values that shape inference cannot see"

    def _value(self, name: str, role: str, size_zero: bool = False) -> Value:
        t = self.types.get(name)
        tensor = isinstance(t, _TensorType)
        dtype = dtype_name(t.elem_type) if isinstance(t, _TensorType) else None
        shape = t.concrete if isinstance(t, _TensorType) else None
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
        try:
            size = tensor_bytes(t.elem_type, shape)  # type: ignore[union-attr]
        except GraphError as e:
            raise GraphError(f"{where} {e}") from None
        return Value(id=name, size=size, role=role, dtype=dtype, shape=list(shape))  # type: ignore[arg-type]

    def build(self, order: Sequence[int]) -> tuple[list[Value], list[Node], list[str], list[_NodeInfo]]:
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
        infos: list[_NodeInfo] = []
        for k in order:
            n = g.node[k]
            nid = self.ids[k]
            reads = _reads(n)
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
                )
            )
            infos.append(_NodeInfo(k, n, reads))
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


def _recomputable(n: NodeProto) -> bool:
    if n.op_type in RANDOM_OPS:
        return False
    if n.op_type == "Dropout" and len(n.input) >= 3 and n.input[2]:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# phases


def _infer_phases(
    g: GraphProto, ids: Sequence[str], nodes: Sequence[Node], types: Mapping[str, _TensorType | str]
) -> dict[str, Phase] | None:
    out_names = [o.name for o in g.output]
    training = any("grad" in o.lower() for o in out_names) or any(
        n.op_type == "Gradient" or n.op_type.endswith("Grad") for n in g.node
    )
    if not training or not out_names:
        return None

    def scalar(name: str) -> bool:
        s = _shape_of(types, name)
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


# ---------------------------------------------------------------------------------------------
# FLOPs


def _attr(n: NodeProto, name: str, default: Any = None) -> Any:
    for a in n.attribute:
        if a.name == name:
            return oh.get_attribute_value(a)
    return default


_NORMS_8 = frozenset(
    {
        "LayerNormalization",
        "InstanceNormalization",
        "GroupNormalization",
        "MeanVarianceNormalization",
        "LpNormalization",
        "SimplifiedLayerNormalization",
        "SkipLayerNormalization",
        "RMSNormalization",
    }
)
_POOLS = frozenset({"MaxPool", "AveragePool", "LpPool"})
_GLOBAL_POOLS = frozenset({"GlobalMaxPool", "GlobalAveragePool", "GlobalLpPool"})
_SOFTMAX = frozenset({"Softmax", "LogSoftmax", "Hardmax"})
_MATMULS = frozenset({"MatMul", "MatMulInteger", "QLinearMatMul", "FusedMatMul"})
_METADATA = frozenset({"Shape", "Size"})


def node_flops(n: NodeProto, shape: Callable[[str], list[int] | None]) -> float:
    """Analytic FLOPs of one ONNX node; `shape(name)` gives a tensor's concrete shape or None.

    Multiply-accumulates count 2 (Conv: 2 * |Y| * C/group * prod(kernel) [+ |Y| for the bias];
    ConvTranspose: 2 * |X| * M/group * prod(kernel) [+ |Y|]; Gemm: 2MNK [+ MN with C];
    MatMul: 2 * |Y| * K; LSTM/GRU/RNN: 2 * steps * batch * (|W| + |R|)). Pooling: |Y| *
    prod(kernel); global pooling: |X|. BatchNormalization: 4 |X| (8 in training mode);
    layer/instance/group normalisations: 8 |X| (statistics, normalise, scale, shift); Softmax:
    5 |X|. Reductions: elements read. Views: 0. Shape/Size: 1. Everything else, elementwise ops
    included: elements written. Unknown shapes fall back to elements written, then to 1.
    """
    op = n.op_type
    ins = [i for i in n.input]

    def numel(name: str | None) -> int | None:
        if not name:
            return None
        s = shape(name)
        return None if s is None else math.prod(s)

    written = [numel(o) for o in n.output if o]
    out_elems = sum(w for w in written if w is not None) if any(w is not None for w in written) else None
    y = numel(n.output[0]) if n.output else None
    x = numel(ins[0]) if ins else None

    def result() -> float | None:
        if op in VIEW_OPS and n.domain in DEFAULT_DOMAINS:
            return 0.0
        if op in _METADATA:
            return 1.0
        if op == "Conv" and len(ins) >= 2:
            w = shape(ins[1])
            if y is None or w is None:
                return None
            bias = y if len(ins) >= 3 and ins[2] else 0
            return 2.0 * y * math.prod(w[1:]) + bias
        if op == "ConvTranspose" and len(ins) >= 2:
            w = shape(ins[1])
            if x is None or w is None:
                return None
            bias = (y or 0) if len(ins) >= 3 and ins[2] else 0
            return 2.0 * x * math.prod(w[1:]) + bias
        if op == "Gemm" and len(ins) >= 2:
            a = shape(ins[0])
            if a is None or y is None or len(a) != 2:
                return None
            k = a[0] if _attr(n, "transA", 0) else a[1]
            return 2.0 * y * k + (y if len(ins) >= 3 and ins[2] else 0)
        if op in _MATMULS and len(ins) >= 2:
            a = shape(ins[0])
            if a is None or y is None or not a:
                return None
            return 2.0 * y * a[-1]
        if op in ("LSTM", "GRU", "RNN") and len(ins) >= 3:
            xs, w, r = shape(ins[0]), numel(ins[1]), numel(ins[2])
            if xs is None or w is None or r is None or not xs or xs[-1] == 0:
                return None
            return 2.0 * (math.prod(xs) // xs[-1]) * (w + r)
        if op in _POOLS:
            kernel = _attr(n, "kernel_shape")
            if y is None or not kernel:
                return None
            return float(y * math.prod(kernel))
        if op in _GLOBAL_POOLS:
            return None if x is None else float(x)
        if op == "BatchNormalization":
            return None if x is None else float((8 if _attr(n, "training_mode", 0) else 4) * x)
        if op in _NORMS_8:
            return None if x is None else 8.0 * x
        if op in _SOFTMAX:
            return None if x is None else 5.0 * x
        if op.startswith("Reduce") or op in ("ArgMax", "ArgMin", "TopK"):
            return None if x is None else float(x)
        return None

    flops = result()
    if flops is None:
        flops = float(out_elems) if out_elems is not None else 1.0
    return flops


# ---------------------------------------------------------------------------------------------
# profiling


def _profile(
    m: ModelProto,
    ids: Sequence[str],
    types: Mapping[str, _TensorType | str],
    infos: Sequence[_NodeInfo],
    runs: int,
    base_dir: str | Path | None,
) -> dict[str, float]:
    """Seconds per node: each node alone in a one-node model on onnxruntime (CPU), median of
    `runs` runs after a warm-up. Inputs are real where they matter (shape and index tensors):
    small and integer results of earlier nodes' runs, initializer data, zeros for integer
    graph inputs; everything else random of the inferred dtype and shape."""
    import onnxruntime as ort

    g = m.graph
    rng = np.random.default_rng(0)
    inits = {t.name: t for t in g.initializer}
    known: dict[str, np.ndarray] = {}
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    opts.log_severity_level = 3
    ir_version = max(7, min(m.ir_version, 13))
    costs: dict[str, float] = {}

    def array(name: str) -> np.ndarray:
        if name in known:
            return known[name]
        t = types.get(name)
        if name in inits:
            arr = _initializer_array(inits[name], base_dir)
            if arr is not None:
                return arr
        if not isinstance(t, _TensorType) or t.concrete is None:
            raise GraphError(f"cannot profile: shape of tensor {name!r} is unknown")
        dt = np.dtype(oh.tensor_dtype_to_np_dtype(t.elem_type))
        if dt.kind == "f":
            return rng.random(t.concrete, dtype=np.float32).astype(dt)
        if dt.kind == "b":
            return rng.random(t.concrete) < 0.5
        if dt.kind == "c":
            return (rng.random(t.concrete) + 0j).astype(dt)
        return np.zeros(t.concrete, dtype=dt)

    for info in infos:
        n = info.proto
        nid = ids[info.index]
        feeds = {name: array(name) for name in info.reads}
        inputs = [
            oh.make_tensor_value_info(name, oh.np_dtype_to_tensor_dtype(a.dtype), a.shape)
            for name, a in feeds.items()
        ]
        outs = [o for o in n.output if o]
        outputs = []
        for o in outs:
            t = types.get(o)
            if not isinstance(t, _TensorType) or not t.elem_type:
                raise GraphError(f"cannot profile node {nid!r}: type of its output {o!r} is unknown")
            outputs.append(oh.make_tensor_value_info(o, t.elem_type, None))
        one = oh.make_model(
            oh.make_graph([n], f"profile_{nid}", inputs, outputs),
            opset_imports=list(m.opset_import),
            ir_version=ir_version,
            functions=list(m.functions),
        )
        try:
            sess = ort.InferenceSession(one.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            results = sess.run(outs, feeds)
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                sess.run(outs, feeds)
                times.append(time.perf_counter() - t0)
        except GraphError:
            raise
        except Exception as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise GraphError(
                f"cannot profile node {nid!r} ({n.op_type}) with onnxruntime: {first}; use --cost flops"
            ) from None
        costs[nid] = max(statistics.median(times), 1e-9)
        for o, r in zip(outs, results, strict=True):
            if not isinstance(r, np.ndarray):
                continue
            limit = PROFILE_KEEP_BYTES if r.dtype.kind in "fc" else PROFILE_KEEP_INT_BYTES
            if r.nbytes <= limit:
                known[o] = r
    return costs


def _initializer_array(t: TensorProto, base_dir: str | Path | None) -> np.ndarray | None:
    """The initializer's data; None (random data will do) for weights in external files, whose
    values do not change an operator's run time, and for external tensors whose file is absent."""
    from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

    if uses_external_data(t):
        if base_dir is None or t.data_type not in _INT_TYPES:
            return None
        c = TensorProto()
        c.CopyFrom(t)
        try:
            load_external_data_for_tensor(c, str(base_dir))
        except Exception:  # the weights file is absent: random data of the right shape will do
            return None
        del c.external_data[:]
        c.data_location = TensorProto.DEFAULT
        t = c
    try:
        return numpy_helper.to_array(t)
    except Exception:
        return None
