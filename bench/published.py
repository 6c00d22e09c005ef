"""Our numbers next to the published ones, for every paper table bench/ reproduces; cells where
ours is worse are marked.

    python3 bench/published.py [--sweep RESULTS] [--run RESULTS --time-limit 120] [--only moccasin,fastsa]

Tables (the published values are the ones the bench scripts carry):
  Moccasin Table 3, MOCCASIN column     bench/results/moccasin*.json (TDI % = overhead %)
  Moccasin Table 3, Checkmate MILP      bench/results/checkmate*.json
  Moccasin Table 3, Checkmate LP+round  bench/results/checkmate_lp.json
  FastSA Table 1, FastSA column         bench/results/fastsa.json (cost increase %)
  baselines vs the best published value bench/results/baselines.json (any method; for reference)
With `--sweep RESULTS`, the records of a `remat sweep` results folder join the Moccasin (solver
moccasin, 90/80%) and FastSA (solver fastsa, 90/80/70%) tables; `--run RESULTS` first runs those
cells with `remat sweep` (resumable: cells already in RESULTS are kept).

"worse" = our value, rounded to the decimals the paper printed, is above the published one, or our
schedule misses the budget, or we found none where the paper has one. Writes
bench/results/published.json with the exact command.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import fastsa as fastsa_bench  # noqa: E402
import moccasin as moccasin_bench  # noqa: E402
from common import GRAPHS, MOCCASIN, RESULTS, SHORT, write_results  # noqa: E402

from remat_cli.sweep.cells import read_records  # noqa: E402
from remat_cli.sweep.plot import latest  # noqa: E402

# file name -> the labels each paper table uses
BY_FILE = {f: label for label, f in GRAPHS.items()}
# label -> the keys bench/moccasin.py uses (n100, ..., cm1)
MOCCASIN_KEY = {label: key.replace("rl", "n") for key, label in SHORT.items()}
#: Moccasin Table 3 prints LP+rounding schedules for RL n250 whose peaks exceed the budget
LP_OVER_BUDGET = {("rl250", 0.9), ("rl250", 0.8)}
CHECKMATE_KEY = SHORT  # bench/checkmate.py's keys (rl100, ..., cm1) -> label


def at_precision_of(value: float, published: float) -> float:
    text = repr(float(published))
    decimals = len(text.split(".")[1]) if "." in text else 0
    return round(value, decimals)


def verdict(
    ours: float | None, published: float | None, within_budget: bool | None, published_fits: bool = True
) -> str:
    if not published_fits:  # the paper's schedule itself misses the budget
        return "better" if ours is not None and within_budget else "same (neither fits)"
    if published is None:
        return "n/a" if ours is None else "new"  # the paper has no number here
    if ours is None or within_budget is False:
        return "WORSE"
    rounded = at_precision_of(ours, published)
    return "WORSE" if rounded > published else ("same" if rounded == published else "better")


def row(table: str, source: str, graph: str, budget: str, solver: str, ours: float | None, published: float | None,
        within: bool | None, seconds: float | None, note: str = "", published_fits: bool = True) -> dict[str, Any]:  # fmt: skip
    return {
        "table": table,
        "source": source,
        "graph": graph,
        "budget": budget,
        "solver": solver,
        "ours_pct": None if ours is None else round(ours, 3),
        "published_pct": published,
        "within_budget": within,
        "seconds": None if seconds is None else round(seconds, 1),
        "verdict": verdict(ours, published, within, published_fits),
        "note": note,
    }


def load(name: str) -> dict[str, Any] | None:
    p = RESULTS / name
    return json.loads(p.read_text()) if p.exists() else None


def moccasin_rows() -> Iterable[dict[str, Any]]:
    for name in ("moccasin.json", "moccasin_staged.json", "moccasin_quiet_rl.json"):
        d = load(name)
        for r in (d or {}).get("rows", []):
            label = BY_FILE.get(r["file"], r["graph"])
            ours = r["tdi_percent"] if r.get("status") in ("optimal", "feasible") else None
            yield row(
                "Moccasin Table 3: MOCCASIN", name, label, f"{round(100 * r['fraction'])}%",
                f"moccasin ({r['variant']})", ours, r["published"]["tdi_percent"], r.get("within_budget"),
                r.get("seconds"),
            )  # fmt: skip


def checkmate_rows() -> Iterable[dict[str, Any]]:
    for name, table in (
        ("checkmate.json", "Moccasin Table 3: Checkmate MILP"),
        ("checkmate_quiet.json", "Moccasin Table 3: Checkmate MILP"),
        ("checkmate_lp.json", "Moccasin Table 3: Checkmate LP+rounding"),
    ):
        d = load(name)
        for r in (d or {}).get("rows", []):
            if r.get("solver") not in ("checkmate", "checkmate-lp") or r.get("params"):
                continue  # the backend and ablation rows have no published counterpart
            pub = (r.get("published") or [None])[0]
            ok = r.get("status") in ("optimal", "feasible") and r.get("overhead_pct") is not None
            yield row(
                table, name, CHECKMATE_KEY.get(r["graph"], r["graph"]), f"{round(100 * r['fraction'])}%",
                r["solver"], r["overhead_pct"] if ok else None, pub, r.get("within_budget"), r.get("seconds"),
                published_fits=not (r["solver"] == "checkmate-lp" and (r["graph"], r["fraction"]) in LP_OVER_BUDGET),
            )  # fmt: skip


def fastsa_rows() -> Iterable[dict[str, Any]]:
    d = load("fastsa.json")
    for r in (d or {}).get("rows", []):
        ours = r.get("cost_increase_pct") if r.get("within_budget") else None
        yield row(
            "FastSA Table 1: FastSA", "fastsa.json", r["graph"], f"{r['budget_pct']}%", "fastsa", ours,
            r["published_cost_increase_pct"], r.get("within_budget"), r.get("seconds"),
            f"memory {r.get('memory_pct')}% (published {r.get('published_memory_pct')}%)",
        )  # fmt: skip


def baseline_rows() -> Iterable[dict[str, Any]]:
    d = load("baselines.json")
    for r in (d or {}).get("rows", []):
        ok = r.get("status") in ("optimal", "feasible")
        yield row(
            "Baselines vs the best published (any method)", "baselines.json",
            CHECKMATE_KEY.get(r["graph"], r["graph"]), f"{round(100 * r['fraction'])}%", r["solver"],
            r["overhead_pct"] if ok else None, r.get("paper_best_tdi_pct"), ok, r.get("seconds"),
        )  # fmt: skip


def sweep_rows(results: Path) -> Iterable[dict[str, Any]]:
    """A `remat sweep` folder's records matched to the Moccasin and FastSA tables."""
    for r in latest(read_records(results)):
        label = BY_FILE.get(Path(r["graph_file"]).name)
        pct = round(100 * r["budget_bytes"] / r["baseline_peak"]) if r.get("baseline_peak") else None
        if label is None or pct is None:
            continue
        ok = r["status"] in ("optimal", "feasible")
        ours = 100 * r["overhead"] if ok and r.get("overhead") is not None else None
        source = f"sweep {results.name} ({r['time_limit']:g}s)"
        if r["solver"] == "moccasin" and (MOCCASIN_KEY[label], pct / 100) in moccasin_bench.PUBLISHED:
            pub = moccasin_bench.PUBLISHED[(MOCCASIN_KEY[label], pct / 100)][0]
            yield row(
                "Moccasin Table 3: MOCCASIN",
                source,
                label,
                f"{pct}%",
                "moccasin",
                ours,
                pub,
                ok,
                r["seconds"],
            )
        if r["solver"] == "fastsa" and pct in fastsa_bench.PUBLISHED.get(label, {}):
            pub = fastsa_bench.PUBLISHED[label][pct][0]
            yield row(
                "FastSA Table 1: FastSA", source, label, f"{pct}%", "fastsa", ours, pub, ok, r["seconds"]
            )


def run_sweep(results: Path, time_limit: float) -> list[str]:
    """The published tables' cells with `remat sweep` (each solve in its own process, resumable)."""
    files = [str(MOCCASIN / f) for f in GRAPHS.values()]
    cmd = [sys.executable, "-m", "remat_cli", "sweep", *files, "--budgets", "90%,80%,70%"]
    cmd += ["--solvers", "moccasin,fastsa", "--time-limit", f"{time_limit:g}", "-o", str(results)]
    subprocess.run(cmd, check=False)
    return cmd


def print_table(rows: list[dict[str, Any]]) -> None:
    tables: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        tables.setdefault(r["table"], []).append(r)
    for name, rs in tables.items():
        print(f"\n== {name}")
        print(
            f"{'graph':9} {'budget':>6} {'solver':22} {'ours %':>8} {'published %':>11} {'s':>7}  verdict   source"
        )
        for r in rs:
            ours = "—" if r["ours_pct"] is None else f"{r['ours_pct']:.2f}"
            pub = "—" if r["published_pct"] is None else f"{r['published_pct']}"
            mark = "  <-- worse" if r["verdict"] == "WORSE" else ""
            secs = "" if r["seconds"] is None else f"{r['seconds']:.1f}"
            print(
                f"{r['graph']:9} {r['budget']:>6} {r['solver'][:22]:22} {ours:>8} {pub:>11} {secs:>7}  "
                f"{r['verdict']:8}  {r['source']}{mark}"
            )
        worse = sum(r["verdict"] == "WORSE" for r in rs)
        print(f"   {worse} of {len(rs)} cells worse than published")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", type=Path, default=None, help="a `remat sweep` results folder to include")
    ap.add_argument(
        "--run", type=Path, default=None, help="run the tables' cells with `remat sweep` here first"
    )
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per cell for --run")
    ap.add_argument("--only", default="moccasin,checkmate,fastsa,baselines")
    ap.add_argument("--out", default="published")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    only = set(args.only.split(","))
    rows: list[dict[str, Any]] = []
    extra: dict[str, Any] = {}
    if args.run is not None:
        extra["sweep_command"] = " ".join(run_sweep(args.run, args.time_limit)[1:])
        args.sweep = args.sweep or args.run
    sources = {
        "moccasin": moccasin_rows,
        "checkmate": checkmate_rows,
        "fastsa": fastsa_rows,
        "baselines": baseline_rows,
    }
    for key, fn in sources.items():
        if key in only:
            rows += list(fn())
    if args.sweep is not None:
        rows += list(sweep_rows(args.sweep))
    rows.sort(key=lambda r: (r["table"], r["graph"], r["budget"], r["solver"], r["source"]))
    print_table(rows)
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        counts.setdefault(r["table"], {}).setdefault(r["verdict"], 0)
        counts[r["table"]][r["verdict"]] += 1
    path = write_results(args.out, rows, note=args.note, verdicts=counts, **extra)
    print(f"\nwrote {path}")


if __name__ == "__main__":
    main()
