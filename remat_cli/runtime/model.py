"""The ONNX side of a replay: find each remat node's ONNX node, rewrite a model to follow a
schedule, cut one node out as a model of its own, and make or read the inputs.

A remat node stands for the ONNX node named by its ``source`` (the importer's contract: one
remat node per ONNX node, ``source = [id]`` with ids from
:func:`remat_cli.importers.onnx.onnx_node_ids`), and value ids are ONNX tensor names.
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import helper as oh
from onnx import numpy_helper

from remat_cli.graph import Graph
from remat_cli.importers.onnx import VIEW_OPS, draws_random, node_reads, onnx_node_ids
from remat_cli.schedule import Step

#: ops whose integer input indexes `data` along `axis` (input positions: data, indices)
_INDEXING = {"Gather": (0, 1), "GatherElements": (0, 1), "ScatterElements": (0, 1), "ScatterND": (0, 1)}
#: ops an integer input can pass through on its way to an indexing op (Where: ignore_index masks)
_PASS_THROUGH = VIEW_OPS | {"Cast", "Expand", "Slice", "Transpose", "Concat", "Where"}


#: the name :func:`scheduled_model` gives a recomputation's copy of a node
REMAT_COPY = re.compile(r"__remat\d+")


class ModelMismatch(ValueError):
    """The schedule or graph does not belong to this ONNX model."""


def node_table(model: onnx.ModelProto, graph: Graph) -> dict[str, onnx.NodeProto]:
    """remat node id -> the ONNX node it stands for (found by ``source``, else by id)."""
    by_id = dict(zip(onnx_node_ids(model.graph), model.graph.node, strict=True))
    table: dict[str, onnx.NodeProto] = {}
    for n in graph.nodes:
        key = (n.source or [n.id])[0]
        proto = by_id.get(key)
        if proto is None:
            raise ModelMismatch(f"node {n.id!r} (source {key!r}) is not a node of the ONNX model")
        table[n.id] = proto
    return table


def view_values(model: onnx.ModelProto) -> set[str]:
    """Tensors that alias their input in onnxruntime (outputs of Reshape, Squeeze, ...): they
    occupy no bytes of their own, as in the importer."""
    return {o for n in model.graph.node if _is_view(n) for o in n.output if o}


def compute_sequence(steps: Sequence[Step]) -> list[str]:
    return [s.node for s in steps if s.op == "compute" and s.node is not None]


def scheduled_model(
    model: onnx.ModelProto,
    graph: Graph,
    steps: Sequence[Step],
    names: dict[tuple[int, str], str] | None = None,
) -> onnx.ModelProto:
    """`model` rewritten so that its node list *is* the schedule's compute sequence.

    `names`, where given, receives (index in `steps` of a compute step, tensor) -> the name the
    rewritten model gives that production of the tensor (memory plans are keyed by the former);
    a view made again before a step is keyed by that step.

    Each recomputation is a copy of the ONNX node whose outputs get new names
    (``<tensor>__remat<k>``); every later node reads the newest copy. The last production of
    a tensor keeps its original name, so graph outputs stay as they are. onnxruntime frees a
    tensor after its last reader in execution order, so with the order kept (see
    :func:`remat_cli.runtime.ort.session_options`) the original copy of a recomputed
    tensor dies at its last use before the recomputation — what the schedule's frees say.
    Free steps later than the last use are not modelled (onnxruntime frees earlier).
    """
    table = node_table(model, graph)
    seq = compute_sequence(steps)
    at = [i for i, s in enumerate(steps) if s.op == "compute" and s.node is not None]
    taken = {t for n in model.graph.node for t in (*n.input, *n.output)}
    taken |= {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer}
    last_production: dict[str, int] = {}
    for k, nid in enumerate(seq):
        for t in table[nid].output:
            if t:
                last_production[t] = k
    view_of = {o: n for n in model.graph.node if _is_view(n) for o in n.output if o}
    current: dict[str, str] = {}
    #: view tensor -> the name of the data tensor its current copy aliases
    made_from: dict[str, str] = {}
    seen: Counter[str] = Counter()
    nodes: list[onnx.NodeProto] = []

    def emit(proto: onnx.NodeProto, name: str, outputs: list[str]) -> None:
        copy = onnx.NodeProto()
        copy.CopyFrom(proto)
        copy.name = name
        del copy.input[:]
        copy.input.extend(current.get(t, t) if t else t for t in proto.input)
        del copy.output[:]
        copy.output.extend(outputs)
        nodes.append(copy)
        for t, new in zip(proto.output, outputs, strict=True):
            if t:
                current[t] = new
        if proto.output and proto.output[0] in view_of:
            made_from[proto.output[0]] = current.get(proto.input[0], proto.input[0])

    def refresh(t: str) -> None:
        """A view aliases the copy of its base that existed when it was made. When the base
        has been recomputed since, the schedule (which counts views as 0 bytes and keeps the
        *base* live) means the new copy: re-make the view, which costs nothing, so the old
        base's buffer is released as the schedule's free step says."""
        proto = view_of.get(t)
        if proto is None or t not in made_from:
            return
        refresh(proto.input[0])
        if made_from[t] != current.get(proto.input[0], proto.input[0]):
            out = _fresh(f"{t}__view", taken)
            emit(proto, _fresh(f"{proto.name or t}__view", taken), [out])
            if names is not None and step:  # the view made again before the compute step[0]
                names[(step[0], t)] = out

    step: list[int] = []
    for k, nid in enumerate(seq):
        proto = table[nid]
        step[:] = [at[k]]
        for t in proto.input:
            if t:
                refresh(t)
        r = seen[nid]
        seen[nid] += 1
        name = proto.name or nid
        if r:
            name = _fresh(f"{name}__remat{r}", taken)
        outs = [
            t if (not t or last_production[t] == k) else _fresh(f"{t}__remat{r}", taken) for t in proto.output
        ]
        emit(proto, name, outs)
        if names is not None:
            names.update({(at[k], t): o for t, o in zip(proto.output, outs, strict=True) if t})
    _drop_unread_optional_outputs(nodes, {o.name for o in model.graph.output}, model)
    nodes = _release_unread_outputs(nodes, {o.name for o in model.graph.output}, taken)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    del out.graph.node[:]
    out.graph.node.extend(nodes)
    # A graph output that is a view must alias the final copy of its base.
    for o in out.graph.output:
        if o.name in view_of and current.get(o.name) != o.name:
            raise ModelMismatch(f"graph output {o.name!r} is a view whose base was recomputed after it")
    return out


def recomputed_copies(model: onnx.ModelProto) -> int:
    """Recomputations in `model`: nodes beyond the first of each group that
    :func:`scheduled_model` named ``<node>`` and ``<node>__remat<k>``. In onnxruntime's
    optimized graph too: a merge (common subexpression elimination) leaves one node of a group,
    and its rewrites keep the names of the nodes they leave alone."""
    names = [n.name for n in model.graph.node if n.name and not _helper(n.name)]
    groups = Counter(REMAT_COPY.sub("", name) for name in names)
    marked = {REMAT_COPY.sub("", name) for name in names if REMAT_COPY.search(name)}
    return sum(groups[g] - 1 for g in marked)


def _helper(name: str) -> bool:
    """A node the rewrite adds (a view made again, a Shape that releases an unread output)."""
    return name.endswith("__release") or "__view" in name


def _drop_unread_optional_outputs(
    nodes: list[onnx.NodeProto], graph_outputs: set[str], model: onnx.ModelProto
) -> None:
    """Omit optional outputs nothing reads (MaxPool's Indices, LayerNormalization's Mean, ...).

    onnxruntime keeps an output that no node reads until the run ends, while the schedule
    frees it at once; an omitted optional output is never allocated at all."""
    read = {t for n in nodes for t in n.input if t} | graph_outputs
    opsets = {o.domain or "": o.version for o in model.opset_import}
    for n in nodes:
        unread = [i for i, t in enumerate(n.output) if t and t not in read]
        if not unread:
            continue
        try:
            schema = onnx.defs.get_schema(n.op_type, opsets.get(n.domain or "", 1), n.domain or "")
        except onnx.defs.SchemaError:
            continue
        optional = onnx.defs.OpSchema.FormalParameterOption.Optional
        for i in unread:
            formal = schema.outputs[min(i, len(schema.outputs) - 1)]
            if formal.option == optional:
                n.output[i] = ""
        while n.output and not n.output[-1]:
            n.output.pop()


def _release_unread_outputs(
    nodes: list[onnx.NodeProto], graph_outputs: set[str], taken: set[str]
) -> list[onnx.NodeProto]:
    """Follow every output that nothing reads (a required one) by a Shape node reading it.

    onnxruntime keeps an unread output allocated until the run ends; the schedule frees it
    right after its producer. A Shape node is a last use that reads no data, so the tensor
    is released there; what stays is Shape's own few bytes."""
    read = {t for n in nodes for t in n.input if t} | graph_outputs
    out: list[onnx.NodeProto] = []
    for n in nodes:
        out.append(n)
        for t in n.output:
            if t and t not in read:
                out.append(
                    oh.make_node(
                        "Shape", [t], [_fresh(f"{t}__shape", taken)], name=_fresh(f"{t}__release", taken)
                    )
                )
    return out


def _is_view(n: onnx.NodeProto) -> bool:
    return n.op_type in VIEW_OPS and n.domain in ("", "ai.onnx") and bool(n.input) and bool(n.input[0])


def _fresh(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def single_node_model(
    model: onnx.ModelProto, node: onnx.NodeProto, types: Mapping[str, int]
) -> onnx.ModelProto:
    """A model holding `node` alone; its inputs and outputs are graph inputs and outputs typed
    by element type only (shapes come from the actual inputs at run time). The tensors an If,
    Loop or Scan body reads from the enclosing graph are inputs too."""
    ins = node_reads(node)
    outs = [t for t in node.output if t]
    graph = oh.make_graph(
        [node],
        f"node_{node.name}",
        [oh.make_tensor_value_info(t, types[t], None) for t in ins],
        [oh.make_tensor_value_info(t, types.get(t, 0), None) for t in outs],
    )
    m = oh.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    m.functions.extend(model.functions)
    return m


def seed_random_ops(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` in which every random op without a ``seed`` (Dropout's mask in an
    exported training step) gets one from its name, and how many did: unseeded, the scheduled
    and the unscheduled run draw different numbers and their outputs never match. A recomputed
    random op would draw again, so the importer never recomputes one."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    seeded = 0
    for n in out.graph.node:
        if draws_random(n) and not any(a.name == "seed" for a in n.attribute):
            seed = zlib.crc32(n.name.encode()) % (1 << 24)
            # Dropout's seed is an int attribute, the Random* ops' a float one
            n.attribute.append(oh.make_attribute("seed", seed if n.op_type == "Dropout" else float(seed)))
            seeded += 1
    return out, seeded


def elem_types(model: onnx.ModelProto) -> dict[str, int]:
    """ONNX element type of every tensor, from shape inference."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types: dict[str, int] = {}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.HasField("tensor_type"):
            types[vi.name] = vi.type.tensor_type.elem_type
    for t in g.initializer:
        types[t.name] = t.data_type
    return types


# ---------------------------------------------------------------- inputs
def feed_names(model: onnx.ModelProto) -> list[str]:
    """Graph inputs without an initializer: the tensors a run must be fed."""
    inits = {t.name for t in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def make_inputs(
    model: onnx.ModelProto,
    seed: int = 0,
    given: Mapping[str, np.ndarray] | None = None,
    graph: Graph | None = None,
) -> dict[str, np.ndarray]:
    """Seeded random data of the right shape and dtype for every graph input not in `given`.

    Floats are normal with standard deviation 1/sqrt(fan-in) (the product of all dims but the
    first, so deep training graphs stay finite); integers are uniform in [0, bound) where the
    bound is the smallest extent they index (Gather, GatherElements, Scatter*), else [0, 2).
    Shapes come from the graph's values when given (symbolic dims fixed by the importer),
    else from the model. Raises ValueError when a shape is unknown or `given` is malformed.
    """
    given = dict(given or {})
    values = graph.value_map if graph is not None else {}
    out: dict[str, np.ndarray] = {}
    names = feed_names(model)
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise ValueError(f"input {unknown[0]!r} is not an input of the model (inputs: {', '.join(names)})")
    by_name = {i.name: i for i in model.graph.input}
    for name in names:
        tt = by_name[name].type.tensor_type
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = _input_shape(name, tt, values)
        # One stream per input: data for one input does not depend on which others are given.
        rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
        if name in given:
            arr = np.asarray(given[name])
            if arr.dtype != dtype or list(arr.shape) != list(shape):
                raise ValueError(
                    f"input {name!r}: expected {dtype}{list(shape)}, got {arr.dtype}{list(arr.shape)}"
                )
            out[name] = np.require(arr, requirements="C")
        elif np.issubdtype(dtype, np.floating):
            fan_in = int(np.prod(shape[1:])) if len(shape) >= 2 else 1
            out[name] = (rng.standard_normal(shape) / np.sqrt(max(fan_in, 1))).astype(dtype)
        elif dtype == np.bool_:
            out[name] = rng.integers(0, 2, shape).astype(np.bool_)
        elif np.issubdtype(dtype, np.integer):
            out[name] = rng.integers(0, _index_bound(model, name, values), shape).astype(dtype)
        else:
            raise ValueError(f"input {name!r}: cannot make random data of type {dtype}")
    return out


def _input_shape(name: str, tt: onnx.TypeProto.Tensor, values: Mapping) -> list[int]:
    v = values.get(name)
    if v is not None and v.shape is not None and all(isinstance(d, int) for d in v.shape):
        return [int(d) for d in v.shape]
    dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    if any(d is None for d in dims):
        raise ValueError(f"input {name!r} has a symbolic shape: pass --inputs or fix its shape")
    return [int(d) for d in dims]


def _index_bound(model: onnx.ModelProto, name: str, values: Mapping) -> int:
    """The smallest extent an integer input indexes, following it through views and casts."""
    shapes = {v.id: v.shape for v in values.values()} if values else {}
    if not shapes:
        inferred = onnx.shape_inference.infer_shapes(model).graph
        for vi in (*inferred.input, *inferred.value_info, *inferred.output):
            shapes[vi.name] = [
                d.dim_value if d.HasField("dim_value") else None for d in vi.type.tensor_type.shape.dim
            ]
        for t in inferred.initializer:
            shapes[t.name] = list(t.dims)
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in model.graph.node:
        for t in n.input:
            readers.setdefault(t, []).append(n)
    bounds: list[int] = []
    todo, seen = [name], {name}
    while todo:
        t = todo.pop()
        for n in readers.get(t, []):
            if n.op_type in _INDEXING and len(n.input) > 1 and n.input[1] == t:
                data_shape = shapes.get(n.input[0]) or []
                axis = next((a.i for a in n.attribute if a.name == "axis"), 0)
                extents = data_shape[:1] if n.op_type == "ScatterND" else data_shape[axis : axis + 1]
                bounds.extend(int(e) for e in extents if isinstance(e, int) and e > 0)
            elif n.op_type in _PASS_THROUGH:
                for o in n.output:
                    if o and o not in seen:
                        seen.add(o)
                        todo.append(o)
    return min(bounds) if bounds else 2


def read_inputs(path: str | Path) -> dict[str, np.ndarray]:
    """Arrays by input name from an .npz archive; ValueError for anything else (a bare .npy)."""
    z = np.load(path, allow_pickle=False)
    if not isinstance(z, np.lib.npyio.NpzFile):
        raise ValueError("not an .npz archive of arrays by input name (numpy.savez writes one)")
    with z:
        return {k: z[k] for k in z.files}


def initializer_arrays(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
