"""Deep models: GPT-style decoders of 12, 24, 48 and 96 layers and a Llama-style one of 32
(bench/decoders.py), at 50% and 30% of the baseline peak and at `--solver blocks`' own peak;
for each cell the overhead, peak, solve time and resident memory of greedy, fastsa, auto and
blocks, and the cut bound `remat info --budget` proves (the least overhead any schedule needs).

Each solve is its own `remat solve` process (the watchdog forks the solver inside it); its peak
resident memory is the largest high-water mark (VmHWM) of any process of that tree, sampled from
/proc every 0.2 s (wait4's rusage misses the solver child, which is killed, not reaped); its CPU
seconds are those of the processes it reaped (the solver's own are not among them). Cells run one after
another; the load average before and after each is recorded, since the machine may be shared.
Rows of an earlier run in the same --out that this run does not redo are kept, so subsets add up:

    python3 bench/deep.py --solvers greedy,blocks --bound                # every model, no fastsa/auto
    python3 bench/deep.py --models gpt48 --solvers auto --time-limit 120  # one more column
    python3 bench/deep.py --layers 12,24 --budgets 50%,blocks

Deeper decoders are exported once into bench/.cache (git-ignored; minutes each).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from common import RESULTS, write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

MODELS = ("gpt12", "gpt24", "gpt48", "gpt96", "llama32")
SOLVERS = ("greedy", "blocks", "fastsa", "auto")


def model_path(model: str) -> Path:
    """The export of `model` (gpt12 is the one shipped in graphs/), exported on first use."""
    import decoders

    kind, layers = ("gpt", int(model[3:])) if model.startswith("gpt") else ("llama", int(model[5:]))
    shipped = ROOT / "graphs" / f"{decoders.name(kind, layers)}.onnx"
    return shipped if shipped.exists() else decoders.export(kind, layers)


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def tree_high_water(root: int, seen: dict[int, int]) -> None:
    """Record in `seen` each live process of `root`'s tree with its resident high-water mark (kB,
    /proc's VmHWM): the solver runs in a child the watchdog kills once it has the result, so
    wait4's rusage (reaped children only) misses it."""
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        hwm = next((int(ln.split()[1]) for ln in status.splitlines() if ln.startswith("VmHWM:")), 0)
        seen[pid] = max(seen.get(pid, 0), hwm)
        todo.extend(int(k) for k in kids)


def run_measured(cmd: list[str]) -> tuple[int, float, float, float, str]:
    """Exit code, wall seconds, CPU seconds (user + system of the processes it reaped) and peak
    resident MB of `cmd` (the largest high-water mark of any process of its tree, sampled every
    0.2 s), and its stderr's last line."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    seen: dict[int, int] = {}
    with tempfile.TemporaryFile("w+") as err:
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env, cwd=ROOT)
        while True:
            pid, status, usage = os.wait4(p.pid, os.WNOHANG)
            if pid:
                break
            tree_high_water(p.pid, seen)
            time.sleep(0.2)
        p.returncode = os.waitstatus_to_exitcode(status)
        wall = time.monotonic() - t0
        err.seek(0)
        lines = [ln for ln in err.read().splitlines() if ln.strip()]
    cpu = usage.ru_utime + usage.ru_stime
    # not usage.ru_maxrss: Linux carries the high-water mark across exec, so it is the bench's own
    rss = max(seen.values(), default=0) / 1024
    return p.returncode, wall, cpu, rss, lines[-1] if lines else ""


def solve_cell(path: Path, budget: int, solver: str, limit: float) -> dict[str, Any]:
    """One `remat solve` of `path` within `budget` bytes, measured."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "s.json")
        cmd = [sys.executable, "-m", "remat_cli", "solve", str(path), "--budget", str(budget)]
        cmd += ["--solver", solver, "-o", str(out), "--quiet"]
        if solver != "blocks":
            cmd += ["--time-limit", f"{limit:g}"]
        before = load()
        code, wall, cpu, rss, last = run_measured(cmd)
        row: dict[str, Any] = {
            "exit": code,
            "wall_s": round(wall, 2),
            "cpu_s": round(cpu, 2),
            "rss_mb": round(rss, 1),
            "rss_from": "VmHWM",
        }
        row |= {"load_before": before, "load_after": load()}
        if out.exists():
            s = json.loads(out.read_text())
            summ = s["summary"]
            row |= {
                "status": s["solver"]["status"],
                "solve_s": s["solver"].get("seconds"),
                "peak": summ["peak_memory"],
                "peak_pct": round(100 * summ["peak_memory"] / summ["baseline_peak_memory"], 2),
                "overhead_pct": round(100 * summ["overhead"], 3),
                "within_budget": summ["peak_memory"] <= budget,
            }
        else:
            row |= {"status": "none", "message": last}
        return row


def bound_cell(path: Path, budget: int, limit: float) -> dict[str, Any]:
    """`remat info --budget`'s cut bound, as an overhead in %."""
    cmd = [sys.executable, "-m", "remat_cli", "info", str(path), "--budget", str(budget), "--json"]
    cmd += ["--bound-time-limit", f"{limit:g}"]
    t0 = time.monotonic()
    p = subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT
    )
    if p.returncode != 0:
        return {"bound_error": p.stderr.strip().splitlines()[-1:]}
    info = json.loads(p.stdout)
    return {
        "bound_pct": round(100 * info["overhead_lower_bound"], 3),
        "bound_s": round(time.monotonic() - t0, 1),
    }


def cells_of(model: str, budgets: list[str]) -> tuple[dict[str, Any], list[tuple[str, int]]]:
    """The model's facts and its (label, bytes) budgets: a percentage of the baseline peak, or
    "blocks" (blocks' own peak)."""
    path = model_path(model)
    g = load_graph(path)
    base = baseline(g)
    schedule, _ = run_solver(g, base.peak_memory, "blocks", SolveOptions())
    assert schedule is not None
    facts = {
        "file": str(path.relative_to(ROOT)),
        "nodes": len(g.nodes),
        "baseline_peak": base.peak_memory,
        "baseline_cost": base.cost,
        "blocks_peak": schedule.summary.peak_memory,
        "blocks_overhead_pct": round(100 * schedule.summary.cost / base.cost - 100, 3),
    }
    out = []
    for b in budgets:
        if b == "blocks":
            out.append(("blocks", schedule.summary.peak_memory))
        else:
            out.append((b, int(float(b.rstrip("%")) / 100 * base.peak_memory)))
    return facts, out


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'model':8} {'budget':7} {'solver':7} {'status':10} {'peak%':>6} {'overhead%':>9} {'bound%':>7} {'solve s':>8} {'s/1k':>6} {'RSS MB':>7}"
    lines = [head]
    for r in rows:
        per_k = r.get("solve_s") and 1000 * r["solve_s"] / r["nodes"]
        lines.append(
            f"{r['model']:8} {r['budget']:7} {r['solver']:7} {r.get('status', ''):10} "
            f"{r.get('peak_pct', ''):>6} {r.get('overhead_pct', ''):>9} {r.get('bound_pct', ''):>7} "
            f"{r.get('solve_s', ''):>8} {round(per_k, 2) if per_k else '':>6} {r.get('rss_mb', ''):>7}"
        )  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"among {', '.join(MODELS)}")
    ap.add_argument("--layers", help="GPT-style depths only, e.g. 12,24 (instead of --models)")
    ap.add_argument("--solvers", default=",".join(SOLVERS), help="'' for none (with --bound: bounds only)")
    ap.add_argument(
        "--budgets", default="50%,30%,blocks", help="percentages of the baseline peak, and 'blocks'"
    )
    ap.add_argument("--time-limit", type=float, default=120.0, help="per solve (blocks has none)")
    ap.add_argument("--bound", action="store_true", help="also the cut bound of each cell")
    ap.add_argument("--bound-time-limit", type=float, default=30.0)
    ap.add_argument("--out", default="deep")
    ap.add_argument("--note", default="", help="recorded with the run (e.g. what else loaded the machine)")
    args = ap.parse_args()
    models = [f"gpt{k}" for k in args.layers.split(",")] if args.layers else args.models.split(",")
    solvers, budgets = [s for s in args.solvers.split(",") if s], args.budgets.split(",")
    previous = RESULTS / f"{args.out}.json"
    old = json.loads(previous.read_text()) if previous.exists() else {}
    rows = {(r["model"], r["budget"], r["solver"]): r for r in old.get("rows", [])}
    for r in rows.values():  # measured by wait4 before: the bench's own high-water mark, dropped
        if r.get("rss_from") != "VmHWM":
            r.pop("rss_mb", None)
    facts, bounds, runs = old.get("models", {}), old.get("bounds", {}), old.get("runs", [])
    for model in models:
        facts[model], cells = cells_of(model, budgets)
        path = ROOT / facts[model]["file"]
        for label, nbytes in cells:
            cell = f"{model} {label}"
            if args.bound:
                bounds[cell] = {"budget_bytes": nbytes, **bound_cell(path, nbytes, args.bound_time_limit)}
                bounds[cell] |= {"time_limit": args.bound_time_limit, "load_after": load()}
            for solver in solvers:
                row = {
                    "model": model,
                    "nodes": facts[model]["nodes"],
                    "budget": label,
                    "budget_bytes": nbytes,
                }
                row |= {"solver": solver, "time_limit": None if solver == "blocks" else args.time_limit}
                row |= solve_cell(path, nbytes, solver, args.time_limit)
                rows[(model, label, solver)] = row
                print(table([row | bounds.get(cell, {})]).splitlines()[1], flush=True)
    runs.append({"command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])})
    runs[-1] |= {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "note": args.note}
    for r in rows.values():  # each row shows its cell's bound
        b = bounds.get(f"{r['model']} {r['budget']}", {})
        r |= {k: v for k, v in b.items() if k.startswith("bound")}

    def order(r: dict[str, Any]) -> tuple:
        return (
            rank(MODELS, r["model"]),
            rank(("50%", "30%", "blocks"), r["budget"]),
            rank(SOLVERS, r["solver"]),
        )

    ordered = sorted(rows.values(), key=order)
    path = write_results(args.out, ordered, models=facts, bounds=bounds, runs=runs)
    print(table(ordered))
    print(f"wrote {path}")


def rank(known: tuple[str, ...], x: str) -> tuple[int, str]:
    return (known.index(x) if x in known else len(known), x)


if __name__ == "__main__":
    main()
