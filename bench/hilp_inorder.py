"""How much could the H-ILP earn over fastsa's schedule in fastsa's own order? (issue 18, item 2)

The H-ILP's refined top follows the flat start, fastsa's schedule (``follow``): its compute nodes
run in that schedule's order. This script poses that instance at the finest grain the H-ILP has
(every operator its own unit, cut along the schedule as ``follow`` cuts it, up to ``--cap``
compute nodes), starts HiGHS from the schedule (``flat_hint``) and records, per cell:

- ``fastsa``: the overhead of fastsa's schedule (one worker, seed 0, ``--fastsa-time``);
- ``ilp``: the overhead of the best schedule the engine found (simulated; = fastsa's when it
  found nothing cheaper);
- ``ilp_bound``: the engine's dual bound, as an overhead. It bounds what this instance can ever
  return, so what any H-ILP in fastsa's order and at this grain could earn; it is no bound on
  the simulator's schedules (the H-ILP's memory rows are App. B.3's approximation), and none
  on other orders (limits.json's ``best_bound`` is that one).

Usage (one core per run; the other may run another cell):

    python bench/hilp_inorder.py --only torch_unet_train --fractions 0.5 --ilp-time 600
    python bench/hilp_inorder.py --fractions 0.5 --ilp-time 120
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import EXPORTS, RESULTS, export_path, write_results  # noqa: E402

from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.milp import EngineSettings  # noqa: E402
from remat_cli.milp import solve as milp_solve  # noqa: E402
from remat_cli.runner import run_solver  # noqa: E402
from remat_cli.schedule import baseline, simulate, steps_from_sequence  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402
from remat_cli.solvers.hilp.context import Ctx  # noqa: E402
from remat_cli.solvers.hilp.model import build_instance, decode, flatten, hilp_model  # noqa: E402
from remat_cli.solvers.hilp.units import atomic, compute_nodes, first_ranks, follow  # noqa: E402
from remat_cli.solvers.hilp.warmstart import flat_hint  # noqa: E402

NOTE = (
    "ilp_bound bounds what the H-ILP in fastsa's order at this grain can return (its memory rows are "
    "App. B.3's approximation): no bound on the simulator's schedules nor on other orders"
)


def cell(g: Graph, frac: float, args: argparse.Namespace) -> dict[str, object]:
    base = baseline(g)
    budget = int(frac * base.peak_memory)
    row: dict[str, object] = {"fraction": frac, "budget": budget}
    opts = SolveOptions(time_limit=args.fastsa_time, seed=0, workers=1)
    flat, _ = run_solver(g, budget, "fastsa", opts)
    if flat is None or flat.summary.peak_memory > budget:
        row["status"] = "fastsa found no schedule within budget"
        return row
    row["fastsa"] = round(flat.summary.overhead, 6)
    seq = [s.node for s in flat.steps if s.op == "compute" and s.node is not None]
    order = first_ranks(seq)
    ctx = Ctx(g, False)
    units = follow(ctx, [atomic(ctx, n) for n in sorted(order, key=order.__getitem__)], seq, args.cap)
    inst = build_instance(ctx, units, with_loss=False, order=order)
    target = budget - g.resident_bytes
    model, R = hilp_model(inst, target, True, None)
    x0, need = flat_hint(inst, model, seq)
    if x0 is None and need is not None:  # as solve_instance: posed under what the start needs
        model, R = hilp_model(inst, need, True, None)
        x0, _ = flat_hint(inst, model, seq)
        row["ilp_budget_raised_to"] = need + g.resident_bytes
    row.update(compute_nodes=compute_nodes(units), variables=model.num_vars, rows=model.num_constraints)
    t0 = time.monotonic()
    res = milp_solve(
        model,
        EngineSettings(backend="highs", time_limit=args.ilp_time, threads=1, seed=0, rel_gap=1e-4, hint=x0),
    )
    row["ilp_seconds"] = round(time.monotonic() - t0, 1)
    row["ilp_status"] = res.status
    best = flat.summary.overhead
    if res.x is not None:
        steps = steps_from_sequence(g, flatten(inst, decode(inst, res.x, R))[0])
        sim = simulate(g, steps)
        if sim.peak_memory <= budget:
            best = min(best, sim.cost / base.cost - 1)
    row["ilp"] = round(best, 6)
    if res.bound is not None:
        row["ilp_bound"] = round(res.bound / base.cost - 1, 6)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--graphs", nargs="*", type=Path, default=[], help="more training graphs (ONNX or JSON)")
    ap.add_argument("--fractions", default="0.5")
    ap.add_argument("--fastsa-time", type=float, default=120)
    ap.add_argument("--ilp-time", type=float, default=300)
    ap.add_argument("--cap", type=int, default=10_000, help="most compute nodes (default: every operator)")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    paths = [export_path(n) for n in EXPORTS] + args.graphs
    out = RESULTS / "hilp_inorder.json"
    rows = json.loads(out.read_text())["rows"] if out.exists() else []
    command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
    for p in paths:
        if only and p.stem not in only:
            continue
        g = load_graph(p)
        for frac in (float(f) for f in args.fractions.split(",")):
            row = {"graph": p.stem, "nodes": len(g.nodes), **cell(g, frac, args), "command": command}
            print(json.dumps(row), flush=True)
            rows = [r for r in rows if (r["graph"], r["fraction"]) != (p.stem, frac)] + [row]
            write_results("hilp_inorder", rows, note=NOTE)
    print(
        f"{'graph':26} {'budget':>6} {'nodes':>6} {'fastsa':>8} {'H-ILP':>8} {'its bound':>9} {'seconds':>7}"
    )
    for r in rows:
        cells = [f"{100 * r[k]:7.2f}%" if k in r else f"{'-':>8}" for k in ("fastsa", "ilp", "ilp_bound")]
        print(
            f"{r['graph']:26} {100 * r['fraction']:5.0f}% {r.get('compute_nodes', '-'):>6} "
            f"{' '.join(cells)} {r.get('ilp_seconds', '-'):>7}"
        )


if __name__ == "__main__":
    main()
