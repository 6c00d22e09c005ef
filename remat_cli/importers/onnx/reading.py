"""Stage 1 of the ONNX import: reading the model, checking its external data and upgrading
old opsets.

- **Opsets.** A model older than opset 13 (``MIN_OPSET``) is upgraded to 13 with
  ``onnx.version_converter`` first (:func:`upgrade_opset`, an :class:`OpsetUpgraded` warning
  says so); everything below describes the upgraded model. ``remat run`` upgrades it the same
  way, so the node ids match, and compares with the original model's outputs.
- **External data.** Weights kept in external files are never read; their locations must
  stay inside the model's folder (:func:`check_external_data`). Only int32/int64
  initializers of at most ``SMALL_INT_ELEMENTS`` elements are read, when their file is
  present, so shape inference sees Reshape/Expand/Slice targets.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from onnx import GraphProto, ModelProto, TensorProto
from onnx import helper as oh

from remat_cli.graph import GraphError
from remat_cli.importers.onnx.common import DEFAULT_DOMAINS, MIN_OPSET, SMALL_INT_ELEMENTS, subgraphs


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
        check_is_model(model, str(path))
        return model
    except Exception:  # protobuf's DecodeError and friends, or no graph: maybe text format
        pass
    model = ModelProto()
    try:
        text_format.Parse(raw.decode("utf-8"), model)
    except Exception:
        raise GraphError(f"{path} is not an ONNX model (protobuf parse failed)") from None
    check_is_model(model, str(path))
    return model


def check_is_model(model: ModelProto, where: str) -> None:
    if not model.HasField("graph") or not model.opset_import:
        raise GraphError(f"{where} is not an ONNX model (no graph or no opset_import)")


def looks_like_onnx_json(data: Any) -> bool:
    """Whether parsed JSON is an ONNX model in protobuf's JSON mapping (onnx saves ``.json`` so)."""
    return (
        isinstance(data, dict)
        and isinstance(data.get("graph"), dict)
        and any(k in data for k in ("opset_import", "opsetImport", "ir_version", "irVersion"))
    )


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


@functools.cache
def runtime_ir_version() -> int:
    """The newest ONNX IR version the installed onnxruntime loads.

    onnx and onnxruntime are released apart, and onnxruntime-gpu lags onnxruntime: an onnx that
    writes a newer IR version than the installed onnxruntime loads makes every model its helpers
    build fail to load. onnxruntime has no call that says
    its limit; a one-node model at onnx's own IR version is loaded once, and the limit is read
    from the refusal ("max supported IR version: N").
    """
    import re

    import onnx
    import onnxruntime as ort

    x = oh.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = oh.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    probe = oh.make_model(
        oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "probe", [x], [y]),
        opset_imports=[oh.make_opsetid("", MIN_OPSET)],
        ir_version=onnx.IR_VERSION,
    )
    version = onnx.IR_VERSION
    try:
        ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime's own exception types
        found = re.search(r"max supported IR version: (\d+)", str(e))
        if found:
            version = int(found.group(1))
    return version


def fit_ir_version(model: ModelProto) -> ModelProto:
    """`model` itself, or a copy at the newest IR version onnxruntime loads when the model's is
    newer (never below the version its opsets need; onnxruntime then names what it lacks)."""
    limit = max(runtime_ir_version(), oh.find_min_ir_version_for(list(model.opset_import), True))
    if model.ir_version <= limit:
        return model
    fitted = ModelProto()
    fitted.CopyFrom(model)
    fitted.ir_version = limit
    return fitted


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


def inline_small_int_initializers(g: GraphProto, base_dir: Path) -> None:
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
        for sub in subgraphs(n):
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
