"""Anytime answers of `remat solve` (the default solver, auto): overhead, peak and when the first
schedule within the budget came (the schedule's solver.trace), before and after a change, each cell
run as a user runs it (one `remat solve` process from each checkout, one after the other).

    python3 bench/anytime.py --trees /work/wt/base . --graphs G.onnx ... --fractions 0.5,0.3 \
        --time-limits 15 --out anytime

A checkout without solver.trace (before the trace existed) shows no first time. Times count from
the command's start, as --time-limit does: reading a large ONNX graph on a loaded machine takes
much of a short limit.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_results  # noqa: E402


def cell(tree: Path, graph: Path, fraction: float, limit: float, solver: str, tmp: Path) -> dict[str, Any]:
    """One `remat solve` from checkout `tree`; its schedule's facts, or why there is none."""
    out = tmp / "schedule.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "remat_cli", "solve", str(graph), "-b", f"{100 * fraction:g}%",
           "-s", solver, "--time-limit", f"{limit:g}", "-q", "-o", str(out)]  # fmt: skip
    load = [round(x, 2) for x in os.getloadavg()]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=tree, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    row: dict[str, Any] = {"tree": str(tree), "graph": graph.stem, "budget": fraction, "time_limit": limit,
                           "exit": proc.returncode, "wall_seconds": round(time.monotonic() - t0, 2), "load_before": load,
                           "load_after": [round(x, 2) for x in os.getloadavg()]}  # fmt: skip
    if proc.returncode != 0 or not out.exists():
        return row | {"message": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""}
    s = json.loads(out.read_text())
    trace = s["solver"].get("trace") or {}
    return row | {
        "overhead": s["summary"]["overhead"],
        "peak_fraction": s["summary"]["peak_memory"] / s["summary"]["baseline_peak_memory"],
        "first_within_budget": trace.get("first_within_budget"),
        "solver_started": trace.get("solver_started"),
        "winner": s["solver"]["params"].get("winner") or s["solver"].get("message", "")[:60],
    }


@contextlib.contextmanager
def busy(graph: Path | None) -> Iterator[None]:
    """While the block runs, `remat solve graph -s fastsa` (two workers, an hour's limit) runs
    beside it, its own session, stopped at the end."""
    if graph is None:
        yield
        return
    cmd = [sys.executable, "-m", "remat_cli", "solve", str(graph.resolve()), "-b", "50%", "-s", "fastsa",
           "--workers", "2", "--time-limit", "3600", "-q", "-o", os.devnull]  # fmt: skip
    proc = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[1], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        yield
    finally:
        # SIGTERM: remat's watchdog then kills its solver's own process group (a SIGKILL of the
        # command would leave that solver running to its hour's limit)
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trees", nargs="+", type=Path, required=True, help="checkouts, e.g. before and after")
    ap.add_argument("--graphs", nargs="+", type=Path, required=True)
    ap.add_argument("--fractions", default="0.5,0.3")
    ap.add_argument("--time-limits", default="15")
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--out", default="anytime")
    ap.add_argument("--note", default="")
    ap.add_argument(
        "--busy",
        type=Path,
        help="a graph fastsa solves (two workers) in the background the whole time: another CPU-bound solve",
    )
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="remat-anytime-") as tmp, busy(args.busy):
        for graph in args.graphs:
            for frac in (float(f) for f in args.fractions.split(",")):
                for limit in (float(t) for t in args.time_limits.split(",")):
                    for tree in args.trees:
                        r = cell(tree.resolve(), graph.resolve(), frac, limit, args.solver, Path(tmp))
                        rows.append(r)
                        over = f"{100 * r['overhead']:.2f}%" if "overhead" in r else "none"
                        print(f"{r['graph']:<28} {frac:>4.0%} {limit:>5g} s {tree.name:<10} overhead {over:>7} "
                              f"first {r.get('first_within_budget')} started {r.get('solver_started')} "
                              f"wall {r['wall_seconds']} load {r['load_before'][0]} "
                              f"{r.get('winner') or r.get('message', '')}", flush=True)  # fmt: skip
    print(write_results(args.out, rows, note=args.note))


if __name__ == "__main__":
    main()
