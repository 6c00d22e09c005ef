"""Baseline solvers (greedy, chen-sqrtn, chen-greedy) on the Moccasin benchmark graphs.

Graphs: random layered RL n100..n1000, CM1 = fcn_8_vgg train, CM2 = ResNet50 train, at 90/80/70%
of the baseline peak. Prints a table and writes bench/results/baselines.json with the command.

    python3 bench/baselines.py [--time-limit S] [--graphs rl100,cm1,...] [--solvers greedy,...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import MOCCASIN as DATA  # noqa: E402
from common import SHORT, graph_files  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.importers.nx import from_node_link  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

GRAPHS = graph_files(SHORT)
FRACTIONS = (0.9, 0.8, 0.7)
SOLVERS = ("greedy", "chen-sqrtn", "chen-greedy")
# Moccasin paper Table 3 (TDI %, its best solver) at 90% / 80%, for reference
PAPER = {
    "rl100": {0.9: 0.8, 0.8: 2.3},
    "rl250": {0.9: 0.9, 0.8: 4.9},
    "rl500": {0.9: 0.7, 0.8: 3.4},
    "rl1000": {0.9: 0.7, 0.8: 3.4},
    "cm1": {0.9: 0.0, 0.8: 0.1},
    "cm2": {0.9: 0.1, 0.8: 0.3},
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=120.0)
    ap.add_argument("--graphs", default=",".join(GRAPHS))
    ap.add_argument("--solvers", default=",".join(SOLVERS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "baselines.json"))
    args = ap.parse_args()
    rows = []
    print(
        f"{'graph':8} {'budget':>6} {'solver':12} {'status':10} {'peak%':>6} {'overhead%':>9} "
        f"{'paper%':>6} {'seconds':>8}  how"
    )
    for gname in args.graphs.split(","):
        graph = from_node_link(json.loads((DATA / GRAPHS[gname]).read_text()), name=gname)
        base = baseline(graph)
        for frac in FRACTIONS:
            budget = int(frac * base.peak_memory)
            for sname in args.solvers.split(","):
                t0 = time.monotonic()
                sched, result = run_solver(graph, budget, sname, SolveOptions(time_limit=args.time_limit))
                seconds = time.monotonic() - t0
                row = {
                    "graph": gname,
                    "nodes": len(graph.nodes),
                    "fraction": frac,
                    "budget": budget,
                    "solver": sname,
                    "status": sched.solver.status if sched else result.status,
                    "peak": sched.summary.peak_memory if sched else None,
                    "peak_fraction": sched.summary.peak_memory / base.peak_memory if sched else None,
                    "overhead_pct": 100 * sched.summary.overhead if sched else None,
                    "paper_best_tdi_pct": PAPER.get(gname, {}).get(frac),
                    "seconds": round(seconds, 3),
                    "message": result.message,
                }
                rows.append(row)
                print(
                    f"{gname:8} {frac:>6.0%} {sname:12} {row['status']:10} "
                    f"{100 * (row['peak_fraction'] or 0):>6.1f} {row['overhead_pct'] or 0:>9.2f} "
                    f"{'' if row['paper_best_tdi_pct'] is None else row['paper_best_tdi_pct']:>6} "
                    f"{seconds:>8.2f}  {result.message}",
                    flush=True,
                )
    out = {
        "command": "python3 " + " ".join(["bench/baselines.py", *sys.argv[1:]]),
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, shared with "
        "other jobs (loaded machine)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
