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

CP-SAT is the default: its boxes need neither big-M rows nor pair binaries, so it proves small
arenas optimal where the MILP's relaxation stays at the greedy start (figures in bench/README.md,
`bench/model.py`). The lower bound is the order's fragmentation-free peak (`arena_peak`).

Before either engine (not in the paper): best fit in perturbed buffer orders, then, with CP-SAT,
the big buffers (at least `BIG` of the peak) placed exactly on their own and the rest best-fitted
around them. The fixed greedy orders can leave a wide gap above the peak on convolutional steps;
random orders close part of it, and a small exact model of the big buffers, proven quickly, gives
the full model a far better start than the greedy one. The perturbed draws stop after `PATIENCE`
in a row without a smaller arena, since on graphs where the greedy arena is already good no draw
improves it and each costs a placement. ``exact=False`` stops before the full model (the
solver's cheap look at several candidate orders).

Then squeaky wheel optimisation (`squeaky_wheel`; Joslin & Clements, "Squeaky Wheel"
Optimization, JAIR 10, 1999; not in the paper): first fit in a priority order, and the buffers
that end near the arena's top are raised in priority for the next round. Where a training
step's arena is set by small long-lived buffers (batch-norm statistics saved for the backward
pass, weight gradients kept to the end), no size order gives them a lane through their whole
lifetime, so they end on top; raised, they are placed before the large buffers that would
block the lane.

Then ruin and recreate (`repack`, not in the paper; the principle of Schrimpf et al., J. Comput.
Phys. 2000, on the address axis), from the caller's offsets or the heuristics': take a buffer at
the arena's top, lift out every buffer live during its lifetime (give or take a few steps) whose
top is above a random level, and best-fit them back in a perturbed size order around the buffers
that stay. A move is kept when the arena, then the bytes x steps in its top 1% band, do not
grow, so the search drifts until a column empties under the top: on large arenas it keeps
improving where the full CP-SAT model, with hundreds of boxes, no longer does. It stops on a
count of fruitless moves (`REPACK_WORK`), so a seed repeats.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from remat_cli import milp
from remat_cli.milp import cpsat
from remat_cli.planning.memory_plan import (
    Buffer,
    align,
    arena_of,
    arena_peak,
    best_fit,
    buffer_arrays,
    greedy_offsets,
    perturbed_breadth,
    perturbed_offsets,
)

ENGINES = ("cp-sat", "milp")
#: buffers of at least this fraction of the peak are placed exactly before the others
BIG = 0.01
#: perturbed best-fit orders tried before an engine runs
RESTARTS = 300
#: ... ending after this many in a row without a smaller arena (improvements come a few to a few
#: hundred draws apart where the draws help at all)
PATIENCE = 100
#: perturbed breadth orders tried after them (`memory_plan.perturbed_breadth`)
BREADTH_DRAWS = 30
#: ruin-and-recreate moves in a row without a smaller arena before `repack` ends, this many
#: divided by the number of buffers (a move costs about that many best-fit steps), so that the
#: work, not the move count, is bounded on large arenas
REPACK_WORK = 2_000_000


#: squeaky wheel optimisation (`squeaky_wheel`): the band under the arena's top whose buffers
#: are raised in priority, as a fraction of the peak, and the largest raise of a round
SWO_BAND, SWO_RAISE = 0.005, 0.5
#: ... ending after this many rounds per buffer in a row without a smaller arena (on a
#: training step the gains can come many rounds per buffer apart)
SWO_ROUNDS = 10


def place(
    buffers: Sequence[Buffer],
    alignment: int,
    time_limit: float,
    workers: int = 1,
    seed: int = 0,
    engine: str = "cp-sat",
    gap: float = 0.0,
    exact: bool = True,
    stall: float | None = None,
    start: Sequence[int] | None = None,
) -> tuple[list[int], int, int, bool]:
    """Offsets for `buffers`: (offsets, arena, lower bound, proven optimal). Stops once the
    arena is within `gap` (a fraction) of the bound; `exact=False`: the heuristics only (best
    fit, perturbed, the big buffers first), not ruin and recreate nor the full engine; `stall`:
    CP-SAT's rounds of deterministic time (`cpsat.run`); `start`: offsets the caller has (then
    ruin and recreate and the full engine go on from them, with no other heuristic)."""
    deadline = time.monotonic() + max(0.0, time_limit)
    offsets = greedy_offsets(buffers, alignment) if start is None else list(start)
    arena = arena_of(buffers, offsets, alignment)
    bound = arena_peak(buffers, alignment)

    def settled() -> bool:
        return arena <= bound * (1 + gap) or time.monotonic() >= deadline

    if time_limit <= 0 or settled():
        return offsets, arena, bound, arena <= bound
    if start is None:
        offsets = perturbed_offsets(
            buffers, alignment, offsets, RESTARTS, seed, deadline - 0.8 * time_limit, patience=PATIENCE
        )
        offsets = perturbed_breadth(
            buffers, alignment, offsets, BREADTH_DRAWS, seed, deadline - 0.7 * time_limit, patience=PATIENCE
        )
        arena = arena_of(buffers, offsets, alignment)
        if not settled():
            offsets = squeaky_wheel(buffers, alignment, offsets, seed, deadline - 0.4 * time_limit, gap)
            arena = arena_of(buffers, offsets, alignment)
    if engine == "cp-sat" and start is None and not settled():
        share = 0.3 * (deadline - time.monotonic())
        tiered = _big_first(buffers, alignment, bound, share, workers, seed)
        if tiered is not None and (tiered_arena := arena_of(buffers, tiered, alignment)) < arena:
            offsets, arena = tiered, tiered_arena
    if settled() or not exact:
        return offsets, arena, bound, arena <= bound
    offsets = repack(
        buffers, alignment, offsets, seed + 1, time.monotonic() + 0.6 * (deadline - time.monotonic()), gap
    )
    arena = arena_of(buffers, offsets, alignment)
    if settled():
        return offsets, arena, bound, arena <= bound
    left = deadline - time.monotonic()
    task = PlacementTask(buffers, alignment, offsets, arena, bound, left, workers, seed, gap, stall)
    got = place_milp(task) if engine == "milp" else place_cpsat(task)
    if got is None:
        return offsets, arena, bound, False
    new, new_bound, proven = got
    new_arena = arena_of(buffers, new, alignment)
    if new_arena < arena:
        offsets, arena = new, new_arena
    bound = max(bound, new_bound)
    return offsets, arena, min(bound, arena), proven or arena <= bound


def _big_first(
    buffers: Sequence[Buffer], alignment: int, peak: int, time_limit: float, workers: int, seed: int
) -> list[int] | None:
    """The buffers of at least BIG x peak placed by the exact model alone, then the others best
    fitted around them (perturbed orders); None when there is nothing to split."""
    big = [i for i, b in enumerate(buffers) if b.size >= BIG * peak]
    if len(big) < 2 or len(big) == len(buffers):
        return None
    sub = [buffers[i] for i in big]
    start = greedy_offsets(sub, alignment)
    task = PlacementTask(
        sub,
        alignment,
        start,
        arena_of(sub, start, alignment),
        arena_peak(sub, alignment),
        time_limit,
        workers,
        seed,
    )
    got = place_cpsat(task) if task.arena > task.bound else (start, task.bound, True)
    if got is None:
        return None
    fixed = {i: o for i, o in zip(big, got[0], strict=True)}
    small = sorted((i for i in range(len(buffers)) if i not in fixed), key=lambda i: -buffers[i].size)
    first = best_fit(buffers, small, alignment, fixed)
    return perturbed_offsets(buffers, alignment, first, RESTARTS // 6, seed, fixed=fixed, patience=PATIENCE)


def repack(
    buffers: Sequence[Buffer],
    alignment: int,
    offsets: Sequence[int],
    seed: int = 0,
    deadline: float | None = None,
    gap: float = 0.0,
    patience: int | None = None,
) -> list[int]:
    """Ruin and recreate from `offsets` (module docstring): never a larger arena. Ends within
    `gap` of the buffers' peak, after `patience` moves in a row without a smaller score (a count:
    the same offsets for a seed; REPACK_WORK / number of buffers by default, at least 100), or at
    `deadline` (time.monotonic())."""
    from remat_cli.planning.best_fit import best_fit_kernel

    n = len(buffers)
    start, end, size = buffer_arrays(buffers, alignment)
    off = np.asarray(offsets, dtype=np.int64)
    if n < 2:
        return off.tolist()
    patience = max(100, REPACK_WORK // n) if patience is None else patience
    peak = arena_peak(buffers, alignment)
    band = max(1, peak // 100)
    area = size * (end - start)
    rng = np.random.default_rng(seed)

    def score(o: np.ndarray) -> tuple[int, int]:
        top = o + size
        arena = int(top.max())
        return arena, int(area[top > arena - band].sum())

    cur = score(off)
    stale = 0
    while cur[0] > peak * (1 + gap) and stale < patience:
        if deadline is not None and time.monotonic() >= deadline:
            break
        stale += 1
        ruined = ruin_band(rng, start, end, off, size, cur[0])
        trial = off.copy()
        trial[ruined] = -1
        placed = best_fit_kernel(start, end, size, refill_order(rng, size, ruined), trial)
        got = score(placed)
        if got <= cur:
            if got < cur:  # the top band thinning counts: the drift towards a smaller arena
                stale = 0
            off, cur = placed, got
    return off.tolist()


def squeaky_wheel(
    buffers: Sequence[Buffer],
    alignment: int,
    offsets: Sequence[int],
    seed: int = 0,
    deadline: float | None = None,
    gap: float = 0.0,
    patience: int | None = None,
) -> list[int]:
    """Squeaky wheel optimisation (module docstring) from `offsets`: never a larger arena. Each
    round places every buffer by first fit in decreasing priority (at first its size); the
    buffers that end within SWO_BAND of the peak under the arena's top then get their priority
    raised by a random factor up to 1 + SWO_RAISE, so that the next round places them earlier.
    Ends within `gap` of the buffers' peak, after `patience` rounds in a row without a smaller
    arena (a count: the same offsets for a seed; SWO_ROUNDS x number of buffers by default, at
    least 100), or at `deadline` (time.monotonic())."""
    from remat_cli.planning.best_fit import first_fit_kernel

    start, end, size = buffer_arrays(buffers, alignment)
    best = np.asarray(offsets, dtype=np.int64)
    if len(buffers) < 2:
        return best.tolist()
    patience = max(100, SWO_ROUNDS * len(buffers)) if patience is None else patience
    peak = arena_peak(buffers, alignment)
    best_arena = int((best + size).max())
    rng = np.random.default_rng(seed)
    # equal sizes: the later start first (the stable sort orders what is still equal by index)
    priority = size.astype(np.float64) * (1.0 + 1e-9 * start / max(1, int(end.max())))
    empty = np.full(len(size), -1, dtype=np.int64)
    stale = 0
    while best_arena > peak * (1 + gap) and stale < patience:
        if deadline is not None and time.monotonic() >= deadline:
            break
        stale += 1
        placed = first_fit_kernel(start, end, size, np.argsort(-priority, kind="stable"), empty)
        top = placed + size
        arena = int(top.max())
        if arena < best_arena:
            best, best_arena, stale = placed, arena, 0
        squeaky = np.nonzero(top > arena - SWO_BAND * peak)[0]
        priority[squeaky] *= 1.0 + SWO_RAISE * rng.random(len(squeaky))
    return best.tolist()


def ruin_band(
    rng: np.random.Generator, start: np.ndarray, end: np.ndarray, off: np.ndarray, size: np.ndarray, top: int
) -> np.ndarray:
    """The buffers one ruin-and-recreate move lifts: those live while a random buffer at the
    arena's `top` is (widened by up to 20 steps) and reaching above a random level under it."""
    i = int(rng.choice(np.nonzero(off + size == top)[0]))
    widen = int(rng.integers(0, 20))
    # half the moves lift a thin layer under the top (where the arena is set by small buffers
    # over a stack of weight gradients, only these gain), half a thick one
    depth = rng.uniform(0.002, 0.05) if rng.random() < 0.5 else rng.uniform(0.05, 0.6)
    level = top * (1.0 - depth)
    return np.nonzero((start < end[i] + widen) & (start[i] - widen < end) & (off + size > level))[0]


def refill_order(rng: np.random.Generator, size: np.ndarray, lifted: np.ndarray) -> np.ndarray:
    """The lifted buffers in the order they are placed back: largest first, sizes jittered so
    that repeated moves try other orders."""
    key = -size[lifted] * np.exp(rng.normal(0.0, 0.3, len(lifted)))
    return lifted[np.argsort(key, kind="stable")]


@dataclass(frozen=True)
class PlacementTask:
    """What either engine gets: the buffers, the greedy start and its arena, the lower bound, limits."""

    buffers: Sequence[Buffer]
    alignment: int
    start: list[int]  # the greedy offsets: the warm start
    arena: int  # their arena: the top of every address domain
    bound: int
    time_limit: float
    workers: int
    seed: int
    gap: float = 0.0  # stop once the arena is within this fraction of the bound
    stall: float | None = None  # CP-SAT's rounds of deterministic time (cpsat.run)


# (offsets, lower bound, proven optimal), or None when the engine found no solution
_Found = tuple[list[int], int, bool] | None


def place_cpsat(t: PlacementTask) -> _Found:
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
    got = cpsat.run(m, t.time_limit, t.workers, t.seed, t.gap, t.stall, incumbent=top)
    if got is None:
        return None
    solver, optimal, best_bound = got
    bound = int(round(best_bound)) * alignment
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


def place_milp(t: PlacementTask) -> _Found:
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
            backend="highs",
            time_limit=t.time_limit,
            threads=t.workers,
            seed=t.seed,
            hint=hint,
            rel_gap=max(t.gap, 1e-6),
        ),
    )
    if res.x is None:
        return None
    offsets = [int(round(res.x[a[i]])) * alignment for i in range(n)]
    lb = int(np.ceil((res.bound or 0) - 1e-6)) * alignment
    return offsets, lb, res.status == "optimal"
