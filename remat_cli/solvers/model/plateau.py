"""Program (9)'s objective, the arena, searched over orders by local moves (not in the paper).

Once the order stage has the smallest fragmentation-free peak, many orders reach it, and their
best placements differ: on the exported VGG-11 step at batch 32 the order found first has a
proven-optimal peak of 134.2 MB, yet no placement heuristic nor 20 s of CP-SAT brings its arena
below 138.9 MB (3.5% above). This walk moves one operator at a time (half of the time one that
creates or reads a tensor at the arena's top, `Lifetimes.on_top`) to a random position inside
its precedence window, and keeps the move when the greedy arena of the new order (best fit by
size, `Lifetimes.greedy`) does not grow; moves whose fragmentation-free peak is above the
current arena are rejected without placing (no arena can be below the peak). Equal arenas are
accepted, so the walk drifts along the plateau of orders the order stage left. On the exported
VGG-11 step it comes within 0.01% of the peak, and the exact placement of `addresses.py` then
closes the rest.

Which best fit scores a move: greedy by size, equal sizes by the producer's place in program
order (`Lifetimes.greedy`), a priority that does not change when the walk moves an operator. On
VGG-11 b32 that walk reached the peak in 15,270 moves, where ties broken by the current order
(`ties="start"`) stayed 3.1% above it after 19,300. But on the shipped ResNet step and the
exported transformer (b32) that fixed priority starts 17% and 0.11% above the placement the
solver already has (best fit with ties by the order: `memory_plan.greedy_offsets`), and 40 x n
moves (50-70 s) did not climb back to it, so the walk was pure cost there. Hence `incumbent`:
when the fixed priority starts above it and a tie-break by the order starts at or below it, the
walk scores with that one and so starts from the incumbent's quality (on the ResNet step it
then reached 0.001% above the bound in 2,690 moves, from 0.22%).

Deterministic for a seed: the walk ends at `bound`, after `patience` moves in a row without a
smaller arena, or on the deadline; once the arena is within `near` (the bound widened by --gap)
the patience drops to n moves, a last try for the bound itself. On the ResNet step the walk
is within --gap after 2,690 moves and had not reached the bound after 25,080 (the old patience,
20 x n, would have run on for 25 s); on VGG-11 b32 the last 64 B took 7 moves.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from remat_cli.solvers.model.lifetimes import TIES, Problem


def plateau_walk(
    p: Problem,
    order: list[int],
    bound: int,
    deadline: float,
    seed: int = 0,
    patience: int | None = None,
    incumbent: int | None = None,
    near: int | None = None,
) -> tuple[list[int], list[int]]:
    """An order whose greedy arena is at most `order`'s (module docstring), and that placement
    (offsets per tensor of `p.tensors`); stops at `bound`, or n moves without a smaller arena
    after it is at most `near`. `incumbent`: the arena the caller already has, which picks the
    tie-break of the scoring best fit (module docstring)."""
    n = len(order)
    life = p.lives
    if n < 2:
        return order, life.greedy(*life.of(order)).tolist()
    patience = 20 * n if patience is None else patience
    rng = np.random.default_rng(seed)
    first = {t: life.greedy(*life.of(order), ties=t) for t in TIES}
    ties = "src"
    if incumbent is not None and life.arena(first["src"]) > incumbent:
        ties = min(TIES, key=lambda t: (life.arena(first[t]) > incumbent, t != "src", life.arena(first[t])))
    offsets = first[ties]
    arena = life.arena(offsets)
    stale = 0
    while arena > bound and time.monotonic() < deadline:
        if stale >= (n if near is not None and arena <= near else patience):
            break
        stale += 1
        i = int(rng.choice(life.on_top(offsets, arena))) if rng.random() < 0.5 else int(rng.integers(n))
        pos = {v: k for k, v in enumerate(order)}
        k = pos[i]
        lo = max((pos[q] for q in p.preds[i]), default=-1) + 1
        hi = min((pos[s] for s in p.succs[i]), default=n) - 1
        target = int(rng.integers(lo, hi + 1)) if hi > lo else k
        if target == k:
            continue
        trial = order[:k] + order[k + 1 :]
        trial.insert(target, i)
        start, end = life.of(trial)
        if life.peak(start, end) > arena:
            continue
        placed = life.greedy(start, end, ties)
        got = life.arena(placed)
        if got <= arena:
            if got < arena:
                stale = 0
            order, arena, offsets = trial, got, placed
    return order, offsets.tolist()


#: share of the joint walk's moves that move an operator (the rest are address-only moves)
ORDER_MOVES = 0.5


def joint_walk(
    p: Problem,
    order: list[int],
    offsets: Sequence[int],
    bound: int,
    deadline: float,
    seed: int = 0,
    patience: int | None = None,
) -> tuple[list[int], list[int]]:
    """Orders and offsets searched together from a placement the caller has (`offsets`, one per
    tensor of `p.tensors`), by ruin and recreate (`addresses.repack`'s moves, not in the paper);
    returns (order, offsets), whose arena is never above the start's.

    Half the moves are `repack`'s: lift the buffers above a random level around a tensor at the
    arena's top and place them back. The other half move one operator (half of the time the
    producer of a tensor at the top later, or its last reader earlier: that tensor's lifetime
    shrinks) to a random place in its precedence window, so that the lifetimes of the tensors
    it creates or reads change and nothing else's overlaps do; those tensors and what lies above
    a level just under the top over their new lifetimes are lifted and placed back, every other
    offset kept. Placed back by first fit (the lowest gap, `best_fit.first_fit_kernel`), not
    best fit: 60 s from the same start reached 0.56% on MobileNet-v2 b1 and 0.17% on ResNet-50
    b1 by first fit, 1.39-1.41% (three seeds) and 0.53% by best fit. Orders whose fragmentation-free peak
    is above the current arena are rejected unplaced; others are kept when (arena, bytes x
    steps of the tensors in the top 1% band) does not grow, so the walk drifts. Why: where the
    arena is set by a layer of small long-lived tensors above the rest (the exported
    MobileNet-v2 and ResNet-50 steps, batch 1), no placement of the order found closes the gap
    (best fit, ruin and recreate, 60 s of CP-SAT all stay 1.44% above the peak on MobileNet),
    and the plateau walk, which re-places every tensor by a plain best fit after each move,
    starts 3% above it; moving an operator shortens the lifetime that forces the hole.

    Ends at `bound`, after `patience` moves in a row without a smaller score (a count, so a
    seed repeats; 20 x n by default) or at `deadline` (time.monotonic())."""
    from remat_cli.planning.addresses import refill_order, ruin_band
    from remat_cli.planning.best_fit import first_fit_kernel

    n = len(order)
    life = p.lives
    size = life.size
    off = np.asarray(offsets, dtype=np.int64)
    if n < 2 or len(size) < 2:
        return order, off.tolist()
    patience = 20 * n if patience is None else patience
    touched = life.touched
    rng = np.random.default_rng(seed)
    start, end = life.of(order)
    band = max(1, bound // 100)

    def score(o: np.ndarray, s: np.ndarray, e: np.ndarray) -> tuple[int, int]:
        top = o + size
        arena = int(top.max())
        return arena, int((size * (e - s))[top > arena - band].sum())

    cur = score(off, start, end)
    pos = np.empty(n, dtype=np.int64)  # each operator's place in `order`
    pos[order] = np.arange(n)
    stale = 0
    while cur[0] > bound and stale < patience and time.monotonic() < deadline:
        stale += 1
        trial, s, e = order, start, end
        if rng.random() < ORDER_MOVES:
            side = 0  # -1: earlier, 1: later, 0: anywhere in the window
            # half the time, shorten a tensor at the top: its producer later, or its last reader
            # earlier
            if rng.random() < 0.5:
                t = int(rng.choice(np.nonzero(off + size == cur[0])[0]))
                if life.to_end[t] or rng.random() < 0.5:
                    i, side = int(life.src[t]), 1
                else:
                    i, side = max((int(r) for r in life.readers[t]), key=pos.__getitem__), -1
            else:
                i = int(rng.integers(n))
            k = int(pos[i])
            lo = int(max((pos[q] for q in p.preds[i]), default=-1)) + 1
            hi = int(min((pos[q] for q in p.succs[i]), default=n)) - 1
            lo, hi = (k + 1, hi) if side > 0 else (lo, k - 1) if side < 0 else (lo, hi)
            target = int(rng.integers(lo, hi + 1)) if hi >= lo else k
            if target == k:
                continue
            trial = order[:k] + order[k + 1 :]
            trial.insert(target, i)
            s, e = life.of(trial)
            if life.peak(s, e) > cur[0]:
                continue
            moved = touched[i]
            # a thin layer only: the order move is the change, the lift makes room for it
            level = cur[0] * (1.0 - rng.uniform(0.002, 0.05))
            w0, w1 = int(s[moved].min()), int(e[moved].max())
            lifted = np.union1d(np.nonzero((s < w1) & (w0 < e) & (off + size > level))[0], moved)
        else:
            lifted = ruin_band(rng, s, e, off, size, cur[0])
        kept = off.copy()
        kept[lifted] = -1
        placed = first_fit_kernel(s, e, size, refill_order(rng, size, lifted), kept)
        got = score(placed, s, e)
        if got <= cur:
            if got < cur:
                stale = 0
            if trial is not order:
                pos[trial] = np.arange(n)
            order, start, end, off, cur = trial, s, e, placed, got
    return order, off.tolist()
