"""Stage 4b of the ONNX import: each node's workspace, the scratch onnxruntime's CPU kernel
allocates for the length of one run of the node (DESIGN.md: ``workspace``, counted at the node's
instant beside its inputs and outputs).

The rules are those of onnxruntime's CPU kernels at one intra-op thread (what ``remat apply``
deploys with), each a buffer the kernel takes from its temporary-space allocator and frees
before it returns; the bytes counted are the ones the kernel writes, which are the ones that
become resident:

- **Conv, FusedConv** (float32, 1 to 3 spatial dims: MLAS, ``MlasConvPrepare``): with
  K = C/group · prod(kernel) and N = prod(output spatial dims), a pointwise convolution (K =
  C/group, strides 1, no padding) and one whose kernel spans the input's width (one input
  channel per group, strides 1, no padding or dilation) read the input in place: 0. When the
  filters per group outnumber N the whole im2col matrix is expanded: 4 · N · K. Otherwise
  the expansion runs in segments of at most ``MLAS_SGEMM_STRIDEN · MLAS_SGEMM_STRIDEK`` =
  16384 floats: 4 · min(N · K, 16384). With 4 or more spatial dims the im2col buffer:
  4 · K · N.
- **ConvTranspose**: its col buffer, itemsize · (M/group · prod(kernel)) · prod(input spatial
  dims), M the output channels.
- **Where**: the two broadcast selections it merges into its output, itemsize(X) ·
  (|broadcast(cond, X)| + |broadcast(cond, Y)|).
- **ScatterElements**: the indices copied as int64, 8 · |indices|.

Every other node gets 0: onnxruntime's remaining CPU kernels on these models write in place
into their outputs (a per-node measurement of the six deployment models found no other scratch
above 64 KiB).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from onnx import NodeProto, helper

from remat_cli.importers.onnx.common import DEFAULT_DOMAINS

#: MLAS_SGEMM_STRIDEN * MLAS_SGEMM_STRIDEK: the floats one segment of an im2col expansion holds
MLAS_CONV_SEGMENT = 128 * 128
_FLOAT = 1  # onnx.TensorProto.FLOAT
_FUSED_DOMAINS = (*DEFAULT_DOMAINS, "com.microsoft")

#: name -> concrete shape or None
ShapeOf = Callable[[str], "list[int] | None"]
#: name -> ONNX element type or None
TypeOf = Callable[[str], "int | None"]


def _attr(n: NodeProto, name: str, default):
    for a in n.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _itemsize(elem: int | None) -> int:
    if not elem:
        return 0
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem)).itemsize
    except (KeyError, TypeError, ValueError):  # strings and other non-numeric types
        return 0


def _broadcast(a: Sequence[int], b: Sequence[int]) -> int:
    rank = max(len(a), len(b))
    pa, pb = [1] * (rank - len(a)) + list(a), [1] * (rank - len(b)) + list(b)
    return math.prod(max(x, y) for x, y in zip(pa, pb, strict=True))


def _conv(n: NodeProto, shape: ShapeOf, elem: TypeOf) -> int:
    x, w, y = shape(n.input[0]), shape(n.input[1]), shape(n.output[0])
    if x is None or w is None or y is None or len(x) < 3 or elem(n.input[0]) != _FLOAT:
        return 0
    group = int(_attr(n, "group", 1))
    dims = len(x) - 2
    kernel = list(_attr(n, "kernel_shape", None) or w[2:])
    strides = list(_attr(n, "strides", None) or [1] * dims)
    dilations = list(_attr(n, "dilations", None) or [1] * dims)
    pads = list(_attr(n, "pads", None) or [0] * (2 * dims))
    channels = x[1] // group
    k = channels * math.prod(kernel)
    out = math.prod(y[2:])
    if dims > 3:
        return 4 * k * out
    plain = all(s == 1 for s in strides) and all(p == 0 for p in pads)
    if plain and k == channels:
        return 0
    spatial = ([1] + list(x[2:]), [1] + kernel) if dims == 1 else (list(x[2:]), kernel)
    if plain and dims <= 2 and all(d == 1 for d in dilations) and channels == 1:
        (ih, iw), (kh, kw) = spatial
        if kw == iw or (kh == ih and kw == 1):
            return 0
    if w[0] // group > out:
        return 4 * out * k
    return 4 * min(out * k, MLAS_CONV_SEGMENT)


def _conv_transpose(n: NodeProto, shape: ShapeOf, elem: TypeOf) -> int:
    x, w = shape(n.input[0]), shape(n.input[1])
    if x is None or w is None or len(x) < 3 or len(w) < 3:
        return 0
    group = int(_attr(n, "group", 1))
    kernel = list(_attr(n, "kernel_shape", None) or w[2:])
    out_channels = w[1] * group
    return _itemsize(elem(n.input[0])) * (out_channels // group) * math.prod(kernel) * math.prod(x[2:])


def _where(n: NodeProto, shape: ShapeOf, elem: TypeOf) -> int:
    c, x, y = (shape(t) for t in n.input[:3])
    if c is None or x is None or y is None:
        return 0
    return _itemsize(elem(n.input[1])) * (_broadcast(c, x) + _broadcast(c, y))


def _scatter_elements(n: NodeProto, shape: ShapeOf, elem: TypeOf) -> int:
    idx = shape(n.input[1])
    return 0 if idx is None else 8 * math.prod(idx)


_RULES: dict[str, Callable[[NodeProto, ShapeOf, TypeOf], int]] = {
    "Conv": _conv,
    "FusedConv": _conv,
    "ConvTranspose": _conv_transpose,
    "Where": _where,
    "ScatterElements": _scatter_elements,
}


def node_workspace(n: NodeProto, shape: ShapeOf, elem: TypeOf) -> int:
    """The bytes of scratch onnxruntime's CPU kernel for `n` writes while it runs (module
    docstring); 0 for ops without a rule, custom domains and unknown shapes."""
    rule = _RULES.get(n.op_type)
    if rule is None or n.domain not in _FUSED_DOMAINS or len(n.input) < (3 if n.op_type == "Where" else 2):
        return 0
    if n.op_type == "FusedConv" and n.domain != "com.microsoft":
        return 0
    return int(rule(n, shape, elem))
