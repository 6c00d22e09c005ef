"""Small graphs with known MODeL optima, shared by the model tests (notes/model.md)."""

from __future__ import annotations

from remat_cli.graph import Graph, Node, Value

MIB = 1 << 20


def fan(k: int) -> Graph:
    """source -> k branches of [100-byte tensor -> 1-byte tensor] -> join; optimum 100 + k
    (run branch by branch); starting every branch first costs about 100 k."""
    values = [Value(id="x", size=1), Value(id="out", size=1)]
    nodes = [Node(id="src", outputs=["x"])]
    for i in range(k):
        values += [Value(id=f"t{i}", size=100), Value(id=f"u{i}", size=1)]
        nodes.append(Node(id=f"a{i}", inputs=["x"], outputs=[f"t{i}"]))
    for i in range(k):  # program order: every branch's big tensor first
        nodes.append(Node(id=f"b{i}", inputs=[f"t{i}"], outputs=[f"u{i}"]))
    nodes.append(Node(id="join", inputs=[f"u{i}" for i in range(k)], outputs=["out"]))
    return Graph(name=f"fan_k{k}", values=values, nodes=nodes, outputs=["out"])


def fig3() -> Graph:
    """MODeL Fig. 3: v1 feeds v2 (10 MiB) and v3 (20 MiB); v2 (30 MiB) and v3 (5 MiB) feed v4
    (10 MiB out). The figure's sizes are not in the text; these reproduce its two peaks: the
    program order v1 v2 v3 v4 needs 60 MiB = 62,914,560 B, v1 v3 v2 v4 needs 45 MiB = 47,185,920 B."""
    values = [
        Value(id="e1", size=10 * MIB),
        Value(id="e2", size=20 * MIB),
        Value(id="e3", size=30 * MIB),
        Value(id="e4", size=5 * MIB),
        Value(id="e5", size=10 * MIB),
    ]
    nodes = [
        Node(id="v1", outputs=["e1", "e2"]),
        Node(id="v2", inputs=["e1"], outputs=["e3"]),
        Node(id="v3", inputs=["e2"], outputs=["e4"]),
        Node(id="v4", inputs=["e3", "e4"], outputs=["e5"]),
    ]
    return Graph(name="model_fig3", values=values, nodes=nodes, outputs=["e5"])
