"""ONNX models (inference or training graphs) as remat graphs.

How an ONNX model becomes a remat-graph (DESIGN.md §1): the import runs in stages, one module
each, whose docstrings say how each part of the model is modelled:

1. :mod:`.reading` reads the protobuf (binary, text or JSON), checks external-data locations and
   upgrades opsets older than ``MIN_OPSET``;
2. :mod:`.shapes` fixes symbolic input dims (``input_shapes`` / ``batch``), runs onnx's and
   onnxruntime's shape inference and sizes the tensors;
3. :mod:`.builder` builds the remat nodes and values (node ids, views, constants, control flow,
   recomputability) and infers training phases;
4. :mod:`.costs` gives each node its cost (``flops``, ``unit`` or ``profile``), and
   :mod:`.workspace` its workspace (the scratch onnxruntime's CPU kernel writes while it runs).

:mod:`.common` holds the constants they share. This module has the entry points and re-exports
the names other modules use.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from onnx import ModelProto
from pydantic import ValidationError

from remat_cli.graph import Graph, GraphError
from remat_cli.importers.notes import OpsetUpgraded
from remat_cli.importers.onnx.builder import (
    GRAD_OF_KEY,
    SCOPE_KEY,
    Builder,
    draws_random,
    grad_of_links,
    infer_phases,
    node_reads,
    onnx_node_ids,
    topological_order,
)
from remat_cli.importers.onnx.common import (
    COST_MODELS,
    COST_UNITS,
    DEFAULT_DOMAINS,
    MIN_OPSET,
    PROFILE_KEEP_BYTES,
    PROFILE_KEEP_INT_BYTES,
    RANDOM_OPS,
    SMALL_INT_ELEMENTS,
    VIEW_OPS,
    Dim,
)
from remat_cli.importers.onnx.costs import node_flops, profile_times
from remat_cli.importers.onnx.reading import (
    check_external_data,
    check_is_model,
    fit_ir_version,
    inline_small_int_initializers,
    looks_like_onnx_json,
    read_model,
    runtime_ir_version,
    upgrade_opset,
)
from remat_cli.importers.onnx.shapes import (
    collect_types,
    dtype_name,
    fix_input_dims,
    infer_shapes,
    shape_of,
    tensor_bytes,
)
from remat_cli.importers.onnx.workspace import node_workspace

__all__ = [
    "GRAD_OF_KEY",
    "SCOPE_KEY",
    "draws_random",
    "node_reads",
    "COST_MODELS",
    "COST_UNITS",
    "DEFAULT_DOMAINS",
    "Dim",
    "MIN_OPSET",
    "PROFILE_KEEP_BYTES",
    "PROFILE_KEEP_INT_BYTES",
    "RANDOM_OPS",
    "SMALL_INT_ELEMENTS",
    "VIEW_OPS",
    "check_external_data",
    "fit_ir_version",
    "dtype_name",
    "from_onnx_file",
    "from_onnx_json",
    "from_onnx_model",
    "looks_like_onnx_json",
    "node_flops",
    "onnx_node_ids",
    "read_model",
    "runtime_ir_version",
    "tensor_bytes",
    "upgrade_opset",
]


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


def from_onnx_json(data: Mapping[str, Any], **options: Any) -> Graph:
    """An ONNX model in protobuf's JSON mapping; `options` as for :func:`from_onnx_model`."""
    from google.protobuf import json_format

    model = ModelProto()
    try:
        json_format.ParseDict(data, model)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise GraphError(f"ONNX JSON does not parse: {first}") from None
    check_is_model(model, "ONNX JSON")
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
    """The remat Graph of an ONNX ModelProto (the stage modules' docstrings say how it is modelled).

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
        inline_small_int_initializers(m.graph, Path(base_dir))
    symbols = fix_input_dims(m.graph, input_shapes or {}, batch)
    inferred, no_symbolic = infer_shapes(m)
    types = collect_types(inferred.graph, symbols)
    g = m.graph
    ids = onnx_node_ids(g)
    order = topological_order(g, ids)
    builder = Builder(g, ids, types, no_symbolic)
    values, nodes, outputs, node_infos = builder.build(order)
    phases = infer_phases(g, ids, nodes, types)
    if phases is not None:
        grad_of = grad_of_links(g, ids, phases)
        for n in nodes:
            n.phase = phases[n.id]
            n.grad_of = grad_of.get(n.id)
    if cost == "unit":
        for n in nodes:
            n.cost = 1.0
    elif cost == "flops":
        for n, info in zip(nodes, node_infos, strict=True):
            n.cost = float(node_flops(info.proto, lambda t: shape_of(types, t)))
    else:
        costs = profile_times(m, ids, types, node_infos, profile_runs, base_dir)
        for n in nodes:
            n.cost = costs[n.id]
    for n, info in zip(nodes, node_infos, strict=True):
        n.workspace = node_workspace(info.proto, lambda t: shape_of(types, t), lambda t: _elem(types, t))
    graph_name = name or g.name or "onnx"
    try:
        return Graph(name=graph_name, cost_unit=COST_UNITS[cost], values=values, nodes=nodes, outputs=outputs)
    except ValidationError as e:  # pydantic wraps the GraphError raised by validation
        msg = str(e.errors()[0].get("msg", e))
        raise GraphError(msg.removeprefix("Value error, ")) from None


def _elem(types: Mapping[str, Any], name: str) -> int | None:
    t = types.get(name)
    return getattr(t, "elem_type", None)
