"""`remat info`: size, baseline and lower bounds of a graph."""

from __future__ import annotations

import json

import click
from rich.table import Table

from remat_cli.budget import BUDGET_HELP
from remat_cli.cli.common import (
    BOUND_TIME_LIMIT,
    BadInput,
    compute_bound,
    err,
    friendly_errors,
    graph_options,
    human_bytes,
    read_graph,
    resolve_budget,
)
from remat_cli.schedule import baseline, peak_lower_bound


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print a JSON object to stdout.")
@click.option(
    "--budget",
    "-b",
    default=None,
    help="Also bound the extra compute of every schedule within this budget, in any order. " + BUDGET_HELP,
)
@BOUND_TIME_LIMIT
@graph_options
@friendly_errors
def info(
    graph_path: str,
    as_json: bool,
    budget: str | None,
    bound_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Size, baseline and lower bounds of GRAPH: the peak no schedule goes below and, with
    --budget, the least extra compute any schedule within it needs (remat_cli/execution/cost_bound.py)."""
    g = read_graph(graph_path, input_shapes, batch, cost)
    base = baseline(g)
    phases: dict[str, int] = {}
    for n in g.nodes:
        phases[n.phase or "none"] = phases.get(n.phase or "none", 0) + 1
    facts = {
        "name": g.name,
        "nodes": len(g.nodes),
        "needed_nodes": len(g.needed_nodes),
        "values": len(g.values),
        "outputs": len(g.outputs),
        "resident_bytes": g.resident_bytes,
        "baseline_peak_memory": base.peak_memory,
        "baseline_cost": base.cost,
        "cost_unit": g.cost_unit,
        "peak_lower_bound": peak_lower_bound(g),
        "phases": phases,
        "sha256": g.sha256(),
    }
    if budget is not None:
        if g.devices:
            raise BadInput("--budget: the compute bound is for single-device graphs")
        limit = resolve_budget(g, budget)
        bound = compute_bound(g, limit, bound_time_limit)
        facts["budget"] = limit
        facts["extra_cost_lower_bound"] = bound.extra_cost  # in cost_unit
        facts["overhead_lower_bound"] = bound.overhead(base.cost)
        facts["bound_instant"] = bound.node
        if bound.chain:  # the chain bound's instants, `bound_instant` the last of them
            facts["bound_instants"] = list(bound.chain)
    if as_json:
        click.echo(json.dumps(facts, indent=1))
        return
    t = Table(show_header=False, box=None)
    for k, v in facts.items():
        if k == "overhead_lower_bound":
            shown = f"{v:.4%}"
        elif k == "bound_instants":
            shown = " -> ".join(v)
        elif k.endswith(("bytes", "memory", "peak_lower_bound")) or k == "budget":
            shown = human_bytes(v) + f"  ({v:,} B)"
        else:
            shown = v
        t.add_row(k.replace("_", " "), str(shown))
    err.print(t)
