"""Speed unchanged by a refactor: three figures of two checkouts, measured paired.

    python3 bench/refactor_speed.py --before /work/wt/base                     # after: this checkout
    python3 bench/refactor_speed.py --before /work/wt/base --after /work/main --pairs 7

Figures, each of a fresh interpreter that imports the checkout (PYTHONPATH; bytecode and numba's
cache in a temporary folder per checkout, so a read-only checkout is measured like any other):

- ``startup``: ``python -m remat_cli --help``, the whole process's wall seconds;
- ``greedy``: ``remat solve RL_n1000 --budget 80% --solver greedy --workers 1``, the solver's own
  seconds (``solver.seconds`` of the schedule) and the whole process's wall seconds;
- ``fastsa``: moves per second, fastsa's iterations (``iterations_run``) over its seconds, one
  worker, one round of 2,000,000 + 200,000 iterations on RL n1000 at 80% (no greedy start, no
  kicks: the annealing itself), after one short solve that loads the kernels.

RL n1000 is the published random layered graph of the MOCCASIN and FastSA tables
(REMAT_BENCH_GRAPHS or ../shared/benchmarks/moccasin beside the checkout; ``--graph`` another):
``remat generate random-layered --n 1000`` makes a graph with other sizes, on which greedy finds no
schedule within 80% (and spends seconds trying).

Before and after run in turn (B A B A ...) after one warm-up each; the ratio after/before is
taken pair by pair and its median is the verdict (``within`` 5% by default). Times measured on
a shared machine move with its load: compare the ratio, never a figure against an older run.
Writes bench/results/refactor_speed.json.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "refactor_speed.json"
TMP = Path(tempfile.gettempdir())
RL1000 = (
    Path(os.environ.get("REMAT_BENCH_GRAPHS", ROOT.parent / "shared/benchmarks/moccasin"))
    / "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json"
)

FASTSA = """
import json, sys, remat_cli
g = remat_cli.load_graph(sys.argv[1])
opts = dict(solver="fastsa", seed=0, workers=1, rounds=1, greedy_start=False, kicks=0.0)
remat_cli.solve(g, "80%", iterations=1000, iterations2=100, **opts)  # loads the kernels
s = remat_cli.solve(g, "80%", iterations=2_000_000, iterations2=200_000, **opts)
p = s.solver.params
print(json.dumps({"iterations": p["iterations_run"], "seconds": s.solver.seconds,
                  "wall_stopped": p["wall_stopped"], "file": remat_cli.__file__}))
"""


def side_env(checkout: Path) -> dict[str, str]:
    """The environment that makes a fresh interpreter import `checkout`'s remat_cli, its bytecode
    and numba cache kept in a temporary folder of its own."""
    tag = hashlib.sha256(str(checkout).encode()).hexdigest()[:12]
    return {
        **os.environ,
        "PYTHONPATH": str(checkout),
        "PYTHONPYCACHEPREFIX": str(TMP / f"remat-speed-{tag}" / "pyc"),
        "NUMBA_CACHE_DIR": str(TMP / f"remat-speed-{tag}" / "numba"),
    }


def run(argv: list[str], env: dict[str, str]) -> tuple[float, str]:
    """Wall seconds and stdout of one process (cwd: the temporary folder, so that ``-m`` does not
    find a remat_cli in the current directory)."""
    t0 = time.monotonic()
    p = subprocess.run(argv, env=env, cwd=TMP, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(
            f"refactor_speed: {shlex.join(argv)} exited {p.returncode}: {p.stderr.strip()[-500:]}"
        )
    return wall, p.stdout


def measure(name: str, checkout: Path, graph: Path) -> dict[str, float]:
    """One run of figure `name` on `checkout`: its figures by name."""
    py, env = sys.executable, side_env(checkout)
    if name == "startup":
        wall, _ = run([py, "-m", "remat_cli", "--help"], env)
        return {"wall_s": wall}
    if name == "greedy":
        argv = [
            py,
            "-m",
            "remat_cli",
            "solve",
            str(graph),
            "--budget",
            "80%",
            "--solver",
            "greedy",
            "--workers",
            "1",
        ]
        wall, out = run(argv, env)
        return {"solver_s": json.loads(out)["solver"]["seconds"], "wall_s": wall}
    _, out = run([py, "-c", FASTSA, str(graph)], env)
    r = json.loads(out)
    if not Path(r["file"]).resolve().is_relative_to(checkout):
        raise SystemExit(f"refactor_speed: remat_cli imported from {r['file']}, not from {checkout}")
    return {
        "moves_per_s": r["iterations"] / r["seconds"],
        "solver_s": r["seconds"],
        "wall_stopped": r["wall_stopped"],
    }


#: the figure of each measure that the verdict reads, and whether higher is better
VERDICT = {"startup": ("wall_s", False), "greedy": ("solver_s", False), "fastsa": ("moves_per_s", True)}


def paired(name: str, before: Path, after: Path, graph: Path, pairs: int) -> dict[str, Any]:
    """`pairs` runs of each side in turn after one warm-up each; per figure the medians and the
    pair-by-pair ratio after/before."""
    measure(name, before, graph), measure(name, after, graph)  # warm-up: bytecode, numba cache
    runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for _ in range(pairs):
        runs["before"].append(measure(name, before, graph))
        runs["after"].append(measure(name, after, graph))
    out: dict[str, Any] = {"runs": runs}
    for key in runs["before"][0]:
        if key == "wall_stopped":
            out["wall_stopped"] = any(r[key] for side in runs.values() for r in side)
            continue
        ratios = [a[key] / b[key] for a, b in zip(runs["after"], runs["before"], strict=True)]
        out[key] = {
            "before_median": statistics.median(r[key] for r in runs["before"]),
            "after_median": statistics.median(r[key] for r in runs["after"]),
            "ratio_median": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="the reference checkout")
    ap.add_argument("--after", type=Path, default=ROOT, help="the checkout measured (default: this one)")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--within", type=float, default=0.05, help="allowed change of the median ratio")
    ap.add_argument("--only", default="startup,greedy,fastsa")
    ap.add_argument("--graph", type=Path, default=RL1000, help="the graph of greedy and fastsa")
    ap.add_argument("--note", default="", help="the machine's load, for the reader")
    args = ap.parse_args()
    before, after = args.before.resolve(), args.after.resolve()
    graph = args.graph.resolve()
    if not graph.is_file():
        print(f"refactor_speed: no graph {graph} (set REMAT_BENCH_GRAPHS or --graph)", file=sys.stderr)
        return 2
    rows, slower = [], []
    print(f"{'figure':<22}{'before':>12}{'after':>12}{'after/before':>14}{'min':>8}{'max':>8}")
    for name in args.only.split(","):
        r = {"figure": name, **paired(name, before, after, graph, args.pairs)}
        key, higher_better = VERDICT[name]
        change = r[key]["ratio_median"] - 1
        r["verdict"] = (
            "unchanged"
            if abs(change) <= args.within
            else ("faster" if (change > 0) == higher_better else "slower")
        )
        if r["verdict"] == "slower":
            slower.append(name)
        rows.append(r)
        for k, v in r.items():
            if isinstance(v, dict) and "ratio_median" in v:
                print(
                    f"{name + ' ' + k:<22}{v['before_median']:>12.4g}{v['after_median']:>12.4g}"
                    f"{v['ratio_median']:>14.3f}{v['ratio_min']:>8.3f}{v['ratio_max']:>8.3f}"
                )
        print(f"  {name}: {r['verdict']} ({key}, median ratio {r[key]['ratio_median']:.3f})")
    record = {
        "command": shlex.join([Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "before": {"checkout": str(before), "commit": git_head(before)},
        "after": {"checkout": str(after), "commit": git_head(after)},
        "graph": str(graph),
        "pairs": args.pairs,
        "within": args.within,
        "load_average": os.getloadavg(),
        "cpus": os.cpu_count(),
        "note": args.note,
        "rows": rows,
    }
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(record, indent=1) + "\n")
    print(f"written: {RESULTS}")
    return 1 if slower else 0


def git_head(checkout: Path) -> str | None:
    p = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    return p.stdout.strip() or None


if __name__ == "__main__":
    sys.exit(main())
