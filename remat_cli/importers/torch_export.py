"""Export a PyTorch model's training step (forward + loss + backward) as an ONNX graph that
remat can import and `remat run` can replay (needs the optional extra ``remat-cli[torch]``).

Route: ``make_fx`` (real tracing) of ``torch.func.grad_and_value`` over ``functional_call``,
decomposed with ``core_aten_decompositions()`` plus decompositions the ONNX exporter lacks or
that keep onnxruntime's hidden temporaries small — ``aten.convolution_backward`` into
convolutions, ``max_pool{2,3}d_with_indices_backward`` into ``scatter_add``,
``avg_pool{2,3}d_backward`` into a transposed convolution, ``adaptive_max_pool2d`` (sizes that
divide) into max pooling and its backward into ``scatter_add``, the backwards of bilinear,
bicubic and nearest 2-D upsampling and of ``_adaptive_avg_pool2d`` into two MatMuls with
interpolation or pooling matrices (1-D upsampling into one, trilinear and nearest 3-D into three),
EmbeddingBag's sum and mean bags and their backward into gathers and ``index_add`` (torch.onnx
builds a sequence for the forward and has no function for the backward), ``_trilinear``
(nn.Bilinear) into an einsum, ``empty_permuted`` into ``empty``, ReLU's
backward as a mask product — then ``torch.onnx.export(gm, ..., dynamo=True)``. Attention is
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

import functools
import math
import tempfile
import warnings
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import onnx
import onnx.inliner
import torch
import torch.fx.traceback as fx_traceback
from torch import nn
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

from remat_cli.importers.notes import Float32Rounding, NotCompared
from remat_cli.importers.onnx import GRAD_OF_KEY, draws_random, node_reads
from remat_cli.importers.torch_scopes import recording_scopes, traced_scopes, write_scopes
from remat_cli.util.files import write_atomic

aten = torch.ops.aten
Batch = tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor]
Spec = tuple[nn.Module, Batch, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def _conv_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: list[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """aten.convolution_backward for convolutions of any number of spatial dimensions (1-D, 2-D,
    3-D), strided, dilated and grouped (MobileNet's depthwise ones among them), plain or
    transposed, each gradient itself a (transposed) convolution with the same groups.

    Convolution y = x ⋆ w: grad_x is the transposed convolution of grad_y with w, and grad_w
    the convolution of x with grad_y with batch and channels swapped (stride and dilation swap
    places); with g groups the batch goes into the channels, (N, g, C/g) -> (C/g, g N), so that
    group k of x meets only group k of grad_y. Transposed convolution: the roles of x and grad_y
    swap."""
    grad_x = grad_w = grad_b = None
    d = weight.dim() - 2  # spatial dimensions
    k = list(weight.shape[2:])
    spatial = list(range(2, 2 + d))
    if output_mask[0]:
        if transposed:
            grad_x = aten.convolution(
                grad_out, weight, None, stride, padding, dilation, False, [0] * d, groups
            )
            if grad_x.shape[2:] != x.shape[2:]:  # output_padding past the stride: no input's
                grad_x = grad_x[(slice(None), slice(None), *(slice(0, m) for m in x.shape[2:]))]
        elif all(s == 1 for s in stride):
            # Stride 1: a plain convolution with the flipped kernel. onnxruntime's ConvTranspose
            # keeps a column buffer as large as a whole image's input gradient; Conv does not.
            out_g, in_g = weight.shape[0] // groups, weight.shape[1]
            flipped = (
                weight.reshape(groups, out_g, in_g, *k)
                .transpose(1, 2)
                .reshape(groups * in_g, out_g, *k)
                .flip(spatial)
            )
            pad = [dl * (kk - 1) - p for dl, kk, p in zip(dilation, k, padding, strict=True)]
            grad_x = aten.convolution(grad_out, flipped, None, [1] * d, pad, dilation, False, [0] * d, groups)
        else:
            # output_padding recovers the input size lost to integer division by the stride.
            op = [
                x.shape[2 + i]
                - ((grad_out.shape[2 + i] - 1) * stride[i] - 2 * padding[i] + dilation[i] * (k[i] - 1) + 1)
                for i in range(d)
            ]
            grad_x = aten.convolution(grad_out, weight, None, stride, padding, dilation, True, op, groups)
    if output_mask[1]:
        a, b = (grad_out, x) if transposed else (x, grad_out)
        # `a` (N, g, C/g, *S) -> (C/g, g N, *S) and `b` (N, C', *S') -> (C', N, *S'): group k of
        # `a`'s channels meets only group k of `b`'s, summed over the batch.
        n, c = a.shape[0], a.shape[1]
        a = (
            a.reshape(n, groups, c // groups, *a.shape[2:])
            .permute(2, 1, 0, *range(3, 3 + d))
            .reshape(c // groups, groups * n, *a.shape[2:])
        )
        gw = aten.convolution(
            a, b.transpose(0, 1), None, dilation, padding, stride, False, [0] * d, groups
        ).transpose(0, 1)
        grad_w = gw[(slice(None), slice(None), *(slice(0, kk) for kk in k))]
    if output_mask[2]:
        grad_b = grad_out.sum(dim=[0, *spatial])
    return grad_x, grad_w, grad_b


def _max_pool_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    indices: torch.Tensor,
) -> torch.Tensor:
    """max_pool2d_with_indices_backward and max_pool3d_with_indices_backward as a scatter_add of
    the gradient at the argmax indices (flat over the spatial dimensions)."""
    n, c = x.shape[0], x.shape[1]
    flat = grad_out.new_zeros((n, c, math.prod(x.shape[2:])))
    flat = flat.scatter_add(2, indices.flatten(2), grad_out.flatten(2))
    return flat.view(x.shape)


def _avg_pool_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: int | None,
) -> torch.Tensor:
    """avg_pool2d_backward and avg_pool3d_backward (DenseNet's transitions; torch.onnx has no
    ONNX function for them) as a grouped transposed convolution with a kernel of ones of the
    gradient divided by each window's divisor. ceil_mode windows are left to the exporter
    (NotImplemented)."""
    if ceil_mode:
        return NotImplemented
    d = x.dim() - 2
    k = (list(kernel_size) * d)[:d]
    st = (list(stride or kernel_size) * d)[:d]
    pad = (list(padding) * d)[:d]
    if divisor_override:
        g = grad_out / divisor_override
    elif count_include_pad or not any(pad):
        g = grad_out / math.prod(k)
    else:  # windows over the padding count only their real elements
        ones = x.new_ones((1, 1, *x.shape[2:]))
        count = aten.convolution(ones, x.new_ones((1, 1, *k)), None, st, pad, [1] * d, False, [0] * d, 1)
        g = grad_out / count
    # output_padding recovers the input size lost to integer division by the stride
    op = [x.shape[2 + i] - ((grad_out.shape[2 + i] - 1) * st[i] - 2 * pad[i] + k[i]) for i in range(d)]
    c = x.shape[1]
    return aten.convolution(g, x.new_ones((c, 1, *k)), None, st, pad, [1] * d, True, op, c)


def _adaptive_max_pool(x: torch.Tensor, output_size: list[int]) -> tuple[torch.Tensor, torch.Tensor] | object:
    """adaptive_max_pool2d when the output size divides the input's: max pooling with windows of
    the quotient (the same values and argmax indices); other sizes are left to the exporter."""
    h, w = x.shape[-2], x.shape[-1]
    oh_, ow = (list(output_size) * 2)[:2]
    if oh_ <= 0 or ow <= 0 or h % oh_ or w % ow:
        return NotImplemented
    k = [h // oh_, w // ow]
    return aten.max_pool2d_with_indices(x, k, k)


def _adaptive_max_pool_backward(
    grad_out: torch.Tensor, x: torch.Tensor, indices: torch.Tensor
) -> torch.Tensor:
    """adaptive_max_pool2d_backward (no ONNX function in torch.onnx): the same scatter_add."""
    return _max_pool_backward(grad_out, x, [], [], [], [], False, indices)


def _interpolation_matrix(
    n_in: int,
    n_out: int,
    align_corners: bool | None,
    scale: float | None,
    ref: torch.Tensor,
    cubic: bool = False,
) -> torch.Tensor:
    """(n_in, n_out): row j is 1-D upsampling of the unit vector e_j, the same rule the forward
    applies along one axis (nearest, linear and cubic upsampling are separable); nearest when
    `align_corners` is None, cubic with `cubic` (bicubic along one axis, the other of size 1)."""
    eye = torch.eye(n_in, dtype=ref.dtype, device=ref.device).unsqueeze(1)
    if align_corners is None:
        return aten.upsample_nearest1d(eye, [n_out], scale).squeeze(1)
    if cubic:
        return aten.upsample_bicubic2d(eye.unsqueeze(-1), [n_out, 1], align_corners, scale, None).flatten(1)
    return aten.upsample_linear1d(eye, [n_out], align_corners, scale).squeeze(1)


def _along_axes(grad_out: torch.Tensor, mats: list[torch.Tensor]) -> torch.Tensor:
    """grad_x of a separable upsampling y = x A_1 ... A_d (A_i (n_in, n_out) along spatial axis
    i): grad_y multiplied by A_i^T along each axis."""
    g = grad_out
    for i, a in enumerate(mats):
        axis = 2 + i
        if axis == g.dim() - 1:  # the last axis: no move
            g = torch.matmul(g, a.transpose(0, 1))
        else:
            g = torch.movedim(torch.matmul(torch.movedim(g, axis, -1), a.transpose(0, 1)), -1, axis)
    return g


def _upsample_nd_backward(
    grad_out: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    align_corners: bool | None,
    scales: tuple[float | None, ...],
) -> torch.Tensor:
    """The backwards of 1-D and 3-D nearest and (tri)linear upsampling (no ONNX function in
    torch.onnx): A^T along each spatial axis; nearest when `align_corners` is None."""
    scales = scales + (None,) * (len(output_size) - len(scales))
    mats = [
        _interpolation_matrix(input_size[2 + i], output_size[i], align_corners, scales[i], grad_out)
        for i in range(len(output_size))
    ]
    return _along_axes(grad_out, mats)


def _upsample_bilinear_backward(
    grad_out: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    align_corners: bool,
    scales_h: float | None = None,
    scales_w: float | None = None,
    cubic: bool = False,
) -> torch.Tensor:
    """upsample_bilinear2d_backward (no ONNX function in torch.onnx; UNet-style decoders): the
    forward is y = A_h x A_w^T per channel, so grad_x = A_h^T grad_y A_w, two MatMuls with
    interpolation matrices of the sizes involved; with `cubic`, upsample_bicubic2d_backward."""
    return _separable_backward(grad_out, output_size, input_size, align_corners, scales_h, scales_w, cubic)


def _upsample_nearest_backward(
    grad_out: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    scales_h: float | None = None,
    scales_w: float | None = None,
) -> torch.Tensor:
    """upsample_nearest2d_backward (no ONNX function in torch.onnx): as the bilinear one."""
    return _separable_backward(grad_out, output_size, input_size, None, scales_h, scales_w)


def _separable_backward(
    grad_out: torch.Tensor,
    output_size: list[int],
    input_size: list[int],
    align_corners: bool | None,
    scales_h: float | None,
    scales_w: float | None,
    cubic: bool = False,
) -> torch.Tensor:
    """A_h^T grad_y A_w for 2-D upsampling (nearest when `align_corners` is None)."""
    a_h = _interpolation_matrix(input_size[2], output_size[0], align_corners, scales_h, grad_out, cubic)
    a_w = _interpolation_matrix(input_size[3], output_size[1], align_corners, scales_w, grad_out, cubic)
    return torch.matmul(torch.matmul(a_h, grad_out), a_w.transpose(0, 1))


def _adaptive_avg_pool_backward(grad_out: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """_adaptive_avg_pool2d_backward (no ONNX function in torch.onnx; output sizes that do not
    divide the input's): the forward is y = P_h x P_w^T per channel with P the (overlapping)
    window averages, so grad_x = P_h^T grad_y P_w; P^T is the pooling of the identity."""

    def pool_of_eye(n_in: int, n_out: int) -> torch.Tensor:  # (n_in, n_out) = P^T
        eye = torch.eye(n_in, dtype=grad_out.dtype, device=grad_out.device).unsqueeze(1)
        return aten.adaptive_avg_pool1d(eye, [n_out]).squeeze(1)

    p_h = pool_of_eye(x.shape[-2], grad_out.shape[-2])
    p_w = pool_of_eye(x.shape[-1], grad_out.shape[-1])
    return torch.matmul(torch.matmul(p_h, grad_out), p_w.transpose(0, 1))


def _bags(indices: torch.Tensor, offsets: torch.Tensor, n_bags: int) -> torch.Tensor:
    """Each index's bag: the number of bag starts at or before its position, less one."""
    at = torch.arange(indices.shape[0], device=indices.device)
    return (at.unsqueeze(1) >= offsets[:n_bags].unsqueeze(0)).sum(1) - 1


def _bag_rows(
    rows: torch.Tensor, indices: torch.Tensor, per_sample_weights: torch.Tensor | None, padding_idx: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The looked-up rows as a bag sums them (per-sample weights, padding rows zero) and each
    row's count towards its bag's size (0 for padding)."""
    keep = torch.ones_like(indices, dtype=rows.dtype)
    if padding_idx >= 0:
        keep = (indices != padding_idx).to(rows.dtype)
    if per_sample_weights is not None:
        rows = rows * per_sample_weights.unsqueeze(1)
    return rows * keep.unsqueeze(1), keep


def _embedding_bag(
    weight: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    scale_grad_by_freq: bool = False,
    mode: int = 0,
    sparse: bool = False,
    per_sample_weights: torch.Tensor | None = None,
    include_last_offset: bool = False,
    padding_idx: int = -1,
) -> tuple[torch.Tensor, ...] | object:
    """_embedding_bag (EmbeddingBag, a recommender's lookups) for sum and mean bags as a
    row gather and an index_add per bag: torch.onnx's own export builds an ONNX sequence in a
    Loop, whose tensors have no size remat can plan. Max bags are left to the exporter."""
    if mode not in (0, 1):
        return NotImplemented
    n_bags = offsets.shape[0] - int(include_last_offset)
    bag = _bags(indices, offsets, n_bags)
    rows, keep = _bag_rows(weight.index_select(0, indices), indices, per_sample_weights, padding_idx)
    out = weight.new_zeros((n_bags, weight.shape[1])).index_add(0, bag, rows)
    size = weight.new_zeros(n_bags).index_add(0, bag, keep)
    if mode == 1:
        out = out / size.clamp(min=1).unsqueeze(1)
    return out, bag, size.to(torch.long), torch.zeros_like(bag[:n_bags])


def _embedding_bag_backward(
    grad: torch.Tensor,
    indices: torch.Tensor,
    offsets: torch.Tensor,
    offset2bag: torch.Tensor,
    bag_size: torch.Tensor,
    maximum_indices: torch.Tensor,
    num_weights: int,
    scale_grad_by_freq: bool,
    mode: int,
    sparse: bool,
    per_sample_weights: torch.Tensor | None,
    padding_idx: int = -1,
) -> torch.Tensor | object:
    """_embedding_bag_backward (no ONNX function in torch.onnx) for sum and mean bags: each
    looked-up row gets its bag's gradient (over the bag's size for mean, times its per-sample
    weight), summed per row with index_add. The bags come from the offsets (as in
    :func:`_embedding_bag`). Max bags and scale_grad_by_freq are left to the exporter."""
    if mode not in (0, 1) or scale_grad_by_freq:
        return NotImplemented
    n_bags = grad.shape[0]
    bag = _bags(indices, offsets, n_bags)
    g, keep = _bag_rows(grad.index_select(0, bag), indices, per_sample_weights, padding_idx)
    if mode == 1:
        size = grad.new_zeros(n_bags).index_add(0, bag, keep)
        g = g / size.index_select(0, bag).clamp(min=1).unsqueeze(1)
    return grad.new_zeros((num_weights, grad.shape[1])).index_add(0, indices, g)


def _trilinear(
    i1: torch.Tensor,
    i2: torch.Tensor,
    i3: torch.Tensor,
    expand1: list[int],
    expand2: list[int],
    expand3: list[int],
    sumdim: list[int],
    unroll_dim: int = 1,
) -> torch.Tensor:
    """aten._trilinear (nn.Bilinear, forward and backward; no ONNX function in torch.onnx) as
    one einsum: each input spans the dimensions it is not expanded along, the output those not
    summed over."""
    total = i1.dim() + len(expand1)
    letters = [chr(ord("a") + k) for k in range(total)]

    def spans(expand: list[int]) -> str:
        return "".join(letters[k] for k in range(total) if k not in expand)

    out = "".join(letters[k] for k in range(total) if k not in sumdim)
    return torch.einsum(f"{spans(expand1)},{spans(expand2)},{spans(expand3)}->{out}", i1, i2, i3)


def _empty_permuted(size: list[int], physical_layout: list[int], **kwargs) -> torch.Tensor:  # noqa: ANN003
    """aten.empty_permuted (GroupNorm/LayerNorm backward on CPU): its memory layout means
    nothing to ONNX, so a plain empty tensor of the same logical size."""
    return aten.empty.memory_format(size, **kwargs)


def _threshold_backward(grad_out: torch.Tensor, x: torch.Tensor, threshold: float) -> torch.Tensor:
    """ReLU's backward as grad * (x > threshold): onnxruntime's Where (the default
    decomposition) keeps two hidden output-sized temporaries; here every tensor is visible."""
    return grad_out * (x > threshold).to(grad_out.dtype)


def decompositions() -> dict:
    table = dict(core_aten_decompositions())
    table[aten.threshold_backward.default] = _threshold_backward
    table[aten.convolution_backward.default] = _conv_backward
    table[aten.max_pool2d_with_indices_backward.default] = _max_pool_backward
    table[aten.avg_pool2d_backward.default] = _avg_pool_backward
    table[aten.adaptive_max_pool2d.default] = _adaptive_max_pool
    table[aten.adaptive_max_pool2d_backward.default] = _adaptive_max_pool_backward
    table[aten.empty_permuted.default] = _empty_permuted
    table[aten.upsample_bilinear2d_backward.default] = _upsample_bilinear_backward
    table[aten.upsample_nearest2d_backward.default] = _upsample_nearest_backward
    table[aten._adaptive_avg_pool2d_backward.default] = _adaptive_avg_pool_backward
    table[aten.avg_pool3d_backward.default] = _avg_pool_backward
    table[aten.max_pool3d_with_indices_backward.default] = _max_pool_backward
    table[aten.upsample_bicubic2d_backward.default] = functools.partial(
        _upsample_bilinear_backward, cubic=True
    )
    table[aten._embedding_bag.default] = _embedding_bag
    table[aten._trilinear.default] = _trilinear
    table[aten._embedding_bag_backward.default] = _embedding_bag_backward
    # aten's positional arguments: (grad, output_size, input_size, [align_corners,] *scales)
    for op in (aten.upsample_nearest1d_backward, aten.upsample_nearest3d_backward):
        table[op.default] = lambda g, out, inp, *scales: _upsample_nd_backward(g, out, inp, None, scales)
    for op in (aten.upsample_linear1d_backward, aten.upsample_trilinear3d_backward):
        table[op.default] = lambda g, out, inp, align, *scales: _upsample_nd_backward(
            g, out, inp, align, scales
        )
    return table


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
        with (
            sdpa_kernel(SDPBackend.MATH),
            torch.backends.mkldnn.flags(enabled=False),
            fx_traceback.preserve_node_meta(),
            recording_scopes(model),
        ):
            gm = make_fx(step, decomposition_table=decompositions(), tracing_mode="real")(*params, *xs, y)
    finally:
        for m in tracked:
            m.track_running_stats = True
    # The traced graph already holds the training-mode ops; its own flag only makes the
    # exporter warn.
    gm.eval()
    safe = [n.replace(".", "_") for n in names]
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
    import onnxruntime as ort

    model, loss_fn, params, xs, y = step

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), [*params, *xs, y], strict=True)}
    got = sess.run(None, feeds)
    model.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):
        loss = loss_fn(model(*xs), y)
    loss.backward()
    want = [loss.detach().numpy(), *(p.grad.numpy() for p in model.parameters())]
    outputs = [o.name for o in sess.get_outputs()]
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
