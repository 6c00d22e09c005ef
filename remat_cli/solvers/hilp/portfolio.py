"""The whole-graph fallbacks of the H-ILP solver: greedy, then fastsa with the time left, run in
a forked process beside the H-ILPs (HiREmate's "framework of solvers", §3.2.1, applied to the
whole graph in parallel)."""

from __future__ import annotations

import time
from typing import Any

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.schedule import Step, simulate
from remat_cli.solver import SolveOptions

FALLBACK = ("greedy", "fastsa")


class Portfolio:
    """Whole-graph greedy, then fastsa with the time left, in a forked process beside the
    H-ILPs (the "framework of solvers" of §3.2.1 applied to the whole graph, in parallel)."""

    def __init__(self, graph: Graph, budget: int, limit: float, seed: int):
        import multiprocessing as mp

        self.g = graph
        self.budget = budget
        ctx = mp.get_context("fork")
        self.conn, child = ctx.Pipe(duplex=False)
        # a little before the limit, so that its schedules are back when the H-ILPs end
        self.proc = ctx.Process(target=_portfolio_main, args=(child, graph, budget, 0.95 * limit, seed))
        self.proc.start()
        child.close()

    def collect(self, wait: float, notes: list[str]) -> tuple[float, list[Step], int, str] | None:
        """The cheapest schedule within budget it sent, waiting at most `wait` (+5) seconds; the
        helpers' failures are added to `notes`."""
        if not self.conn.poll(max(0.0, wait) + 5.0):
            notes.append("whole-graph greedy/fastsa sent nothing in time")
            return None
        out: tuple[float, list[Step], int, str] | None = None
        found, failures = self.conn.recv()
        notes.extend(failures)
        for name, steps in found:
            sim = simulate(self.g, steps)
            if sim.peak_memory <= self.budget and (out is None or sim.cost < out[0]):
                out = (sim.cost, steps, sim.peak_memory, name)
        return out

    def stop(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join()
        self.conn.close()


def _portfolio_main(conn: Any, graph: Graph, budget: int, limit: float, seed: int) -> None:
    started = time.monotonic()
    found: list[tuple[str, list[Step]]] = []
    failures: list[str] = []
    for name in FALLBACK:
        left = max(5.0 if name == "greedy" else 0.5, limit - (time.monotonic() - started))
        # greedy held to its limit (two workers; see flatstart.WholeGraph.flat_schedule)
        opts = SolveOptions(time_limit=left, seed=seed, workers=2 if name == "greedy" else 1)
        r = registry.call_solver(name, graph, budget, opts, failures)
        if r is not None and r.steps is not None:
            found.append((name, r.steps))
    conn.send((found, failures))
    conn.close()
