"""networkx node-link JSON as published with Moccasin (and Checkmate's graphs converted by it).

Two variants exist in `shared/benchmarks/moccasin`:
- random layered: node keys ``out_cost``, ``duration``, ``param_cost``; links keyed ``"0"``
  (source) and ``"1"`` (target); a topological ``graph.order``;
- Checkmate-derived: node keys ``cost_ram``, ``cost_cpu``, ``backward``; links ``source`` and
  ``target``.

Node v becomes one node with one output value of size out_cost / cost_ram; ``param_cost`` adds
a resident parameter value read by v; nodes without successors are the graph outputs.
"""

from __future__ import annotations

import ast
from typing import Any

from remat_cli.graph import Graph, GraphError, Node, Value


def looks_like_node_link(data: Any) -> bool:
    return isinstance(data, dict) and "nodes" in data and ("links" in data or "edges" in data)


def _node_key(d: dict[str, Any]) -> str:
    key = d.get("id", d.get("name"))
    if key is None:
        raise GraphError("node-link node without 'id' or 'name'")
    return str(key)


def _link_ends(link: dict[str, Any]) -> tuple[str, str]:
    if "source" in link and "target" in link:
        return str(link["source"]), str(link["target"])
    if "0" in link and "1" in link:
        return str(link["0"]), str(link["1"])
    raise GraphError(f"node-link link without source/target: {link!r}")


def _number(d: dict[str, Any], keys: tuple[str, ...], default: float) -> float:
    for k in keys:
        if k in d and d[k] is not None:
            return float(d[k])
    return default


def from_node_link(data: dict[str, Any], name: str | None = None) -> Graph:
    try:
        return _from_node_link(data, name)
    except GraphError:
        raise
    except RecursionError:
        raise GraphError("node-link JSON is nested too deeply") from None
    except (TypeError, ValueError, KeyError, AttributeError, SyntaxError, MemoryError) as e:
        # pydantic's ValidationError is a ValueError: let the caller name its field
        if type(e).__name__ == "ValidationError":
            raise
        raise GraphError(f"malformed node-link JSON: {type(e).__name__}: {e}") from None


def _size(d: dict[str, Any], k: str) -> int:
    raw = next((d[key] for key in ("out_cost", "cost_ram") if d.get(key) is not None), 0)
    try:
        size = float(raw)
        if size < 0 or size != int(size):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        raise GraphError(f"node {k!r} has an invalid size {raw!r}") from None
    return int(size)


def _from_node_link(data: dict[str, Any], name: str | None) -> Graph:
    meta = data.get("graph") or {}
    if not isinstance(meta, dict):
        meta = {}
    raw_nodes = data["nodes"]
    links = data.get("links", data.get("edges", []))
    if not isinstance(raw_nodes, list) or not isinstance(links, list):
        raise GraphError("malformed node-link JSON: 'nodes' and 'links' must be lists")
    keys = [_node_key(d) for d in raw_nodes]
    labels = {k: str(d.get("name", k)) for k, d in zip(keys, raw_nodes, strict=True)}
    preds: dict[str, list[str]] = {k: [] for k in keys}
    has_succ: set[str] = set()
    for link in links:
        u, v = _link_ends(link)
        for end in (u, v):
            if end not in preds:
                raise GraphError(f"link references unknown node {end!r}")
        if u not in preds[v]:
            preds[v].append(u)
        has_succ.add(u)

    values: list[Value] = []
    nodes: list[Node] = []
    for k, d in zip(keys, raw_nodes, strict=True):
        out = f"v{k}"
        values.append(Value(id=out, size=_size(d, k)))
        inputs = [f"v{u}" for u in preds[k]]
        param = int(_number(d, ("param_cost",), 0))
        if param:
            values.append(Value(id=f"p{k}", size=param, role="parameter"))
            inputs.append(f"p{k}")
        phase = None
        if "backward" in d:
            phase = "backward" if d["backward"] else "forward"
        nodes.append(
            Node(
                id=k,
                inputs=inputs,
                outputs=[out],
                cost=_number(d, ("duration", "cost_cpu"), 1.0),
                op=labels[k] if labels[k] != k else None,
                phase=phase,
            )
        )
    order = meta.get("order")
    if isinstance(order, str):
        try:  # literal_eval never runs code: names and calls are refused
            order = ast.literal_eval(order)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            raise GraphError(f"graph.order is not a list literal: {order[:60]!r}") from None
    if order is not None and not isinstance(order, list | tuple):
        raise GraphError("graph.order must be a list of node ids")
    return Graph(
        name=name or str(meta.get("name", "graph")),
        values=values,
        nodes=nodes,
        outputs=[f"v{k}" for k in keys if k not in has_succ],
        order=[str(x) for x in order] if order else _stable_topo(keys, preds),
    )


def _stable_topo(keys: list[str], preds: dict[str, list[str]]) -> list[str] | None:
    """The file order when it is topological (Checkmate's data is), else None (node order)."""
    pos = {k: i for i, k in enumerate(keys)}
    if all(pos[u] < pos[v] for v in keys for u in preds[v]):
        return None
    import networkx as nx

    g = nx.DiGraph()
    g.add_nodes_from(keys)
    g.add_edges_from((u, v) for v in keys for u in preds[v])
    if not nx.is_directed_acyclic_graph(g):
        cyc = nx.find_cycle(g)
        raise GraphError(f"graph has a cycle through node {cyc[0][0]!r}")
    return list(nx.lexicographical_topological_sort(g, key=pos.__getitem__))
