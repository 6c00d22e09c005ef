"""Stage 4 of the ONNX import: node costs (analytic FLOPs, unit, or onnxruntime profiles).

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
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, numpy_helper
from onnx import helper as oh

from remat_cli.graph import GraphError
from remat_cli.importers.onnx.builder import NodeInfo
from remat_cli.importers.onnx.common import (
    DEFAULT_DOMAINS,
    INT_TYPES,
    PROFILE_KEEP_BYTES,
    PROFILE_KEEP_INT_BYTES,
    VIEW_OPS,
)
from remat_cli.importers.onnx.reading import runtime_ir_version
from remat_cli.importers.onnx.shapes import TensorType

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
    5 |X|. onnxruntime's fused contrib ops (``remat optimize``) cost what they fuse: FusedConv,
    FusedGemm as Conv, Gemm plus |Y| for the activation; FusedMatMul as MatMul (A transposed
    where ``transA``). Reductions: elements read. Views: 0. Shape/Size: 1. Everything else, elementwise ops
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
        if op in ("Conv", "FusedConv") and len(ins) >= 2:
            w = shape(ins[1])
            if y is None or w is None:
                return None
            bias = y if len(ins) >= 3 and ins[2] else 0
            return 2.0 * y * math.prod(w[1:]) + bias + _fused(y)
        if op == "ConvTranspose" and len(ins) >= 2:
            w = shape(ins[1])
            if x is None or w is None:
                return None
            bias = (y or 0) if len(ins) >= 3 and ins[2] else 0
            return 2.0 * x * math.prod(w[1:]) + bias
        if op in ("Gemm", "FusedGemm") and len(ins) >= 2:
            a = shape(ins[0])
            if a is None or y is None or len(a) != 2:
                return None
            k = a[0] if _attr(n, "transA", 0) else a[1]
            return 2.0 * y * k + (y if len(ins) >= 3 and ins[2] else 0) + _fused(y)
        if op in _MATMULS and len(ins) >= 2:
            a = shape(ins[0])
            if a is None or y is None or not a:
                return None
            # onnxruntime's FusedMatMul may read A transposed (its last two axes swapped)
            k = a[-2] if _attr(n, "transA", 0) and len(a) >= 2 else a[-1]
            return 2.0 * y * k
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

    def _fused(elems: int) -> int:
        """The activation onnxruntime fused into a FusedConv or FusedGemm: one per element."""
        return elems if op.startswith("Fused") and _attr(n, "activation") else 0

    flops = result()
    if flops is None:
        flops = float(out_elems) if out_elems is not None else 1.0
    return flops


# ---------------------------------------------------------------------------------------------
# profiling


def profile_times(
    m: ModelProto,
    ids: Sequence[str],
    types: Mapping[str, TensorType | str],
    infos: Sequence[NodeInfo],
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
    ir_version = max(7, min(m.ir_version, runtime_ir_version()))
    costs: dict[str, float] = {}

    def array(name: str) -> np.ndarray:
        if name in known:
            return known[name]
        t = types.get(name)
        if name in inits:
            arr = _initializer_array(inits[name], base_dir)
            if arr is not None:
                return arr
        if not isinstance(t, TensorType) or t.concrete is None:
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
            if not isinstance(t, TensorType) or not t.elem_type:
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
        if base_dir is None or t.data_type not in INT_TYPES:
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
