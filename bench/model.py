"""MODeL (`--solver model`, issue 16) on ONNX training graphs: the shipped ones and the
torchvision-style exports of bench/model_nets.py (batch 1 and 32).

Per graph: the program order's peak of intermediate bytes; the order-only fragmentation-free
peak (§5.5) with its status (proven optimal or not) and its reduction against the program order,
beside the paper's reorder-alone means; MODeL's arena (joint mode), its bound, status and
seconds; the planned fragmentation (arena over the returned order's own peak); the arena
measured by replaying the planned schedule inside one numpy arena (runtime/arena.py, outputs
compared bitwise) against the plan; onnxruntime's own peak for the same order (`remat run`
session mode: process high-water mark above the pre-run baseline, CPU arena enabled, minus
resident bytes); with --engine-limit > 0, the address engines with the program order fixed
(CP-SAT AddNoOverlap2D vs. the big-M MILP of eqs. 6-8 on HiGHS, from the same start).

    python3 bench/model_nets.py /tmp/nets                  # torchvision-style exports (torch extra)
    python3 bench/model.py --graphs graphs/torch_*_train.onnx /tmp/nets/*.onnx [--time-limit 30]

Writes bench/results/model.json (--name to change). The summary's median and worst solve times
are over the graphs of at most 1,000 operators; larger ones are listed apart.

    python3 bench/model.py --graphs ... --name model_part && python3 bench/model.py --merge-from bench/results/model_part.json

solves nothing: the rows of that run replace those of the same graphs in model.json (each keeps
its run's command and date under "run") and the summary is recomputed over all rows.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import onnx  # noqa: E402
from common import write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.planning.addresses import place  # noqa: E402
from remat_cli.planning.memory_plan import arena_peak, buffers_of  # noqa: E402
from remat_cli.runtime import interpret as interp  # noqa: E402
from remat_cli.runtime import run_schedule  # noqa: E402
from remat_cli.runtime.arena import arena_replay  # noqa: E402
from remat_cli.runtime.model import make_inputs  # noqa: E402
from remat_cli.schedule import baseline, baseline_steps  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

#: MODeL Table/§5.5 means for reordering alone (fragmentation-free peak vs. PyTorch's order)
PAPER_REORDER_MEAN = {"batch 1": -0.239, "batch 32": -0.117}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=30.0, help="seconds for the joint solve")
    ap.add_argument(
        "--large-time-limit",
        type=float,
        default=300.0,
        help="seconds for graphs above 1,000 operators (the issue's bar: 2,000 operators in 10 minutes)",
    )
    ap.add_argument(
        "--engine-limit", type=float, default=0.0, help="seconds per address engine (0: not compared)"
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--machine-note", default="quiet 2-core machine")
    ap.add_argument(
        "--alignment", type=int, default=64, help="of the MODeL plan (bitwise-equal replay needs 64)"
    )
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--no-session", action="store_true", help="skip onnxruntime's own measurement")
    ap.add_argument("--graphs", nargs="*", help="ONNX files instead of graphs/torch_*_train.onnx")
    ap.add_argument("--name", default="model", help="results file bench/results/NAME.json")
    ap.add_argument("--merge-from", type=Path, help="instead: merge that run's rows into NAME.json")
    args = ap.parse_args()
    if args.merge_from:
        merge(args.merge_from, args.name)
        return
    rows = []
    files = (
        [Path(f) for f in args.graphs]
        if args.graphs
        else sorted((ROOT / "graphs").glob("torch_*_train.onnx"))
    )
    for path in files:
        key = path.stem.removeprefix("torch_").removesuffix("_train")
        if args.only and key not in args.only:
            continue
        g = from_onnx_file(str(path))
        limit = args.time_limit if len(g.needed_nodes) <= 1000 else args.large_time_limit
        resident = g.resident_bytes
        program_peak = baseline(g).peak_memory - resident
        batch = path.stem.rsplit("_b", 1)[-1] if "_b" in path.stem else "shipped"
        row: dict = {
            "graph": path.name,
            "batch": batch,
            "time_limit": limit,
            "ops": len(g.needed_nodes),
            "program_order_peak": program_peak,
        }
        s, _ = run_solver(
            g,
            10**15,
            "model",
            SolveOptions(time_limit=limit, workers=args.workers, params={"alignment": args.alignment}),
        )
        assert s is not None and s.memory_plan is not None
        row |= {
            "model_arena": s.memory_plan.arena,
            "model_bound": int(s.solver.lower_bound or 0) - resident,
            "model_status": s.solver.status,
            "model_gap": s.solver.gap,
            "model_seconds": s.solver.seconds,
            "model_vs_program": s.memory_plan.arena / program_peak - 1,
            "planned_fragmentation": s.memory_plan.arena / (s.summary.peak_memory - resident) - 1,
            "model_message": s.solver.message,
        }
        o, _ = run_solver(
            g,
            10**15,
            "model",
            SolveOptions(time_limit=limit, workers=args.workers, params={"order_only": True}),
        )
        assert o is not None
        row |= {
            "order_only_peak": o.summary.peak_memory - resident,
            "order_only_status": o.solver.status,
            "order_only_seconds": o.solver.seconds,
            "order_only_vs_program": (o.summary.peak_memory - resident) / program_peak - 1,
            "order_only_bound": int(o.solver.lower_bound or 0) - resident,
            "order_only_message": o.solver.message,
        }
        # the plan measured inside one arena
        model = onnx.load(str(path))
        feeds = make_inputs(model, seed=0, given=None, graph=g)
        engine = interp.Interpreter(model, g)
        ref = interp.interpret(engine, [baseline_steps(g)], feeds, warmup=0, repeat=1)[0].outputs
        run = arena_replay(engine, s.steps, s.memory_plan, feeds)
        row |= {
            "measured_arena": run.measured_arena,
            "measured_fragmentation": run.measured_arena / (s.summary.peak_memory - resident) - 1,
            "measured_vs_plan": run.measured_arena / s.memory_plan.arena - 1,
            "arena_outputs_match": all(
                k in run.outputs and run.outputs[k].tobytes() == v.tobytes() for k, v in ref.items()
            ),
        }
        if not args.no_session:
            rep = run_schedule(path, g, s, mode="session", repeat=1, warmup=0)
            row["ort_session_peak"] = rep.measured.peak_memory - resident
            row["ort_vs_plan"] = row["ort_session_peak"] / s.memory_plan.arena - 1
        # address engines, the program order fixed
        bufs = buffers_of(g, baseline_steps(g))
        for eng in ("cp-sat", "milp") if args.engine_limit > 0 else ():
            t0 = time.monotonic()
            _, arena, bound, proven = place(bufs, 1, args.engine_limit, args.workers, 0, eng)
            row[f"fixed_{eng}"] = {
                "arena": arena,
                "bound": bound,
                "proven": proven,
                "seconds": round(time.monotonic() - t0, 2),
            }
        row["fixed_order_peak"] = arena_peak(bufs)
        rows.append(row)
        print(
            f"{path.name:28s} ops {row['ops']:4d} program {program_peak:>12,} "
            f"order-only {row['order_only_peak']:>12,} ({100 * row['order_only_vs_program']:+.1f}%, "
            f"{row['order_only_status']}, {row['order_only_seconds']:.1f}s) model {row['model_arena']:>12,} "
            f"({100 * row['model_vs_program']:+.1f}%, {row['model_status']}, {row['model_seconds']:.1f}s, "
            f"frag {100 * row['planned_fragmentation']:.2f}%) measured {row['measured_arena']:>12,} "
            f"match {row['arena_outputs_match']} ort {row.get('ort_session_peak', '-')}",
            flush=True,
        )
    write_results(
        args.name,
        rows,
        machine_note=args.machine_note,
        time_limit=args.time_limit,
        large_time_limit=args.large_time_limit,
        **summary(rows),
    )


def summary(rows: list[dict]) -> dict:
    """The record's summary fields, over `rows`."""
    small = [r["model_seconds"] for r in rows if r["ops"] <= 1000]
    reduction = {
        b: statistics.mean(r["order_only_vs_program"] for r in rows if r["batch"] == b)
        for b in dict.fromkeys(r["batch"] for r in rows)
    }
    return dict(
        median_model_seconds=statistics.median(small) if small else None,
        worst_model_seconds=max(small) if small else None,
        large_graphs_model_seconds={r["graph"]: r["model_seconds"] for r in rows if r["ops"] > 1000},
        order_only_proven=sum(r["order_only_status"] == "optimal" for r in rows),
        order_only_reduction_mean_by_batch=reduction,
        paper_reorder_alone_mean=PAPER_REORDER_MEAN,
    )


def merge(source: Path, name: str) -> None:
    """The rows of the run in `source` in place of those of the same graphs in NAME.json; every
    row keeps the command, date and machine note of the run it comes from."""
    path = ROOT / "bench" / "results" / f"{name}.json"
    record, fresh = json.loads(path.read_text()), json.loads(source.read_text())

    def run(rec: dict) -> dict:
        return {k: rec.get(k) for k in ("command", "date", "machine_note", "time_limit", "large_time_limit")}

    new = {r["graph"]: r | {"run": run(fresh)} for r in fresh["rows"]}
    rows = [new.pop(r["graph"], None) or r | {"run": r.get("run") or run(record)} for r in record["rows"]]
    rows += list(new.values())
    record |= summary(rows) | {"merged_from": str(source.resolve().relative_to(ROOT)), "rows": rows}
    path.write_text(json.dumps(record, indent=1) + "\n")
    print(f"merged {len(fresh['rows'])} rows of {source} into {path}")


if __name__ == "__main__":
    main()
