"""How long `remat --help` and `remat solvers` take to start, and which solver modules they import
(none should: the registry's table describes the built-ins; issue 22 item 6 asks for < 1 s).

    python3 bench/startup.py [--repeat 5] [--note "loaded machine"]

Each command runs in a fresh interpreter (`python -m remat_cli ...`); the table shows the
fastest and the median wall time, and the solver modules `-X importtime` saw imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import write_results  # noqa: E402

COMMANDS = {"--help": ["--help"], "solvers": ["solvers"], "solvers --json": ["solvers", "--json"]}


def run(args: list[str], repeat: int) -> dict:
    times = []
    for _ in range(repeat):
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "remat_cli", *args], capture_output=True, check=True)
        times.append(time.monotonic() - t0)
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "remat_cli", *args], capture_output=True, text=True
    )
    solvers = sorted(
        {
            line.rsplit("|", 1)[1].strip()
            for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "remat_cli.solvers." in line
        }
    )
    return {"min_s": min(times), "median_s": statistics.median(times), "solver_modules": solvers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    rows = []
    print(f"{'command':<18}{'min s':>8}{'median s':>10}  solver modules imported")
    for label, argv in COMMANDS.items():
        r = {"command": f"remat {label}", **run(argv, args.repeat)}
        rows.append(r)
        mods = ", ".join(r["solver_modules"]) or "none"
        print(f"{label:<18}{r['min_s']:>8.2f}{r['median_s']:>10.2f}  {mods}")
    print("written:", write_results("startup", rows, note=args.note, repeat=args.repeat))


if __name__ == "__main__":
    main()
