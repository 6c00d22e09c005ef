"""The decompositions the training-step export (:mod:`remat_cli.importers.torch_export`) adds to
``core_aten_decompositions()``: ops the ONNX exporter has no function for, or whose ONNX form
keeps onnxruntime's hidden temporaries large — ``aten.convolution_backward`` into convolutions,
``max_pool{2,3}d_with_indices_backward`` into ``scatter_add``, ``avg_pool{2,3}d_backward`` into a
transposed convolution, ``adaptive_max_pool2d`` (sizes that divide) into max pooling and its
backward into ``scatter_add``, the backwards of bilinear, bicubic and nearest 2-D upsampling and
of ``_adaptive_avg_pool2d`` into two MatMuls with interpolation or pooling matrices (1-D
upsampling into one, trilinear and nearest 3-D into three), EmbeddingBag's sum and mean bags and
their backward into gathers and ``index_add`` (torch.onnx builds a sequence for the forward and
has no function for the backward), ``_trilinear`` (nn.Bilinear) into an einsum,
``empty_permuted`` into ``empty``, ReLU's backward as a mask product. :func:`decompositions` is
the whole table.
"""

from __future__ import annotations

import functools
import math

import torch
from torch._decomp import core_aten_decompositions

aten = torch.ops.aten


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
