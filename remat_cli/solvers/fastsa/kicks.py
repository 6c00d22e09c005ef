"""Kicks after the second stage: an iterated local search around FastSA's best schedule.

Not in the paper (Imanishi et al., NeurIPS'23, which anneals two stages once, App. D.4). At
tight budgets the first stage decides early which large computation a schedule recomputes, and
the cold second stage cannot undo it: every state between the two choices is above the budget.
A schedule may then recompute one expensive node where a cheaper one keeps its output and
recomputes what follows it instead. A kick removes the later computations of the recomputed node with the
largest recomputation cost (cost × extra copies), which leaves the schedule above the budget,
and anneals it again at the second stage's temperatures with a steep slope above the budget
(``RESCUE_OVER``); the result replaces the schedule only when the simulator finds it within the
budget and cheaper (the acceptance rule of iterated local search, Lourenço et al. 2003). A kick
that does not improve moves on to the next most expensive recomputation; one that does starts
again from the top of the new schedule's list.

The kicks get the iterations (``--kicks``, a share of the budget) that a first stage gives back
when it meets the budget before its tight part would begin; a stage that needs the tight part
keeps all of them, as it meets the budget late or not at all when they are taken up front.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from remat_cli.schedule import simulate, steps_from_sequence
from remat_cli.solvers.fastsa.problem import Problem, State, expand, to_base
from remat_cli.solvers.fastsa.run import Run


def kicked(order: Sequence[int], cost: Sequence[float], r: int) -> list[int] | None:
    """``order`` (base-problem indices) without the later computations of its ``r``-th most
    expensive recomputed node, or None when it recomputes fewer than r + 1 nodes."""
    copies = Counter(int(i) for i in order)
    recomputed = sorted(
        (i for i, c in copies.items() if c > 1), key=lambda i: (-cost[i] * (copies[i] - 1), i)
    )
    if r >= len(recomputed):
        return None
    k, seen, out = recomputed[r], False, []
    for i in order:
        if int(i) == k:
            if seen:
                continue
            seen = True
        out.append(int(i))
    return out


def iterate(run: Run, base_prob: Problem, start: list[int], start_cost: float, n_iter: int, each: int,
            h0: float, hf: float, over: float, seed: int) -> tuple[list[int], float, int]:  # fmt: skip
    """Kick ``start`` (base-problem indices, simulated cost ``start_cost``, within the budget)
    while ``n_iter`` iterations remain, ``each`` per kick annealed from ``h0`` to ``hf`` with
    slope ``over`` above the budget. Returns the best order, its cost and the number of kicks."""
    best, best_cost = list(start), start_cost
    r = kicks = 0
    left = n_iter
    slope = run.over
    while left >= each // 2 and not run.wall_stopped:
        order = kicked(best, base_prob.cost, r)
        if order is None:
            break
        kicks += 1
        state = State(base_prob, np.array(order, dtype=np.int64), seed + 2 + kicks, run.log_cap, run.cfg.lse)
        before, run.over = run.iterations, max(slope, over)
        found = run.stage(2, state, min(each, left), h0, hf, False, False).feas
        run.over = slope
        left -= run.iterations - before
        r += 1
        if found.order is None:
            continue
        polished = run.polish(base_prob, expand(base_prob, found.order))
        sim = simulate(run.graph, steps_from_sequence(run.graph, [run.nv.ids[i] for i in polished]))
        if sim.peak_memory <= run.cfg.budget and sim.cost < best_cost:
            best, best_cost, r = to_base(base_prob, polished), sim.cost, 0
    return best, best_cost, kicks
