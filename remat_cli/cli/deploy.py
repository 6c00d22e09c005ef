"""`remat optimize` and `remat apply`: parse, call, print; the work is in
:mod:`remat_cli.runtime.optimize` and :mod:`remat_cli.runtime.deploy`.

Exit codes: 0 written, 1 the written model's outputs differ from the original's, 2 bad input
(nothing written).
"""

from __future__ import annotations

import click

from remat_cli.cli.common import graph_options


@click.command("optimize")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="The .onnx file to write."
)
@click.option(
    "--level",
    type=click.Choice(["basic", "extended", "all"]),
    default="extended",
    show_default=True,
    help="onnxruntime's graph optimization level (all adds the provider's layout rewrites).",
)
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
def optimize_command(model_path: str, output: str, level: str, provider: str) -> None:
    """Write onnxruntime's offline-optimized MODEL (its fusions and contrib ops), the graph a
    deployment runs: solve, run and apply it like any model."""
    from remat_cli.cli.common import BadInput, check_writable, err, friendly_errors
    from remat_cli.runtime.optimize import OptimizeRefused, optimize_model
    from remat_cli.runtime.ort import RuntimeUnavailable

    @friendly_errors
    def go() -> None:
        check_writable(output)
        try:
            done = optimize_model(model_path, output, level=level, provider=provider)  # type: ignore[arg-type]
        except (OptimizeRefused, RuntimeUnavailable) as e:
            raise BadInput(str(e)) from None
        ops = ", ".join(f"{k.split(':')[-1]} x{v}" for k, v in sorted(done.contrib_ops.items())) or "none"
        err.print(
            f"wrote {done.path}: {done.nodes_before} -> {done.nodes_after} nodes at --level {level} on "
            f"{provider}; contrib ops: {ops}"
        )

    go()


@click.command("apply")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(exists=True, dir_okay=False))
@click.argument("schedule_path", metavar="SCHEDULE.json", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="The .onnx file to write."
)
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Intra-op threads.")
@graph_options
def apply_command(
    model_path: str,
    schedule_path: str,
    output: str,
    provider: str,
    threads: int,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Write SCHEDULE.json applied to MODEL.onnx as a standalone model: recomputed nodes
    duplicated, node order the schedule's, the session settings it needs in its metadata
    (printed as SessionOptions lines on stderr), the schedule's memory plan too."""
    from remat_cli.cli.common import (
        BadInput,
        check_writable,
        err,
        fail,
        friendly_errors,
        read_graph,
        read_schedule,
    )
    from remat_cli.runtime.deploy import ApplyRefused, apply_schedule
    from remat_cli.runtime.ort import RuntimeUnavailable

    @friendly_errors
    def go() -> None:
        check_writable(output)
        graph = read_graph(model_path, input_shapes, batch, cost)
        schedule = read_schedule(schedule_path)
        try:
            done = apply_schedule(model_path, graph, schedule, output, threads=threads, provider=provider)
        except (ApplyRefused, RuntimeUnavailable) as e:
            raise BadInput(str(e)) from None
        err.print(
            f"wrote {done.path}: {done.nodes} nodes, {done.recomputations} recomputation(s); outputs "
            f"{'equal' if done.outputs_match else 'DIFFER from'} the original's (max |diff| {done.max_abs_diff:g})"
        )
        err.print(
            "# its session settings (ORT_LOAD_CONFIG_FROM_MODEL=1 makes onnxruntime read the ones it can):"
        )
        for line in done.lines:
            click.echo(line, err=True)
        if not done.outputs_match:
            fail("the written model's outputs differ from the original's", 1)

    go()
