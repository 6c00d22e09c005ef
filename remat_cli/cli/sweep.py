"""`remat sweep`, `remat plot` and `remat report`: parse, call, print."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import click
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from remat_cli import registry
from remat_cli.cli.common import (
    SECONDS,
    BadInput,
    err,
    friendly_errors,
    graph_options,
    read_graph,
    read_schedule,
    resolve_budget,
)
from remat_cli.devices import resolve_device_budgets
from remat_cli.graph import Graph
from remat_cli.schedule import baseline
from remat_cli.sweep.cells import RESULTS_FILE, GraphEntry, make_cells, read_records, record_key, split_list
from remat_cli.sweep.pool import LocalPool, default_jobs
from remat_cli.sweep.sweep import best_by_graph, run_sweep
from remat_cli.util.files import write_atomic


@click.command("sweep")
@click.argument("graph_paths", metavar="GRAPH...", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option(
    "--budgets",
    default="90%,80%,70%,60%,50%",
    show_default=True,
    help="Comma-separated budgets (percentages of each graph's baseline peak, or bytes).",
)
@click.option("--solvers", "solver_list", default="greedy,fastsa,moccasin", show_default=True)
@click.option("--time-limit", type=SECONDS, default=60.0, show_default=True, help="Seconds per cell.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--output", "-o", required=True, type=click.Path(file_okay=False), help="Results folder.")
@click.option(
    "--jobs",
    "-j",
    type=click.IntRange(min=1),
    default=None,
    help=f"Solves at a time on the local pool (default: one for every two cores, here {default_jobs()}).",
)
@click.option(
    "--scheduler",
    default=None,
    metavar="tcp://HOST:PORT",
    help="Run the cells on this Dask distributed scheduler (pip install remat-cli[distributed]).",
)
@click.option("--quiet", "-q", is_flag=True, help="No progress bar.")
@graph_options
@friendly_errors
def sweep_command(
    graph_paths: tuple[str, ...],
    budgets: str,
    solver_list: str,
    time_limit: float,
    seed: int,
    output: str,
    jobs: int | None,
    scheduler: str | None,
    quiet: bool,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Every (GRAPH, budget, solver) cell, each solve in its own process under --time-limit.

    One JSON record a cell is appended to OUTPUT/sweep.jsonl with its schedule under
    OUTPUT/schedules/. Cells already in OUTPUT are skipped, so an interrupted sweep resumes
    where it stopped; Ctrl-C keeps every finished cell.
    """
    names = split_list(solver_list)
    budget_specs = split_list(budgets)
    if not names or not budget_specs:
        raise BadInput("--solvers and --budgets need at least one entry each")
    for n in names:
        registry.get(n)  # an unknown name is bad input before anything runs
    if time_limit <= 0:
        raise BadInput("--time-limit must be positive")
    graphs: dict[str, Graph] = {}
    entries: list[GraphEntry] = []
    for p in graph_paths:
        g = read_graph(p, input_shapes, batch, cost)
        entry = GraphEntry.of(p, g)
        if entry.sha256 not in graphs:
            graphs[entry.sha256] = g
            entries.append(entry)
    cells = make_cells(entries, budget_specs, names, seed, time_limit)
    results = Path(output)
    if results.exists() and not results.is_dir():
        raise BadInput(f"{output} exists and is not a folder")
    results.mkdir(parents=True, exist_ok=True)
    backend: Any
    if scheduler:
        from remat_cli.sweep.dask_backend import DaskBackend, DistributedMissing, connect

        try:
            backend = DaskBackend(connect(scheduler))
        except DistributedMissing as e:
            raise BadInput(str(e)) from None
        except (OSError, ValueError) as e:  # refused, timed out, or not a scheduler address
            raise BadInput(f"cannot reach the Dask scheduler {scheduler}: {e}") from None
    else:
        backend = LocalPool(jobs)
    err.print(
        f"{len(cells)} cells ({_n(len(entries), 'graph')} × {_n(len(budget_specs), 'budget')} × "
        f"{_n(len(names), 'solver')}), "
        f"{backend.describe()}, results in {results / RESULTS_FILE}"
    )
    label = {e.sha256: e.name for e in entries}
    per_graph = {e.sha256: sum(c.graph_sha256 == e.sha256 for c in cells) for e in entries}
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[best]}"),
    ]
    earlier = read_records(results)
    with Progress(*columns, console=err, disable=quiet, transient=False) as progress:
        total = progress.add_task("all cells", total=len(cells), best="")
        tasks = {sha: progress.add_task(f"  {label[sha]}", total=n, best="") for sha, n in per_graph.items()}
        keys = {c.key for c in cells}
        seen = {record_key(r): r for r in earlier if record_key(r) in keys}.values()
        for r in seen:
            progress.advance(total)
            progress.advance(tasks[r["graph_sha256"]])
        mine = list(seen)

        def show(record: dict[str, Any]) -> None:
            mine.append(record)
            progress.advance(total)
            sha = record["graph_sha256"]
            progress.update(tasks[sha], advance=1, best=best_by_graph(mine).get(sha, ""))

        for sha, text in best_by_graph(mine).items():
            progress.update(tasks[sha], best=text)
        # `kill PID` stops the sweep as Ctrl-C does: finished cells kept, child solves killed
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            outcome = run_sweep(cells, graphs, backend, results, on_record=show)
        finally:
            signal.signal(signal.SIGTERM, previous)
    statuses: dict[str, int] = {}
    for r in outcome.records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    counts = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())) or "nothing new"
    err.print(
        f"{'interrupted: ' if outcome.interrupted else ''}{outcome.ran} cells ran, "
        f"{outcome.already_done} already in {output}, {outcome.skipped} skipped ({counts})"
    )
    if outcome.interrupted:
        left = len(cells) - outcome.already_done - len(outcome.records)
        err.print(f"finished cells are kept; run the same command again to resume ({left} left)")
        raise SystemExit(130)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


FIGURE_FORMATS = ("png", "svg", "pdf")


def _n(k: int, word: str) -> str:
    return f"{k} {word}{'' if k == 1 else 's'}"


def _records_or_fail(results: str) -> list[dict[str, Any]]:
    if not Path(results).exists():
        raise BadInput(f"{results}: no such results folder or file")
    records = read_records(results)
    if not records:
        raise BadInput(f"{results}: no sweep records (expected *.jsonl from `remat sweep`)")
    return records


@click.command("plot")
@click.argument("results", required=False, type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="PNG, SVG or PDF file.")
@click.option(
    "--memory", "schedule_path", type=click.Path(dir_okay=False), help="Plot this schedule's live memory."
)
@click.option("--graph", "-g", "graph_path", type=click.Path(dir_okay=False), help="The graph of --memory.")
@click.option("--budget", "-b", default=None, help="Budget line for --memory (default: the schedule's).")
@graph_options
@friendly_errors
def plot_command(
    results: str | None,
    output: str,
    schedule_path: str | None,
    graph_path: str | None,
    budget: str | None,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Trade-off figure of a sweep (RESULTS folder), or with --memory the live memory of a schedule.

    `remat plot results/ -o tradeoff.png`: per graph, each solver's overhead against peak memory
    (both % of the baseline), proven lower bounds shaded, the baseline marked.
    `remat plot --memory schedule.json -g graph.json -o mem.png`: live bytes at each step against
    the budget (on a multi-device graph, one line per device against its budget).
    """
    fmt = Path(output).suffix.lower().lstrip(".")
    if fmt not in FIGURE_FORMATS:
        raise BadInput(f"{output}: the file name must end in .png, .svg or .pdf")
    from remat_cli.sweep import plot

    if schedule_path is not None:
        if graph_path is None:
            raise BadInput("--memory needs the schedule's graph: -g GRAPH")
        graph = read_graph(graph_path, input_shapes, batch, cost)
        schedule = read_schedule(schedule_path)
        if schedule.graph.sha256 != graph.sha256():
            raise BadInput(f"{schedule_path} was made for another graph (graph.sha256 differs)")
        limit = budgets = None
        if budget is not None and graph.devices:
            budgets = resolve_device_budgets(graph, budget, baseline(graph).peak_memory)
        elif budget is not None:
            limit = resolve_budget(graph, budget)
        fig = plot.memory_figure(graph, schedule, limit, budgets)
    else:
        if results is None:
            raise BadInput("give a results folder (from `remat sweep -o`), or --memory SCHEDULE -g GRAPH")
        fig = plot.tradeoff_figure(_records_or_fail(results))
    write_atomic(output, plot.figure_bytes(fig, fmt))
    err.print(f"wrote {output}")


@click.command("report")
@click.argument("results", type=click.Path())
@click.option("--output", "-o", required=True, type=click.Path(dir_okay=False), help="HTML file.")
@click.option("--title", default="remat sweep", show_default=True)
@friendly_errors
def report_command(results: str, output: str, title: str) -> None:
    """A static HTML report of a sweep: the trade-off figure, live-memory plots and the table."""
    from remat_cli.importers import load_graph
    from remat_cli.sweep.report import report_html

    records = _records_or_fail(results)
    folder = Path(results) if Path(results).is_dir() else Path(results).parent
    write_atomic(output, report_html(records, folder, load_graph=load_graph, title=title))
    err.print(f"wrote {output} ({len(records)} records)")
