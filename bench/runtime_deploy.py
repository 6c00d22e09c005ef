"""Deployment truth in onnxruntime (CPU): what a schedule's peak and time are under the settings
people deploy with, against remat's replay settings, `remat apply`'s model and the plan executor.

Per model: `remat optimize --level extended` (fusions kept), then per budget (100/70/50% of the
optimized graph's baseline peak) the schedule of --solver (auto, the default, for --time-limit
seconds: what a user gets) on the graph costed by --cost (``profile``, the default: each node's
onnxruntime CPU time, so the predicted overhead is in the seconds the target is judged in), with
a memory plan fitted to the budget (`execution.fit.fit_plan`, 64-byte alignment: solved again
below the budget where the arena and the resident bytes pass it), `remat apply`. Rows, all on the same seeded inputs, peaks in fresh subprocesses, times interleaved
in one more (median of --repeat runs after a warm-up):

Two groups of rows, one with glibc's mmap threshold lowered to 64 KiB (as `remat run` measures:
every freed tensor goes back to the OS) and one with glibc as a deployment has it:

- deployed (mmap64k): the applied model under remat's replay settings, which are the deployed
  ones (optimizers, arena, pattern, reuse off; the file's order)
- ort_defaults: the applied model under onnxruntime's defaults, CSE off
- ort_defaults_unscheduled: the optimized model, unscheduled, under onnxruntime's defaults (the
  time reference: target = 1.10 x (1 + predicted overhead) x its median)
- deployed (glibc): the same, glibc as a deployment has it
- plan: the applied model inside its memory plan (runtime.plan_executor.PlanExecutor); with the
  mmap threshold lowered its peak is a run's after one warm-up run (as the other mmap64k rows'),
  the first run's (onnxruntime's machine code paged in on first use) is ``first_run_peak``. Its
  prediction is ``planned_peak``, the executor's own (``PlanExecutor.held_bytes``): the resident
  bytes, the arena and the largest kernel scratch, or the budget where that is lower (dead pages
  are handed back to keep it), or the live peak where that is higher

    python3 bench/runtime_deploy.py [--models a.onnx b.onnx ...] [--fractions 1,0.7,0.5] [--repeat 5]
        [--solver auto] [--time-limit 30] [--cost profile]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from remat_cli.execution.fit import fit_plan  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.runtime.deploy import apply_schedule  # noqa: E402
from remat_cli.runtime.model import feed_names, make_inputs  # noqa: E402
from remat_cli.runtime.optimize import optimize_model  # noqa: E402
from remat_cli.runtime.plan_executor import PlanExecutor  # noqa: E402
from remat_cli.runtime.session import measure  # noqa: E402
from remat_cli.schedule import baseline, simulate  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

SHIPPED = [ROOT / "graphs" / f"torch_{n}_train.onnx" for n in ("mlp", "unet", "transformer", "resnet")]
#: per allocator (mmap64k: glibc's mmap threshold lowered to 64 KiB, every freed tensor goes back
#: to the OS, as remat run measures; glibc: the allocator as a deployment has it), the rows and
#: their session settings, each group's times interleaved with its own reference
GROUPS = {
    # remat's replay settings are the deployed ones (ort.session_options): one row for both
    "mmap64k": [
        ("deployed", "deployed"),
        ("plan", "plan"),
        ("ort_defaults_unscheduled", "defaults"),
    ],
    "glibc": [
        ("ort_defaults", "defaults"),
        ("ort_defaults_unscheduled", "defaults"),
        ("deployed", "deployed"),
        ("plan", "plan"),
    ],
}
ROWS = [r for g in GROUPS.values() for r, _ in g]


def cell(src: Path, opt: Path, fraction: float, args: argparse.Namespace, d: Path) -> list[dict]:
    graph = from_onnx_file(opt, cost=args.cost)
    budget = int(fraction * baseline(graph).peak_memory)
    # the plan fitted to the budget (arena + resident), solving below it where the placement
    # leaves the arena above the live peak (MobileNet's fastsa schedules: 6-8%)
    sched, result = fit_plan(graph, budget, args.solver, SolveOptions(time_limit=args.time_limit, seed=0))
    if sched is None or sched.memory_plan is None:
        return [{"row": r, "feasible": False} for r in ROWS]
    app = d / "applied.onnx"
    applied = apply_schedule(opt, graph, sched, app)
    model = onnx.load(str(opt))
    feeds = make_inputs(model, graph=graph)
    np.savez(d / "in.npz", **{k: feeds[k] for k in feed_names(model)})
    sim, base = simulate(graph, sched.steps), baseline(graph)
    # the plan executor's own figure: the arena and the largest kernel scratch, or the budget
    # (the live peak where that is above it) it hands dead pages back to keep
    planned = graph.resident_bytes + PlanExecutor(app).held_bytes
    overhead = sim.cost / base.cost - 1
    rows = []
    for malloc, group in GROUPS.items():
        models = [opt if r == "ort_defaults_unscheduled" else app for r, _ in group]
        got = measure(
            [(m, d / f"{malloc}_{r}.npz") for m, (r, _) in zip(models, group, strict=True)],
            d / "in.npz",
            repeat=args.repeat,
            warmup=1,
            # the median of 3 measured runs: the first after the warm-up can still add a little
            # (MobileNet at 50%: 132 KB, then 1-5 KB)
            memory_repeat=3,
            settings=[kind for _, kind in group],  # type: ignore[misc]
            mmap=malloc == "mmap64k",
        )
        by = dict(zip([r for r, _ in group], got, strict=True))
        ref_m = by["ort_defaults_unscheduled"]
        with np.load(d / f"{malloc}_ort_defaults_unscheduled.npz") as z:
            ref = {k: z[k] for k in z.files}
        for (r, _), m in zip(group, got, strict=True):
            with np.load(d / f"{malloc}_{r}.npz") as z:
                match = all(np.allclose(z[k], ref[k], rtol=1e-4, atol=1e-5) for k in ref)
            peak = m.peak_above_baseline + graph.resident_bytes
            predicted = planned if r == "plan" else sim.peak_memory
            cpu = float(np.median(m.cpu_times))
            ratio, cpu_ratio = m.seconds / ref_m.seconds, cpu / float(np.median(ref_m.cpu_times))
            rows.append(
                {
                    "row": r,
                    "malloc": malloc,
                    "feasible": True,
                    "peak": peak,
                    "peak_vs_predicted": peak / predicted - 1,
                    # plan (mmap64k): the peak is a run's after the warm-up (the replay rows' is
                    # too); the first run's also holds onnxruntime's machine code paged in
                    "first_run_peak": None
                    if m.first_run_peak is None
                    else m.first_run_peak + graph.resident_bytes,
                    "seconds": m.seconds,
                    "cpu_seconds": cpu,
                    "times": [round(t, 5) for t in m.times],
                    "cpu_times": [round(t, 5) for t in m.cpu_times],
                    "time_vs_defaults_unscheduled": ratio,
                    "cpu_vs_defaults_unscheduled": cpu_ratio,
                    "outputs_match": match,
                    "peak_within_3pct": peak <= 1.03 * predicted,
                    "time_target_met": ratio <= 1.10 * (1 + overhead),
                    "cpu_time_target_met": cpu_ratio <= 1.10 * (1 + overhead),
                }
            )
    head = {
        "model": src.stem,
        "fraction": fraction,
        "solver": (result.params or {}).get("winner") or args.solver,
        "budget": budget,
        "predicted_peak": sim.peak_memory,
        "planned_peak": planned,
        "predicted_overhead": overhead,
        "planned_arena": sched.memory_plan.arena,
        "recomputations": applied.recomputations,
        "applied_outputs_match": applied.outputs_match,
    }
    return [head | r for r in rows]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", type=Path, default=SHIPPED)
    ap.add_argument("--fractions", default="1,0.7,0.5")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--solver", default="auto")
    ap.add_argument("--cost", default="profile", help="the importer's cost model (flops, profile)")
    ap.add_argument("--time-limit", type=float, default=30.0)
    ap.add_argument("--out", default="runtime_deploy")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    fractions = [float(f) for f in args.fractions.split(",")]
    results: list[dict] = []
    out = ROOT / "bench" / "results" / f"{args.out}.json"
    with tempfile.TemporaryDirectory() as tmp:
        for src in args.models:
            optimize_model(src, Path(tmp) / f"{src.stem}.opt.onnx", level="extended")
        for f in fractions:  # every model at the first fraction first: a stopped run has all six
            for src in args.models:
                opt = Path(tmp) / f"{src.stem}.opt.onnx"
                d = Path(tmp) / f"{src.stem}_{f}"
                d.mkdir()
                t0 = time.time()
                rows = cell(src, opt, f, args, d)
                results += rows
                _print(src, f, rows)
                print(f"  ({time.time() - t0:.0f} s)", flush=True)
                _write(out, args, results)  # after every cell: a stopped run keeps what it measured
    print(f"wrote {out}")


def _print(src: Path, f: float, rows: list[dict]) -> None:
    for r in rows:
        if not r.get("feasible"):
            print(f"{src.stem:24s} {f:4.0%} infeasible", flush=True)
            return
        print(
            f"{src.stem:24s} {f:4.0%} {r['malloc']:7s} {r['row']:24s} "
            f"peak {r['peak'] / 1e6:8.2f} MB ({r['peak_vs_predicted']:+6.1%}) "
            f"{r['seconds'] * 1e3:7.1f} ms (x{r['time_vs_defaults_unscheduled']:.2f}) "
            f"cpu {r['cpu_seconds'] * 1e3:6.1f} ms (x{r['cpu_vs_defaults_unscheduled']:.2f}) "
            f"target x{1.10 * (1 + r['predicted_overhead']):.2f} match {r['outputs_match']}",
            flush=True,
        )


def _write(out: Path, args: argparse.Namespace, results: list[dict]) -> None:
    doc = {
        "command": "python3 " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": args.note,
        "load_average": os.getloadavg(),
        "rows": results,
    }
    out.write_text(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
