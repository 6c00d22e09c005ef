"""Independent FastSA chains side by side, one per worker, the cheapest schedule kept.

Imanishi et al. (NeurIPS'23) run one annealing chain (§2.2, App. D.4). Its result varies with
the seed as much as with the time (ONNX exports, 60 s, one core: resnet18_b32 at 50% 16.2 /
15.4 / 11.7% for seeds 0-2; mobilenet_v2_b1 at 70% ends near 0.8% or near 3.0% by chance, and
at 50% finds nothing with seeds 0 and 1 at 30 s, 11.1% with seed 2). Where more than one core
is free, chain k runs the whole solve with seed + k in a forked process beside chain 0 (this
process, seed as given, which reports progress and incumbents), each with the full iteration
budget: the result is never worse than one chain's, and is as deterministic (seed and worker
count decide it)."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from remat_cli.graph import Graph
from remat_cli.schedule import simulate
from remat_cli.solver import SolveOptions, SolverResult

#: seconds a chain may take past the time limit before its result is given up
GRACE = 5.0

Chain = Callable[[SolveOptions], SolverResult]


def can_fork() -> bool:
    """Forked chains need the fork start method and a process allowed children (a daemonic
    one, e.g. the H-ILP's forked helpers, is not)."""
    return "fork" in mp.get_all_start_methods() and not mp.current_process().daemon


def run_chains(chain: Chain, graph: Graph, budget: int, options: SolveOptions, k: int) -> SolverResult:
    """`chain` run with seeds seed .. seed + k - 1 side by side; the result the simulator finds
    within budget at least cost, else at the lowest peak (ties: the lowest seed)."""
    ctx = mp.get_context("fork")
    children = []
    for j in range(1, k):
        recv, send = ctx.Pipe(duplex=False)
        opts = replace(options, seed=options.seed + j, workers=1, on_incumbent=None, on_progress=None)
        proc = ctx.Process(target=_child, args=(send, chain, opts), daemon=True)
        proc.start()
        send.close()
        children.append((proc, recv))
    try:
        results: list[SolverResult | None] = [chain(replace(options, workers=1))]
        for _, recv in children:
            left = options.remaining()
            got: Any = None
            try:
                if recv.poll(None if left is None else left + GRACE):
                    got = recv.recv()
            except (EOFError, OSError):
                got = None
            results.append(got if isinstance(got, SolverResult) else None)
    finally:  # also when chain 0 raises: no chain outlives the solve
        for proc, recv in children:
            if proc.is_alive():
                proc.terminate()
            proc.join()
            recv.close()
    return cheapest(graph, budget, options, results, "chains side by side", 1)


def _child(send: Any, chain: Chain, opts: SolveOptions) -> None:
    try:
        send.send(chain(opts))
    except Exception as e:  # noqa: BLE001 - the parent keeps chain 0's result; no traceback here
        send.send(f"{type(e).__name__}: {e}")
    finally:
        send.close()


def cheapest(
    graph: Graph,
    budget: int,
    options: SolveOptions,
    results: list[SolverResult | None],
    how: str,
    seed_step: int,
) -> SolverResult:
    """The result the simulator finds within budget at least cost, else at the lowest peak (ties:
    the first); result j ran with seed + `seed_step`·j, and the message says which won."""
    best: tuple[tuple[int, float], int] | None = None
    for j, r in enumerate(results):
        if r is None or not r.steps:
            continue
        sim = simulate(graph, r.steps)
        over = sim.peak_memory > budget
        key = (int(over), float(sim.peak_memory) if over else sim.cost)
        if best is None or key < best[0]:
            best = (key, j)
    if best is None:
        first = results[0]
        assert first is not None
        return first
    j = best[1]
    chosen = results[j]
    assert chosen is not None
    ran = sum(r is not None for r in results)
    last = options.seed + seed_step * (len(results) - 1)
    chosen.message = (
        f"{chosen.message}; the cheapest of {ran} {how} (seeds {options.seed}-{last}): "
        f"seed {options.seed + seed_step * j}"
    )
    if j:
        options.incumbent(chosen.steps or [])
    return chosen
