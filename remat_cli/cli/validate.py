"""`remat validate`: simulate a schedule on its graph and report validity, peak, cost and its memory plan."""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from remat_cli.budget import parse_budget
from remat_cli.cli.common import (
    BOUND_TIME_LIMIT,
    compute_bound,
    device_budgets,
    err,
    friendly_errors,
    graph_options,
    human_bytes,
    read_graph,
    read_schedule,
)
from remat_cli.execution.cost_bound import meets
from remat_cli.execution.exit_codes import EXIT_INFEASIBLE, EXIT_OK
from remat_cli.planning.check import PlanError, check_plan
from remat_cli.schedule import ScheduleError, baseline, evaluate, peak_lower_bound


@click.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.argument("schedule_path", metavar="SCHEDULE", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", default=None, help="Check against this budget instead of the schedule's.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report to stdout.")
@click.option(
    "--bound",
    is_flag=True,
    help="Also the least overhead any schedule within the budget needs (remat info --budget), and "
    "whether this one meets it (then it is optimal).",
)
@BOUND_TIME_LIMIT
@graph_options
@friendly_errors
def validate(
    graph_path: str,
    schedule_path: str,
    budget: str | None,
    as_json: bool,
    bound: bool,
    bound_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Simulate SCHEDULE on GRAPH: validity, peak, cost, overhead, within budget (exit 1 if not)."""
    g = read_graph(graph_path, input_shapes, batch, cost)
    s = read_schedule(schedule_path)
    base = baseline(g)
    limit = parse_budget(budget, base.peak_memory) if budget is not None and not g.devices else s.budget
    limits = None
    if g.devices:  # every device against its own budget
        limits = device_budgets(g, budget) if budget is not None else s.budgets
        if limits is None and s.budget is not None:
            limits = {d.id: s.budget for d in g.devices}
        limit = max(limits.values()) if limits else None
    report: dict[str, Any] = {"valid": False, "graph_matches": s.graph.sha256 == g.sha256(), "budget": limit}
    try:
        ev = evaluate(g, s.steps, limit, base, limits)
        report |= {
            "valid": True,
            "peak_memory": ev.sim.peak_memory,
            "cost": ev.sim.cost,
            "overhead": ev.overhead,
            "recomputations": ev.sim.recomputations,
            "baseline_peak_memory": base.peak_memory,
            "within_budget": ev.within_budget,
        }
        if ev.sim.peak_by_device is not None:
            report |= {
                "budgets": limits,
                "peak_memory_by_device": ev.sim.peak_by_device,
                "copies": ev.sim.copies,
                "copy_cost": ev.sim.copy_cost,
                "over_budget_devices": ev.over_budget_devices,
            }
    except ScheduleError as e:
        report["error"] = str(e)
    if bound and report["valid"] and limit is not None and not g.devices:
        if limit < peak_lower_bound(g):
            report["overhead_lower_bound"] = None  # no schedule fits: nothing to bound
        else:
            cut = compute_bound(g, limit, bound_time_limit)
            report["overhead_lower_bound"] = cut.overhead(base.cost)
            report["proven_optimal"] = report["within_budget"] and meets(
                report["cost"], base.cost + cut.extra_cost
            )
    if report["valid"] and s.memory_plan is not None:
        try:
            pr = check_plan(g, s.steps, s.memory_plan)
            report["memory_plan"] = {
                "valid": True,
                "arena": pr.arena,
                "peak": pr.peak,
                "fragmentation": pr.fragmentation,
                "footprint": g.resident_bytes + pr.arena,
                "footprint_within_budget": limit is None or g.resident_bytes + pr.arena <= limit,
            }
        except PlanError as e:
            report["memory_plan"] = {"valid": False, "error": str(e)}
    plan_ok = report.get("memory_plan", {}).get("valid", True)
    ok = report["valid"] and report["graph_matches"] and report.get("within_budget", False) and plan_ok
    if as_json:
        click.echo(json.dumps(report, indent=1))
    if not report["graph_matches"]:
        err.print("[red]schedule was made for another graph[/] (graph.sha256 differs)")
    if report["valid"]:
        err.print(
            f"{'[green]valid[/]' if ok else '[red]not ok[/]'}: peak {human_bytes(report['peak_memory'])}"
            f" ({'within' if report['within_budget'] else 'OVER'} budget {human_bytes(limit)}), "
            f"cost {report['cost']:.6g}, overhead {100 * report['overhead']:.2f}%, "
            f"{report['recomputations']} recomputations"
        )
        if "peak_memory_by_device" in report:
            err.print(
                "  per device: "
                + ", ".join(
                    f"{d} {human_bytes(p)}"
                    + (f" / {human_bytes(report['budgets'][d])}" if report["budgets"] else "")
                    for d, p in report["peak_memory_by_device"].items()
                )
                + f"; {report['copies']} copies costing {report['copy_cost']:.6g}"
            )
    else:
        err.print(f"[red]invalid[/]: {report['error']}")
    if report.get("overhead_lower_bound") is not None:
        lb = report["overhead_lower_bound"]
        err.print(
            f"lower bound on the overhead of any schedule within the budget: {100 * lb:.2f}% "
            + (
                "(this schedule meets it: optimal)"
                if report["proven_optimal"]
                else f"(this one is at most {100 * (report['overhead'] - lb):.2f} points above the optimum)"
            )
        )
    mp = report.get("memory_plan")
    if mp is not None and mp["valid"]:
        err.print(
            f"memory plan: arena {human_bytes(mp['arena'])}, fragmentation {100 * mp['fragmentation']:.2f}% "
            f"(arena / peak of arena bytes - 1), footprint {human_bytes(mp['footprint'])}"
        )
    elif mp is not None:
        err.print(f"[red]invalid memory plan[/]: {mp['error']}")
    sys.exit(EXIT_OK if ok else EXIT_INFEASIBLE)
