"""`remat run`: replay a schedule in ONNX Runtime and measure its memory and time.

It only parses, calls :func:`remat_cli.runtime.run_schedule` and prints; onnxruntime is imported
when the command runs, so that `remat --help` does not load it.
Exit codes: 0 outputs match, 1 outputs differ or onnxruntime failed (e.g. the CUDA arena hit
the budget), 2 bad input or the provider is unavailable.
"""

from __future__ import annotations

import sys

import click


@click.command("run")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(exists=True, dir_okay=False))
@click.argument(
    "schedule_path", metavar="SCHEDULE.json", type=click.Path(exists=True, dir_okay=False, allow_dash=True)
)
@click.option("--provider", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--mode",
    type=click.Choice(["session", "interpret"]),
    default="session",
    show_default=True,
    help="session: the rewritten model in one InferenceSession (process or device memory); "
    "interpret: one session per node, exact live-tensor bytes.",
)
@click.option(
    "--repeat", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs (median)."
)
@click.option("--warmup", type=click.IntRange(min=0), default=1, show_default=True)
@click.option(
    "--inputs", "inputs_path", type=click.Path(exists=True, dir_okay=False), help="Inputs (.npz by name)."
)
@click.option("--seed", type=int, default=0, show_default=True, help="For the random inputs.")
@click.option(
    "--threads",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Intra-op threads. onnxruntime's ScatterND/ScatterElements add-reductions lose updates on more than one.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON to stdout.")
@click.option(
    "--ort-defaults/--no-ort-defaults",
    default=None,
    help="Also measure the rewritten and the unscheduled model under onnxruntime's default session "
    "settings (only common subexpression elimination off): what a plain deployment sees. "
    "Default: in session mode on the CPU.",
)
@click.option(
    "--graph",
    "graph_path",
    type=click.Path(exists=True, dir_okay=False),
    help="A remat-graph of MODEL (e.g. from `remat profile`) used instead of importing MODEL; "
    "with devices, each node runs on its device's provider (--mode interpret).",
)
@click.option("--input-shape", "input_shapes", multiple=True, metavar="NAME=DxDx...", help="As for solve.")
@click.option("--batch", type=int, default=None, help="As for solve.")
@click.option(
    "--cost",
    type=click.Choice(["flops", "unit", "profile"]),
    default="flops",
    show_default=True,
    help="As for solve.",
)
def run_command(
    model_path: str,
    schedule_path: str,
    provider: str,
    mode: str,
    repeat: int,
    warmup: int,
    inputs_path: str | None,
    seed: int,
    threads: int,
    as_json: bool,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
    graph_path: str | None,
    ort_defaults: bool | None,
) -> None:
    """Replay SCHEDULE.json on MODEL.onnx with ONNX Runtime; measure peak memory and time
    against the unscheduled model and check that the outputs match."""
    from remat_cli.cli.common import BadInput, err, fail, friendly_errors, read_graph, read_schedule
    from remat_cli.runtime import ModelMismatch, RunFailed, RuntimeUnavailable, run_schedule
    from remat_cli.runtime.model import read_inputs

    @friendly_errors
    def go() -> None:
        graph = read_graph(graph_path) if graph_path else read_graph(model_path, input_shapes, batch, cost)
        schedule = read_schedule(schedule_path)
        if schedule.budgets and not graph.devices:
            raise BadInput(
                f"{schedule_path} is a schedule on devices {', '.join(schedule.budgets)}: "
                "pass the graph it was solved for with --graph GRAPH.json"
            )
        from pathlib import Path

        from remat_cli.importers.onnx import check_external_data, read_model

        # running needs the weights: refuse missing or hostile external data before onnx reads it
        check_external_data(read_model(model_path), Path(model_path).parent, require_files=True)
        try:
            inputs = read_inputs(inputs_path) if inputs_path else None
        except (OSError, ValueError) as e:
            raise BadInput(f"cannot read inputs {inputs_path}: {e}") from None
        try:
            report = run_schedule(
                model_path,
                graph,
                schedule,
                provider=provider,  # type: ignore[arg-type]
                mode=mode,  # type: ignore[arg-type]
                repeat=repeat,
                warmup=warmup,
                inputs=inputs,
                seed=seed,
                threads=threads,
                ort_defaults=ort_defaults,
            )
        except (RuntimeUnavailable, ModelMismatch, ValueError) as e:
            raise BadInput(str(e)) from None
        except RunFailed as e:
            fail(str(e), 1)
        from rich.table import Table

        table = Table(title=f"{graph.name}: {report.mode} mode on {report.provider}, {threads} thread(s)")
        for col in report.columns():
            table.add_column(col, justify="right" if col else "left")
        for row in report.table():
            table.add_row(*row)
        err.print(table)
        for note in report.notes:
            err.print(f"note: {note}")
        if report.arena is not None:
            a = report.arena
            err.print(
                f"arena: planned {a['planned_arena']:,} B, measured {a['measured_arena']:,} B, outputs "
                f"{'match' if a['outputs_match'] else 'DIFFER'} inside the arena ({a['how']})"
            )
        if as_json:
            click.echo(report.to_json())
        if report.arena is not None and not report.arena["outputs_match"]:
            fail("outputs computed inside the planned arena differ: the plan overlaps live tensors", 1)
        if not report.outputs_match:
            fail(f"outputs differ from the unscheduled run: {', '.join(report.mismatched_outputs)}", 1)

    go()
    sys.exit(0)
