"""`remat compare`: several solvers on one graph and budget, each in its own process."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from remat_cli import registry
from remat_cli.budget import BUDGET_HELP
from remat_cli.cli.common import (
    BOUND_TIME_LIMIT,
    SECONDS,
    compute_bound,
    err,
    friendly_errors,
    graph_options,
    human_bytes,
    read_graph,
    resolve_budget,
)
from remat_cli.execution.cost_bound import meets
from remat_cli.schedule import baseline
from remat_cli.sweep.runner import solve_in_subprocess


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", required=True, help=BUDGET_HELP)
@click.option(
    "--solvers", "solver_list", default=None, help="Comma-separated (default: every available one)."
)
@click.option("--time-limit", type=SECONDS, default=60.0, show_default=True, help="Seconds per solver.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list to stdout.")
@click.option(
    "--bound",
    is_flag=True,
    help="Also the least overhead any schedule within the budget needs (remat info --budget): each "
    "row gets it and whether its schedule meets it (proven_optimal).",
)
@BOUND_TIME_LIMIT
@graph_options
@friendly_errors
def compare(
    graph_path: str,
    budget: str,
    solver_list: str | None,
    time_limit: float,
    seed: int,
    as_json: bool,
    bound: bool,
    bound_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Run several solvers, each in its own process under --time-limit, and compare them."""
    graph = read_graph(graph_path, input_shapes, batch, cost)
    budget_bytes = resolve_budget(graph, budget)
    names = [n.strip() for n in solver_list.split(",")] if solver_list else registry.names()
    for n in names:
        registry.get(n)  # unknown names are bad input before anything runs
    base = baseline(graph)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="remat-compare-") as tmp:
        graph_file = Path(tmp, "graph.json")
        graph_file.write_text(graph.to_json())
        for n in names:
            state, reason = registry.get(n).availability()
            why_not = registry.get(n).supports(graph)
            if state != "available" or why_not is not None:
                rows.append({"solver": n, "status": "skipped", "message": reason or why_not})
                continue
            with err.status(f"running [bold]{n}[/] (≤ {time_limit:g}s)…"):
                rows.append(_run_in_process(n, graph_file, budget_bytes, time_limit, seed, Path(tmp)))
    for r in rows:
        if "peak_memory" in r:
            r["peak_fraction"] = r["peak_memory"] / base.peak_memory
        if "lowest_peak" in r:
            r["lowest_peak_fraction"] = r["lowest_peak"] / base.peak_memory
    least = None
    if bound and not graph.devices:
        cut = compute_bound(graph, budget_bytes, bound_time_limit)
        least = cut.overhead(base.cost)
        for r in rows:
            r["overhead_lower_bound"] = least
            if "overhead" in r:
                within = r["status"] in ("feasible", "optimal")
                r["proven_optimal"] = within and meets(
                    base.cost * (1 + r["overhead"]), base.cost + cut.extra_cost
                )
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    caption = (
        None if least is None else f"no schedule within the budget has an overhead below {100 * least:.2f}%"
    )
    t = Table(
        title=f"{graph.name} — budget {human_bytes(budget_bytes)}", title_justify="left", caption=caption
    )
    for col in ("solver", "status", "peak", "% of baseline", "overhead %", "recomputations", "seconds"):
        t.add_column(col, justify="left" if col in ("solver", "status") else "right")
    for r in rows:
        if "peak_memory" in r:
            t.add_row(
                r["solver"],
                r["status"] + (" (meets the bound)" if r.get("proven_optimal") else ""),
                human_bytes(r["peak_memory"]),
                f"{100 * r['peak_fraction']:.1f}",
                f"{100 * r['overhead']:.2f}",
                str(r["recomputations"]),
                f"{r['seconds']:.2f}",
            )
        elif "lowest_peak" in r:
            # how far off the budget it stayed: the lowest peak its schedules reached
            t.add_row(
                r["solver"],
                r["status"],
                f"lowest {human_bytes(r['lowest_peak'])}",
                f"{100 * r['lowest_peak_fraction']:.1f}",
                "—",
                "—",
                f"{r.get('seconds', 0):.2f}",
            )
        else:
            t.add_row(r["solver"], r["status"], "—", "—", "—", "—", f"{r.get('seconds', 0):.2f}")
    err.print(t)


def _run_in_process(
    name: str, graph_file: Path, budget: int, time_limit: float, seed: int, tmp: Path
) -> dict:
    child = solve_in_subprocess(graph_file, budget, name, time_limit, seed, tmp / f"{name}.json")
    s = child.schedule
    if s is None:
        row = {
            "solver": name,
            "status": child.status,
            "message": child.message,
            "seconds": child.wall_seconds,
        }
        if child.best_peak is not None:
            row["lowest_peak"] = child.best_peak
        return row
    return {
        "solver": name,
        "status": s.solver.status,
        "peak_memory": s.summary.peak_memory,
        "overhead": s.summary.overhead,
        "recomputations": s.summary.recomputations,
        "seconds": s.solver.seconds,
        "wall_seconds": child.wall_seconds,
    }
