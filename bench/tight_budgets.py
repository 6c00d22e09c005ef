"""Tight budgets on the shipped ONNX training graphs (issue 18, item 3): greedy, FastSA as the
paper describes it (`--chain 0`: no recomputation chains, no soft peak) and FastSA as shipped,
each alone within the same time limit, at 50% and 40% of the baseline peak.

    python3 bench/tight_budgets.py [--time-limit 60] [--fractions 50,40] [--only mlp unet]

Per cell: status, overhead (recomputation cost over the baseline cost), peak as a fraction of the
baseline peak, seconds, and the solver's message. Writes bench/results/tight_budgets.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

RUNS = {  # label -> (solver, params)
    "greedy": ("greedy", {}),
    "fastsa (paper: --chain 0)": ("fastsa", {"chain": 0}),
    "fastsa": ("fastsa", {}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--fractions", default="50,40", help="budget percentages, comma separated")
    ap.add_argument("--only", nargs="*", help="graph keys: mlp unet transformer resnet")
    ap.add_argument("--note", default="", help="free text stored with the results (e.g. machine load)")
    args = ap.parse_args()
    rows = []
    for path in sorted((ROOT / "graphs").glob("torch_*_train.onnx")):
        key = path.stem.removeprefix("torch_").removesuffix("_train")
        if args.only and key not in args.only:
            continue
        g = from_onnx_file(str(path))
        base = baseline(g)
        for pct in (float(f) for f in args.fractions.split(",")):
            budget = int(base.peak_memory * pct / 100)
            for label, (solver, params) in RUNS.items():
                t0 = time.monotonic()
                s, r = run_solver(
                    g, budget, solver, SolveOptions(time_limit=args.time_limit, workers=1, params=params)
                )
                seconds = time.monotonic() - t0
                fits = s is not None and s.summary.peak_memory <= budget
                peak = s.summary.peak_memory if s is not None else r.best_peak
                row = {
                    "graph": path.name,
                    "budget_percent": pct,
                    "run": label,
                    "status": r.status,
                    "overhead": s.summary.overhead if fits and s is not None else None,
                    "peak_fraction": peak / base.peak_memory if peak else None,
                    "seconds": round(seconds, 2),
                    "message": r.message,
                }
                rows.append(row)
                shown = f"{100 * row['overhead']:.2f}%" if row["overhead"] is not None else "none"
                print(
                    f"{path.name:30s} {pct:3.0f}% {label:26s} {shown:>9s} {r.status:10s} {seconds:6.1f}s",
                    flush=True,
                )
    write_results("tight_budgets", rows, time_limit=args.time_limit, note=args.note)


if __name__ == "__main__":
    main()
