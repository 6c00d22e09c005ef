"""Issue 18: is fastsa's schedule of a PyTorch export a local optimum for exact ILPs that may also
reorder? The windows of remat_cli.solvers.hilp.windows re-solve Checkmate's model over a stretch
of the schedule's own first-computation order and find nothing over fastsa's 120 s schedules.
This asks the wider question: for each window of ``--size`` stages (half overlap, where the
schedule recomputes most first), other topological orders of the window's operators — each one
moved to the earliest and the latest place its dependencies in the window allow, and
``--random`` random orders — each with Checkmate's model (Jain et al., MLSys'20, eqs. 1-16)
re-solved over the window with the rest of the schedule fixed (``LinearModel.restricted``;
U and FREE are also free in the later stages that recompute an operator of the window, which
now run them in the new order). A cheaper schedule the simulator confirms within budget restarts the sweep from it.

    python3 bench/hilp_reorder.py                      # the four shipped exports at 50%
    python3 bench/hilp_reorder.py --only torch_unet_train --size 16 --random 2 --out hilp_reorder_unet

Prints a table and writes bench/experiments/results/hilp_reorder.json.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the checkout, and bench/ for common.py

from common import EXPORTS, export_cells, write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.milp import EngineSettings  # noqa: E402
from remat_cli.milp import solve as milp_solve  # noqa: E402
from remat_cli.schedule import Step, overhead, simulate  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402
from remat_cli.solvers.checkmate.decode import S_from_steps, minimal_R, steps_from_S  # noqa: E402
from remat_cli.solvers.checkmate.model import build_model, stages_of  # noqa: E402
from remat_cli.solvers.hilp.windows import column_stages, in_order, spans  # noqa: E402


def orders(
    win: list[str], preds: dict[str, list[str]], rng: random.Random, n_random: int
) -> Iterator[list[str]]:
    """Topological orders of the window's operators other than its own: each operator moved as
    early and as late as its dependencies inside the window allow, then random ones."""
    seen = {tuple(win)}

    def new(order: list[str]) -> bool:
        if tuple(order) in seen:
            return False
        seen.add(tuple(order))
        return True

    for u in win:
        rest = [n for n in win if n != u]
        lo = max((rest.index(p) + 1 for p in preds[u]), default=0)
        hi = min((rest.index(s) for s in rest if u in preds[s]), default=len(rest))
        for at in (lo, hi):
            if new(order := rest[:at] + [u] + rest[at:]):
                yield order
    for _ in range(n_random):
        indeg = {n: len(preds[n]) for n in win}
        ready, order = [n for n in win if indeg[n] == 0], []
        while ready:
            n = ready.pop(rng.randrange(len(ready)))
            order.append(n)
            for s in win:
                if n in preds[s]:
                    indeg[s] -= 1
                    if indeg[s] == 0:
                        ready.append(s)
        if new(order):
            yield order


def reorder_sweep(
    graph: Graph, budget: int, steps: list[Step], size: int, n_random: int, per_window: float, limit: float
) -> dict[str, object]:
    """Windows with other orders over `steps` until a whole pass improves nothing or `limit`
    seconds pass: the cheapest cost found, and how many orders were solved or infeasible."""
    end = time.monotonic() + limit
    rng = random.Random(0)
    best = simulate(graph, steps).cost
    solved = infeasible = improved = 0
    again = True
    while again and time.monotonic() < end:
        again = False
        seq = list(dict.fromkeys(s.node for s in steps if s.op == "compute" and s.node))
        st0 = stages_of(in_order(graph, seq), budget)
        S0, R0 = minimal_R(st0, S_from_steps(st0, steps))
        T, ids = st0.T, st0.ids
        recomputed = (R0 * st0.cost[None, :]).sum(1) - st0.cost  # per stage
        windows = spans(T, size)
        # the schedule's recomputations in and just after a window are what reordering may save
        windows.sort(key=lambda w: -recomputed[w[0] : w[1] + size].sum())
        for a, b in windows:
            if again or time.monotonic() > end:
                break
            win = ids[a:b]
            preds = {n: [ids[p] for p in st0.preds[a + k] if a <= p < b] for k, n in enumerate(win)}
            for order in orders(win, preds, rng, n_random):
                if time.monotonic() > end:
                    break
                new_ids = ids[:a] + order + ids[b:]
                st = stages_of(in_order(graph, new_ids), budget)
                if st.ids != new_ids:  # the stages follow the order given, or the mapping is void
                    raise AssertionError(f"stages out of the order given at window {a}-{b}")
                where = {n: k for k, n in enumerate(new_ids)}
                perm = np.array([where[n] for n in ids])
                S, R = np.zeros_like(S0), np.zeros_like(R0)
                S[:, perm], R[:, perm] = S0, R0  # the same schedule outside the window
                R[a:b] = False
                R[np.arange(a, b), np.arange(a, b)] = True
                S[a + 1 : b] = False
                cm = build_model(st)
                x = cm.vector(S, R)
                stage_r, stage_s, stage_u = column_stages(cm)
                # memory and frees re-planned in the window and in the later stages that
                # recompute one of its operators (they now run in the new order there)
                replan = np.zeros(T + 1, dtype=bool)
                replan[max(0, a - 1) : b + 1] = True
                replan[b:T] |= R0[b:, a:b].any(axis=1)
                free = (
                    ((stage_r >= a) & (stage_r < b))
                    | ((stage_s >= a) & (stage_s <= b))
                    | ((stage_u >= 0) & replan[stage_u])
                )
                res = milp_solve(
                    cm.model.restricted(free, x),
                    EngineSettings(backend="highs", time_limit=per_window, threads=1, seed=0),
                )
                if res.x is None:
                    infeasible += 1
                    continue
                solved += 1
                x[free] = res.x
                cand = steps_from_S(st, cm.S_matrix(x))
                sim = simulate(graph, cand)
                if sim.peak_memory <= budget and sim.cost < best - 1e-9 * best:
                    best, steps, again = sim.cost, cand, True
                    improved += 1
                    break
    return {"cost": best, "orders_solved": solved, "orders_infeasible": infeasible, "improved": improved}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", default=list(EXPORTS), help="shipped graph names or graph paths")
    ap.add_argument("--fractions", type=float, nargs="*", default=[0.5])
    ap.add_argument("--fastsa", type=float, default=120.0, help="fastsa's seconds for the start")
    ap.add_argument("--size", type=int, default=16, help="stages per window")
    ap.add_argument("--random", type=int, default=2, help="random orders per window")
    ap.add_argument("--window-seconds", type=float, default=10.0, help="HiGHS's limit per order")
    ap.add_argument("--seconds", type=float, default=600.0, help="the sweep's limit per cell")
    ap.add_argument("--out", default="hilp_reorder", help="bench/experiments/results/OUT.json")
    args = ap.parse_args()
    rows = []
    table = Table("graph", "budget", "fastsa", "reordered windows", "orders solved", "infeasible", "seconds")
    for name, g, base, frac, budget in export_cells(args.only, args.fractions):
        start, _ = run_solver(g, budget, "fastsa", SolveOptions(time_limit=args.fastsa, seed=0, workers=1))
        row: dict[str, object] = {"graph": name, "fraction": frac, "budget": budget}
        if start is None:
            row["fastsa"] = None
        else:
            t0 = time.monotonic()
            out = reorder_sweep(
                g, budget, start.steps, args.size, args.random, args.window_seconds, args.seconds
            )
            row |= {
                "fastsa": round(overhead(start.summary.cost, base.cost), 5),
                "reordered": round(overhead(float(out.pop("cost")), base.cost), 5),
                **out,
                "seconds": round(time.monotonic() - t0, 1),
            }
        rows.append(row)
        table.add_row(
            name,
            f"{frac:.0%}",
            *(f"{row[k]:.2%}" if row.get(k) is not None else "none" for k in ("fastsa", "reordered")),
            *(str(row.get(k, "")) for k in ("orders_solved", "orders_infeasible", "seconds")),
        )
        Console(stderr=True).print(f"{name} {frac:.0%}: {row}")
    Console(stderr=True).print(table)
    write_results(args.out, rows, folder=HERE / "results", fastsa_seconds=args.fastsa, size=args.size)


if __name__ == "__main__":
    main()
