"""Program (9)'s objective, the arena, searched over orders by local moves (not in the paper).

Once the order stage has the smallest fragmentation-free peak, many orders reach it, and their
best placements differ: on the exported VGG-11 step at batch 32 the order found first has a
proven-optimal peak of 134.2 MB, yet no placement heuristic nor 20 s of CP-SAT brings its arena
below 138.9 MB (3.5% above). This walk moves one operator at a time (half of the time one that creates or reads a
tensor at the arena's top, `Lifetimes.on_top`) to a random position inside its precedence
window, and keeps the move when the greedy arena of the new order
(best fit by size, `memory_plan.best_fit_arrays`) does not grow; moves whose fragmentation-free peak
is above the current arena are rejected without placing (no arena can be below the peak).
Equal arenas are accepted, so the walk drifts along the plateau of orders the order stage left.
On that VGG-11 step it reached 134.23 MB (0.01% above the peak) in 919 moves.

Deterministic for a seed: the walk ends after `patience` moves in a row without a smaller arena
(or on the deadline, on large graphs).
"""

from __future__ import annotations

import time

import numpy as np

from remat_cli.memory_plan import best_fit_arrays
from remat_cli.solvers.model.lifetimes import Problem


class Lifetimes:
    """Every tensor's steps [start, end) under an order, vectorised (one operator per step, as in
    `lifetimes.Problem.lifetime`: the same overlaps as the schedule's buffers)."""

    def __init__(self, p: Problem):
        n = len(p)
        self.n = n
        self.src = np.array([t.src for t in p.tensors], dtype=np.int64)
        width = max((len(t.sinks) for t in p.tensors), default=0)
        # readers padded with the producer itself: a tensor nobody reads ends right after it
        self.readers = np.array(
            [list(t.sinks) + [t.src] * (width + 1 - len(t.sinks)) for t in p.tensors], dtype=np.int64
        ).reshape(len(p.tensors), width + 1)
        self.to_end = np.array([t.to_end for t in p.tensors], dtype=bool)
        self.size = np.array([t.size for t in p.tensors], dtype=np.int64)
        self.by_size = np.lexsort((self.src, -self.size))  # placement order: larger first

    def of(self, order: list[int]) -> tuple[np.ndarray, np.ndarray]:
        pos = np.empty(self.n, dtype=np.int64)
        pos[np.asarray(order, dtype=np.int64)] = np.arange(self.n)
        start = pos[self.src]
        end = np.where(self.to_end, self.n, pos[self.readers].max(axis=1) + 1)
        return start, end

    def peak(self, start: np.ndarray, end: np.ndarray) -> int:
        delta = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(delta, start, self.size)
        np.add.at(delta, end, -self.size)
        return int(np.cumsum(delta).max()) if self.n else 0

    def greedy(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Offsets by best fit in decreasing size (ties: earlier producer)."""
        return best_fit_arrays(start, end, self.size, self.by_size.tolist())

    def arena(self, offsets: np.ndarray) -> int:
        return int((offsets + self.size).max()) if len(offsets) else 0

    def on_top(self, offsets: np.ndarray, arena: int) -> np.ndarray:
        """The operators creating or reading a tensor that reaches the arena's top: moving them
        shortens or shifts what sets the arena."""
        top = np.nonzero(offsets + self.size == arena)[0]
        return np.unique(np.concatenate([self.src[top], self.readers[top].ravel()]))


def plateau_walk(
    p: Problem, order: list[int], bound: int, deadline: float, seed: int = 0, patience: int | None = None
) -> tuple[list[int], list[int]]:
    """An order whose greedy arena is at most `order`'s (module docstring), and that placement
    (offsets per tensor of `p.tensors`); stops at `bound`."""
    n = len(order)
    life = Lifetimes(p)
    if n < 2:
        return order, life.greedy(*life.of(order)).tolist()
    patience = 20 * n if patience is None else patience
    rng = np.random.default_rng(seed)
    offsets = life.greedy(*life.of(order))
    arena = life.arena(offsets)
    stale = 0
    while arena > bound and stale < patience and time.monotonic() < deadline:
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
        placed = life.greedy(start, end)
        got = life.arena(placed)
        if got <= arena:
            if got < arena:
                stale = 0
            order, arena, offsets = trial, got, placed
    return order, offsets.tolist()
