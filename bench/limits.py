"""The yardstick of issue 18: how good can a schedule be on the shipped ONNX training graphs?

For each graph (graphs/torch_*_train.onnx) and budget fraction of the baseline peak, the
fixed-order Checkmate MILP (Jain et al., MLSys'20, §4; the registered ``checkmate`` solver, SCIP
or HiGHS) is run with a per-cell time limit and we record its schedule's overhead (the optimum
when proven), its best lower bound on the cost (the "best bound"), and the peak lower bound
``peak_lower_bound`` (below it no schedule of any order exists). Writes bench/results/limits.json
after every cell, so a cut-short run keeps what it measured. Usage:

    nice -n 15 python3 bench/limits.py --time-limit 300 --loaded
    python3 bench/limits.py --only torch_unet_train --fractions 0.5 --time-limit 60
    python3 bench/limits.py --graphs /tmp/nets/alexnet_b1.onnx --only alexnet_b1   # bench/model_nets.py's
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import RESULTS, write_results  # noqa: E402

from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.runner import run_solver  # noqa: E402
from remat_cli.schedule import baseline, peak_lower_bound  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

NAMES = ("torch_mlp_train", "torch_unet_train", "torch_transformer_train", "torch_resnet_train")


def onnx_graphs(only: set[str], extra: list[Path]) -> dict[str, Graph]:
    """The shipped graphs and `extra` ONNX files (named by their stem), those in `only` if any."""
    paths = [ROOT / "graphs" / f"{name}.onnx" for name in NAMES] + extra
    return {p.stem: from_onnx_file(p) for p in paths if p.exists() and (not only or p.stem in only)}


def cell(g: Graph, frac: float, limit: float, backend: str) -> dict[str, object]:
    base = baseline(g)
    budget = int(frac * base.peak_memory)
    floor = peak_lower_bound(g)
    row: dict[str, object] = {
        "fraction": frac,
        "budget": budget,
        "peak_lower_bound_fraction": round(floor / base.peak_memory, 5),
    }
    if budget < floor:
        return row | {"status": "infeasible (below the peak lower bound)", "best_bound": None}
    t0 = time.monotonic()
    sched, res = run_solver(
        g, budget, "checkmate", SolveOptions(time_limit=limit, seed=0, workers=1, params={"backend": backend})
    )
    bound = None
    if res.lower_bound is not None and base.cost > 0:
        bound = round(max(0.0, res.lower_bound / base.cost - 1), 6)
    overhead = None if sched is None else round(sched.summary.overhead, 6)
    if res.status == "optimal" and overhead is not None:
        bound = overhead
    return row | {
        "checkmate_status": res.status,
        "checkmate_overhead": overhead,
        # lower bound on the overhead over all fixed-order schedules (None: the engine gave none)
        "best_bound": bound,
        "seconds": round(time.monotonic() - t0, 1),
        "message": res.message,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--graphs", nargs="*", type=Path, default=[], help="more ONNX training graphs")
    ap.add_argument("--fractions", default="0.7,0.6,0.5,0.4")
    ap.add_argument("--time-limit", type=float, default=300)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--loaded", action="store_true", help="note that the machine was shared")
    args = ap.parse_args()
    # cells measured before (another --only/--fractions run) are kept; a cell run again replaces them
    old = RESULTS / "limits.json"
    rows: list[dict[str, object]] = json.loads(old.read_text())["rows"] if old.exists() else []
    for name, g in onnx_graphs({s for s in args.only.split(",") if s}, args.graphs).items():
        for frac in (float(f) for f in args.fractions.split(",")):
            row = {"graph": name, "nodes": len(g.nodes)} | cell(g, frac, args.time_limit, args.backend)
            rows = [r for r in rows if (r["graph"], r["fraction"]) != (name, row["fraction"])] + [row]
            print(
                f"{name:24s} {frac:4.0%} checkmate {row.get('checkmate_status')} "
                f"overhead {row.get('checkmate_overhead')} bound {row.get('best_bound')} "
                f"({row.get('seconds')} s)",
                flush=True,
            )
            write_results(
                "limits",
                rows,
                time_limit=args.time_limit,
                note="loaded machine (2 cores shared by ~8 engineers)" if args.loaded else "",
            )


if __name__ == "__main__":
    main()
