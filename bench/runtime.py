"""Acceptance of `remat run` (issue 7) on the shipped ONNX training graphs.

For every graph in graphs/torch_*_train.onnx, the checkpoint-all schedule and a 70%-budget schedule
(greedy by default) are replayed in interpret mode and in session mode on the CPU. Checked:
outputs match the unscheduled run; interpret-mode peak = predicted within 1%; session-mode
peak within 15% of predicted and (70% schedule) below the unscheduled run's peak; measured
time overhead next to the predicted one.

    python3 bench/runtime.py [--solver greedy] [--budget 0.7] [--repeat 5] [--only mlp unet]
                             [--provider cuda] [--out runtime_cuda]

Writes bench/results/runtime.json (or --out). On CUDA, session mode's peak is what onnxruntime's
CUDA arena reserved (live tensors plus regions it could not reuse), not the live bytes, so its
15% tolerance is reported, not expected to hold. `--from-reports DIR --command CMD` makes the rows
from `remat run --json` reports saved as DIR/GRAPH_PERCENT_MODE.json (a device machine's run,
with CMD the commands that made them) instead of running here.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
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
    ap.add_argument("--provider", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--out", default="runtime", help="bench/results/OUT.json")
    ap.add_argument("--from-reports", type=Path, help="rows from saved `remat run --json` reports")
    ap.add_argument("--command", default="", help="with --from-reports: the commands that made them")
    args = ap.parse_args()
    if args.from_reports:
        rows = [_row(json.loads(f.read_text())) for f in sorted(args.from_reports.glob("*_*_*.json"))]
        for row in rows:
            _print_row(row)
        path = write_results(args.out, rows, reports_made_by=args.command, note=_note(rows[0]["provider"]))
        print(f"-> {path.relative_to(ROOT)}")
        return

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
                rep = run_schedule(
                    path,
                    graph,
                    sched,
                    provider=args.provider,
                    mode=mode,
                    repeat=args.repeat,
                    warmup=args.warmup,
                )
                row = _row(json.loads(rep.to_json()), args.budget)
                row["wall"] = round(time.perf_counter() - t0, 2)
                rows.append(row)
                _print_row(row)
    accepted = all(r.get("accepted", False) for r in rows)
    path = write_results(args.out, rows, all_accepted=accepted, note=_note(args.provider))
    print(f"all accepted: {accepted}  -> {path.relative_to(ROOT)}")


def _note(provider: str) -> str:
    if provider == "cuda":
        return "CUDA provider (onnxruntime-gpu), one intra-op thread; session peak = what the CUDA arena reserved"
    return "CPU provider, one intra-op thread; 2 shared cores under load from other jobs, so times are noisy"


def _row(rep: dict, fraction: float | None = None) -> dict:
    """One table row from a run report (`remat run --json`)."""
    predicted, measured, unscheduled = rep["predicted"], rep["measured"], rep["unscheduled"]
    budget = None if rep["solver"] == "checkpoint-all" else rep["budget"]
    if fraction is None and budget is not None:
        fraction = round(budget / predicted["baseline_peak_memory"], 3)
    row = {
        "graph": rep["graph"].removeprefix("torch_").removesuffix("_train"),
        "solver": rep["solver"],
        "budget": budget,
        "budget_fraction": None if budget is None else fraction,
        "provider": rep["provider"],
        "mode": rep["mode"],
        "outputs_match": rep["outputs_match"],
        "predicted_peak": predicted["peak_memory"],
        "measured_peak": measured["peak_memory"],
        "unscheduled_peak": unscheduled["peak_memory"],
        "memory_error": rep["memory_error"],
        "predicted_overhead": predicted["overhead"],
        "measured_overhead": rep["time_overhead"],
        "measured_cpu_overhead": rep["cpu_time_overhead"],
        "seconds": measured["seconds"],
        "unscheduled_seconds": unscheduled["seconds"],
        "order_kept": rep["order_kept"],
    }
    tol = 0.01 if row["mode"] == "interpret" else 0.15
    below = row["measured_peak"] < row["unscheduled_peak"]
    row["accepted"] = bool(
        row["outputs_match"]
        and abs(row["memory_error"]) <= tol
        and (row["mode"] == "interpret" or budget is None or below)
        and row["order_kept"] is not False
    )
    return row


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
