"""Benchmark of the hilp solver (HiREmate H-ILP) on training graphs, at 70% and 50% of the
baseline peak: solve time, overhead, peak. Writes bench/results/hilp.json.

References (issue 6): HiREmate Table 3 (within ~1% of the Checkmate optimum) and Table 4 (GPT
96 layers, 2894 nodes, in 15 min). Targets on 2 cores: <= 2% above the Checkmate optimum where
that optimum is provable within 10 minutes; a 2000-node training graph at 50% in <= 10 minutes.

The reference optimum is the flat H-ILP over single operators (one option each), i.e.
RK-Checkmate on the graph's order; the registered ``checkmate`` solver is used instead when
present. Usage:

    python3 bench/hilp.py                 # everything
    python3 bench/hilp.py --only transformer_l4,transformer_l83 --reference transformer_l4
    python3 bench/hilp.py --only torch_unet_train --compare greedy,fastsa
    python3 bench/hilp.py --only segnet_train --reference segnet_train
    python3 bench/hilp.py --sweep 60     # defaults against each parameter moved alone
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import GRAPHS, MOCCASIN, write_results  # noqa: E402

from remat_cli import registry  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import generators as G  # noqa: E402
from remat_cli.importers.nx import from_node_link  # noqa: E402
from remat_cli.importers.onnx import from_onnx_file  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402


def graphs(extra: list[Path] | None = None) -> dict[str, tuple[Graph, float]]:
    """name -> (graph, time limit in seconds); `extra` ONNX files (held-out exports, e.g. those of
    bench/model_nets.py) are named by their stem, with 120 s"""
    out: dict[str, tuple[Graph, float]] = {
        "transformer_l4": (G.transformer(layers=4, seed=0), 300),
        "unet_d4_c4": (G.unet(depth=4, convs=4, seed=0), 300),
        "transformer_l20": (G.transformer(layers=20, seed=0), 600),
        "unet_d8_c8": (G.unet(depth=8, convs=8, seed=0), 300),
        "unet_d16_c12": (G.unet(depth=16, convs=12, seed=0), 600),
        "transformer_l40": (G.transformer(layers=40, seed=0), 600),
        "transformer_l83": (G.transformer(layers=83, seed=0), 600),
        "transformer_l125": (G.transformer(layers=125, seed=0), 600),
        # issue 18 item 4: 5,019 nodes within 30 minutes (HiREmate: 5,851 nodes in 147 min)
        "transformer_l209": (G.transformer(layers=209, seed=0), 1800),
    }
    # the ONNX training graphs of the runtime issue (phase from the importer, no grad_of)
    names = ("torch_mlp_train", "torch_resnet_train", "torch_transformer_train", "torch_unet_train")
    for path in [ROOT / "graphs" / f"{name}.onnx" for name in names] + list(extra or []):
        if path.exists():
            out[path.stem] = (from_onnx_file(path), 120)
    # Checkmate-derived training graphs (Moccasin's benchmark folder): CM2 is ResNet50, and the
    # small ones are those of HiREmate Table 3 whose Checkmate optimum is provable in minutes
    moccasin = {
        "resnet50_train_cm2": (GRAPHS["CM2"], 300),
        "fcn8_vgg_train_cm1": (GRAPHS["CM1"], 120),
        "vgg_unet_train": ("vgg_unet (MLSys)_32_(416, 608, 3)_train_nx.json", 120),
        "segnet_train": ("segnet (MLSys)_32_(416, 608, 3)_train_nx.json", 120),
        "mobilenet_train": ("MobileNet (MLSys)_512_(224, 224, 3)_train_nx.json", 300),
    }
    for name, (file, limit) in moccasin.items():
        if (MOCCASIN / file).exists():
            out[name] = (from_node_link(json.loads((MOCCASIN / file).read_text()), name), limit)
    return out


def reference(g: Graph, budget: int, limit: float) -> dict[str, object]:
    if "checkmate" in registry.names():
        name, params = "checkmate", {}
    else:
        name, params = "hilp", {"max_top": 10**6, "max_subgraph": 2}  # flat: no partition
    t0 = time.monotonic()
    sched, res = run_solver(g, budget, name, SolveOptions(time_limit=limit, seed=0, params=params))
    return {
        "solver": name if name == "checkmate" else "flat H-ILP (RK-Checkmate)",
        "seconds": round(time.monotonic() - t0, 2),
        "status": res.status,
        # the flat H-ILP is exact in memory (one operator per compute node): optimal = proven
        "proved_optimal": res.status == "optimal"
        or (name == "hilp" and sched is not None and "top H-ILP optimal on" in (res.message or "")),
        "overhead": None if sched is None else sched.summary.overhead,
        "peak_fraction": None if sched is None else sched.summary.peak_memory / baseline(g).peak_memory,
    }


def _limits() -> dict[tuple[str, float], dict[str, object]]:
    """bench/results/limits.json by (graph, fraction): the Checkmate optimum or bound."""
    path = ROOT / "bench" / "results" / "limits.json"
    if not path.exists():
        return {}
    return {(r["graph"], r["fraction"]): r for r in json.loads(path.read_text())["rows"]}


def _used(message: str) -> str:
    m = re.search(r"used: ([\w-]+)", message)
    return m.group(1) if m else "?"


def _hilp_overhead(message: str) -> float | None:
    m = re.findall(r"\(overhead (-?[\d.]+)\)", message)
    return min(float(x) for x in m) if m else None


#: --sweep: each parameter moved alone from its default (HILP.params), to show the defaults
#: were chosen by measurement; the H-ILP's own schedule is the measure (the fallback's would
#: hide the hierarchy)
SWEEP = {
    "max_subgraph": (4, 16),
    "max_top": (12, 48),
    "alpha": (0.25, 0.75),
    "options": (24, 96),
    "levels": (2, 6),
}
SWEEP_ROWS = (("transformer_l20", 0.5), ("unet_d8_c8", 0.5))


def sweep(limit: float) -> None:
    all_graphs = graphs()
    rows = []
    settings: list[dict[str, object]] = [{}] + [{k: v} for k, vs in SWEEP.items() for v in vs]
    for name, frac in SWEEP_ROWS:
        g = all_graphs[name][0]
        budget = int(frac * baseline(g).peak_memory)
        for params in settings:
            t0 = time.monotonic()
            sched, res = run_solver(g, budget, "hilp", SolveOptions(time_limit=limit, seed=0, params=params))
            row = {
                "graph": name,
                "fraction": frac,
                "params": params or "defaults",
                "seconds": round(time.monotonic() - t0, 2),
                "hilp_overhead": _hilp_overhead(res.message or ""),
                "returned_overhead": None if sched is None else round(sched.summary.overhead, 5),
                "message": res.message,
            }
            rows.append(row)
            print(
                f"{name:18s} {frac:4.0%} {str(row['params']):24s} H-ILP's own {row['hilp_overhead']}",
                flush=True,
            )
    print(f"wrote {write_results('hilp_params', rows, time_limit=limit)}")


def table() -> None:
    """The issue-18 table: each row's columns, the bound and Checkmate ones (re)filled from
    limits.json (measured separately by bench/limits.py); best known = the least overhead of any
    schedule; known-bound = how far that can be from the optimum (the cut bound holds for any
    order; 0: proven optimal)."""
    path = ROOT / "bench" / "results" / "hilp.json"
    record = json.loads(path.read_text())
    limits = _limits()
    keys = ("best_bound", "checkmate", "greedy", "fastsa", "hilp_own", "returned", "seconds")
    print(
        f"{'graph':24s} {'budget':>6s} "
        + " ".join(f"{k:>10s}" for k in keys)
        + f" {'best known':>10s} {'known-bound':>11s}  H-ILP own by"
    )
    for row in record["rows"]:
        cols = row.get("columns")
        if cols is None:
            continue
        lim = limits.get((row["graph"], row["fraction"]), {})
        cols["best_bound"] = lim.get("best_bound")
        cols["checkmate"] = lim.get("checkmate_overhead")
        # only schedules within budget count (an "infeasible" result reports its lowest peak's)
        for k, run in [*row.get("compare", {}).items(), ("hilp_own", row.get("hilp_own"))]:
            if isinstance(run, dict):
                cols[k] = run["overhead"] if run["status"] in ("feasible", "optimal") else None
        known = [
            cols[k] for k in ("checkmate", "greedy", "fastsa", "hilp_own", "returned") if cols[k] is not None
        ]
        cols["best_known"] = min(known) if known else None
        # "hilp" where an H-ILP schedule beat the flat start it starts from (rows before 2026-11-27
        # did not record it)
        own = row.get("hilp_own")
        cols["hilp_own_by"] = own.get("produced_by") if isinstance(own, dict) else None
        # how far the best schedule can be from the optimum (0: proven optimal)
        bound = cols["best_bound"]
        gap = None if bound is None or not known else cols["best_known"] - bound
        # the overheads here are rounded to 5 decimals, the bounds down to 6
        cols["gap_to_bound"] = None if gap is None else round(max(gap, 0.0) if gap > -1e-5 else gap, 6)

        def fmt(v: object) -> str:
            return "-" if v is None else f"{v:.4f}" if isinstance(v, float) else str(v)

        print(
            f"{row['graph']:24s} {row['fraction']:6.0%} "
            + " ".join(f"{fmt(cols[k]):>10s}" for k in keys)
            + f" {fmt(cols['best_known']):>10s} {fmt(cols['gap_to_bound']):>11s}  {fmt(cols['hilp_own_by'])}"
        )
    path.write_text(json.dumps(record, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated graph names")
    ap.add_argument("--graphs", nargs="*", type=Path, default=[], help="more ONNX training graphs")
    ap.add_argument("--reference", default="", help="graphs to also solve flat for the optimum")
    ap.add_argument("--fractions", default="0.7,0.5")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="--workers of every solve (1: the deterministic mode, fallbacks after the H-ILPs)",
    )
    ap.add_argument("--compare", default="", help="other solvers to run on the same rows, e.g. greedy,fastsa")
    ap.add_argument("--loaded", action="store_true", help="note that the machine was shared")
    ap.add_argument("--limit", type=float, default=0, help="time limit per solve (default: per graph)")
    ap.add_argument(
        "--own", action="store_true", help="also run --fallback none: the H-ILP's own schedule, same limit"
    )
    ap.add_argument(
        "--sweep", type=float, default=0, help="instead: the parameter sweep, with this time limit"
    )
    ap.add_argument(
        "--table",
        action="store_true",
        help="instead: fill the issue-18 columns from limits.json and print them",
    )
    args = ap.parse_args()
    if args.table:
        table()
        return
    if args.sweep:
        sweep(args.sweep)
        return
    only = {s for s in args.only.split(",") if s}
    refs = {s for s in args.reference.split(",") if s}
    compare = [s for s in args.compare.split(",") if s]
    fractions = [float(f) for f in args.fractions.split(",")]
    rows = []
    limits = _limits()
    for name, (g, limit) in graphs(args.graphs).items():
        if only and name not in only:
            continue
        limit = args.limit or limit
        base = baseline(g)
        for frac in fractions:
            budget = int(frac * base.peak_memory)
            t0 = time.monotonic()
            sched, res = run_solver(
                g,
                budget,
                "hilp",
                SolveOptions(time_limit=limit, seed=0, workers=args.workers, params={"jobs": args.jobs}),
            )
            secs = time.monotonic() - t0
            row: dict[str, object] = {
                "graph": name,
                "nodes": len(g.nodes),
                "fraction": frac,
                "budget": budget,
                "time_limit": limit,
                "workers": args.workers,
                "seconds": round(secs, 2),
                "status": res.status,
                "overhead": None if sched is None else round(sched.summary.overhead, 5),
                "peak_fraction": None
                if sched is None
                else round(sched.summary.peak_memory / base.peak_memory, 5),
                "message": res.message,
                # which schedule won, and what the H-ILP's own schedule cost (the message says)
                "used": _used(res.message or ""),
                "hilp_overhead": _hilp_overhead(res.message or ""),
            }
            for other in compare:
                t1 = time.monotonic()
                osched, ores = run_solver(
                    g, budget, other, SolveOptions(time_limit=limit, seed=0, workers=args.workers)
                )
                row.setdefault("compare", {})[other] = {  # type: ignore[union-attr]
                    "seconds": round(time.monotonic() - t1, 2),
                    "status": ores.status,
                    "overhead": None if osched is None else round(osched.summary.overhead, 5),
                    "peak_fraction": None
                    if osched is None
                    else round(osched.summary.peak_memory / base.peak_memory, 5),
                }
            if args.own:
                t1 = time.monotonic()
                own_params = {"jobs": args.jobs, "fallback": "none"}
                osched, ores = run_solver(
                    g,
                    budget,
                    "hilp",
                    SolveOptions(time_limit=limit, seed=0, workers=args.workers, params=own_params),
                )
                row["hilp_own"] = {
                    "seconds": round(time.monotonic() - t1, 2),
                    "status": ores.status,
                    "overhead": None if osched is None else round(osched.summary.overhead, 5),
                    # "hilp", or the flat start's solver where no H-ILP schedule was cheaper
                    "produced_by": ores.params.get("produced_by"),
                }
            # the issue-18 columns: graph, budget, best bound, checkmate, greedy, fastsa, H-ILP own,
            # returned, seconds (None: no schedule within budget)
            lim = limits.get((name, frac), {})
            cmp_ = {
                k: v
                for k, v in row.get("compare", {}).items()  # type: ignore[union-attr]
                if v["status"] in ("feasible", "optimal")
            }
            row["columns"] = {
                "best_bound": lim.get("best_bound"),
                "checkmate": lim.get("checkmate_overhead"),
                "greedy": cmp_.get("greedy", {}).get("overhead"),  # type: ignore[union-attr]
                "fastsa": cmp_.get("fastsa", {}).get("overhead"),  # type: ignore[union-attr]
                "hilp_own": row.get("hilp_own", {}).get("overhead")  # type: ignore[union-attr]
                if args.own
                else row["hilp_overhead"],
                "returned": row["overhead"],
                "seconds": row["seconds"],
            }
            if name in refs:
                ref = reference(g, budget, 600)
                row["reference"] = ref
            rows.append(row)
            print(
                f"{name:22s} {len(g.nodes):5d} {frac:4.0%} {secs:8.1f}s {res.status:10s} "
                f"overhead {row['overhead']}  peak {row['peak_fraction']}  used {row['used']} "
                f"(H-ILP's own: {row.get('hilp_own', {}).get('overhead', row['hilp_overhead'])})"  # type: ignore[union-attr]
                + (f"  ref {row['reference']}" if "reference" in row else "")
                + "".join(
                    f"  {k}: {v['status']} {v['overhead']} peak {v['peak_fraction']}"
                    for k, v in row.get("compare", {}).items()  # type: ignore[union-attr]
                ),
                flush=True,
            )
    command = "python3 " + " ".join(sys.argv)
    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores" + (
        " (shared with other jobs: timings are loaded)" if args.loaded else ""
    )
    date = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    for row in rows:
        row.update(command=command, machine=machine, date=date)
    path = ROOT / "bench" / "results" / "hilp.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    # runs accumulate: a later run of the same graph and fraction replaces the earlier row
    old = json.loads(path.read_text())["rows"] if path.exists() else []
    fresh = {(r["graph"], r["fraction"]) for r in rows}
    # a reference not solved again (it takes up to 10 minutes) is carried over, with its date
    earlier = {(r["graph"], r["fraction"]): r for r in old if "reference" in r}
    for row in rows:
        prev = earlier.get((row["graph"], row["fraction"]))
        if "reference" not in row and prev is not None and row["overhead"] is not None:
            ref = dict(prev["reference"])  # type: ignore[arg-type]
            ref.setdefault("date", prev["date"])
            row["reference"] = ref
    for row in rows:
        ref = row.get("reference")
        if isinstance(ref, dict) and ref["overhead"] is not None:
            # the returned schedule's cost and the H-ILP's own, over the reference's
            for key, ours in (
                ("above_reference", row["overhead"]),
                ("hilp_above_reference", row["hilp_overhead"]),
            ):
                if ours is not None:
                    row[key] = round((1 + float(ours)) / (1 + float(ref["overhead"])) - 1, 5)  # type: ignore[arg-type]
    merged = [r for r in old if (r["graph"], r["fraction"]) not in fresh] + rows
    path.write_text(json.dumps({"solver": "hilp", "rows": merged}, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
