"""`remat profile`: measure each node of a model on each device and write a device profile.

It only parses, calls :func:`remat_cli.runtime.device_profile.profile_devices` and prints.
Exit codes: 0 written (devices whose provider is missing are left out, with a note), 1
onnxruntime failed on a node, 2 bad input or no requested device can run here.
"""

from __future__ import annotations

import click

from remat_cli.cli.common import graph_options


@click.command("profile")
@click.argument("model_path", metavar="MODEL.onnx", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--devices",
    default="cpu",
    show_default=True,
    help="Comma-separated devices, the first is home: cpu, cuda (= cuda:0), cuda:N. Several cpu "
    "ids (cpu,cpu:1) share the CPU provider.",
)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False), help="The remat-graph to write (default stdout)."
)
@click.option(
    "--runs", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs per node (median)."
)
@click.option("--threads", type=click.IntRange(min=1), default=1, show_default=True, help="Intra-op threads.")
@click.option("--seed", type=int, default=0, show_default=True, help="For the random inputs.")
@graph_options
def profile_command(
    model_path: str,
    devices: str,
    output: str | None,
    runs: int,
    threads: int,
    seed: int,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Measure each node of MODEL.onnx on each device's onnxruntime provider and the copy cost
    per byte between the devices; write a remat-graph with devices, device_costs and links."""
    import onnx

    from remat_cli.cli.common import BadInput, emit, err, fail, friendly_errors, read_graph
    from remat_cli.importers.onnx import fit_ir_version
    from remat_cli.runtime import ModelMismatch, RunFailed, RuntimeUnavailable
    from remat_cli.runtime.device_profile import parse_devices, profile_devices
    from remat_cli.runtime.ort import unloadable

    @friendly_errors
    def go() -> None:
        try:
            ids = parse_devices(devices)
        except ValueError as e:
            raise BadInput(str(e)) from None
        graph = read_graph(model_path, input_shapes, batch, cost)
        loaded = onnx.load(model_path)
        try:
            prof = profile_devices(fit_ir_version(loaded), graph, ids, runs=runs, threads=threads, seed=seed)
        except (RuntimeUnavailable, ModelMismatch) as e:
            raise BadInput(str(e)) from None
        except RunFailed as e:
            # the model itself, not the run, where onnxruntime cannot load it (as `remat run`)
            if reason := unloadable(model_path, loaded, threads):
                raise BadInput(reason) from None
            fail(str(e), 1)
        for d, why in prof.unavailable.items():
            err.print(f"note: {d} left out: {why}", markup=False)
        from rich.table import Table

        table = Table(
            title=f"{graph.name}: {len(graph.nodes)} nodes, {runs} run(s) each, {threads} thread(s)"
        )
        for col in ("device", "kind", "sum of node times"):
            table.add_column(col, justify="left" if col != "sum of node times" else "right")
        for dev in prof.graph.devices or []:
            table.add_row(dev.id, dev.kind or "", f"{prof.node_seconds[dev.id] * 1e3:.2f} ms")
        err.print(table)
        for k in prof.links:
            err.print(
                f"link {k.source} -> {k.target}: latency {k.latency * 1e6:.1f} us, "
                f"bandwidth {k.bandwidth / 1e9:.2f} GB/s"
            )
        emit(prof.graph.model_dump_json(indent=1, exclude_none=True, by_alias=True), output)
        if output:
            err.print(f"wrote {output}")

    go()
