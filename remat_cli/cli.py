"""The `remat` command line: parse, call, print. No algorithms here.

JSON goes to stdout (so commands pipe), people-facing output to stderr. Exit codes:
0 = success / schedule within budget, 1 = no feasible schedule (or an invalid schedule for
`validate`), 2 = bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from remat_cli import generators, watchdog
from remat_cli.budget import BUDGET_HELP, parse_budget
from remat_cli.cli_common import (
    EXIT_INFEASIBLE,
    EXIT_OK,
    BadInput,
    emit,
    err,
    fail,
    fmt_value,
    friendly_errors,
    graph_options,
    human_bytes,
    print_summary,
    read_graph,
    read_schedule,
    resolve_budget,
)
from remat_cli.graph import Graph
from remat_cli.schedule import Schedule, ScheduleError, baseline, peak_lower_bound, simulate
from remat_cli.solvers import registry
from remat_cli.solvers.base import Param, SolveOptions, Solver
from remat_cli.watchdog import run_guarded


# ---- solver-specific options: --name-with-dashes after the solver is known ----
def parse_solver_args(solver: Solver, args: list[str]) -> dict[str, Any]:
    spec: dict[str, Param] = {f"--{p.name.replace('_', '-')}": p for p in solver.params}
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        key, eq, inline = arg.partition("=")
        negated = key.startswith("--no-") and f"--{key[5:]}" in spec and spec[f"--{key[5:]}"].type is bool
        p = spec.get(f"--{key[5:]}" if negated else key)
        if p is None:
            known = ", ".join(spec) or "none"
            raise BadInput(f"unknown option {key!r} for solver {solver.name!r} (its options: {known})")
        if p.type is bool:
            if eq:
                raise BadInput(f"{key} is a flag and takes no value")
            out[p.name] = not negated
            i += 1
            continue
        if eq:
            raw = inline
            i += 1
        elif i + 1 < len(args):
            raw = args[i + 1]
            i += 2
        else:
            raise BadInput(f"{key} needs a value")
        try:
            value = p.type(raw)
        except ValueError:
            raise BadInput(f"{key}: {raw!r} is not a valid {p.type.__name__}") from None
        if p.choices and value not in p.choices:
            raise BadInput(f"{key}: {raw!r} is not one of {', '.join(p.choices)}")
        out[p.name] = value
    return out


# ---- commands ----
@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="remat-cli")
def main() -> None:
    """remat: tensor rematerialization (activation checkpointing) solvers.

    Graphs: ONNX, remat-graph JSON or networkx node-link JSON (detected from the content).
    JSON goes to stdout, human output to stderr. Exit 0 = success, 1 = no schedule fits the
    budget, 2 = bad input.
    """


@main.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", required=True, help=BUDGET_HELP)
@click.option(
    "--solver", "-s", "solver_name", default="greedy", show_default=True, help="See `remat solvers`."
)
@click.option(
    "--output", "-o", type=click.Path(dir_okay=False), help="Write the schedule here (default: stdout)."
)
@click.option("--time-limit", type=float, default=None, help="Seconds; the best schedule so far is returned.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--workers", type=int, default=None, help="Threads for solvers that use them (default: all cores)."
)
@click.option("--hint", type=click.Path(exists=True, dir_okay=False), help="A schedule to warm-start from.")
@click.option("--quiet", "-q", is_flag=True, help="No summary on stderr.")
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
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Find a schedule for GRAPH within --budget.

    Solver-specific options follow the common ones, e.g. `--solver moccasin --max-copies 3`;
    `remat solvers NAME` lists them.
    """
    watchdog.exit_on_sigterm()
    solver = registry.get(solver_name)
    params = parse_solver_args(solver, ctx.args)
    state, reason = solver.availability()
    if state != "available":
        raise BadInput(f"solver {solver_name!r} is unavailable: {reason}")
    graph = read_graph(graph_path, input_shapes, batch, cost)
    why_not = solver.supports(graph)
    if why_not is not None:
        raise BadInput(f"solver {solver_name!r} does not apply to this graph: {why_not}")
    budget_bytes = resolve_budget(graph, budget)
    hint_steps = None
    if hint:
        hint_schedule = read_schedule(hint)
        simulate(graph, hint_schedule.steps)  # a hint for another graph is bad input
        hint_steps = hint_schedule.steps
    options = SolveOptions(time_limit=time_limit, seed=seed, hint=hint_steps, params=params)
    if workers is not None:
        options.workers = workers
    with err.status(f"[bold]{solver_name}[/] solving…", spinner="dots") as status:

        def show(facts: dict[str, Any]) -> None:
            status.update(
                f"[bold]{solver_name}[/] " + "  ".join(f"{k} {fmt_value(v)}" for k, v in facts.items())
            )

        options.on_progress = show if not quiet else None
        outcome = run_guarded(graph, budget_bytes, solver_name, options, watchdog.COMMAND_STARTED)
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
    if not quiet:
        print_summary(schedule)
    if schedule.solver.status == "infeasible":
        # Keep the user's output file untouched: nothing within budget was found.
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
@graph_options
@friendly_errors
def info(graph_path: str, as_json: bool, input_shapes: tuple[str, ...], batch: int | None, cost: str) -> None:
    """Size, baseline and lower bound of GRAPH."""
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
    if as_json:
        click.echo(json.dumps(facts, indent=1))
        return
    t = Table(show_header=False, box=None)
    for k, v in facts.items():
        shown = human_bytes(v) + f"  ({v:,} B)" if k.endswith(("bytes", "memory", "bound")) else v
        t.add_row(k.replace("_", " "), str(shown))
    err.print(t)


@main.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.argument("schedule_path", metavar="SCHEDULE", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", default=None, help="Check against this budget instead of the schedule's.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON report to stdout.")
@graph_options
@friendly_errors
def validate(
    graph_path: str,
    schedule_path: str,
    budget: str | None,
    as_json: bool,
    input_shapes: tuple[str, ...],
    batch: int | None,
    cost: str,
) -> None:
    """Simulate SCHEDULE on GRAPH: validity, peak, cost, overhead, within budget (exit 1 if not)."""
    g = read_graph(graph_path, input_shapes, batch, cost)
    s = read_schedule(schedule_path)
    base = baseline(g)
    limit = parse_budget(budget, base.peak_memory) if budget is not None else s.budget
    report: dict[str, Any] = {"valid": False, "graph_matches": s.graph.sha256 == g.sha256(), "budget": limit}
    try:
        sim = simulate(g, s.steps)
        report |= {
            "valid": True,
            "peak_memory": sim.peak_memory,
            "cost": sim.cost,
            "overhead": sim.cost / base.cost - 1 if base.cost else 0.0,
            "recomputations": sim.recomputations,
            "baseline_peak_memory": base.peak_memory,
            "within_budget": limit is None or sim.peak_memory <= limit,
        }
    except ScheduleError as e:
        report["error"] = str(e)
    ok = report["valid"] and report["graph_matches"] and report.get("within_budget", False)
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
    else:
        err.print(f"[red]invalid[/]: {report['error']}")
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
    """The solver registry; with NAME, that solver's options."""
    rows = []
    for n in [name] if name else registry.names():
        s = registry.get(n)
        state, reason = s.availability()
        rows.append(
            {
                "name": n,
                "method": s.method,
                "paper": s.paper,
                "status": state,
                "reason": reason,
                "exact": s.exact,
                "notes": s.notes(),
                "params": [
                    {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help}
                    for p in s.params
                ],
            }
        )
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    t = Table(title="remat solvers", title_justify="left")
    for col in ("solver", "method", "paper", "status"):
        t.add_column(col)
    for r in rows:
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        notes = f"\n[dim]{r['notes']}[/]" if r["notes"] else ""
        t.add_row(r["name"], r["method"] + notes, r["paper"], status)
    err.print(t)
    if name:
        for p in rows[0]["params"]:
            flag = "--" + p["name"].replace("_", "-")
            err.print(f"  {flag} ({p['type']}, default {p['default']!r}): {p['help']}")


@main.command()
@click.argument("graph_path", metavar="GRAPH", type=click.Path(dir_okay=False))
@click.option("--budget", "-b", required=True, help=BUDGET_HELP)
@click.option(
    "--solvers", "solver_list", default=None, help="Comma-separated (default: every available one)."
)
@click.option("--time-limit", type=float, default=60.0, show_default=True, help="Seconds per solver.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list to stdout.")
@graph_options
@friendly_errors
def compare(
    graph_path: str,
    budget: str,
    solver_list: str | None,
    time_limit: float,
    seed: int,
    as_json: bool,
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
    if as_json:
        click.echo(json.dumps(rows, indent=1))
    t = Table(title=f"{graph.name} — budget {human_bytes(budget_bytes)}", title_justify="left")
    for col in ("solver", "status", "peak", "% of baseline", "overhead %", "recomputations", "seconds"):
        t.add_column(col, justify="left" if col in ("solver", "status") else "right")
    for r in rows:
        if "peak_memory" in r:
            t.add_row(
                r["solver"],
                r["status"],
                human_bytes(r["peak_memory"]),
                f"{100 * r['peak_fraction']:.1f}",
                f"{100 * r['overhead']:.2f}",
                str(r["recomputations"]),
                f"{r['seconds']:.2f}",
            )
        else:
            t.add_row(r["solver"], r["status"], "—", "—", "—", "—", f"{r.get('seconds', 0):.2f}")
    err.print(t)


def _run_in_process(
    name: str, graph_file: Path, budget: int, time_limit: float, seed: int, tmp: Path
) -> dict:
    out = tmp / f"{name}.json"
    cmd = [sys.executable, "-m", "remat_cli", "solve", str(graph_file), "--budget", str(budget)]
    cmd += ["--solver", name, "--time-limit", str(time_limit), "--seed", str(seed), "-q", "-o", str(out)]
    t0 = time.monotonic()
    grace = 30.0 + 0.5 * time_limit  # model building and decoding happen outside the engine's limit
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=time_limit + grace)
    except subprocess.TimeoutExpired:
        return {"solver": name, "status": "timeout", "seconds": time.monotonic() - t0}
    seconds = time.monotonic() - t0
    if proc.returncode == 0 and out.exists():
        s = Schedule.model_validate_json(out.read_text())
        return {
            "solver": name,
            "status": s.solver.status,
            "peak_memory": s.summary.peak_memory,
            "overhead": s.summary.overhead,
            "recomputations": s.summary.recomputations,
            "seconds": s.solver.seconds,
            "wall_seconds": seconds,
        }
    last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    status = "infeasible" if proc.returncode == EXIT_INFEASIBLE else "error"
    return {"solver": name, "status": status, "message": last, "seconds": seconds}


@main.group()
def generate() -> None:
    """Synthetic graphs (remat-graph JSON), deterministic by --seed."""


def _generated(g: Graph, output: str | None) -> None:
    emit(g.to_json(), output)
    err.print(f"{g.name}: {len(g.nodes)} nodes, baseline peak {human_bytes(baseline(g).peak_memory)}")


_out = click.option("--output", "-o", type=click.Path(dir_okay=False), help="File (default: stdout).")
_seed = click.option("--seed", type=int, default=0, show_default=True)


@generate.command("linear")
@click.option("--n", type=click.IntRange(1, 10**6), default=8, show_default=True, help="Forward nodes.")
@click.option("--size", type=int, default=None, help="Bytes per activation (default: random).")
@_seed
@_out
@friendly_errors
def generate_linear(n: int, size: int | None, seed: int, output: str | None) -> None:
    """Checkmate's linear chain: n forward nodes, a loss, n backward nodes."""
    _generated(generators.linear(n, seed=seed, size=size), output)


@generate.command("random-layered")
@click.option("--n", type=click.IntRange(1, 10**5), default=100, show_default=True, help="Nodes.")
@click.option("--width", type=float, default=0.3, show_default=True, help="Relative layer width.")
@click.option("--nlv", type=float, default=0.75, show_default=True, help="Layer-width variation.")
@click.option("--ed", type=float, default=0.2, show_default=True, help="Edge density to the next layer.")
@click.option("--scd", type=float, default=0.14, show_default=True, help="Long-skip probability.")
@_seed
@_out
@friendly_errors
def generate_random_layered(
    n: int, width: float, nlv: float, ed: float, scd: float, seed: int, output: str | None
) -> None:
    """Random layered DAG as in the Moccasin benchmarks."""
    _generated(generators.random_layered(n, width, nlv, ed, scd, seed=seed), output)


@generate.command("unet")
@click.option("--depth", type=click.IntRange(1, 12), default=3, show_default=True)
@click.option(
    "--convs", type=click.IntRange(1, 100), default=2, show_default=True, help="Convolutions per block."
)
@_seed
@_out
@friendly_errors
def generate_unet(depth: int, convs: int, seed: int, output: str | None) -> None:
    """U-Net-style training graph with long skips."""
    _generated(generators.unet(depth, convs, seed=seed), output)


@generate.command("transformer")
@click.option("--layers", type=click.IntRange(1, 10**4), default=4, show_default=True)
@_seed
@_out
@friendly_errors
def generate_transformer(layers: int, seed: int, output: str | None) -> None:
    """Transformer-encoder-like training graph."""
    _generated(generators.transformer(layers, seed=seed), output)


def _register_runtime_commands() -> None:
    from remat_cli.runtime.cli_command import export_torch_command, run_command

    main.add_command(run_command)
    main.add_command(export_torch_command)


_register_runtime_commands()
