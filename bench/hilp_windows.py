"""Issue 18: do the H-ILP's windows (remat_cli.solvers.hilp.windows) earn their time? For each
graph and budget: fastsa for T seconds, then the windows over its schedule for W seconds,
against fastsa alone for T + W seconds (one worker, seed 0; the same total time).

    python3 bench/hilp_windows.py --fastsa 60 --windows 20
    python3 bench/hilp_windows.py --only torch_unet_train --fractions 0.5
    python3 bench/hilp_windows.py --only /tmp/held/densenet_b16.onnx --fractions 0.4 --out hilp_windows_heldout

Prints a table and writes bench/results/hilp_windows.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.common import EXPORTS, export_cells, write_results  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.schedule import overhead  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402
from remat_cli.solvers.hilp.windows import sweep  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(EXPORTS))
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.7, 0.5])
    ap.add_argument("--fastsa", type=float, default=60.0, help="fastsa's seconds before the windows")
    ap.add_argument("--windows", type=float, default=20.0, help="the windows' seconds")
    ap.add_argument("--size", type=int, default=40, help="stages per window")
    ap.add_argument("--out", default="hilp_windows", help="bench/results/OUT.json")
    args = ap.parse_args()
    rows = []
    table = Table("graph", "budget", "fastsa T", "+ windows W", "fastsa T+W", "windows", "windows s")
    for name, g, base, frac, budget in export_cells(args.only, args.fractions):
        short, _ = run_solver(g, budget, "fastsa", SolveOptions(time_limit=args.fastsa, seed=0, workers=1))
        long, _ = run_solver(
            g, budget, "fastsa", SolveOptions(time_limit=args.fastsa + args.windows, seed=0, workers=1)
        )
        row = {"graph": name, "fraction": frac, "budget": budget, "size": args.size}
        row["fastsa"] = None if short is None else round(overhead(short.summary.cost, base.cost), 5)
        row["fastsa_longer"] = None if long is None else round(overhead(long.summary.cost, base.cost), 5)
        row["windows"] = None
        if short is not None:
            t0 = time.monotonic()
            w = sweep(g, budget, short.steps, args.size, args.windows, 0, True)
            row["windows_seconds"] = round(time.monotonic() - t0, 1)
            row["windows"] = round(overhead(w.cost, base.cost), 5)
            row["windows_note"] = w.note
        rows.append(row)
        table.add_row(
            name,
            f"{frac:.0%}",
            *(
                f"{row[k]:.2%}" if row[k] is not None else "none"
                for k in ("fastsa", "windows", "fastsa_longer")
            ),
            str(row.get("windows_note", "")),
            str(row.get("windows_seconds", "")),
        )
        Console(stderr=True).print(f"{name} {frac:.0%}: {row}")
    Console(stderr=True).print(table)
    write_results(args.out, rows, fastsa_seconds=args.fastsa, windows_seconds=args.windows)


if __name__ == "__main__":
    main()
