"""The `remat` command line: parse, call, print. No algorithms here.

JSON goes to stdout (so commands pipe), people-facing output to stderr. Exit codes:
0 = success / schedule within budget, 1 = no feasible schedule (or an invalid schedule for
`validate`), 2 = bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from remat_cli import generators, registry, watchdog
from remat_cli.budget import BUDGET_HELP, parse_budget
from remat_cli.cli_common import (
    EXIT_INFEASIBLE,
    EXIT_OK,
    MAX_GENERATED_NODES,
    MAX_RANDOM_LAYERED_NODES,
    POSITIVE_INT,
    SECONDS,
    BadInput,
    FiniteFloatRange,
    OneLineErrors,
    check_writable,
    device_budgets,
    emit,
    err,
    fail,
    friendly_errors,
    graph_options,
    guard_stderr,
    human_bytes,
    native_stdout_to_stderr,
    parse_solver_args,
    print_summary,
    read_graph,
    read_schedule,
    resolve_budget,
)
from remat_cli.commands.live import BackgroundBound, LiveLine
from remat_cli.commands.plan import plan as plan_command
from remat_cli.cost_bound import MAX_NODES, CostBound, cost_lower_bound, meets
from remat_cli.graph import Graph
from remat_cli.plan_check import PlanError, check_plan
from remat_cli.runner import with_cost_bound
from remat_cli.schedule import ScheduleError, baseline, check_hint, evaluate, peak_lower_bound
from remat_cli.solve_trace import TraceRecorder
from remat_cli.solver import SolveOptions
from remat_cli.sweep.runner import solve_in_subprocess
from remat_cli.watchdog import run_guarded

# ---- commands ----
#: --bound-time-limit of solve, info and validate
BOUND_TIME_LIMIT = click.option(
    "--bound-time-limit",
    type=SECONDS,
    default=30.0,
    show_default=True,
    help="Seconds for the compute bound (0, the trivial bound, where they do not suffice to build "
    f"its ancestor matrix, or above {MAX_NODES:,} nodes).",
)


def compute_bound(g: Graph, budget: int, seconds: float) -> CostBound:
    """The cut bound (remat_cli/cost_bound.py), HiGHS's own prints kept off stdout."""
    with native_stdout_to_stderr():
        return cost_lower_bound(g, budget, time_limit=seconds)


@click.group(
    cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="remat-cli")
def main() -> None:
    """remat: tensor rematerialization (activation checkpointing) solvers.

    Graphs: ONNX, remat-graph JSON or networkx node-link JSON (detected from the content).
    JSON goes to stdout, human output to stderr. Exit 0 = success, 1 = no schedule fits the
    budget, 2 = bad input.
    """
    guard_stderr()


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", required=True, help=BUDGET_HELP)
@click.option("--solver", "-s", "solver_name", default="auto", show_default=True, help="See `remat solvers`.")
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write the schedule here (default: stdout)."
)
@click.option(
    "--time-limit",
    type=SECONDS,
    default=None,
    help="Seconds; the best schedule so far is returned (default for auto and hilp: 60).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workers",
    type=POSITIVE_INT,
    default=None,
    help="Threads for solvers that use them (default: the cores this process may run on).",
)
@click.option("--hint", type=click.Path(exists=True, dir_okay=False), help="A schedule to warm-start from.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
@click.option(
    "--bound",
    is_flag=True,
    help="After the solve, the least overhead any schedule within the budget needs (remat info "
    "--budget) becomes the schedule's lower bound; status optimal when the schedule meets it.",
)
@BOUND_TIME_LIMIT
@graph_options
@click.pass_context
@friendly_errors
def solve(
    ctx: click.Context,
    graph_path: str,
    budget: str,
    solver_name: str,
    output: str | None,
    time_limit: float | None,
    seed: int,
    workers: int | None,
    hint: str | None,
    quiet: bool,
    bound: bool,
    bound_time_limit: float,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Find a schedule for GRAPH within --budget.

    Solver-specific options follow the common ones, e.g. `--solver moccasin --max-copies 3`;
    `remat solvers NAME` lists them.
    """
    begun = watchdog.command_started(time.monotonic())
    watchdog.exit_on_sigterm()
    check_writable(output)
    if not quiet and registry.numba_cache_cold(solver_name):
        click.echo(  # not err.print: rich would wrap the line
            f"remat: note: {solver_name} compiles its numba kernels on first use (about a minute, "
            "not counted in --time-limit); later runs load them from numba's cache",
            err=True,
        )
    solver = registry.get(solver_name)
    params = parse_solver_args(solver, ctx.args)
    state, reason = solver.availability()
    if state != "available":
        raise BadInput(f"solver {solver_name!r} is unavailable: {reason}")
    graph = read_graph(graph_path, input_shapes, batch, cost)
    why_not = solver.supports(graph)
    if why_not is not None:
        raise BadInput(f"solver {solver_name!r} does not apply to this graph: {why_not}")
    budgets = device_budgets(graph, budget) if graph.devices else None
    budget_bytes = max(budgets.values()) if budgets else resolve_budget(graph, budget)
    hint_steps = None
    if hint:
        hint_schedule = read_schedule(hint)
        check_hint(graph, hint_schedule.steps)  # a hint for another graph is bad input
        hint_steps = hint_schedule.steps
    if time_limit is None and solver_name == "auto":
        time_limit = 60.0
    options = SolveOptions(time_limit=time_limit, seed=seed, hint=hint_steps, params=params, budgets=budgets)
    if workers is not None:
        options.workers = workers
    base = baseline(graph)
    recorder = TraceRecorder(budget_bytes, base.cost, begun)
    # --bound: the cut bound beside the solve, at a lower priority (shown live, used after it)
    background = None
    if bound and not graph.devices and solver.minimises == "cost":
        background = BackgroundBound(graph, budget_bytes, (time_limit or 0.0) + bound_time_limit)
    try:
        if quiet or not err.is_terminal:
            outcome = run_guarded(graph, budget_bytes, solver_name, options, begun, recorder)
        else:
            with LiveLine(err, solver_name, time_limit, recorder, base.peak_memory, background) as live:
                options.on_progress = live.progress
                outcome = run_guarded(graph, budget_bytes, solver_name, options, begun, recorder)
        solved = outcome.schedule is not None and outcome.schedule.solver.status != "infeasible"
        cut = (
            background.poll(bound_time_limit)
            if background is not None and solved and not outcome.signal
            else None
        )
    finally:
        if background is not None:
            background.stop()
    schedule, result = outcome.schedule, outcome.result
    # SIGINT/SIGTERM: the best schedule so far is written as usual, then exit 128 + signal
    code = EXIT_INFEASIBLE if outcome.signal is None else 128 + outcome.signal
    if schedule is None:
        peak = f"; lowest peak reached {result.best_peak:,} B" if result.best_peak else ""
        fail(
            f"no schedule within {budget_bytes:,} B found by {solver_name} ({result.status}{peak}; "
            f"lower bound {peak_lower_bound(graph):,} B){': ' + result.message if result.message else ''}",
            code,
            exit=watchdog.exit_fast,
        )
    if bound and schedule.solver.status != "infeasible":
        try:
            with native_stdout_to_stderr():  # HiGHS's own prints
                schedule = with_cost_bound(graph, schedule, bound_time_limit, cut)
        except KeyboardInterrupt:  # the schedule found is still written, without the bound
            click.echo("remat: note: --bound interrupted; the schedule is written without it", err=True)
    if not quiet:
        print_summary(schedule)
    if schedule.solver.status == "infeasible":
        # Keep the user's output file untouched: nothing within budget was found.
        if schedule.memory_plan is not None:  # the footprint is resident bytes + the planned arena
            fail(
                f"no schedule within {budget_bytes:,} B found by {solver_name}: smallest arena "
                f"{schedule.memory_plan.arena:,} B + resident {graph.resident_bytes:,} B = "
                f"{graph.resident_bytes + schedule.memory_plan.arena:,} B (lower bound "
                f"{int(schedule.solver.lower_bound or peak_lower_bound(graph)):,} B)",
                code,
                exit=watchdog.exit_fast,
            )
        fail(
            f"no schedule within {budget_bytes:,} B found by {solver_name}: lowest peak reached "
            f"{schedule.summary.peak_memory:,} B (lower bound {peak_lower_bound(graph):,} B)",
            code,
            exit=watchdog.exit_fast,
        )
    emit(schedule.to_json(), output)
    watchdog.exit_fast(EXIT_OK if outcome.signal is None else 128 + outcome.signal)


@main.command()
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
    --budget, the least extra compute any schedule within it needs (remat_cli/cost_bound.py)."""
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


@main.command()
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


@main.command()
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


@main.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list to stdout.")
@friendly_errors
def solvers(name: str | None, as_json: bool) -> None:
    """The solver registry; with NAME, that solver's options.

    The plain listing imports no solver (the registry's table describes the built-ins); NAME and
    --json load the solver classes for their options, notes and exact availability.
    """
    rows = [
        _solver_facts(n) if name or as_json else _listed(n) for n in ([name] if name else registry.names())
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    t = Table(title="remat solvers", title_justify="left")
    for col in ("solver", "method", "paper", "status"):
        t.add_column(col)
    for r in rows:
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        notes = f"\n[dim]{r['notes']}[/]" if r.get("notes") else ""
        t.add_row(r["name"], r["method"] + notes, r["paper"], status)
    err.print(t)
    if name:
        for p in rows[0]["params"]:
            flag = "--" + p["name"].replace("_", "-")
            err.print(f"  {flag} ({p['type']}, default {p['default']!r}): {p['help']}")


def _listed(name: str) -> dict[str, Any]:
    entry = registry.info(name)
    missing = registry.missing_engines(name)
    return {
        "name": name,
        "method": entry.method,
        "paper": entry.paper,
        "status": "missing engine" if missing else "available",
        "reason": f"not installed: {', '.join(missing)}" if missing else "",
        "exact": entry.exact,
    }


def _solver_facts(name: str) -> dict[str, Any]:
    s = registry.get(name)
    state, reason = s.availability()
    return {
        "name": name,
        "method": s.method,
        "paper": s.paper,
        "status": state,
        "reason": reason,
        "exact": s.exact,
        "notes": s.notes(),
        "params": [
            {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help} for p in s.params
        ],
    }


@main.command()
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


@main.group()
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


def _register_runtime_commands() -> None:
    from remat_cli.runtime.cli_command import export_torch_command, run_command
    from remat_cli.runtime.profile_command import profile_command

    main.add_command(run_command)
    main.add_command(export_torch_command)
    main.add_command(profile_command)


def _register_sweep_commands() -> None:
    from remat_cli.sweep.cli_command import plot_command, report_command, sweep_command

    main.add_command(sweep_command)
    main.add_command(plot_command)
    main.add_command(report_command)


_register_runtime_commands()
_register_sweep_commands()
main.add_command(plan_command)


def run() -> None:
    """The `remat` executable: one process, one command, so --time-limit counts from its start."""
    watchdog.process_is_command()
    main()
