"""Benchmark of the xengine solver (XEngine, TACO 2023) on a synthetic CPU + accelerator profile:
the accelerator 10× faster with a quarter of the CPU's memory, joined by a PCIe-like link
(remat_cli.devices.synthetic_devices). Budgets: "full" = CPU 100% / accelerator 25% of the
baseline peak, "25%" = both 25% (each at least the graph's peak lower bound, so that one
operator alone fits). Writes bench/results/xengine.json.

Reference (issue 17): XEngine reports 5–22% lower time than the best single device with
sufficient memory, and +3…+10% time at 25% memory. Each row has xengine's cost, the best
single-device schedule's cost (the project's single-device solvers on each device, placed on
it), the copies, the solve time, status and gap. Usage:

    python3 bench/xengine.py [--time-limit 60] [--only unet_d3,vgg16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from common import write_results  # noqa: E402

from remat_cli.devices import synthetic_devices  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import generators as G  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.schedule import baseline, peak_lower_bound  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def vgg_like(n: int, seed: int = 0) -> Graph:
    """A chain training graph whose activations shrink with depth and costs grow (VGG-like)."""
    fw = G.Forward()
    size, cost = 3_211_264, 1.0
    for k in range(n):
        fw.add(f"conv{k}", [k - 1] if k else [], size, cost)
        if k % 2 == 1:
            size, cost = size // 2, cost * 1.4
    return G.training_graph(fw, f"vgg_like_{n}", input_size=602_112, param_size=0)


def graphs() -> dict[str, Graph]:
    out = {
        "vgg_like_8": vgg_like(8),
        "unet_d2_c2": G.unet(depth=2, convs=2, seed=0),
        "unet_d3_c2": G.unet(depth=3, convs=2, seed=0),
        "vgg_like_16": vgg_like(16),
        "unet_train.json": load_graph(ROOT / "graphs" / "unet_train.json"),
        "transformer_train.json": load_graph(ROOT / "graphs" / "transformer_train.json"),
        "torch_unet_train.onnx": load_graph(ROOT / "graphs" / "torch_unet_train.onnx"),
        "torch_resnet_train.onnx": load_graph(ROOT / "graphs" / "torch_resnet_train.onnx"),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    rows = []
    chosen = [s for s in args.only.split(",") if s]
    for name, g0 in graphs().items():
        if chosen and name not in chosen:
            continue
        g = synthetic_devices(g0, speedup=10.0, memory_fraction=0.25)
        peak, low = baseline(g0).peak_memory, peak_lower_bound(g0)
        for label, budgets in (
            ("full", {"cpu": peak, "accel": max(int(0.25 * peak), low)}),
            ("25%", {"cpu": max(int(0.25 * peak), low), "accel": max(int(0.25 * peak), low)}),
        ):
            opts = SolveOptions(time_limit=args.time_limit, seed=0, workers=1, budgets=budgets)
            t0 = time.monotonic()
            s, r = run_solver(g, max(budgets.values()), "xengine", opts)
            seconds = time.monotonic() - t0
            best = r.params.get("best_single_device_cost")
            row = {
                "graph": name,
                "nodes": len(g.needed_nodes),
                "devices": ["cpu (home)", "accel (10x faster)"],
                "budget": label,
                "budgets": budgets,
                "cost": s.summary.cost if s and s.solver.status != "infeasible" else None,
                "best_single_device_cost": best,
                "best_single_device": r.params.get("best_single_device"),
                "cpu_only_cost": r.params.get("single_cost_cpu"),
                "accel_only_cost": r.params.get("single_cost_accel"),
                "copies": s.summary.copies if s else None,
                "copy_cost": s.summary.copy_cost if s else None,
                "peak_memory_by_device": s.summary.peak_memory_by_device if s else None,
                "seconds": round(seconds, 2),
                "status": s.solver.status if s else r.status,
                "gap": s.solver.gap if s else None,
                "message": r.message,
            }
            if row["cost"] is not None and best:
                row["vs_best_single_device"] = row["cost"] / best - 1
            rows.append(row)
            vs = f"{100 * row['vs_best_single_device']:+.1f}%" if "vs_best_single_device" in row else "—"
            print(
                f"{name:26s} {label:5s} n={row['nodes']:4d} cost={row['cost']} best_single={best} "
                f"({row['best_single_device']}) {vs} copies={row['copies']} {row['status']} "
                f"gap={row['gap']} {seconds:.1f}s",
                flush=True,
            )
    write_results(
        "xengine", rows, note="loaded machine (2 cores shared by ~8 engineers); costs are sequential"
    )


if __name__ == "__main__":
    main()
