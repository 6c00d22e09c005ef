"""MODeL §4.2 and §5.5: the operator order alone, minimising the fragmentation-free peak.

Eqs. (1)-(5) with one operator per step say: the positions form a permutation that respects the
edges, and each tensor is resident over [pos(src), max pos(sinks)]. In CP-SAT that is one
integer `pos` per operator (AllDifferent, pos(u) < pos(v) on every edge, App. A.1's window as
its domain) and one interval per tensor whose end is the max over its sinks; the resident bytes
at every step are one `AddCumulative` whose capacity is the peak being minimised. The best
bound CP-SAT proves is a lower bound for the arena of any order (§5.5: "reordering alone").

The same variables are the time axis of the joint model (`joint.py`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from ortools.sat.python import cp_model

from remat_cli.milp import cpsat
from remat_cli.solvers.model.bound import CutNetwork, live_profile
from remat_cli.solvers.model.lifetimes import Problem


@dataclass
class OrderVars:
    pos: list[cp_model.IntVar]
    #: per tensor of problem.tensors (None for zero-size ones): time interval, its start and end
    intervals: list[cp_model.IntervalVar | None]


def order_vars(m: cp_model.CpModel, p: Problem) -> OrderVars:
    """Positions, precedences and tensor lifetimes (eqs. 1-5, 10-12)."""
    n = len(p)
    pos = [m.new_int_var(lo, hi, f"pos{i}") for i, (lo, hi) in enumerate(p.window)]
    m.add_all_different(pos)
    for i, ps in enumerate(p.preds):
        for q in ps:
            m.add(pos[q] < pos[i])
    intervals: list[cp_model.IntervalVar | None] = []
    for k, t in enumerate(p.tensors):
        if t.size == 0:
            intervals.append(None)
            continue
        start = pos[t.src]
        lo, hi = p.window[t.src]
        if t.to_end:
            end = m.new_constant(n)
        elif not t.sinks:
            end = start + 1
        else:
            sink_hi = max(p.window[s][1] for s in t.sinks)
            sink_lo = max(p.window[s][0] for s in t.sinks)
            last = m.new_int_var(max(lo, sink_lo), sink_hi, f"last{k}")
            m.add_max_equality(last, [pos[s] for s in t.sinks])
            end = last + 1
        size = m.new_int_var(1, n - lo, f"life{k}")
        intervals.append(m.new_interval_var(start, size, end, f"t{k}"))
    return OrderVars(pos, intervals)


def greedy_order(p: Problem) -> list[int]:
    """A memory-aware list schedule: of the ready operators, run the one whose step adds the
    fewest bytes net (its outputs minus the inputs it is the last reader of); ties go to
    program order. A warm start for the exact model, not part of the paper."""
    n = len(p)
    left = [len(ps) for ps in p.preds]
    readers: dict[int, int] = {}  # tensor index -> sinks not yet run
    of_op: list[list[int]] = [[] for _ in range(n)]  # tensors each op reads
    made: list[list[int]] = [[] for _ in range(n)]
    for k, t in enumerate(p.tensors):
        made[t.src].append(k)
        readers[k] = len(t.sinks)
        for s in t.sinks:
            of_op[s].append(k)
    ready = {i for i in range(n) if left[i] == 0}
    order: list[int] = []
    while ready:

        def net(i: int) -> tuple[int, int]:
            out = sum(p.tensors[k].size for k in made[i])
            freed = sum(p.tensors[k].size for k in of_op[i] if readers[k] == 1 and not p.tensors[k].to_end)
            return out - freed, i

        i = min(ready, key=net)
        ready.remove(i)
        order.append(i)
        for k in of_op[i]:
            readers[k] -= 1
        for s in p.succs[i]:
            left[s] -= 1
            if left[s] == 0:
                ready.add(s)
    return order


def improve_order(p: Problem, order: list[int], deadline: float) -> list[int]:
    """Hill climbing on the fragmentation-free peak: move one operator as late as its first
    successor allows (it allocates more than it frees) or as early as its last predecessor
    allows, keep the move when the peak drops; sweeps until none helps or `deadline`
    (time.monotonic()). A warm start for the exact model, not part of the paper."""
    life = p.lives
    best = p.peak(order)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for i in range(len(order)):
            if time.monotonic() >= deadline:
                break
            pos = {v: k for k, v in enumerate(order)}
            k = pos[i]
            lo = max((pos[q] for q in p.preds[i]), default=-1) + 1
            hi = min((pos[s] for s in p.succs[i]), default=len(order)) - 1
            for target in (hi, lo):
                if target == k:
                    continue
                trial = order[:k] + order[k + 1 :]
                trial.insert(target, i)
                peak = life.peak(*life.of(trial))
                if peak < best:
                    order, best, improved = trial, peak, True
                    break
    return order


def peak_walk(
    p: Problem, order: list[int], bound: int, deadline: float, seed: int = 0, patience: int | None = None
) -> list[int]:
    """A walk across the peak (not in the paper): take a tensor live at every step of the peak,
    created before it and read after it, and move its producer to a random place after the peak
    (or one of its readers to one before it) within its precedence window; keep the move when
    (peak, steps at the peak) does not grow, so that moves that change nothing at the peak are
    taken too. Two tensors read by the same pair of operators need two moves, the first of which
    gains nothing: on the exported ResNet-18 step (batch 1) the order search ends 40 B above the
    sequence bound (a 40-byte value kept across the peak for two late readers), and the walk
    closes it in 143 moves. Ends at `bound`, after `patience` moves in a row without a lower
    (peak, count) (10 x n by default; a count, so a seed repeats) or at `deadline`."""
    n = len(order)
    life = p.lives
    rng = np.random.default_rng(seed)
    patience = 10 * n if patience is None else patience

    def score(o: list[int]) -> tuple[int, int, np.ndarray, np.ndarray, np.ndarray]:
        start, end = life.of(o)
        profile = life.profile(start, end)
        top = int(profile.max())
        return top, int((profile == top).sum()), start, end, profile

    cur = score(order)
    pos = np.empty(n, dtype=np.int64)  # each operator's place in `order`
    pos[order] = np.arange(n)
    stale = 0
    while cur[0] > bound and stale < patience and time.monotonic() < deadline:
        stale += 1
        top, count, start, end, profile = cur
        steps = np.nonzero(profile == top)[0]
        first, last = int(steps[0]), int(steps[-1])
        across = np.nonzero((start < first) & (end > last + 1))[0]
        if len(across) == 0:
            break
        t = int(rng.choice(across))
        if rng.random() < 0.5:
            i = int(life.src[t])
            hi = int(min((pos[q] for q in p.succs[i]), default=n)) - 1
            if hi < last:
                continue
            # in `order` without i, the peak's last step is at last - 1: i goes after it
            target = int(rng.integers(last, hi + 1))
        else:
            readers = sorted(int(r) for r in set(life.readers[t].tolist()) if pos[r] > last)
            if not readers:
                continue
            i = readers[int(rng.integers(len(readers)))]
            lo = int(max((pos[q] for q in p.preds[i]), default=-1)) + 1
            if lo > first:
                continue
            target = int(rng.integers(lo, first + 1))
        k = int(pos[i])
        trial = order[:k] + order[k + 1 :]
        trial.insert(target, i)
        got = score(trial)
        if got[:2] <= (top, count):
            if got[:2] < (top, count):
                stale = 0
            pos[trial] = np.arange(n)
            order, cur = trial, got
    return order


def cut_descent(
    p: Problem,
    order: list[int],
    bound: int,
    deadline: float,
    patience: int = 5,
    net: CutNetwork | None = None,
) -> list[int]:
    """Local search by minimum cuts (not in the paper): at the operator v where `order` peaks,
    run first exactly the operators of v's minimum-cut closure (`bound.CutNetwork.closure`), so
    that v's step holds the fewest bytes any order can, keep the relative order of the rest, and
    hill-climb (`improve_order`) what that moved. Repeats from the new peak until the peak reaches
    `bound` (proven optimal), `patience` moves in a row bring nothing, an order comes back, or
    `deadline` (time.monotonic()). While the peak is above the bound the move strictly lowers the
    peak step's bytes, since that step holds more than its cut. On the exported ResNet training
    step three moves take the hill-climbed order from 34.15 MB to the 34.08 MB bound; CP-SAT's
    order model had not closed that gap in 30 s."""
    net = CutNetwork(p) if net is None else net
    best, best_peak = order, p.peak(order)
    cur, seen, stale = order, {tuple(order)}, 0
    while best_peak > bound and stale < patience and time.monotonic() < deadline:
        v = int(np.argmax(live_profile(p, cur)))
        before = net.closure(v)
        cur = [i for i in cur if i in before] + [v] + [i for i in cur if i not in before and i != v]
        cur = improve_order(p, cur, deadline)
        if tuple(cur) in seen:
            break
        seen.add(tuple(cur))
        peak = p.peak(cur)
        if peak < best_peak:
            best, best_peak, stale = cur, peak, 0
        else:
            stale += 1
    return best


def pair_move(
    p: Problem, order: list[int], first: int, second: int, deadline: float, net: CutNetwork | None = None
) -> list[int]:
    """The order the pair bound (`bound.pair_bound`) points at (not in the paper): `first` with
    the closure of its minimum cut given that `second` has not run, then `second` with the
    closure of its cut given that all of that has, then the rest, each part in `order`'s relative
    order; hill-climbed. On the exported ResNet-18 step (batch 32) the best pair's order peaks at
    168,879,660 B, 0.009% above the bound, where the cut descent and CP-SAT had stopped at
    169,403,948 B. `net`: the graph's CutNetwork, when the caller has one."""
    net = CutNetwork(p) if net is None else net
    runs_first = net.closure(first, after=net.from_[second]) | {first}
    mask = 0
    for i in runs_first:
        mask |= net.up[i]
    then = net.closure(second, before=mask) | {second} | runs_first
    moved = [i for i in order if i in runs_first]
    moved += [i for i in order if i in then and i not in runs_first]
    moved += [i for i in order if i not in then]
    return improve_order(p, moved, deadline)


def pair_descent(
    p: Problem, order: list[int], pair: list[int], bound: int, deadline: float, net: CutNetwork | None = None
) -> list[int]:
    """Pair moves (`pair_move`) from the operator where `order` peaks, paired with each of the
    bound's `pair` in both orders, while one lowers the peak, until `bound` or `deadline`. On the
    exported ResNet-18 step (batch 32) the cut descent ends 2,048 B above the bound, at a second
    peak whose pair with the bound's first operator reaches it: the order proven optimal."""
    net = CutNetwork(p) if net is None else net
    best, best_peak = order, p.peak(order)
    while best_peak > bound and time.monotonic() < deadline:
        v = int(np.argmax(live_profile(p, best)))
        moves = [(u, v) for u in pair if net.independent(u, v)]
        for a, b in [m for u, w in moves for m in ((u, w), (w, u))]:
            moved = pair_move(p, best, a, b, deadline, net)
            peak = p.peak(moved)
            if peak < best_peak:
                best, best_peak = moved, peak
                break
        else:
            return best
    return best


def private_chain(p: Problem, v: int) -> list[int]:
    """`v` and the operators that feed only it, directly or through one another (every successor
    inside the set), in program order: a weight's transpose, view and flip before the backward
    convolution that reads the flip. Moved as one block, they can go where no single move of
    `improve_order` reaches (the transpose alone later holds its input and output at once)."""
    chain, todo = {v}, [v]
    while todo:
        for q in p.preds[todo.pop()]:
            if q not in chain and p.succs[q] <= chain:
                chain.add(q)
                todo.append(q)
    return sorted(chain)


def chain_descent(p: Problem, order: list[int], bound: int, deadline: float) -> list[int]:
    """Local search by chain moves (not in the paper): at the step where `order` peaks, each
    operator that creates or reads a tensor resident there (earliest first) has its private
    chain (`private_chain`, two operators or more) taken out and put back at every place its
    precedences allow; the first chain with a place that lowers the peak moves to the best one,
    and the search starts again from the new peak, until none does, the peak reaches `bound`
    (proven optimal) or `deadline` (time.monotonic()).

    The exported MobileNet-v2 step (batch 32) peaks where a stride-1 backward convolution runs:
    its weight's transpose (a permute of the parameter) ran long before, and the flipped copy is
    made while the transpose is still held. Moving each transpose-view-flip chain next to its
    convolution halves the order's gap to the bound there."""
    life = p.lives
    start, end = life.of(order)
    profile = life.profile(start, end)
    best = int(profile.max())
    while best > bound and time.monotonic() < deadline:
        s = int(np.argmax(profile))
        near = life.operators_of(np.nonzero((start <= s) & (s < end))[0]).tolist()
        pos = {v: k for k, v in enumerate(order)}
        moved = None
        for v in sorted(near, key=pos.__getitem__):
            chain = private_chain(p, v)
            if len(chain) == 1:  # `improve_order`'s move; scanning every place costs 1 s a block
                continue
            inside = set(chain)
            rest = [u for u in order if u not in inside]
            at = {u: k for k, u in enumerate(rest)}
            lo = max((at[q] for c in chain for q in p.preds[c] if q not in inside), default=-1) + 1
            hi = min((at[w] for c in chain for w in p.succs[c] if w not in inside), default=len(rest))
            for k in range(lo, hi + 1):
                trial = rest[:k] + chain + rest[k:]
                peak = life.peak(*life.of(trial))
                if peak < best:
                    moved, best = trial, peak
            if moved is not None or time.monotonic() >= deadline:
                break
        if moved is None:
            break
        order = moved
        start, end = life.of(order)
        profile = life.profile(start, end)
    return order


def hint_order(m: cp_model.CpModel, v: OrderVars, order: list[int]) -> None:
    for s, i in enumerate(order):
        m.add_hint(v.pos[i], s)


def decode(solver: cp_model.CpSolver, v: OrderVars) -> list[int]:
    """§4.5, Function 1: operators sorted by their step."""
    return sorted(range(len(v.pos)), key=lambda i: solver.value(v.pos[i]))


@dataclass
class OrderResult:
    order: list[int]
    peak: int
    bound: int
    optimal: bool


def solve_order(
    p: Problem,
    start: list[int],
    time_limit: float,
    workers: int,
    seed: int,
    floor: int = 0,
    gap: float = 0.0,
    stall: float | None = None,
) -> OrderResult:
    """Minimise the fragmentation-free peak over all orders, warm-started from `start`.

    `floor` is a known lower bound (e.g. the largest working set) that seeds the peak's domain;
    `stall`: CP-SAT's rounds of deterministic time (`cpsat.run`).
    """
    start_peak = p.peak(start)
    if start_peak <= floor or len(p) <= 1:
        return OrderResult(start, start_peak, start_peak, True)
    if start_peak <= floor * (1 + gap):
        return OrderResult(start, start_peak, floor, False)
    m = cp_model.CpModel()
    v = order_vars(m, p)
    peak = m.new_int_var(floor, start_peak, "peak")
    live = [(iv, t.size) for iv, t in zip(v.intervals, p.tensors, strict=True) if iv is not None]
    m.add_cumulative([iv for iv, _ in live], [s for _, s in live], peak)
    m.minimize(peak)
    hint_order(m, v, start)
    found = cpsat.run(m, time_limit, workers, seed, gap, stall, incumbent=start_peak)
    if found is None:
        return OrderResult(start, start_peak, floor, False)
    solver, _, best_bound = found
    order = decode(solver, v)
    got = p.peak(order)
    bound = int(best_bound)
    if got > start_peak:  # cannot happen (the peak's domain ends at start_peak); keep the start
        order, got = start, start_peak
    return OrderResult(order, got, min(max(bound, floor), got), got <= bound)
