"""`remat generate`: synthetic graphs (remat-graph JSON), deterministic by seed."""

from __future__ import annotations

import click

from remat_cli.cli.common import (
    MAX_GENERATED_NODES,
    MAX_RANDOM_LAYERED_NODES,
    POSITIVE_INT,
    BadInput,
    FiniteFloatRange,
    emit,
    err,
    friendly_errors,
    human_bytes,
)
from remat_cli.graph import Graph
from remat_cli.importers import generators
from remat_cli.schedule import baseline


@click.group()
def generate() -> None:
    """Synthetic graphs (remat-graph JSON), deterministic by --seed."""


def _within_cap(nodes: int, cap: int = MAX_GENERATED_NODES) -> None:
    """Refuse, before generating, a graph too large to make in reasonable time and memory."""
    if nodes > cap:
        raise BadInput(f"that graph would have {nodes:,} nodes; this generator makes at most {cap:,}")


def _generated(g: Graph, output: str | None) -> None:
    emit(g.to_json(), output)
    err.print(f"{g.name}: {len(g.nodes)} nodes, baseline peak {human_bytes(baseline(g).peak_memory)}")


_out = click.option("--output", "-o", type=click.Path(dir_okay=False), help="File (default: stdout).")
_seed = click.option("--seed", type=int, default=0, show_default=True)


@generate.command("linear")
@click.option("--n", type=POSITIVE_INT, default=8, show_default=True, help="Forward nodes.")
@click.option("--size", type=int, default=None, help="Bytes per activation (default: random).")
@_seed
@_out
@friendly_errors
def generate_linear(n: int, size: int | None, seed: int, output: str | None) -> None:
    """Checkmate's linear chain: n forward nodes, a loss, n backward nodes."""
    _within_cap(2 * n + 1)
    _generated(generators.linear(n, seed=seed, size=size), output)


@generate.command("random-layered")
@click.option("--n", type=POSITIVE_INT, default=100, show_default=True, help="Nodes.")
@click.option(
    "--width",
    type=FiniteFloatRange(min=0, min_open=True),
    default=0.3,
    show_default=True,
    help="Relative layer width.",
)
@click.option(
    "--nlv", type=FiniteFloatRange(min=0), default=0.75, show_default=True, help="Layer-width variation."
)
@click.option(
    "--ed",
    type=FiniteFloatRange(0, 1),
    default=0.2,
    show_default=True,
    help="Edge density to the next layer.",
)
@click.option(
    "--scd", type=FiniteFloatRange(0, 1), default=0.14, show_default=True, help="Long-skip probability."
)
@_seed
@_out
@friendly_errors
def generate_random_layered(
    n: int, width: float, nlv: float, ed: float, scd: float, seed: int, output: str | None
) -> None:
    """Random layered DAG as in the Moccasin benchmarks."""
    _within_cap(n, MAX_RANDOM_LAYERED_NODES)
    _generated(generators.random_layered(n, width, nlv, ed, scd, seed=seed), output)


@generate.command("unet")
@click.option("--depth", type=POSITIVE_INT, default=3, show_default=True)
@click.option("--convs", type=POSITIVE_INT, default=2, show_default=True, help="Convolutions per block.")
@_seed
@_out
@friendly_errors
def generate_unet(depth: int, convs: int, seed: int, output: str | None) -> None:
    """U-Net-style training graph with long skips."""
    _within_cap(2 * (depth * (2 * convs + 3) + convs) + 1)
    _generated(generators.unet(depth, convs, seed=seed), output)


@generate.command("transformer")
@click.option("--layers", type=POSITIVE_INT, default=4, show_default=True)
@_seed
@_out
@friendly_errors
def generate_transformer(layers: int, seed: int, output: str | None) -> None:
    """Transformer-encoder-like training graph."""
    _within_cap(2 * (1 + 12 * layers) + 1)
    _generated(generators.transformer(layers, seed=seed), output)
