"""FastSA's pinned rounds (issue 18): fastsa with `--pins 0` (no pinned rounds) and as shipped,
each alone with the same time limit, one worker, on the shipped ONNX training exports (and any
other graph given by path) at each budget fraction.

    python3 bench/fastsa_pins.py [--time-limit 60] [--fractions 0.7,0.6,0.5,0.4] [--seeds 0]
        [--only torch_unet_train ...] [--graphs other.onnx ...] [--out fastsa_pins]

Per cell and seed: overhead and seconds of both runs, and which node the winning round pinned
(none: an unpinned round won). Writes bench/results/<out>.json.
"""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import ab_args, ab_cells, write_results  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

PINNED = re.compile(r"; (\S+) pinned last")


def run(g, budget: int, base_cost: float, seed: int, limit: float, pins: int | None) -> dict:  # noqa: ANN001
    params = {} if pins is None else {"pins": pins}
    t = time.monotonic()
    sched, res = run_solver(
        g, budget, "fastsa", SolveOptions(time_limit=limit, seed=seed, workers=1, params=params)
    )
    ok = sched is not None and sched.summary.peak_memory <= budget
    pinned = PINNED.findall(res.message or "")
    return {
        "overhead": round(sched.summary.cost / base_cost - 1, 5) if ok else None,
        "seconds": round(time.monotonic() - t, 1),
        "winner_pinned": pinned[0] if ok and pinned else None,
    }


def main() -> None:
    args = ab_args(__doc__, "fastsa_pins", "0.7,0.6,0.5,0.4")
    rows = []
    print(f"{'graph':26s} {'budget':>6s} {'seed':>4s} {'--pins 0':>9s} {'shipped':>9s}  winner pinned")
    for name, g, base, frac, budget, seed in ab_cells(args):
        off = run(g, budget, base.cost, seed, args.time_limit, 0)
        on = run(g, budget, base.cost, seed, args.time_limit, None)
        rows.append({"graph": name, "fraction": frac, "seed": seed, "no_pins": off, "pins": on})

        def pct(r: dict) -> str:
            return "none" if r["overhead"] is None else f"{100 * r['overhead']:.2f}%"

        print(
            f"{name:26s} {frac:6.0%} {seed:4d} {pct(off):>9s} {pct(on):>9s}  {on['winner_pinned'] or '-'}",
            flush=True,
        )
    write_results(args.out, rows, time_limit=args.time_limit, note=args.note)


if __name__ == "__main__":
    main()
