"""Constants and small helpers every stage of the ONNX import shares (see the package docstring)."""

from __future__ import annotations

from collections.abc import Iterable

from onnx import AttributeProto, GraphProto, NodeProto, TensorProto

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

SUB_BYTE_BITS = {
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
INT_TYPES = frozenset(
    {TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64}
    | {TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64}
)

Dim = int | str | None


def subgraphs(n: NodeProto) -> Iterable[GraphProto]:
    for a in n.attribute:
        if a.type == AttributeProto.GRAPH:
            yield a.g
        elif a.type == AttributeProto.GRAPHS:
            yield from a.graphs
