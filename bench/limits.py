"""The yardstick of issue 18: how good can a schedule be on the shipped ONNX training graphs?

For each graph (graphs/torch_*_train.onnx) and budget fraction of the baseline peak we record:

- ``best_bound``: the cut bound (remat_cli/execution/cost_bound.py; the chain bound where it is higher,
  ``bound_instants`` > 1), a lower bound on the overhead of every schedule in *any* order: what
  every solver's result is measured against;
- the fixed-order Checkmate MILP (Jain et al., MLSys'20, §4; the registered ``checkmate`` solver,
  SCIP or HiGHS) with a per-cell time limit: its schedule's overhead (the optimum when proven) and
  its lower bound ``checkmate_bound``, which holds for the graph's own order only;
- ``peak_lower_bound``: below it no schedule of any order exists.

Writes bench/results/limits.json after every cell, so a cut-short run keeps what it measured; a
cell run again replaces the fields it measured and keeps the others. Usage:

    nice -n 15 python3 bench/limits.py --time-limit 300 --loaded
    python3 bench/limits.py --only torch_unet_train --fractions 0.5 --time-limit 60
    python3 bench/limits.py --graphs /tmp/nets/alexnet_b1.onnx --only alexnet_b1   # bench/model_nets.py's
    python3 bench/limits.py --bound-only --bound-time-limit 120   # the cut bound alone, no Checkmate
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import EXPORTS, RESULTS, export_path, write_results  # noqa: E402

from remat_cli.execution.cost_bound import cost_lower_bound  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.schedule import baseline, peak_lower_bound  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def load_graphs(only: set[str], extra: list[Path]) -> dict[str, Graph]:
    """The shipped graphs and `extra` graph files (ONNX or remat-graph JSON, e.g. `remat generate
    transformer --layers 125 -o transformer_l125.json`; named by their stem), those in `only` if any."""
    paths = [export_path(name) for name in EXPORTS] + extra
    return {p.stem: load_graph(p) for p in paths if p.exists() and (not only or p.stem in only)}


def cell(g: Graph, frac: float, args: argparse.Namespace) -> dict[str, object]:
    base = baseline(g)
    budget = int(frac * base.peak_memory)
    floor = peak_lower_bound(g)
    row: dict[str, object] = {
        "fraction": frac,
        "budget": budget,
        "peak_lower_bound_fraction": round(floor / base.peak_memory, 5),
    }
    if budget < floor:
        return row | {"status": "infeasible (below the peak lower bound)", "best_bound": None}
    t0 = time.monotonic()
    cut = cost_lower_bound(g, budget, time_limit=args.bound_time_limit)
    if cut.extra_cost == float("inf"):
        return row | {"status": f"infeasible (no schedule computes {cut.node} within the budget)"}
    row |= {
        # lower bound on the overhead of every schedule in any order
        "best_bound": math.floor(cut.overhead(base.cost) * 1e6) / 1e6,  # rounded down: still a bound
        "bound_instant": cut.node,
        "bound_instants": len(cut.chain) or 1,  # more than one: the chain bound gave it
        "bound_seconds": round(time.monotonic() - t0, 1),
    }
    if args.bound_only:
        return row
    t0 = time.monotonic()
    sched, res = run_solver(
        g,
        budget,
        "checkmate",
        SolveOptions(time_limit=args.time_limit, seed=0, workers=1, params={"backend": args.backend}),
    )
    bound = None
    if res.lower_bound is not None and base.cost > 0:
        bound = round(max(0.0, res.lower_bound / base.cost - 1), 6)
    overhead = None if sched is None else round(sched.summary.overhead, 6)
    if res.status == "optimal" and overhead is not None:
        bound = overhead
    return row | {
        "checkmate_status": res.status,
        "checkmate_overhead": overhead,
        # lower bound on the overhead over the schedules in the graph's order (None: none given)
        "checkmate_bound": bound,
        "seconds": round(time.monotonic() - t0, 1),
        "message": res.message,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--graphs", nargs="*", type=Path, default=[], help="more training graphs (ONNX or JSON)")
    ap.add_argument("--fractions", default="0.7,0.6,0.5,0.4")
    ap.add_argument("--time-limit", type=float, default=300)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--loaded", action="store_true", help="note that the machine was shared")
    ap.add_argument("--bound-only", action="store_true", help="the cut bound alone, no Checkmate run")
    ap.add_argument("--bound-time-limit", type=float, default=120, help="seconds for the cut bound per cell")
    args = ap.parse_args()
    # cells measured before (another --only/--fractions run) are kept; a cell run again replaces them
    old = RESULTS / "limits.json"
    rows: list[dict[str, object]] = json.loads(old.read_text())["rows"] if old.exists() else []
    for r in rows:  # before the cut bound, "best_bound" was Checkmate's (fixed-order) bound
        if "checkmate_bound" not in r and "checkmate_status" in r:
            r["checkmate_bound"] = r.pop("best_bound", None)
    for name, g in load_graphs({s for s in args.only.split(",") if s}, args.graphs).items():
        for frac in (float(f) for f in args.fractions.split(",")):
            row = {"graph": name, "nodes": len(g.nodes)} | cell(g, frac, args)
            same = [r for r in rows if (r["graph"], r["fraction"]) == (name, row["fraction"])]
            rows = [r for r in rows if r not in same] + [(same[0] if same else {}) | row]
            print(
                f"{name:24s} {frac:4.0%} bound {row['best_bound']} ({row.get('bound_seconds')} s) "
                f"checkmate {row.get('checkmate_status')} overhead {row.get('checkmate_overhead')} "
                f"bound {row.get('checkmate_bound')} ({row.get('seconds')} s)",
                flush=True,
            )
            write_results(
                "limits",
                rows,
                time_limit=args.time_limit,
                bound_time_limit=args.bound_time_limit,
                note="loaded machine (2 cores shared by ~8 engineers)" if args.loaded else "",
            )


if __name__ == "__main__":
    main()
