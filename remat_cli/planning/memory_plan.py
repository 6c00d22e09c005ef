"""Memory plans for any schedule: the buffers a schedule allocates and a greedy placement of them.

MODeL (Steiner et al., ICML 2023) §4.5 runs a graph inside one preallocated buffer B, each tensor
at its planned offset A_e. This module makes such a plan for *any* remat schedule: every compute
step allocates one buffer per output (a recomputed value is a new buffer) plus the node's
workspace for that step, and a `free` step ends the value's current buffer. Resident values
(inputs, parameters) are not in the arena. Placement: best fit (the offset heuristic of TFLite's
arena planner, Pisarchyk & Lee 2020, "greedy by size" and "greedy by breadth"), tried with seven
orders of the buffers, the smallest arena kept. The exact placement is MODeL's address model in
`remat_cli.planning.addresses`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import MemoryPlan, PlacedBuffer, Step


@dataclass(frozen=True)
class Buffer:
    """One allocation: live over the step indices [start, end) of the schedule."""

    value: str | None  # None for a workspace
    node: str  # the node whose compute step allocates it
    start: int
    end: int
    size: int


def buffers_of(graph: Graph, steps: Sequence[Step]) -> list[Buffer]:
    """Every buffer `steps` allocates, in allocation order (steps are assumed valid)."""
    vm = graph.value_map
    nodes = graph.node_map
    open_: dict[str, tuple[str, int]] = {}  # value -> (node, start step)
    out: list[Buffer] = []
    for k, step in enumerate(steps):
        if step.op == "compute":
            n = nodes[step.node or ""]
            for v in n.outputs:
                open_[v] = (n.id, k)
            if n.workspace:
                out.append(Buffer(None, n.id, k, k + 1, n.workspace))
        elif step.value in open_:
            node, start = open_.pop(step.value)
            out.append(Buffer(step.value, node, start, k, vm[step.value].size))
    end = len(steps)
    out.extend(Buffer(v, node, start, end, vm[v].size) for v, (node, start) in open_.items())
    out.sort(key=lambda b: (b.start, b.value or ""))
    return out


def arena_peak(buffers: Sequence[Buffer], alignment: int = 1) -> int:
    """Largest total (aligned) size of buffers live at one step: no placement can be smaller."""
    if not buffers:
        return 0
    horizon = max(b.end for b in buffers) + 1
    delta = np.zeros(horizon + 1, dtype=np.int64)
    for b in buffers:
        delta[b.start] += align(b.size, alignment)
        delta[b.end] -= align(b.size, alignment)
    return int(np.cumsum(delta).max())


def align(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


def greedy_offsets(buffers: Sequence[Buffer], alignment: int = 1) -> list[int]:
    """Offsets by best fit, the best of seven buffer orders (size with earlier start or later
    end first, size x lifetime, lifetime, allocation order, breadth, the buffers kept to the end
    first): each wins on some training graph, and none on all, so all seven run. Returns one offset per buffer, in the order given."""
    best: list[int] | None = None
    best_arena = -1
    orders = [
        sorted(range(len(buffers)), key=key)
        for key in (
            lambda i: (-align(buffers[i].size, alignment), buffers[i].start),
            lambda i: (-align(buffers[i].size, alignment), -buffers[i].end),
            lambda i: (-align(buffers[i].size, alignment) * (buffers[i].end - buffers[i].start), i),
            lambda i: (buffers[i].start - buffers[i].end, -buffers[i].size),
            lambda i: (buffers[i].start, -buffers[i].size),
        )
    ]
    if buffers:
        orders.append(breadth_order(*buffer_arrays(buffers, alignment)).tolist())
        # the buffers kept to the end (a training step's weight gradients) first, stacked in the
        # order they are made, then the others by size with later end first: the order that fits
        # a step whose peak is the gradients at its end
        horizon = max(b.end for b in buffers)
        kept = sorted((i for i, b in enumerate(buffers) if b.end == horizon), key=lambda i: buffers[i].start)
        rest = [i for i, b in enumerate(buffers) if b.end != horizon]
        orders.append(
            kept + sorted(rest, key=lambda i: (-align(buffers[i].size, alignment), -buffers[i].end))
        )
    for order in orders:
        offsets = best_fit(buffers, order, alignment)
        arena = arena_of(buffers, offsets, alignment)
        if best is None or arena < best_arena:
            best, best_arena = offsets, arena
    return best or []


def buffer_arrays(buffers: Sequence[Buffer], alignment: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Starts, ends and aligned sizes of `buffers` as int64 arrays."""
    start = np.array([b.start for b in buffers], dtype=np.int64)
    end = np.array([b.end for b in buffers], dtype=np.int64)
    size = np.array([align(b.size, alignment) for b in buffers], dtype=np.int64)
    return start, end, size


def breadth_order(
    start: np.ndarray, end: np.ndarray, size: np.ndarray, noise: np.ndarray | None = None
) -> np.ndarray:
    """TFLite's "greedy by breadth" (Pisarchyk & Lee 2020): the steps by decreasing live bytes
    (each scaled by `noise`, one factor per step, when given), and at each the buffers live there
    not yet placed, by decreasing size. A buffer goes with the first of its steps in that order."""
    horizon = int(max(end.max(), start.max() + 1))
    delta = np.zeros(horizon + 1, dtype=np.int64)
    np.add.at(delta, start, size)
    np.add.at(delta, end, -size)
    live = np.cumsum(delta)[:horizon].astype(np.float64)
    if noise is not None:
        live = live * noise[:horizon]
    rank = np.empty(horizon, dtype=np.int64)
    rank[np.argsort(-live, kind="stable")] = np.arange(horizon)
    first = np.array(
        [rank[s : max(e, s + 1)].min() for s, e in zip(start.tolist(), end.tolist(), strict=True)]
    )
    return np.lexsort((-size, first))


def perturbed_breadth(
    buffers: Sequence[Buffer],
    alignment: int,
    start: list[int],
    count: int,
    seed: int = 0,
    deadline: float | None = None,
    patience: int | None = None,
) -> list[int]:
    """Best fit in `count` breadth orders whose step ranking is perturbed (live bytes scaled by a
    log-normal factor per step, sigma 0.01), from `start`; the smallest arena wins: where breadth
    is the best fixed order, a few perturbed ones often beat it. Stops like `perturbed_offsets`."""
    rng = np.random.default_rng(seed)
    start_, end, size = buffer_arrays(buffers, alignment)
    horizon = int(max(end.max(), start_.max() + 1)) if buffers else 0

    def draw() -> list[int]:
        order = breadth_order(start_, end, size, np.exp(rng.normal(0.0, 0.01, horizon)))
        return best_fit_arrays(start_, end, size, order.tolist()).tolist()  # type: ignore[no-any-return]

    return _best_of_draws(buffers, alignment, start, count if buffers else 0, draw, deadline, patience)


def perturbed_offsets(
    buffers: Sequence[Buffer],
    alignment: int,
    start: list[int],
    count: int,
    seed: int = 0,
    deadline: float | None = None,
    fixed: dict[int, int] | None = None,
    patience: int | None = None,
) -> list[int]:
    """Best fit again in `count` buffer orders drawn around greedy-by-size (each size scaled by
    a log-normal factor, sigma 0.5), from `start` (offsets); the smallest arena wins. Where the
    fixed orders of `greedy_offsets` leave a wide gap above the peak (convolutional steps with
    few, large activations), random orders near size order close much of it. `fixed`: buffers whose
    offsets are given (placed first, never moved). Stops at `deadline` (time.monotonic()), or
    after `patience` draws in a row without a smaller arena (a count, so the result stays the
    same for a seed)."""
    rng = np.random.default_rng(seed)
    size = np.array([align(b.size, alignment) for b in buffers], dtype=np.float64)
    free = [i for i in range(len(buffers)) if not fixed or i not in fixed]

    def draw() -> list[int]:
        key = -size[free] * np.exp(rng.normal(0.0, 0.5, len(free)))
        return best_fit(buffers, [free[k] for k in np.argsort(key, kind="stable")], alignment, fixed)

    return _best_of_draws(buffers, alignment, start, count, draw, deadline, patience)


def _best_of_draws(
    buffers: Sequence[Buffer],
    alignment: int,
    start: list[int],
    count: int,
    draw: Callable[[], list[int]],
    deadline: float | None,
    patience: int | None,
) -> list[int]:
    """The smallest arena of `start` and up to `count` offsets from `draw`, stopping at
    `deadline` (time.monotonic()) or after `patience` draws in a row without a smaller one."""
    best, best_arena = list(start), arena_of(buffers, start, alignment)
    stale = 0
    for _ in range(count):
        if deadline is not None and time.monotonic() > deadline:
            break
        if patience is not None and stale >= patience:
            break
        stale += 1
        offsets = draw()
        arena = arena_of(buffers, offsets, alignment)
        if arena < best_arena:
            best, best_arena, stale = offsets, arena, 0
    return best


def arena_of(buffers: Sequence[Buffer], offsets: Sequence[int], alignment: int = 1) -> int:
    """The arena `buffers` placed at `offsets` need: the top of the highest (aligned) one."""
    return max((o + align(b.size, alignment) for o, b in zip(offsets, buffers, strict=True)), default=0)


def best_fit(
    buffers: Sequence[Buffer], order: list[int], alignment: int, fixed: dict[int, int] | None = None
) -> list[int]:
    """Offsets by best fit, placing the buffers in `order` (`fixed`: offsets already given)."""
    return best_fit_arrays(*buffer_arrays(buffers, alignment), order, fixed).tolist()


def best_fit_arrays(
    start: np.ndarray,
    end: np.ndarray,
    size: np.ndarray,
    order: list[int],
    fixed: dict[int, int] | None = None,
) -> np.ndarray:
    """`best_fit` on lifetimes [start, end) and aligned sizes given as int64 arrays."""
    from remat_cli.planning.best_fit import best_fit_kernel

    offset = np.full(len(start), -1, dtype=np.int64)
    for i, o in (fixed or {}).items():
        offset[i] = o
    return best_fit_kernel(start, end, size, np.asarray(order, dtype=np.int64), offset)


def make_plan(buffers: Sequence[Buffer], offsets: Sequence[int], alignment: int = 1) -> MemoryPlan:
    """The remat-schedule `memory_plan` for `buffers` placed at `offsets`."""
    entries = [
        PlacedBuffer(
            value=b.value,
            node=None if b.value is not None else b.node,
            step=b.start,
            offset=int(o),
            size=align(b.size, alignment),
        )
        for b, o in zip(buffers, offsets, strict=True)
    ]
    arena = max((e.offset + e.size for e in entries), default=0)
    return MemoryPlan(arena=arena, alignment=alignment, offsets=entries)


def plan_schedule(graph: Graph, steps: Sequence[Step], alignment: int = 64) -> MemoryPlan:
    """A plan for any valid schedule, by the greedy placement."""
    bufs = buffers_of(graph, steps)
    return make_plan(bufs, greedy_offsets(bufs, alignment), alignment)
