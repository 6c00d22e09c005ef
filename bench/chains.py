"""FastSA with one chain against one chain per worker (remat_cli/solvers/fastsa/chains.py) on
ONNX training graphs at tight budgets: the same cell, seed and time limit, `--workers 1` and then
`--workers N` (N chains side by side, seeds s .. s + N - 1, the cheapest kept). With `--limits`,
instead one worker at each of several time limits (rounds in sequence, fastsa/rounds.py).

    python3 bench/chains.py --graphs graphs/torch_resnet_train.onnx /tmp/nets/resnet18_b32.onnx \
        --fractions 70,50 --time-limit 60 --seeds 0 --workers 2
    python3 bench/chains.py --graphs graphs/torch_unet_train.onnx --fractions 50 --limits 60,120 \
        --out fastsa_rounds

Per cell and worker count: status, overhead, peak as a fraction of the baseline peak, seconds,
and whether the clock shortened a chain. Writes bench/results/fastsa_chains.json (or --out).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_results  # noqa: E402

from remat_cli import load_graph  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", type=Path, required=True, help="ONNX or JSON graphs")
    ap.add_argument("--fractions", default="70,50", help="budget percentages, comma separated")
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--seeds", default="0", help="comma separated")
    ap.add_argument("--workers", type=int, default=2, help="the chains of the second run")
    ap.add_argument("--limits", default="", help="instead: one worker at each of these time limits")
    ap.add_argument("--out", default="fastsa_chains")
    ap.add_argument("--note", default="", help="free text stored with the results (e.g. machine load)")
    args = ap.parse_args()
    rows = []
    print(
        f"{'graph':26s} {'budget':>6s} {'seed':>4s} {'workers':>7s} {'limit':>6s} {'status':10s} {'overhead':>9s} "
        f"{'peak':>6s} {'s':>6s}"
    )
    limits = [float(x) for x in args.limits.split(",") if x]
    runs = [(1, x) for x in limits] if limits else [(1, args.time_limit), (args.workers, args.time_limit)]
    for path in args.graphs:
        g = load_graph(str(path))
        base = baseline(g)
        for pct in (float(f) for f in args.fractions.split(",")):
            budget = int(base.peak_memory * pct / 100)
            for seed in (int(s) for s in args.seeds.split(",")):
                for workers, limit in runs:
                    t0 = time.monotonic()
                    opts = SolveOptions(time_limit=limit, seed=seed, workers=workers)
                    s, r = run_solver(g, budget, "fastsa", opts)
                    seconds = time.monotonic() - t0
                    fits = s is not None and s.summary.peak_memory <= budget
                    row = {
                        "graph": path.stem,
                        "budget": f"{pct:g}%",
                        "seed": seed,
                        "workers": workers,
                        "time_limit": limit,
                        "status": r.status if fits else "none",
                        "overhead": round(s.summary.overhead, 5) if fits and s is not None else None,
                        "peak_fraction": round(s.summary.peak_memory / base.peak_memory, 4) if s else None,
                        "seconds": round(seconds, 2),
                        "clock_dependent": "not deterministic" in (r.message or ""),
                        "message": r.message,
                    }
                    rows.append(row)
                    ovh = "-" if row["overhead"] is None else f"{100 * row['overhead']:.2f}%"
                    print(
                        f"{path.stem:26s} {pct:5g}% {seed:4d} {workers:7d} {limit:6g} {row['status']:10s} {ovh:>9s} "
                        f"{row['peak_fraction'] or 0:6.3f} {seconds:6.1f}",
                        flush=True,
                    )
    print("wrote", write_results(args.out, rows, note=args.note))


if __name__ == "__main__":
    main()
