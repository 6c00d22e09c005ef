"""Scale: `remat info`, `convert`, `solve --solver greedy` and `validate` on generated training
graphs of about 1k, 10k and 100k nodes, each command in its own process; wall time and peak RSS
(issue 20). The exponent column is log(t_n / t_prev) / log(n / n_prev): 1 is linear, 2 quadratic.

The graphs: a forward chain of n/2 nodes with skip connections (20% of the nodes read one of the
8 before the previous as well), a loss, and the backward pass (`generators.training_graph`).

    python bench/scale.py [--sizes 1000,10000,100000] [--budget 80%] [--time-limit S]
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from common import write_results

from remat_cli.graph import Graph
from remat_cli.importers.generators import Forward, training_graph


def scale_graph(nodes: int, seed: int = 0) -> Graph:
    """A training graph of `nodes` nodes (forward n/2, loss, backward n/2), built in O(n)."""
    rng = np.random.default_rng(seed)
    fw = Forward()
    for k in range(nodes // 2):
        preds = [k - 1] if k else []
        if k > 10 and rng.random() < 0.2:
            preds.append(int(k - rng.integers(2, 10)))
        fw.add(f"f{k}", preds, int(rng.integers(1, 11)) * 1000, float(rng.integers(1, 11)))
    return training_graph(fw, f"scale_{2 * (nodes // 2) + 1}", input_size=1000)


def timed(cmd: list[str]) -> tuple[int, float, int, str]:
    """(exit code, wall seconds, peak RSS in bytes, last stderr line) of one command."""
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    stderr = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - t0
    return proc.returncode, wall, usage.ru_maxrss * 1024, (stderr.strip().splitlines() or [""])[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,10000,100000")
    ap.add_argument("--budget", default="80%")
    ap.add_argument("--time-limit", type=float, default=None, help="for solve (default: none)")
    ap.add_argument("--note", default="quiet machine (2 cores)", help="recorded with the results")
    args = ap.parse_args()
    remat = [sys.executable, "-m", "remat_cli"]
    rows = []
    print(f"{'nodes':>7} {'command':9} {'exit':>4} {'wall s':>8} {'peak RSS MB':>11} {'exponent':>8}")
    prev: dict[str, tuple[int, float]] = {}
    with tempfile.TemporaryDirectory(prefix="remat-scale-") as tmp:
        for size in (int(s) for s in args.sizes.split(",")):
            g = scale_graph(size)
            path = Path(tmp, f"g{size}.json")
            path.write_text(g.to_json())
            sched = Path(tmp, f"s{size}.json")
            solve = [*remat, "solve", str(path), "-b", args.budget, "-s", "greedy", "-q", "-o", str(sched)]
            if args.time_limit:
                solve += ["--time-limit", str(args.time_limit)]
            commands = {
                "info": [*remat, "info", str(path), "--json"],
                "convert": [*remat, "convert", str(path), "-o", str(Path(tmp, f"c{size}.json"))],
                "solve": solve,
                "validate": [*remat, "validate", str(path), str(sched)],
            }
            for name, cmd in commands.items():
                code, wall, rss, last = timed(cmd)
                exponent = None
                if name in prev:
                    n0, t0 = prev[name]
                    exponent = math.log(wall / t0) / math.log(len(g.nodes) / n0)
                prev[name] = (len(g.nodes), wall)
                rows.append(
                    {
                        "nodes": len(g.nodes),
                        "values": len(g.values),
                        "command": name,
                        "exit": code,
                        "wall_seconds": round(wall, 2),
                        "peak_rss_bytes": rss,
                        "exponent_vs_previous_size": None if exponent is None else round(exponent, 2),
                        "message": last if code else None,
                    }
                )
                exp = f"{exponent:8.2f}" if exponent is not None else f"{'':8}"
                print(
                    f"{len(g.nodes):>7} {name:9} {code:>4} {wall:>8.2f} {rss / 1e6:>11.1f} {exp}", flush=True
                )
    path = write_results("scale", rows, note=args.note)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
