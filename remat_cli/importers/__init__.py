"""Read any supported graph file into a Graph; the format is detected from the content."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from remat_cli.graph import Graph, GraphError
from remat_cli.importers.nx import from_node_link, looks_like_node_link


def _pydantic_message(e: ValidationError) -> str:
    err = e.errors()[0]
    where = ".".join(str(p) for p in err.get("loc", ()))
    msg = err.get("msg", str(e))
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return f"{where}: {msg}" if where else msg


def graph_from_data(data: Any, name: str | None = None) -> Graph:
    """A Graph from parsed JSON: remat-graph or networkx node-link."""
    try:
        if isinstance(data, dict) and data.get("format") == "remat-graph":
            return check_usable(Graph.model_validate(data))
        if looks_like_node_link(data):
            return check_usable(from_node_link(data, name=name))
    except ValidationError as e:
        raise GraphError(_pydantic_message(e)) from None
    except RecursionError:
        raise GraphError("JSON is nested too deeply") from None
    raise GraphError(
        "JSON is neither remat-graph (format: remat-graph) nor networkx node-link (nodes, links)"
    )


def check_usable(g: Graph) -> Graph:
    """What a file must have for any command to work on it (a Graph built in code may lack it)."""
    if not g.nodes:
        raise GraphError("graph has no nodes")
    if not g.outputs:
        raise GraphError("graph has no graph outputs: nothing would need computing")
    return g


def parse_json(raw: bytes, where: str) -> Any:
    """json.loads with one-line errors: invalid, non-UTF-8 and too deeply nested documents."""
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise GraphError(f"{where} is not valid JSON: {e}") from None
    except RecursionError:
        raise GraphError(f"{where}: JSON is nested too deeply") from None


def load_graph(path: str | Path, **onnx_options: Any) -> Graph:
    """Load ONNX, remat-graph JSON or networkx node-link JSON, whatever the file is called.

    `onnx_options` go to the ONNX importer (input_shapes, batch, cost).
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise GraphError(f"cannot read {path}: {e.strerror}") from None
    if not raw.strip():
        raise GraphError(f"{path} is empty")
    head = raw.lstrip()[:1]
    if head in (b"{", b"["):
        data = parse_json(raw, str(path))
        from remat_cli.importers.onnx import from_onnx_json, looks_like_onnx_json

        if looks_like_onnx_json(data):  # onnx.save_model writes JSON for a .json file name
            return from_onnx_json(data, name=path.stem, base_dir=path.parent, **onnx_options)
        return graph_from_data(data, name=path.stem)
    from remat_cli.importers.onnx import from_onnx_file

    return from_onnx_file(path, **onnx_options)
