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

With ``--lns K`` the instance is not solved whole: ``--ilp-time`` goes to a large-neighbourhood
search over it instead. Each round frees ``K`` compute nodes chosen at random (with a layer's
partner), over *every* phase: their options, and the presence of every data node they make or
read; every other binary stays at the incumbent's value. So one round can move keep/recompute
choices far apart in the schedule at once, which a window of phases cannot. HiGHS solves the
round (``--round-time``) from the incumbent, and a cheaper solution is kept once the simulator
confirms it (``lns_rounds``, ``lns_proved``: rounds solved to optimality, ``lns_improved``).

Usage (one core per run; the other may run another cell):

    python bench/hilp_inorder.py --only torch_unet_train --fractions 0.5 --ilp-time 600
    python bench/hilp_inorder.py --fractions 0.5 --ilp-time 120
"""

from __future__ import annotations

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the checkout, and bench/ for common.py

from common import EXPORTS, export_path, write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.milp import EngineSettings, LinearModel  # noqa: E402
from remat_cli.milp import solve as milp_solve  # noqa: E402
from remat_cli.schedule import baseline, simulate, steps_from_sequence  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402
from remat_cli.solvers.hilp.context import Ctx  # noqa: E402
from remat_cli.solvers.hilp.instance import Instance, build_instance  # noqa: E402
from remat_cli.solvers.hilp.model import complete, decode, flatten, hilp_model  # noqa: E402
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
    if args.lns:
        assert x0 is not None
        row.update(lns(g, budget, inst, model, R, np.asarray(x0, dtype=float), flat.summary.cost, args))
        row["ilp"] = round(row.pop("lns_cost") / base.cost - 1, 6)
        return row
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


def lns(
    g: Graph,
    budget: int,
    inst: Instance,
    model: LinearModel,
    R: dict[tuple[int, int, int], int],
    x: np.ndarray,
    cost: float,
    args: argparse.Namespace,
) -> dict[str, object]:
    """The large-neighbourhood search of ``--lns`` (see the module docstring) from the start `x`
    of simulated cost `cost`: the cheapest cost and the round counts."""
    Rm, P, Sp, C, D = model.var_maps  # type: ignore[attr-defined]
    # the compute nodes each binary belongs to: a data node's are its producer and its users
    touches = [{inst.producer[d], *(k for k, _ in inst.users[d])} for d in range(len(inst.sizes))]
    owners: dict[int, set[int]] = {v: {k} for (_t, k, _o), v in Rm.items()}
    owners |= {v: touches[d] for (_t, d), v in (*P.items(), *C.items())}
    owners |= {v: touches[d] for (_t, _k, d), v in D.items()}
    owners |= {v: set(inst.layer_of[j]) for (_t, j, _o), v in Sp.items()}
    partner = {k: b if k == f else f for f, b in inst.layer_of.values() for k in (f, b)}
    cols = np.array(sorted(owners))
    x = complete(model, x)
    rng = random.Random(0)
    T = len(inst.items)
    rounds = proved = improved = 0
    end = time.monotonic() + args.ilp_time
    while time.monotonic() < end:
        rounds += 1
        chosen = set(rng.sample(range(T), min(args.lns, T)))
        chosen |= {partner[k] for k in list(chosen) if k in partner}
        free = np.ones(model.num_vars, dtype=bool)  # U^t_k (continuous) stay free
        free[cols] = [bool(owners[c] & chosen) for c in cols]
        sub = model.restricted(free, x)
        limit = min(args.round_time, max(0.1, end - time.monotonic()))
        res = milp_solve(
            sub, EngineSettings(backend="highs", time_limit=limit, threads=1, seed=0, hint=x[free])
        )
        proved += res.status == "optimal"
        if res.x is None or float(sub.cost @ res.x) >= float(sub.cost @ x[free]) - 1e-6:
            continue
        cand = x.copy()
        cand[free] = res.x
        sim = simulate(g, steps_from_sequence(g, flatten(inst, decode(inst, cand, R))[0]))
        if sim.peak_memory <= budget and sim.cost < cost:
            improved += 1
            cost, x = sim.cost, complete(model, cand)
    return {
        "lns_cost": cost,
        "lns_size": args.lns,
        "lns_rounds": rounds,
        "lns_proved": proved,
        "lns_improved": improved,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="")
    ap.add_argument("--graphs", nargs="*", type=Path, default=[], help="more training graphs (ONNX or JSON)")
    ap.add_argument("--fractions", default="0.5")
    ap.add_argument("--fastsa-time", type=float, default=120)
    ap.add_argument("--ilp-time", type=float, default=300)
    ap.add_argument("--cap", type=int, default=10_000, help="most compute nodes (default: every operator)")
    ap.add_argument(
        "--lns", type=int, default=0, help="compute nodes freed per round of the search (0: solve whole)"
    )
    ap.add_argument("--round-time", type=float, default=20, help="seconds per round of --lns")
    ap.add_argument("--out", default="hilp_inorder", help="results file name under bench/results")
    args = ap.parse_args()
    only = {s for s in args.only.split(",") if s}
    paths = [export_path(n) for n in EXPORTS] + args.graphs
    out = HERE / "results" / f"{args.out}.json"
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
            write_results(args.out, rows, folder=HERE / "results", note=NOTE)
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
