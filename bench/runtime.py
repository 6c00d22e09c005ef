"""Acceptance of `remat run` (issue 7) on the shipped ONNX training graphs.

For every graph in graphs/torch_*_train.onnx, the checkpoint-all schedule and a 70%-budget schedule
(greedy by default) are replayed in interpret mode and in session mode on the CPU. Checked:
outputs match the unscheduled run; interpret-mode peak = predicted within 1%; session-mode
peak within 15% of predicted and (70% schedule) below the unscheduled run's peak; measured
time overhead next to the predicted one.

    python3 bench/runtime.py [--solver greedy] [--budget 0.7] [--repeat 5] [--only mlp unet]

Writes bench/results/runtime.json.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_results  # noqa: E402

from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.runner import run_solver  # noqa: E402
from remat_cli.runtime import run_schedule  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--solver", default="greedy", help="solver for the reduced-budget schedule")
    ap.add_argument("--budget", type=float, default=0.7, help="fraction of the baseline peak")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--only", nargs="*")
    args = ap.parse_args()

    rows = []
    for path in sorted((ROOT / "graphs").glob("torch_*_train.onnx")):
        name = path.stem.removeprefix("torch_").removesuffix("_train")
        if args.only and name not in args.only:
            continue
        graph = from_onnx_file(path)
        base = baseline(graph)
        budgets = [("checkpoint-all", None), (args.solver, int(args.budget * base.peak_memory))]
        for solver, budget in budgets:
            sched, result = run_solver(
                graph, budget or base.peak_memory, solver, SolveOptions(time_limit=args.time_limit, seed=0)
            )
            if sched is None:
                rows.append({"graph": name, "solver": solver, "budget": budget, "error": result.message})
                continue
            for mode in ("interpret", "session"):
                t0 = time.perf_counter()
                rep = run_schedule(path, graph, sched, mode=mode, repeat=args.repeat, warmup=args.warmup)
                row = {
                    "graph": name,
                    "solver": solver,
                    "budget": budget,
                    "budget_fraction": None if budget is None else args.budget,
                    "mode": mode,
                    "outputs_match": rep.outputs_match,
                    "predicted_peak": rep.predicted.peak_memory,
                    "measured_peak": rep.measured.peak_memory,
                    "unscheduled_peak": rep.unscheduled.peak_memory,
                    "memory_error": rep.memory_error,
                    "predicted_overhead": rep.predicted.overhead,
                    "measured_overhead": rep.time_overhead,
                    "measured_cpu_overhead": rep.cpu_time_overhead,
                    "seconds": rep.measured.seconds,
                    "unscheduled_seconds": rep.unscheduled.seconds,
                    "order_kept": rep.order_kept,
                    "recomputations": sched.summary.recomputations,
                    "wall": round(time.perf_counter() - t0, 2),
                }
                tol = 0.01 if mode == "interpret" else 0.15
                below = rep.measured.peak_memory < rep.unscheduled.peak_memory
                row["accepted"] = bool(
                    rep.outputs_match
                    and abs(rep.memory_error) <= tol
                    and (mode == "interpret" or budget is None or below)
                    and rep.order_kept is not False
                )
                rows.append(row)
                _print_row(row)
    accepted = all(r.get("accepted", False) for r in rows)
    path = write_results(
        "runtime",
        rows,
        all_accepted=accepted,
        note="CPU provider, one intra-op thread; 2 shared cores under load from other jobs, so times are noisy",
    )
    print(f"all accepted: {accepted}  -> {path.relative_to(ROOT)}")


def _print_row(r: dict) -> None:
    mib = 2**20
    print(
        f"{r['graph']:<12} {r['solver']:<15} {r['mode']:<9} match={str(r['outputs_match']):<5} "
        f"pred {r['predicted_peak'] / mib:7.2f} MiB  meas {r['measured_peak'] / mib:7.2f} MiB "
        f"({r['memory_error']:+6.1%})  unsched {r['unscheduled_peak'] / mib:7.2f} MiB  "
        f"overhead pred {r['predicted_overhead']:+6.1%} meas {r['measured_overhead']:+6.1%} "
        f"(CPU {r['measured_cpu_overhead']:+6.1%})  "
        f"{'OK' if r['accepted'] else 'FAIL'}",
        flush=True,
    )


if __name__ == "__main__":
    main()
