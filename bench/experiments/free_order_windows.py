"""Issue 18, item 2: is a schedule locally optimal when the order inside a window is free too?

`remat_cli.solvers.hilp.windows` re-solves windows of Checkmate's model in a schedule's own order.
This bench frees the order as well: a window B of the schedule's compute sequence is replaced by
any sequence of at most len(B) + slack computes (time-indexed: x[t, n] computes n at step t,
S[t, v] keeps v live at step t; at most one compute per step; inputs live; outputs not live;
memory at each compute instant within the budget: the simulator's rule, docs/FORMATS.md §2).
Where B recomputes nodes, a second window A over their first computations is freed with it, and
what A leaves live across the fixed gap between them is a decision whose bytes count against the
gap's peak: keeping a value from forward to backward instead of recomputing it. Everything
outside A and B stays as it is; the live sets at their edges are the schedule's own (the
sequence is decoded with `steps_from_sequence`, which frees each value after its last use).

Each window's MILP (HiGHS) starts from the schedule's own window; a solution that simulates
within the budget at a lower cost is taken and the sweep goes on from it. A window whose model
is proved optimal shows that no re-ordering, recomputation or keeping inside it is cheaper;
"open" is the largest objective - bound gap of the windows not proved, in points of overhead.

    python3 bench/free_order_windows.py --window 12 --window-limit 30 --start-limit 120
    python3 bench/free_order_windows.py --start greedy --out free_order_windows_greedy

Prints a table and writes bench/experiments/results/free_order_windows.json (or --out).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the checkout, and bench/ for common.py

from common import EXPORTS, export_cells, write_results  # noqa: E402

from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.milp.engine import EngineSettings, LinearModel, solve  # noqa: E402
from remat_cli.schedule import overhead, simulate, steps_from_sequence  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

#: extra steps a window may take beyond its own length (recomputations it adds)
SLACK = 6


def live_sets(g: Graph, seq: list[str]) -> tuple[list[set[str]], list[int]]:
    """The non-resident values live before each compute of `seq` (and at its end), and the
    memory at each compute instant without the resident bytes, as `simulate` counts them."""
    vm, nm = g.value_map, g.node_map
    live: set[str] = set()
    lives: list[set[str]] = []
    instants: list[int] = []
    mem = 0
    for step in steps_from_sequence(g, seq):
        if step.op == "compute":
            n = nm[step.node or ""]
            out = sum(vm[o].size for o in n.outputs)
            lives.append(set(live))
            instants.append(mem + out + n.workspace)
            live.update(n.outputs)
            mem += out
        else:
            live.discard(step.value or "")
            mem -= vm[step.value or ""].size
    lives.append(set(live))
    return lives, instants


class Model:
    """The MILP of one window B, with its forward window A when given (see the module)."""

    def __init__(self, g: Graph, budget: int, seq: list[str], a: tuple[int, int] | None, b: tuple[int, int]):
        self.g, self.seq = g, seq
        nm, vm = g.node_map, g.value_map
        self.lives, instants = live_sets(g, seq)
        self.cap = budget - g.resident_bytes
        self.m = LinearModel()
        self.rows: tuple[list[int], list[int], list[float], list[float], list[float]] = ([], [], [], [], [])
        segments = [a, b] if a else [b]
        nodes_a = sorted(set(seq[a[0] : a[1]])) if a else []
        nodes_b = sorted(set(seq[b[0] : b[1]]) | set(nodes_a))
        values = set().union(*(self.lives[k] for s in segments for k in s))
        for n in nodes_b:
            values |= {v for v in nm[n].inputs if not vm[v].resident} | set(nm[n].outputs)
        self.values = sorted(values)
        self.vi = {v: i for i, v in enumerate(self.values)}
        self.scale = float(max(vm[v].size for v in self.values)) if self.values else 1.0
        carry: set[str] = set()
        gap_used: set[str] = set()
        if a:
            gap = seq[a[1] : b[0]]
            gap_used = {u for n in gap for u in nm[n].inputs} | {o for n in gap for o in nm[n].outputs}
            carry = {v for v in self.values if v not in gap_used}
        lo_b, hi_b = self._bounds(b[1] - b[0] + SLACK)
        hi_b[0] = [1.0 if v in self.lives[b[0]] or v in carry else 0.0 for v in self.values]
        lo_b[-1] = [1.0 if v in self.lives[b[1]] else 0.0 for v in self.values]
        self.parts = []
        if a:
            lo_a, hi_a = self._bounds(a[1] - a[0] + 2)
            hi_a[0] = [1.0 if v in self.lives[a[0]] else 0.0 for v in self.values]
            lo_a[-1] = [1.0 if v in gap_used and v in self.lives[a[1]] else 0.0 for v in self.values]
            self.parts.append((a, nodes_a, *self._segment(nodes_a, lo_a, hi_a)))
        self.parts.append((b, nodes_b, *self._segment(nodes_b, lo_b, hi_b)))
        if a:
            # what A leaves live across the gap: B starts with no more of it, and its bytes join
            # the gap's own peak (the gap's instants without the values it does not touch)
            s_a, s_b = self.parts[0][3], self.parts[1][3]
            for v in carry:
                self._row([s_b[0, self.vi[v]], s_a[-1, self.vi[v]]], [1, -1], -np.inf, 0)
            gap_peak = max(
                instants[k] - sum(vm[v].size for v in self.lives[k] if v in carry) for k in range(a[1], b[0])
            )
            cols = [s_a[-1, self.vi[v]] for v in carry]
            self._row(
                cols, [vm[v].size / self.scale for v in carry], -np.inf, (self.cap - gap_peak) / self.scale
            )
        rows, cols, coefs, lo, hi = self.rows
        self.m.add_constraints(rows, cols, coefs, np.array(lo), np.array(hi), count=len(lo))

    def _bounds(self, steps: int) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros((steps + 1, len(self.values))), np.ones((steps + 1, len(self.values)))

    def _row(self, cols: list[int], coefs: list[float], lo: float, hi: float) -> None:
        r = len(self.rows[3])
        self.rows[0].extend([r] * len(cols))
        self.rows[1].extend(cols)
        self.rows[2].extend(coefs)
        self.rows[3].append(lo)
        self.rows[4].append(hi)

    def _segment(self, nodes: list[str], lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """x[t, n] and S[t, v] of one free-order segment of len(lo) - 1 steps."""
        nm, vm, producer = self.g.node_map, self.g.value_map, self.g.producer
        steps, width = lo.shape[0] - 1, len(nodes)
        ni = {n: j for j, n in enumerate(nodes)}
        cost = np.tile([nm[n].cost for n in nodes], steps)
        x = self.m.add_vars(steps * width, lb=0, ub=1, integer=True, cost=cost).reshape(steps, width)
        s = self.m.add_vars(lo.size, lb=lo.ravel(), ub=hi.ravel(), integer=True).reshape(lo.shape)
        sizes = [vm[v].size / self.scale for v in self.values]
        made = [(sum(vm[o].size for o in nm[n].outputs) + nm[n].workspace) / self.scale for n in nodes]
        for t in range(steps):
            self._row(list(x[t]), [1.0] * width, -np.inf, 1)
            if t + 1 < steps:  # idle steps last: one schedule, one solution
                self._row(list(x[t]) + list(x[t + 1]), [1.0] * width + [-1.0] * width, 0, np.inf)
            for n in nodes:
                for u in nm[n].inputs:
                    if not vm[u].resident:
                        self._row([x[t, ni[n]], s[t, self.vi[u]]], [1, -1], -np.inf, 0)
                for o in nm[n].outputs:
                    self._row([x[t, ni[n]], s[t, self.vi[o]]], [1, 1], -np.inf, 1)
            for v, i in self.vi.items():
                p = producer.get(v)
                made_here = [x[t, ni[p]]] if p in ni else []
                self._row([s[t + 1, i], s[t, i], *made_here], [1, -1] + [-1] * len(made_here), -np.inf, 0)
            self._row(list(s[t]) + list(x[t]), sizes + made, -np.inf, self.cap / self.scale)
        return x, s

    def hint(self) -> np.ndarray:
        """The schedule's own windows as a solution of the model."""
        h = np.zeros(self.m.num_vars)
        for (lo, hi), nodes, x, s in self.parts:
            ni = {n: j for j, n in enumerate(nodes)}
            for t, n in enumerate(self.seq[lo:hi]):
                h[x[t, ni[n]]] = 1
            for t in range(s.shape[0]):
                for v in self.lives[lo + min(t, hi - lo)]:
                    if v in self.vi:
                        h[s[t, self.vi[v]]] = 1
        return h

    def sequence(self, sol: np.ndarray) -> list[str]:
        """The whole compute sequence with the windows replaced by the solution's."""
        out, at = [], 0
        for (lo, hi), nodes, x, _ in self.parts:
            picked = np.round(sol[x]).astype(int)
            out += self.seq[at:lo] + [nodes[j] for t in range(x.shape[0]) for j in np.flatnonzero(picked[t])]
            at = hi
        return out + self.seq[at:]


def forward_window(seq: list[str], b: tuple[int, int], most: int) -> tuple[int, int] | None:
    """A over the first computations of the nodes B recomputes (at most `most` steps, ending
    before B); None where B recomputes nothing."""
    first: dict[str, int] = {}
    for k, n in enumerate(seq[: b[0]]):
        first.setdefault(n, k)
    starts = sorted(first[n] for n in set(seq[b[0] : b[1]]) if n in first)
    if not starts:
        return None
    lo = starts[0]
    hi = min(b[0] - 1, max(k for k in starts if k < lo + most) + 1)
    return (lo, hi) if hi > lo else None


def sweep(g: Graph, budget: int, seq: list[str], window: int, limit: float) -> dict[str, Any]:
    """Windows of `window` steps (stride half that) over `seq`, improved where the MILP finds
    a cheaper schedule within budget; counts and the largest open gap (objective - bound)."""
    cost = simulate(g, steps_from_sequence(g, seq)).cost
    proved = tried = improved = 0
    open_gap = 0.0
    lo = 0
    while lo < len(seq):
        b = (lo, min(len(seq), lo + window))
        model = Model(g, budget, seq, forward_window(seq, b, window), b)
        res = solve(model.m, EngineSettings(backend="highs", time_limit=limit, hint=model.hint()))
        tried += 1
        if res.x is not None:
            new = model.sequence(res.x)
            sim = simulate(g, steps_from_sequence(g, new))
            if sim.peak_memory <= budget and sim.cost < cost - 1e-9:
                seq, cost, improved = new, sim.cost, improved + 1
        if res.status == "optimal":
            proved += 1
        elif res.objective is not None and res.bound is not None:
            open_gap = max(open_gap, res.objective - res.bound)
        lo += max(1, window // 2)
    return {
        "cost": cost,
        "seq": seq,
        "windows": tried,
        "proved": proved,
        "improved": improved,
        "open": open_gap,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fractions", default="0.5")
    ap.add_argument("--start", default="fastsa", help="the solver whose schedule is swept")
    ap.add_argument("--start-limit", type=float, default=120.0)
    ap.add_argument("--window", type=int, default=20)
    ap.add_argument("--window-limit", type=float, default=20.0, help="seconds per window's MILP")
    ap.add_argument("--only", nargs="*", help="shipped exports by name (default: all four)")
    ap.add_argument("--graphs", nargs="*", default=[], help="more graph files")
    ap.add_argument("--out", default="free_order_windows")
    ap.add_argument("--note", default="")
    args = ap.parse_args()
    names = [*(EXPORTS if args.only is None else args.only), *args.graphs]
    table = Table(title=f"free-order windows of {args.window} steps over {args.start}'s schedule")
    for col in ("graph", "budget", "start", "after", "windows", "proved", "improved", "open (pt)", "s"):
        table.add_column(col)
    rows = []
    for name, g, base, frac, budget in export_cells(names, [float(f) for f in args.fractions.split(",")]):
        opts = SolveOptions(time_limit=args.start_limit, seed=0, workers=1)
        sched, _ = run_solver(g, budget, args.start, opts)
        if sched is None or sched.summary.peak_memory > budget:
            continue
        seq = [s.node or "" for s in sched.steps if s.op == "compute"]
        t0 = time.monotonic()
        w = sweep(g, budget, seq, args.window, args.window_limit)
        row = {
            "graph": name,
            "fraction": frac,
            "start": round(overhead(sched.summary.cost, base.cost), 5),
            "after": round(overhead(w["cost"], base.cost), 5),
            "windows": w["windows"],
            "proved": w["proved"],
            "improved": w["improved"],
            "open_points": round(100 * w["open"] / base.cost, 3),
            "seconds": round(time.monotonic() - t0, 1),
        }
        rows.append(row)
        table.add_row(*(str(v) for v in row.values()))
        Console(stderr=True).print(table)
    Console().print(table)
    print(
        write_results(
            args.out, rows, folder=HERE / "results", start=args.start, window=args.window, note=args.note
        )
    )


if __name__ == "__main__":
    main()
