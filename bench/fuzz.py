"""Nightly-size fuzzing (issue 20): random valid graphs (tests/fuzzgraphs.py) × every registered
solver × a budget between the lower bound and the baseline, each schedule checked by the
simulator, against the budget and, for `optimal` claims, against brute force.

Results are written every --every graphs, so a run cut short still records its counts.

    python bench/fuzz.py [--graphs 10000] [--seed 0] [--solvers a,b] [--time-limit 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write_results  # noqa: E402

from remat_cli import registry  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.testing.instances import brute_force_min_cost  # noqa: E402
from tests.fuzzgraphs import budget_between, check, random_graph  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--graphs", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--solvers", default=None, help="comma-separated (default: every available one)")
    ap.add_argument("--time-limit", type=float, default=2.0)
    ap.add_argument("--every", type=int, default=100, help="write results every N graphs")
    ap.add_argument("--name", default="fuzz", help="bench/results/NAME.json (shards of one run)")
    ap.add_argument("--note", default="quiet machine (2 cores)", help="recorded with the results")
    ap.add_argument("--merge", default=None, help="comma-separated result names: sum them into NAME")
    args = ap.parse_args()
    if args.merge:
        merge(args.merge.split(","), args.name)
        return
    names = args.solvers.split(",") if args.solvers else registry.names()
    names = [n for n in names if registry.get(n).availability()[0] == "available"]
    rng = np.random.default_rng(args.seed)

    def draw(lo: int, hi: int) -> int:
        return int(rng.integers(lo, hi + 1))

    runs: Counter[str] = Counter()
    statuses: dict[str, Counter[str]] = {n: Counter() for n in names}
    failures: list[dict] = []
    t0 = time.monotonic()
    done = 0

    def save() -> None:
        write_results(
            args.name,
            [
                {
                    "solver": n,
                    "runs": runs[n],
                    "statuses": dict(statuses[n]),
                    "failures": sum(1 for f in failures if f["solver"] == n),
                }
                for n in names
            ],
            graphs=done,
            graphs_requested=args.graphs,
            seconds=round(time.monotonic() - t0, 1),
            failures=failures[:50],
            note=args.note,
        )

    for i in range(args.graphs):
        g = random_graph(draw)
        budget = budget_between(g, draw(0, 4))
        brute = brute_force_min_cost(g, budget)
        for n in names:
            if registry.get(n).supports(g) is not None:
                statuses[n]["not applicable"] += 1
                continue
            broken = check(g, budget, n, brute, args.time_limit)
            runs[n] += 1
            statuses[n]["failure" if broken else "ok"] += 1
            if broken:
                failures.append(
                    {
                        "graph_index": i,
                        "solver": n,
                        "budget": budget,
                        "problem": broken,
                        "graph": g.model_dump(mode="json", exclude_none=True),
                    }
                )
                print(f"graph {i}: {n}: {broken}", flush=True)
        done = i + 1
        if done % args.every == 0:
            save()
            print(
                f"{done} graphs, {sum(runs.values())} solver runs, {len(failures)} failures, "
                f"{time.monotonic() - t0:.0f} s",
                flush=True,
            )
    save()
    print(f"{done} graphs, {sum(runs.values())} solver runs, {len(failures)} failures")


def merge(shards: list[str], name: str) -> None:
    """One record from several runs (shards with their own seeds): counts summed, each shard's
    command, graphs and failures kept."""
    import json

    from common import RESULTS

    records = [json.loads((RESULTS / f"{s}.json").read_text()) for s in shards]
    rows: dict[str, dict] = {}
    for r in records:
        for row in r["rows"]:
            t = rows.setdefault(
                row["solver"], {"solver": row["solver"], "runs": 0, "statuses": {}, "failures": 0}
            )
            t["runs"] += row["runs"]
            t["failures"] += row["failures"]
            for k, v in row["statuses"].items():
                t["statuses"][k] = t["statuses"].get(k, 0) + v
    shard_info = [
        {k: r[k] for k in ("command", "date", "graphs", "seconds")}
        | {"name": s, "note": r.get("note"), "failures": [recheck(f) for f in r["failures"]]}
        for s, r in zip(shards, records, strict=True)
    ]
    total = sum(r["graphs"] for r in records)
    path = write_results(
        name, list(rows.values()), graphs=total, shards=shard_info, note=records[0].get("note")
    )
    print(f"{total} graphs from {len(shards)} runs -> {path}")


def recheck(failure: dict) -> dict:
    """A shard's failure with `reproduces_now`: the same check on the same graph and budget with
    the code as it is now (a failure fixed since the shard ran says false)."""
    g = Graph.model_validate(failure["graph"])
    budget = failure["budget"]
    now = check(g, budget, failure["solver"], brute_force_min_cost(g, budget), 2.0)
    return failure | {"reproduces_now": now is not None, "problem_now": now}


if __name__ == "__main__":
    main()
