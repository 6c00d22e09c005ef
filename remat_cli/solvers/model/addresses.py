"""MODeL §4.3 with the order fixed: the byte offset A_e of every tensor inside one arena.

Buffers have fixed lifetimes [start, end) here; two whose lifetimes intersect must not share
bytes, and the arena is max A_e + S_e (eq. 8). Two engines:

* ``cp-sat`` (default): one box per buffer, time interval x address interval, and CP-SAT's
  ``AddNoOverlap2D`` - no big-M rows, no pair variables; the lifetimes are constants, so only
  the address axis is searched. Warm-started from the greedy best-fit offsets.
* ``milp``: the paper's eqs. (6)-(8) through `remat_cli.milp` (HiGHS/SCIP/Gurobi): one binary
  per pair of buffers that are live together (App. A.2: pairs with disjoint lifetimes get no
  variable; with the order fixed "live together" is known, so eq. (6)'s a + b >= ... is a = 1 - b),
  big-M rows (7a)/(7b) with M = the greedy arena.

Measured on the shipped training graphs, program order, alignment 1 (bench/model.py, loaded
2-core machine, 20 s each): torch_mlp_train's greedy arena is 1,024 B above the peak; CP-SAT
proves the peak optimal in 0.45 s, the MILP (HiGHS) still has the greedy arena after 20 s. On
torch_resnet_train neither closes a 128 B gap in 20 s; on the transformer and the U-Net the
greedy start is already the peak. Hence CP-SAT by default. The lower bound is the order's
fragmentation-free peak (`arena_peak`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from remat_cli import milp
from remat_cli.memory_plan import Buffer, align, arena_peak, greedy_offsets
from remat_cli.solvers.model import cpsat

ENGINES = ("cp-sat", "milp")


def place(
    buffers: Sequence[Buffer],
    alignment: int,
    time_limit: float,
    workers: int = 1,
    seed: int = 0,
    engine: str = "cp-sat",
) -> tuple[list[int], int, int, bool]:
    """Offsets for `buffers`: (offsets, arena, lower bound, proven optimal)."""
    offsets = greedy_offsets(buffers, alignment)
    arena = _arena(buffers, offsets, alignment)
    bound = arena_peak(buffers, alignment)
    if arena <= bound or time_limit <= 0:
        return offsets, arena, bound, arena <= bound
    task = _Task(buffers, alignment, offsets, arena, bound, time_limit, workers, seed)
    got = _milp(task) if engine == "milp" else _cpsat(task)
    if got is None:
        return offsets, arena, bound, False
    new, new_bound, proven = got
    new_arena = _arena(buffers, new, alignment)
    if new_arena < arena:
        offsets, arena = new, new_arena
    bound = max(bound, new_bound)
    return offsets, arena, min(bound, arena), proven or arena <= bound


def _arena(buffers: Sequence[Buffer], offsets: Sequence[int], alignment: int) -> int:
    return max((o + align(b.size, alignment) for o, b in zip(offsets, buffers, strict=True)), default=0)


@dataclass(frozen=True)
class _Task:
    """What either engine gets: the buffers, the greedy start and its arena, the lower bound, limits."""

    buffers: Sequence[Buffer]
    alignment: int
    start: list[int]  # the greedy offsets: the warm start
    arena: int  # their arena: the top of every address domain
    bound: int
    time_limit: float
    workers: int
    seed: int


# (offsets, lower bound, proven optimal), or None when the engine found no solution
_Found = tuple[list[int], int, bool] | None


def _cpsat(t: _Task) -> _Found:
    buffers, alignment = t.buffers, t.alignment
    # Offsets in units of the alignment: smaller domains, and alignment holds by construction.
    units = [align(b.size, alignment) // alignment for b in buffers]
    top = t.arena // alignment
    m = cp_model.CpModel()
    peak = m.new_int_var(t.bound // alignment, top, "arena")
    a_vars: list[cp_model.IntVar | None] = []
    xs, ys = [], []
    for i, (b, u) in enumerate(zip(buffers, units, strict=True)):
        if u == 0:
            a_vars.append(None)
            continue
        a = m.new_int_var(0, top - u, f"A{i}")
        m.add(a + u <= peak)  # eq. (8)
        m.add_hint(a, t.start[i] // alignment)
        a_vars.append(a)
        xs.append(m.new_fixed_size_interval_var(b.start, b.end - b.start, f"x{i}"))
        ys.append(m.new_fixed_size_interval_var(a, u, f"y{i}"))
    m.add_no_overlap_2d(xs, ys)
    m.minimize(peak)
    got = cpsat.run(m, t.time_limit, t.workers, t.seed)
    if got is None:
        return None
    solver, optimal = got
    bound = int(round(solver.best_objective_bound)) * alignment
    return cpsat.offsets(solver, a_vars, alignment), bound, optimal


def overlapping_pairs(buffers: Sequence[Buffer]) -> list[tuple[int, int]]:
    """Pairs (i, j), i < j, of non-empty buffers live at the same step (App. A.2's pruning)."""
    idx = sorted((i for i, b in enumerate(buffers) if b.size > 0), key=lambda i: buffers[i].start)
    pairs: list[tuple[int, int]] = []
    active: list[int] = []
    for i in idx:
        s = buffers[i].start
        active = [j for j in active if buffers[j].end > s]
        pairs.extend((min(i, j), max(i, j)) for j in active)
        active.append(i)
    return pairs


def _milp(t: _Task) -> _Found:
    buffers, alignment, start = t.buffers, t.alignment, t.start
    units = np.array([align(b.size, alignment) // alignment for b in buffers], dtype=float)
    top = t.arena // alignment
    n = len(buffers)
    pairs = overlapping_pairs(buffers)
    lm = milp.LinearModel("model-addresses")
    a = lm.add_vars(n, lb=0.0, ub=np.maximum(0.0, top - units), integer=True)
    peak = lm.add_vars(1, lb=t.bound // alignment, ub=top, integer=True, cost=1.0)[0]
    below = lm.add_vars(len(pairs), lb=0.0, ub=1.0, integer=True)  # a_ij = 1: i below j
    # eq. (8): A_e + S_e <= peak
    lm.add_constraints(
        np.repeat(np.arange(n), 2),
        np.stack([a, np.full(n, peak)], axis=1).ravel(),
        np.tile([1.0, -1.0], n),
        -np.inf,
        -units,
    )
    if pairs:
        pi = np.array([p[0] for p in pairs])
        pj = np.array([p[1] for p in pairs])
        k = len(pairs)
        big = float(top)
        rows = np.repeat(np.arange(k), 3)
        # (7a) A_i + S_i - A_j <= (1 - a_ij) M   ->  A_i - A_j + M a_ij <= M - S_i
        lm.add_constraints(
            rows,
            np.stack([a[pi], a[pj], below], 1).ravel(),
            np.tile([1.0, -1.0, big], k),
            -np.inf,
            big - units[pi],
        )
        # (7b) with b_ij = 1 - a_ij (they are live together): A_j + S_j - A_i <= a_ij M
        lm.add_constraints(
            rows,
            np.stack([a[pj], a[pi], below], 1).ravel(),
            np.tile([1.0, -1.0, -big], k),
            -np.inf,
            -units[pj],
        )
    hint = np.zeros(lm.num_vars)
    hint[a] = np.array(start) // alignment
    hint[peak] = top
    if pairs:
        hint[below] = [1.0 if start[i] < start[j] else 0.0 for i, j in pairs]
    res = milp.solve(
        lm,
        milp.EngineSettings(
            backend="highs", time_limit=t.time_limit, threads=t.workers, seed=t.seed, hint=hint
        ),
    )
    if res.x is None:
        return None
    offsets = [int(round(res.x[a[i]])) * alignment for i in range(n)]
    lb = int(np.ceil((res.bound or 0) - 1e-6)) * alignment
    return offsets, lb, res.status == "optimal"
