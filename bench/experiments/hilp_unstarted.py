"""Can the H-ILP's engine find, by itself, the schedule its refined top is cut along? (issue 18)

hilp's refined top follows a whole-graph schedule (``follow``): its units are cut so that the
schedule is one of the instance's solutions, and the schedule is the engine's MIP start
(``flat_hint``). This script takes that start away. For each graph and budget it runs fastsa
(one worker, ``--fastsa-limit``), hands its schedule to hilp as the flat start (``--hint``, no
other flat start, no windows, no fallbacks), and solves the instance that follows it with no
start at all: neither fastsa's schedule nor the H-ILP's own sequential and recompute starts.
Two workers, so that no result is dropped for determinism. A row records fastsa's overhead and,
per backend, the overhead of the refined top's own schedule (None: the engine found none, so
hilp returned the start) with hilp's message.

The instance provably contains fastsa's schedule (its start decodes within the budget), so a
None says the engine found no solution of a feasible instance in the limit.

Usage (one core per run; the shipped ONNX exports):

    python bench/hilp_unstarted.py --graphs graphs/torch_unet_train.onnx --fractions 0.5
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the checkout, and bench/ for common.py

from common import export_cells, write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402
from remat_cli.solvers.hilp import solver as hilp_solver  # noqa: E402
from remat_cli.solvers.hilp import subgraphs  # noqa: E402

#: the H-ILP with the hint as its only flat start
OWN = {"flat_start": "", "windows": 0, "fallback": "none"}
_solve_instance = subgraphs.solve_instance


@contextmanager
def no_starts() -> Iterator[None]:
    """The H-ILP's start builders (fastsa's schedule translated, the sequential and the
    recompute schedules) give nothing while the block runs."""
    saved = (subgraphs.flat_hint, subgraphs.sequential_hint, subgraphs.recompute_hint)
    subgraphs.flat_hint = lambda *a, **k: (None, None)
    subgraphs.sequential_hint = lambda *a, **k: None
    subgraphs.recompute_hint = lambda *a, **k: None
    try:
        yield
    finally:
        subgraphs.flat_hint, subgraphs.sequential_hint, subgraphs.recompute_hint = saved


def unstarted(*args: Any, **kwargs: Any) -> Any:
    """solve_instance, with no start for the instance that follows the flat start (``flat``)."""
    if kwargs.get("flat") is None:
        return _solve_instance(*args, **kwargs)
    with no_starts():
        return _solve_instance(*args, **kwargs)


def refined_own(message: str) -> float | None:
    """The refined top's own overhead in hilp's message, or None where it returned its start
    (the whole-graph schedule it follows) or nothing."""
    m = re.search(r"refined \([^)]*\): ([^;]*)", message)
    if m is None or "the whole-graph schedule it follows" in m.group(1):
        return None
    o = re.search(r"\(overhead ([0-9.]+)\)", m.group(1))
    return float(o.group(1)) if o else None


def run(g: Graph, budget: int, name: str, opts: SolveOptions) -> tuple[float | None, str, Any]:
    schedule, result = run_solver(g, budget, name, opts)
    fits = schedule is not None and schedule.summary.peak_memory <= budget
    return (round(schedule.summary.overhead, 6) if fits else None), result.message, schedule


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", required=True)
    ap.add_argument("--fractions", default="0.7,0.5")
    ap.add_argument("--backends", default="highs,cpsat")
    ap.add_argument("--fastsa-limit", type=float, default=60.0)
    ap.add_argument("--limit", type=float, default=120.0, help="seconds per hilp solve")
    ap.add_argument("--out", default="hilp_unstarted")
    args = ap.parse_args()
    hilp_solver.solve_instance = unstarted
    rows = []
    for name, g, _, fraction, budget in export_cells(
        args.graphs, (float(f) for f in args.fractions.split(","))
    ):
        fs, _, start = run(g, budget, "fastsa", SolveOptions(time_limit=args.fastsa_limit, seed=0, workers=1))
        row: dict[str, Any] = {"graph": name, "nodes": len(g.nodes), "fraction": fraction, "budget": budget}
        row |= {"fastsa": fs, "fastsa_limit": args.fastsa_limit, "limit": args.limit}
        for backend in args.backends.split(","):
            if fs is None:
                row[backend] = {"refined_own": None, "message": "no fastsa schedule to follow"}
                continue
            opts = SolveOptions(
                time_limit=args.limit,
                seed=0,
                workers=2,
                hint=start.steps,
                params=OWN | {"backend": backend},
            )
            _, message, _ = run(g, budget, "hilp", opts)
            row[backend] = {"refined_own": refined_own(message), "message": message}
        rows.append(row)
        cells = [row[b]["refined_own"] for b in args.backends.split(",")]
        print(row["graph"], fraction, fs, *cells, flush=True)
    write_results(
        args.out,
        rows,
        folder=HERE / "results",
        note="refined top without any start; " + ", ".join(f"{k}={v!r}" for k, v in OWN.items()),
    )


if __name__ == "__main__":
    main()
