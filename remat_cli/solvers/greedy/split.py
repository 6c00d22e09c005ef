"""greedy, family 2: peak reduction on the compute sequence (the offline counterpart of DTR's
eviction loop, measured better on the Moccasin graphs). See the package docstring."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from remat_cli.solvers.greedy.arrays import Abandon, Arrays

#: how many levels of dead inputs the peak-reduction pass recomputes rather than keeps
SPLIT_DEPTH = 4
#: the pass stops after this many rounds without lowering the peak or the total excess
STALL_ROUNDS = 8
#: computations this far from the peak instant are tried as moves across it (see _best_move)
MOVE_WINDOW = 64
#: when no split scores a gain by the estimates, this many are tried on the exact profile
EXACT_CANDIDATES = 16


def _decode(a: Arrays, seq: list[int]) -> tuple[np.ndarray, list[list[tuple[int, int, list[int]]]]]:
    """The memory at each compute instant of `seq` as `steps_from_sequence` frees it, and each
    value's live intervals (start, end, positions reading it), inclusive."""
    nv = len(a.size)
    opened: dict[int, tuple[int, list[int]]] = {}
    intervals: list[list[tuple[int, int, list[int]]]] = [[] for _ in range(nv)]
    for k, n in enumerate(seq):
        for x in a.ins[n]:
            opened[x][1].append(k)
        for o in a.outs[n]:
            if o in opened:
                s, uses = opened.pop(o)
                intervals[o].append((s, uses[-1] if uses else s, uses))
            opened[o] = (k, [])
    last = len(seq) - 1
    for o, (s, uses) in opened.items():
        intervals[o].append((s, last if a.is_output[o] else (uses[-1] if uses else s), uses))
    diff = [0.0] * (len(seq) + 1)  # a list: numpy scalar updates cost several times more
    size = a.size_l
    for v, ivs in enumerate(intervals):
        for s, e, _ in ivs:
            diff[s] += size[v]
            diff[e + 1] -= size[v]
    ws = np.array([a.workspace[n] for n in seq], dtype=np.float64)
    return np.cumsum(np.array(diff[:-1])) + a.resident_bytes + ws, intervals


def run_split(
    a: Arrays,
    budget: float,
    max_rounds: int,
    depth: int = SPLIT_DEPTH,
    stop: Callable[[], bool] | None = None,
    bound: float = float("inf"),
) -> list[int]:
    """Peak reduction on the compute sequence (the offline counterpart of the eviction loop): at
    the highest instant t over the budget, pick the value live across t (not read there) whose
    recomputation right before its next read after t removes the most excess (bytes over budget,
    summed over instants) per unit of cost, insert that recomputation, and repeat.

    The recomputed producer needs its inputs live at that point: an input that is dead by then is
    either kept alive longer (the excess this adds is charged to the score) or recomputed too,
    recursively up to `depth` levels, whichever scores better. Abandoned (Abandon) once the
    sequence costs more than `bound` (as _run)."""
    seq = list(a.program)
    spent = float(a.cost[seq].sum())
    progress, stalled = (np.inf, np.inf), 0
    for _ in range(max_rounds):
        if stop is not None and stop():
            break
        prof, intervals = _decode(a, seq)
        t = int(np.argmax(prof))
        if prof[t] <= budget:
            break
        total = float(np.maximum(prof - budget, 0.0).sum())
        if total < progress[0] or prof[t] < progress[1]:
            progress, stalled = (total, prof[t]), 0
        else:
            stalled += 1
            if stalled > STALL_ROUNDS:
                break  # the estimates stopped matching the exact profile
        best = _best_split(a, seq, prof, intervals, t, budget, depth)
        if best is None:
            # the estimates see no gain left: score a few candidates on the exact profile
            best = _best_split(a, seq, prof, intervals, t, budget, depth, exact=EXACT_CANDIDATES)
        if best is None:
            # no recomputation helps at t: move one computation across it instead
            moved = _best_move(a, seq, prof, intervals, t, budget)
            if moved is None:
                break
            seq = moved
            continue
        b, nodes = best
        nodes = list(dict.fromkeys(nodes))  # an ancestor shared by two inputs runs once
        spent += float(a.cost[nodes].sum())
        if spent > bound:
            raise Abandon
        seq[b:b] = nodes
    return seq


def _best_move(
    a: Arrays,
    seq: list[int],
    prof: np.ndarray,
    intervals: list[list[tuple[int, int, list[int]]]],
    t: int,
    budget: float,
) -> list[int] | None:
    """The sequence with one computation within MOVE_WINDOW of the peak instant t moved across
    it -- delayed past t when nothing reads its outputs until after t, or brought forward to t
    when its inputs all exist before t -- that lowers (peak, total excess) the most, scored on
    the exact profile; None when no move lowers it. (The operator order is a lever of its own:
    RL n500 at 70% is reached only so.)"""
    first_use: dict[int, list[int]] = {}
    for ivs in intervals:
        for s, _, uses in ivs:
            first_use.setdefault(s, []).append(uses[0] if uses else len(seq))
    candidates: list[list[int]] = []
    for i in range(max(0, t - MOVE_WINDOW), t):
        n = seq[i]
        if all(u > t for u in first_use.get(i, ())) and n not in seq[i + 1 : t + 1]:
            candidates.append(seq[:i] + seq[i + 1 : t + 1] + [n] + seq[t + 1 :])
    for i in range(t + 1, min(len(seq), t + MOVE_WINDOW)):
        n = seq[i]
        # each input's copy read at i must exist before t (none recomputed in between)
        ready = all(max((s for s, _, _ in intervals[x] if s < i), default=t) < t for x in a.ins[n])
        if ready and n not in seq[t:i]:
            candidates.append(seq[:t] + [n] + seq[t:i] + seq[i + 1 :])
    k = _lowest(a, candidates, prof, budget)
    return None if k is None else candidates[k]


def _lowest(a: Arrays, candidates: list[list[int]], prof: np.ndarray, budget: float) -> int | None:
    """The index of the candidate sequence whose exact profile has the lowest (peak, total
    excess over `budget`), if that is below the current profile `prof`'s; else None."""
    now = (float(prof.max()), float(np.maximum(prof - budget, 0.0).sum()))
    best = None
    for k, cand in enumerate(candidates):
        prof2, _ = _decode(a, cand)
        after = (float(prof2.max()), float(np.maximum(prof2 - budget, 0.0).sum()))
        if after < now:
            best, now = k, after
    return best


@njit(cache=True)
def _segment_loss(prof: np.ndarray, lo: int, hi: int, add: float, budget: float) -> float:
    """Excess added over instants [lo, hi) by `add` more bytes: sum of clip(prof + add - budget,
    0, add) (an instant already over the budget gains all of `add`, one under it the part over)."""
    total = 0.0
    for i in range(lo, hi):
        over = prof[i] + add - budget
        if over > 0.0:
            total += over if over < add else add
    return total


def _best_split(
    a: Arrays,
    seq: list[int],
    prof: np.ndarray,
    intervals: list[list[tuple[int, int, list[int]]]],
    t: int,
    budget: float,
    depth: int,
    exact: int = 0,
) -> tuple[int, list[int]] | None:
    """The best (position, nodes to insert there) lowering the excess at instant t, if any.
    With `exact`, the first `exact` candidates (by the score bound) are inserted and decoded, and
    the one lowering (peak, total excess) the most wins: slower, but free of the estimates."""
    excess = np.maximum(prof - budget, 0.0)
    # sparse table: the max of prof over [i, j) in O(1), for the common "stays under" test
    table = [prof]
    while 2 ** len(table) <= len(prof):
        h = 2 ** (len(table) - 1)
        table.append(np.maximum(table[-1][:-h], table[-1][h:]))

    levels = [lv.tolist() for lv in table]
    size, cost_of, evictable, ins, producer = a.size_l, a.cost_l, a.evictable_l, a.ins, a.producer

    def range_max(i: int, j: int) -> float:
        k = (j - i).bit_length() - 1
        lv = levels[k]
        return max(lv[i], lv[j - (1 << k)])

    keep_memo: dict[tuple[int, int], tuple[float, float]] = {}
    plan_memo: dict[tuple[int, int, int], tuple[float, float, float, list[int]]] = {}

    def keep_alive(x: int, b: int) -> tuple[float, float]:
        key = (x, b)
        r = keep_memo.get(key)
        if r is None:
            r = keep_memo[key] = _keep_alive(x, b)
        return r

    def _keep_alive(x: int, b: int) -> tuple[float, float]:
        # (excess added by keeping x alive from its last read before b up to b, x's bytes when it
        # is not live at instant b: a recomputation inserted before b holds them there too)
        for iv in reversed(intervals[x]):
            if iv[0] < b:
                ex = iv[1]
                break
        else:
            return np.inf, size[x]
        if ex >= b:
            return 0.0, 0.0
        if b <= ex + 1 or range_max(ex + 1, b) + size[x] <= budget:
            return 0.0, size[x]
        return _segment_loss(prof, ex + 1, b, size[x], budget), size[x]

    def plan(p: int, b: int, d: int) -> tuple[float, float, float, list[int]]:
        key = (p, b, d)
        r = plan_memo.get(key)
        if r is None:
            r = plan_memo[key] = _plan(p, b, d)
        return r

    def _plan(p: int, b: int, d: int) -> tuple[float, float, float, list[int]]:
        """(cost, excess added, bytes kept alive up to b that are not live there, nodes to insert
        before position b) to recompute node p there."""
        cost, loss, held, nodes = cost_of[p], 0.0, 0.0, []
        for x in ins[p]:
            keep, bytes_at_b = keep_alive(x, b)
            if keep > 0 and d > 0 and evictable[x]:
                c2, l2, h2, n2 = plan(producer[x], b, d - 1)
                # recompute x instead when that costs less excess per unit of extra cost
                if l2 < keep and (c2 == 0 or (keep - l2) / c2 > keep / max(cost, 1e-9)):
                    cost, loss, held = cost + c2, loss + l2, held + h2
                    nodes.extend(n2)
                    continue
            loss += keep
            held += bytes_at_b
        nodes.append(p)
        return cost, loss, held, nodes

    n_t = seq[t]
    touched = set(a.ins[n_t]) | set(a.outs[n_t])
    cands: list[tuple[float, int, int]] = []  # (gain per producer cost: a score bound, gain, b)
    for v in np.flatnonzero(a.evictable):
        v = int(v)
        if v in touched:
            continue
        for s, e, uses in intervals[v]:
            if not s < t < e:
                continue
            before = [u for u in uses if u < t]
            lo = before[-1] if before else s
            b = next(u for u in uses if u > t)
            gain = float(np.sum(np.minimum(excess[lo + 1 : b], a.size[v])))
            cands.append((gain / max(float(a.cost[a.producer[v]]), 1e-9), v, b))
            break
    cands.sort(key=lambda c: (-c[0], c[1]))
    best: tuple[int, list[int]] | None = None
    if exact:
        splits = [(b, list(dict.fromkeys(plan(a.producer[v], b, depth)[3]))) for _, v, b in cands[:exact]]
        k = _lowest(a, [seq[:b] + nodes + seq[b:] for b, nodes in splits], prof, budget)
        return None if k is None else splits[k]
    best_score = 0.0
    for bound, v, b in cands:
        if bound <= best_score:
            break  # the loss is >= 0 and the cost >= the producer's: no later one wins
        cost, loss, held, nodes = plan(a.producer[v], b, depth)
        # the inserted instant itself: what is live before position b, with the producer's
        # outputs (about v's bytes), the other inserted nodes' outputs (inputs of the producer)
        # and the inputs kept alive for it
        at_b = seq[b]
        inserted = prof[b] - a.out_size[at_b] - a.workspace[at_b] + a.workspace[nodes[-1]] + held
        inserted += sum(a.out_size[m] for m in dict.fromkeys(nodes[:-1]))
        loss += max(0.0, inserted - budget)
        score = (bound * max(float(a.cost[a.producer[v]]), 1e-9) - loss) / max(cost, 1e-9)
        if score > best_score:
            best, best_score = (b, nodes), score
    return best
