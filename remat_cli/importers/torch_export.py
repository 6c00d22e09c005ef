"""Export a PyTorch model's training step (forward + loss + backward) as an ONNX graph that
remat can import and `remat run` can replay (needs the optional extra ``remat-cli[torch]``).

Route: ``make_fx`` (on fake tensors) of ``torch.func.grad_and_value`` over ``functional_call``,
decomposed with ``core_aten_decompositions()`` plus decompositions the ONNX exporter lacks or
that keep onnxruntime's hidden temporaries small (:mod:`remat_cli.importers.torch_decompositions`)
— then ``torch.onnx.export(gm, ..., dynamo=True)``. Attention is
traced under ``sdpa_kernel(SDPBackend.MATH)`` and RNNs with oneDNN off; BatchNorm's running
statistics are not tracked while tracing (the step uses the batch statistics either way).
Parameters and data are graph inputs; the loss and every gradient are graph outputs. Each
backward ONNX node names the forward op it differentiates (metadata ``remat.grad_of``, the
graph's ``grad_of``): autograd numbers the node that each forward op creates, and hooks on those
nodes stamp the number on the ops traced while they run backward (as aot_autograd does). Local
functions are inlined and every node gets a unique name (the importer uses ONNX node names as
node ids). Each node records the module it belongs to (metadata ``remat.scope``, the graph's
``scope``: :mod:`remat_cli.importers.torch_scopes`). The export is checked against torch autograd
on onnxruntime.

A spec is ``(model, (x, y), loss_fn)`` with ``loss = loss_fn(model(x), y)``; ``x`` may be a tuple
of tensors (token ids and an attention mask), then ``loss = loss_fn(model(*x), y)``.
"""

from __future__ import annotations

import contextlib
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnx.inliner
import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from remat_cli.importers.notes import Float32Rounding, NotCompared
from remat_cli.importers.onnx import GRAD_OF_KEY, draws_random, node_reads
from remat_cli.importers.torch_decompositions import decompositions
from remat_cli.importers.torch_scopes import recording_scopes, traced_scopes, write_scopes
from remat_cli.util.files import write_atomic

Batch = tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]
Spec = tuple[nn.Module, Batch, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


# ---------------------------------------------------------------- tracing and export
def _tag_backward(root: torch.autograd.graph.Node | None) -> None:
    """While autograd runs each node of the graph under `root`, the FX nodes traced get that
    node's sequence number as ``seq_nr``, the number the forward op that created it has (the
    hooks aot_autograd sets for the same purpose): backward ops pair with the forward op they
    differentiate (HiREmate's F_j/B_j)."""
    seen: set[torch.autograd.graph.Node] = set()
    todo = [root] if root is not None else []
    while todo:
        node = todo.pop()
        if node in seen:
            continue
        seen.add(node)
        todo.extend(fn for fn, _ in node.next_functions if fn is not None)
        seq = node._sequence_nr()
        node.register_prehook(lambda _grads, s=seq: fx_traceback.set_grad_fn_seq_nr(s))
        node.register_hook(lambda _inputs, _outputs: fx_traceback.reset_grad_fn_seq_nr())


def training_step(model: nn.Module, loss_fn: Callable) -> tuple[Callable, list[str]]:
    """A function (params..., *xs, y) -> (loss, grads...) with parameters as plain arguments."""
    names = [n for n, _ in model.named_parameters()]

    def loss_of(params: dict[str, torch.Tensor], *data: torch.Tensor) -> torch.Tensor:
        *xs, y = data
        loss = loss_fn(torch.func.functional_call(model, params, tuple(xs)), y)
        _tag_backward(loss.grad_fn)
        return loss

    grad_and_value = torch.func.grad_and_value(loss_of)

    def step(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params = dict(zip(names, args[: len(names)], strict=True))
        grads, loss = grad_and_value(params, *args[len(names) :])
        return (loss, *(grads[n] for n in names))

    return step, names


def export_training_graph(spec: Spec, path: str | Path, name: str = "train", check: bool = True) -> Path:
    """Write the training step of `spec` to `path` as ONNX; with `check`, compare its loss and
    gradients on onnxruntime with torch autograd (AssertionError when they differ)."""
    model, (x, y), loss_fn = spec
    xs = tuple(x) if isinstance(x, (tuple, list)) else (x,)
    model.train()
    step, names = training_step(model, loss_fn)
    params = [p.detach() for p in model.parameters()]
    # BatchNorm's running statistics are updated in place, which torch.func's transforms refuse;
    # a training step's loss and gradients use the batch statistics either way. oneDNN's RNN
    # kernels (aten.mkldnn_rnn_layer) have no ONNX function; without them LSTM/GRU decompose.
    tracked = [
        m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
    ]
    for m in tracked:
        m.track_running_stats = False
    try:
        gm = _trace(step, model, (*params, *xs, y))
    finally:
        for m in tracked:
            m.track_running_stats = True
    # The traced graph already holds the training-mode ops; its own flag only makes the
    # exporter warn.
    gm.eval()
    safe = [n.replace(".", "_") for n in names]
    with _multi_output_patterns_checked_first():
        program = torch.onnx.export(
            gm,
            (*params, *xs, y),
            dynamo=True,
            input_names=[*safe, *(["x"] if len(xs) == 1 else [f"x{k}" for k in range(len(xs))]), "y"],
            output_names=["loss", *(f"grad_{n}" for n in safe)],
            optimize=True,
            external_data=False,
            verbose=False,
        )
    proto = onnx.inliner.inline_local_functions(program.model_proto)
    proto = _unique_names(proto)
    step_of = _write_grad_of(proto, program, _op_groups(gm))
    write_scopes(proto, step_of, traced_scopes(gm))
    proto.graph.name = f"{name}-train"
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        # torch.onnx's own output (affine_grid's export: a shape of rank 2 where 4 is inferred)
        raise InvalidExport(str(e).strip().splitlines()[0]) from None
    path = Path(path)
    # checked as a private draft: an export that fails its check leaves no file (nor replaces
    # one from before); written as every output is (a symlink's target, /dev/null in place)
    with tempfile.TemporaryDirectory() as folder:
        draft = Path(folder, path.name)
        onnx.save(proto, draft)
        if check:
            random = sorted({n.op_type for n in proto.graph.node if draws_random(n)})
            _check_against_autograd(draft, _Step(model, loss_fn, params, xs, y), random, path.name)
        write_atomic(str(path), draft.read_bytes())
    return path


def _trace(step: Callable, model: nn.Module, args: tuple[torch.Tensor, ...]) -> torch.fx.GraphModule:
    """`step` traced into aten ops (``make_fx`` with remat's decompositions) on fake tensors:
    shapes and dtypes only, so tracing neither computes the step nor holds its tensors (traced
    on real tensors, a deep decoder kept about four times its baseline peak resident). The
    recorded ops are the same: a step whose ops depend on its values (``.item()``) cannot be
    traced on real tensors either. The model's buffers stay real (``_allow_non_fake_inputs``)."""
    with (
        sdpa_kernel(SDPBackend.MATH),
        torch.backends.mkldnn.flags(enabled=False),
        fx_traceback.preserve_node_meta(),
        recording_scopes(model),
    ):
        trace = make_fx(
            step, decomposition_table=decompositions(), tracing_mode="fake", _allow_non_fake_inputs=True
        )
        return trace(*args)


@contextlib.contextmanager
def _multi_output_patterns_checked_first() -> Iterator[None]:
    """While inside, onnxscript's pattern matcher tries a rewrite rule whose pattern has several
    output nodes (its optimizer's ``SlicesSplit``: two Slices of one tensor into a Split) at a node
    only when that node passes the first output node's own check (op type, domain, attributes).
    The matcher otherwise indexes the whole graph by op type, and then tries every combination
    of candidates, at every node, before that check fails on the first: quadratic in the nodes
    (three quarters of a 24-layer decoder's export). A node failing that check fails every
    combination, so the rewrites, and the exported graph, are the same."""
    from onnxscript.rewriter import _basics, _matcher

    match = _matcher.SimplePatternMatcher.match

    def checked_first(self, model, graph_or_function, node, **kwargs):  # noqa: ANN001, ANN202
        if not self.pattern.has_single_output_node:
            first = self.pattern.output_nodes[0].matches(node, _basics.MatchResult())
            if not first:
                return first
        return match(self, model, graph_or_function, node, **kwargs)

    _matcher.SimplePatternMatcher.match = checked_first
    try:
        yield
    finally:
        _matcher.SimplePatternMatcher.match = match


class InvalidExport(ValueError):
    """torch.onnx's export of the step is not a valid ONNX model (onnx.checker's reason)."""


class _Step(NamedTuple):
    """A training step to check an export with: the model, its loss, its parameters, one batch."""

    model: nn.Module
    loss_fn: Callable
    params: list[torch.Tensor]
    xs: tuple[torch.Tensor, ...]
    y: torch.Tensor


def _check_against_autograd(path: Path, step: _Step, random: list[str], name: str) -> None:
    """The exported graph must give torch autograd's loss and gradients (one intra-op thread:
    onnxruntime's ScatterND/ScatterElements with reduction=add loses updates on more). With
    `random` (the op types of the graph that draw random numbers) only their shapes can agree.
    `name`: the file's name in the messages."""
    model, loss_fn, params, xs, y = step
    outputs, got = _onnxruntime_step(path, [*params, *xs, y])
    model.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):
        loss = loss_fn(model(*xs), y)
    loss.backward()
    want = [loss.detach().numpy(), *(p.grad.numpy() for p in model.parameters())]
    for o, g, w in zip(outputs, got, want, strict=True):
        if g.shape != w.shape:
            raise AssertionError(f"{name}: output {o} has shape {g.shape}, autograd's {w.shape}")
    if random:
        # Dropout draws its mask in the graph (RandomUniformLike) and in torch from other
        # generators: the values cannot agree, so only the outputs' shapes are compared
        for o, g in zip(outputs, got, strict=True):
            if not np.isfinite(g).all():
                raise AssertionError(f"{name}: output {o} is not finite")
        warnings.warn(
            NotCompared(f"the step draws random numbers ({', '.join(random)}, e.g. Dropout): only the "
                        "shapes of its loss and gradients were compared with torch autograd"),
            stacklevel=3,
        )  # fmt: skip
        return
    worst = _worst_difference(got, want, FLOAT32_MATCH)
    if worst is None:
        return
    err, k = worst
    # Two float32 runs that sum in another order can differ by more than 1e-3 and both be right:
    # DenseNet (batch 16) on onnxruntime is 1.3e-2 from torch on the weight gradient of a 1x1
    # convolution, which torch's float64 result says is rounding (torch's own float32 result
    # is 1e-6 from it). So the graph itself is judged in float64: onnx's reference evaluator
    # (numpy; 8 s for that DenseNet step) against torch's float64 autograd, where rounding is
    # 1e-12 and an exporter's mistake stays what it is
    differs = f"{name}: output {outputs[k]} differs from autograd (rel. error {err:.2e}"
    try:
        exact = _float64_difference(path, step)
    except _NoFloat64:  # an op without a float64 kernel: the float32 verdict stands
        raise AssertionError(differs + ")") from None
    if exact is not None:
        raise AssertionError(differs + f"; in float64 {exact[0]:.2e} on {outputs[exact[1]]})")
    warnings.warn(
        Float32Rounding(f"onnxruntime's float32 result differs from torch autograd's by up to {err:.1e} "
                        f"({outputs[k]}): float32 rounding, since in float64 the exported graph matches "
                        f"torch autograd within {FLOAT64_MATCH[0]:g}"),
        stacklevel=3,
    )  # fmt: skip


def _onnxruntime_step(path: Path, inputs: list[torch.Tensor]) -> tuple[list[str], list[np.ndarray]]:
    """The names and values of the outputs of the graph at `path` on onnxruntime (one intra-op
    thread), fed `inputs` in order. Without the memory arena, which keeps the step's whole peak
    allocated after the run, and the session gone on return: autograd's own step, run next,
    then reuses that memory rather than adding to it."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.enable_cpu_mem_arena = False
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), inputs, strict=True)}
    return [o.name for o in sess.get_outputs()], sess.run(None, feeds)


#: (relative error, share of the largest output) within which the loss and gradients agree: in
#: float32, and in float64 (DenseNet, batch 16: 3e-12)
FLOAT32_MATCH, FLOAT64_MATCH = (1e-3, 1e-5), (1e-7, 1e-10)


def _worst_difference(
    got: list[np.ndarray], want: list[np.ndarray], match: tuple[float, float]
) -> tuple[float, int] | None:
    """The largest relative error of `got` against `want` and its output's index, None when every
    output agrees: within match[0] of its own largest entry, or within match[1] of the largest
    entry of all outputs (a gradient that is zero in exact arithmetic is noise in both)."""
    tol, share = match
    largest = max(float(np.abs(w).max()) for w in want)
    worst: tuple[float, int] | None = None
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        scale = max(float(np.abs(w).max()), 1e-6)
        err = float(np.abs(g - w).max()) / scale
        if err > tol and err * scale > share * largest and (worst is None or err > worst[0]):
            worst = (err, k)
    return worst


def _float64_difference(path: Path, step: _Step) -> tuple[float, int] | None:
    """The exported graph at `path` evaluated in float64 by onnx's reference evaluator against a
    float64 copy of the model under torch autograd: None when they agree within
    ``FLOAT64_MATCH``, else the largest relative error and its output's index
    (`_worst_difference`). _NoFloat64 when either cannot run in float64."""
    import copy

    from onnx.reference import ReferenceEvaluator

    model, loss_fn, params, xs, y = step

    def wide(t: torch.Tensor) -> torch.Tensor:
        return t.double() if t.is_floating_point() else t

    try:
        twin = copy.deepcopy(model).double()
        twin.zero_grad()
        with sdpa_kernel(SDPBackend.MATH):
            loss = loss_fn(twin(*map(wide, xs)), wide(y))
        loss.backward()
        want = [loss.detach().numpy(), *(p.grad.numpy() for p in twin.parameters())]
        proto = _as_float64(onnx.load(path))
        names = [i.name for i in proto.graph.input]
        feeds = {n: wide(t).numpy() for n, t in zip(names, [*params, *xs, y], strict=True)}
        got = ReferenceEvaluator(proto).run(None, feeds)
    except Exception as e:
        raise _NoFloat64 from e
    return _worst_difference(got, want, FLOAT64_MATCH)


class _NoFloat64(Exception):
    """The model or its exported graph has an op without a float64 kernel."""


def _as_float64(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The same graph with every float32 tensor, type and cast made float64."""
    from onnx import AttributeProto, TensorProto, numpy_helper

    def widen(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))

    g = proto.graph
    for vi in [*g.input, *g.output, *g.value_info]:
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for t in g.initializer:
        widen(t)
    for node in g.node:
        for a in node.attribute:
            if a.name in ("to", "dtype") and a.type == AttributeProto.INT and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            elif a.type == AttributeProto.TENSOR:
                widen(a.t)
    return proto


def _op_groups(gm: torch.fx.GraphModule) -> dict[str, list[str]]:
    """FX node -> the forward FX nodes of its op, in graph order (the op's output last): one
    ``seq_nr`` numbers an aten op's decomposition and its backward (:func:`_tag_backward`); the
    forward nodes are those the loss needs."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function"]
    out = next(n for n in gm.graph.nodes if n.op == "output")
    loss = out.args[0][0]
    forward: set[torch.fx.Node] = set()
    todo = [loss] if isinstance(loss, torch.fx.Node) else []
    while todo:
        n = todo.pop()
        if n not in forward:
            forward.add(n)
            todo.extend(n.all_input_nodes)
    group: dict[int, list[str]] = defaultdict(list)
    for n in nodes:
        if n in forward and n.meta.get("seq_nr", -1) >= 0:
            group[n.meta["seq_nr"]].append(n.name)
    return {n.name: group[n.meta["seq_nr"]] for n in nodes if n.meta.get("seq_nr", -1) in group}


def _source(node: torch.fx.Node) -> str | None:
    """The traced step's node an exported node comes from (its ``from_node`` provenance, through
    the exporter's own passes), or None where torch does not record it (older releases wrote
    entries without that chain: no node is tagged then, and hilp pairs from the dataflow)."""
    src = (node.meta.get("from_node") or [None])[0]
    while getattr(src, "from_node", None):
        src = src.from_node[0]
    name = getattr(src, "name", None)
    return name if isinstance(name, str) else None


def _write_grad_of(proto: onnx.ModelProto, program: object, pairs: dict[str, list[str]]) -> dict[str, str]:
    """Carry `pairs` (names in the traced step) to the ONNX nodes the loss does not need (the
    importer's backward nodes) as ``GRAD_OF_KEY`` metadata naming the ONNX node of their op's
    forward output: backward ops, and parts of a forward op that only the backward reads
    (BatchNorm's inverse deviation, MaxPool's indices), which then belong to its layer.
    Each ONNX node records the exported program's node it comes from (``%name : ...`` under
    ``pkg.torch.onnx.fx_node``), which records the traced node it comes from (the exporter
    renames some: native_batch_norm becomes _native_batch_norm_legit). The op's output is its
    last node with an ONNX node the loss needs (a ``getitem`` of a multi-output op has none),
    written as that node's last such ONNX node."""
    exported = getattr(program, "exported_program", None)
    if exported is None:
        return
    traced = {n.name: _source(n) for n in exported.graph.nodes}
    loss_needs = _ancestors(proto.graph, proto.graph.output[0].name)
    step_of: dict[str, str] = {}  # ONNX node -> traced node
    onnx_of: dict[str, str] = {}  # traced node -> its last ONNX node the loss needs
    for node in proto.graph.node:
        fx = next((p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), "")
        name = traced.get(fx[1:].split(" ", 1)[0]) if fx.startswith("%") else None
        if name is not None:
            step_of[node.name] = name
            if node.name in loss_needs:
                onnx_of[name] = node.name
    for node in proto.graph.node:
        if node.name in loss_needs:
            continue
        forward = [onnx_of[f] for f in pairs.get(step_of.get(node.name, ""), []) if f in onnx_of]
        if forward:
            node.metadata_props.add(key=GRAD_OF_KEY, value=forward[-1])
    return step_of


def _ancestors(graph: onnx.GraphProto, tensor: str) -> set[str]:
    """The names of the nodes `tensor` needs, its producer included, read as the importer reads
    them (:func:`node_reads`: subgraphs' outer-scope tensors too), so that these are the nodes
    its phases call forward."""
    producer = {o: n for n in graph.node for o in n.output}
    seen: set[str] = set()
    todo = [producer[tensor]] if tensor in producer else []
    while todo:
        n = todo.pop()
        if n.name not in seen:
            seen.add(n.name)
            todo.extend(producer[i] for i in node_reads(n) if i in producer)
    return seen


def _unique_names(proto: onnx.ModelProto) -> onnx.ModelProto:
    seen: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        node.name = name
    return proto
