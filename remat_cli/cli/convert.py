"""`remat convert`: any supported graph format to remat-graph JSON."""

from __future__ import annotations

import click

from remat_cli.cli.common import (
    emit,
    friendly_errors,
    graph_options,
    read_graph,
)


@click.command()
@click.argument("input_path", metavar="INPUT", type=click.Path(dir_okay=False))
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="remat-graph JSON file (default: stdout)."
)
@graph_options
@friendly_errors
def convert(
    input_path: str, output: str | None, input_shapes: tuple[str, ...], batch: int | None, cost: str
) -> None:
    """Convert any supported graph (ONNX, node-link JSON) to remat-graph JSON."""
    emit(read_graph(input_path, input_shapes, batch, cost).to_json(), output)
