"""The sweep bar (issue 19): the 6 Moccasin benchmark graphs × 5 budgets × 3 solvers with
`remat sweep`, interrupted with Ctrl-C (SIGINT) part-way, resumed, then plotted and reported.

    python3 bench/sweep.py [--out /tmp/remat-sweep] [--time-limit 10] [--interrupt-after 240]
                           [--solvers greedy,fastsa,moccasin] [--budgets 90%,80%,70%,60%,50%]

Checks that the resumed run re-runs no finished cell: the records after the interrupt, plus the
cells the resumed run reports as run, equal the cells, and every cell key appears exactly once.
Writes bench/results/sweep.json (commands, counts, per-cell records without host/paths) and
puts tradeoff.png and report.html beside the results.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import GRAPHS, MOCCASIN, write_results  # noqa: E402

from remat_cli.sweep.cells import read_records, record_key  # noqa: E402

REMAT = [sys.executable, "-m", "remat_cli"]


def shown(cmd: list[str]) -> str:
    return " ".join(f"'{a}'" if " " in a or "(" in a else a for a in ["remat", *cmd[3:]])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="/tmp/remat-sweep")
    ap.add_argument("--time-limit", type=float, default=10.0)
    ap.add_argument("--interrupt-after", type=float, default=240.0)
    ap.add_argument("--solvers", default="greedy,fastsa,moccasin")
    ap.add_argument("--budgets", default="90%,80%,70%,60%,50%")
    ap.add_argument("--note", default="loaded machine: 2 cores shared with other engineers' jobs")
    args = ap.parse_args()
    out = Path(args.out)
    files = [str(MOCCASIN / f) for f in GRAPHS.values()]
    sweep = [*REMAT, "sweep", *files, "--budgets", args.budgets, "--solvers", args.solvers]
    sweep += ["--time-limit", f"{args.time_limit:g}", "-o", str(out), "-q"]
    n_cells = len(files) * len(args.budgets.split(",")) * len(args.solvers.split(","))
    before = len(read_records(out))

    # 1. start, Ctrl-C after a while (SIGINT to the sweep process only, as a terminal would send)
    t0 = time.monotonic()
    # SIGINT back to its default in the child: a shell starts background jobs with it ignored,
    # and Python only turns SIGINT into KeyboardInterrupt when it is not ignored at start-up
    proc = subprocess.Popen(
        sweep,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        _, first_err = proc.communicate(timeout=args.interrupt_after)
        interrupted = False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        _, first_err = proc.communicate()
        interrupted = True
    first_seconds = time.monotonic() - t0
    after_interrupt = read_records(out)
    print(first_err.strip().splitlines()[-2:], f"exit {proc.returncode}", file=sys.stderr)

    # 2. the same command again resumes
    t1 = time.monotonic()
    second = subprocess.run(sweep, stderr=subprocess.PIPE, text=True)
    resume_seconds = time.monotonic() - t1
    final = read_records(out)
    m = re.search(r"(\d+) cells ran, (\d+) already", second.stderr)
    ran_on_resume, already_on_resume = (int(m.group(1)), int(m.group(2))) if m else (None, None)
    keys = [record_key(r) for r in final]
    checks = {
        "records": len(final),
        "cells": n_cells,
        "unique_keys": len(set(keys)),
        "records_after_interrupt": len(after_interrupt),
        "ran_on_resume": ran_on_resume,
        "already_on_resume": already_on_resume,
        "no_cell_rerun": len(set(keys)) == len(keys) == n_cells
        and already_on_resume == len(after_interrupt)
        and ran_on_resume == n_cells - len(after_interrupt),
    }
    print(json.dumps(checks), file=sys.stderr)

    # 3. pictures
    plot = [*REMAT, "plot", str(out), "-o", str(out / "tradeoff.png")]
    report = [*REMAT, "report", str(out), "-o", str(out / "report.html")]
    pictures = {name: subprocess.run(cmd).returncode for name, cmd in (("plot", plot), ("report", report))}
    rows = [
        {k: v for k, v in r.items() if k not in ("host", "graph_file", "message", "backend")}
        | {"file": Path(r["graph_file"]).name}
        for r in final
    ]
    statuses: dict[str, int] = {}
    for r in final:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    write_results(
        "sweep",
        rows,
        note=args.note,
        load_average=os.getloadavg(),
        commands={
            "sweep": shown(sweep),
            "interrupt": f"SIGINT after {args.interrupt_after:g}s" if interrupted else "finished before it",
            "resume": shown(sweep),
            "plot": shown(plot),
            "report": shown(report),
        },
        first_run={"seconds": round(first_seconds, 1), "exit": proc.returncode, "records_before": before},
        resume={"seconds": round(resume_seconds, 1), "exit": second.returncode},
        checks=checks,
        statuses=statuses,
        pictures_exit=pictures,
    )


if __name__ == "__main__":
    main()
