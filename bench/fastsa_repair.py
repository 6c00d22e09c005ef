"""FastSA's peak repair (issue 18): fastsa with `--repair false` and as shipped, each alone with
the same time limit, one worker, on the shipped ONNX training exports and any other graph given
by path, at each budget fraction.

    python3 bench/fastsa_repair.py [--time-limit 60] [--fractions 0.6,0.5,0.4] [--seeds 0]
        [--only torch_mlp_train ...] [--graphs /tmp/held/bert_b8.onnx ...] [--out fastsa_repair]

Per cell and seed: overhead (none: nothing within the budget) and seconds of both runs, and
whether the shipped run repaired a round. Writes bench/results/<out>.json.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ab_args, ab_cells, write_results  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def run(g, budget: int, base_cost: float, seed: int, limit: float, repair: bool) -> dict:  # noqa: ANN001
    t = time.monotonic()
    sched, res = run_solver(
        g, budget, "fastsa", SolveOptions(time_limit=limit, seed=seed, workers=1, params={"repair": repair})
    )
    ok = sched is not None and sched.summary.peak_memory <= budget
    return {
        "overhead": round(sched.summary.cost / base_cost - 1, 5) if ok else None,
        "seconds": round(time.monotonic() - t, 1),
        "repaired": "repaired at its peak" in (res.message or ""),  # a round of it, this one or one before
    }


def main() -> None:
    args = ab_args(__doc__, "fastsa_repair", "0.6,0.5,0.4")
    rows = []
    print(f"{'graph':26s} {'budget':>6s} {'seed':>4s} {'no repair':>9s} {'shipped':>9s}  repaired")
    for name, g, base, frac, budget, seed in ab_cells(args):
        off = run(g, budget, base.cost, seed, args.time_limit, False)
        on = run(g, budget, base.cost, seed, args.time_limit, True)
        rows.append({"graph": name, "fraction": frac, "seed": seed, "no_repair": off, "repair": on})

        def pct(r: dict) -> str:
            return "none" if r["overhead"] is None else f"{100 * r['overhead']:.2f}%"

        print(f"{name:26s} {frac:6.0%} {seed:4d} {pct(off):>9s} {pct(on):>9s}  {on['repaired']}", flush=True)
    write_results(args.out, rows, time_limit=args.time_limit, note=args.note)


if __name__ == "__main__":
    main()
