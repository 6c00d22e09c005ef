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


@njit(cache=True)
def _decode_kernel(
    seq: np.ndarray,
    ins_ptr: np.ndarray,
    ins_flat: np.ndarray,
    outs_ptr: np.ndarray,
    outs_flat: np.ndarray,
    size: np.ndarray,
    is_output: np.ndarray,
    workspace: np.ndarray,
    resident_bytes: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The memory at each compute instant of `seq` as `steps_from_sequence` frees it, and the live
    intervals as flat arrays: value v's intervals are ``ids[ptr[v]:ptr[v + 1]]`` (by start), each
    interval i from ``start[i]`` to ``end[i]`` (inclusive), read at ``uses[use_ptr[i]:use_ptr[i + 1]]``
    (ascending). Each compute of a value opens an interval (closing the one before) that lasts
    to its last read; a graph output's last one lasts to the end."""
    n, nv = len(seq), len(size)
    n_iv = 0
    n_reads = 0
    for k in range(n):
        n_iv += outs_ptr[seq[k] + 1] - outs_ptr[seq[k]]
        n_reads += ins_ptr[seq[k] + 1] - ins_ptr[seq[k]]
    value = np.empty(n_iv, np.int64)
    start = np.empty(n_iv, np.int64)
    end = np.empty(n_iv, np.int64)
    last = np.full(n_iv, -1, np.int64)
    read_iv = np.empty(n_reads, np.int64)
    read_at = np.empty(n_reads, np.int64)
    open_iv = np.full(nv, -1, np.int64)
    m = 0
    r = 0
    for k in range(n):
        node = seq[k]
        for j in range(ins_ptr[node], ins_ptr[node + 1]):
            i = open_iv[ins_flat[j]]
            read_iv[r] = i
            read_at[r] = k
            r += 1
            last[i] = k
        for j in range(outs_ptr[node], outs_ptr[node + 1]):
            o = outs_flat[j]
            i = open_iv[o]
            if i >= 0:
                end[i] = last[i] if last[i] >= 0 else start[i]
            value[m] = o
            start[m] = k
            open_iv[o] = m
            m += 1
    for o in range(nv):
        i = open_iv[o]
        if i >= 0:
            end[i] = n - 1 if is_output[o] else (last[i] if last[i] >= 0 else start[i])
    # bytes are whole numbers: the sums are exact in any order
    diff = np.zeros(n + 1)
    for i in range(n_iv):
        diff[start[i]] += size[value[i]]
        diff[end[i] + 1] -= size[value[i]]
    prof = np.empty(n)
    acc = 0.0
    for k in range(n):
        acc += diff[k]
        prof[k] = acc + resident_bytes + workspace[seq[k]]
    # intervals grouped by value, reads grouped by interval
    ptr, ids = _group_by(value, np.arange(n_iv), nv)
    use_ptr, uses = _group_by(read_iv, read_at, n_iv)
    return prof, ptr, ids, start, end, use_ptr, uses


@njit(cache=True)
def _group_by(keys: np.ndarray, items: np.ndarray, n_keys: int) -> tuple[np.ndarray, np.ndarray]:
    """(ptr, grouped): `items` grouped by `keys` (0..n_keys-1), key k's at grouped[ptr[k]:ptr[k+1]]
    in their order (a counting sort)."""
    ptr = np.zeros(n_keys + 1, np.int64)
    for k in keys:
        ptr[k + 1] += 1
    for k in range(n_keys):
        ptr[k + 1] += ptr[k]
    grouped = np.empty(len(keys), np.int64)
    fill = ptr[:-1].copy()
    for q in range(len(keys)):
        grouped[fill[keys[q]]] = items[q]
        fill[keys[q]] += 1
    return ptr, grouped


class Intervals:
    """The live intervals of one decoded sequence (:func:`_decode_kernel`'s flat arrays);
    ``intervals[v]`` is value v's list of (start, end, positions reading it), built on first
    access."""

    def __init__(self, flat: tuple[np.ndarray, ...]) -> None:
        self.flat = flat
        self.ptr, self.ids, self.start, self.end, self.use_ptr, self.uses = flat
        self._built: dict[int, list[tuple[int, int, list[int]]]] = {}

    def __getitem__(self, v: int) -> list[tuple[int, int, list[int]]]:
        out = self._built.get(v)
        if out is None:
            ids = self.ids[self.ptr[v] : self.ptr[v + 1]].tolist()
            lo, hi = self.use_ptr[ids].tolist(), self.use_ptr[[i + 1 for i in ids]].tolist()
            out = self._built[v] = [
                (s, e, self.uses[u:w].tolist())
                for s, e, u, w in zip(self.start[ids].tolist(), self.end[ids].tolist(), lo, hi, strict=True)
            ]
        return out

    def starting_at(self, a: Arrays, seq: list[int], i: int) -> list[tuple[int, int, list[int]]]:
        """The intervals opened at position i: those of the outputs of the node computed there."""
        return [iv for o in a.outs[seq[i]] for iv in self[o] if iv[0] == i]


def _decode(a: Arrays, seq: list[int]) -> tuple[np.ndarray, Intervals]:
    """The memory at each compute instant of `seq` as `steps_from_sequence` frees it, and each
    value's live intervals (start, end, positions reading it), inclusive."""
    prof, *flat = _decode_kernel(
        np.array(seq, dtype=np.int64),
        a.ins_ptr,
        a.ins_flat,
        a.outs_ptr,
        a.outs_flat,
        a.size,
        a.is_output,
        a.workspace_a,
        float(a.resident_bytes),
    )
    return prof, Intervals(tuple(flat))


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
    intervals: Intervals,
    t: int,
    budget: float,
) -> list[int] | None:
    """The sequence with one computation within MOVE_WINDOW of the peak instant t moved across
    it -- delayed past t when nothing reads its outputs until after t, or brought forward to t
    when its inputs all exist before t -- that lowers (peak, total excess) the most, scored on
    the exact profile; None when no move lowers it. (The operator order is a lever of its own:
    RL n500 at 70% is reached only so.)"""
    candidates: list[list[int]] = []
    for i in range(max(0, t - MOVE_WINDOW), t):
        n = seq[i]
        # nothing reads the values computed at i until after t
        unread = all((uses[0] if uses else len(seq)) > t for _, _, uses in intervals.starting_at(a, seq, i))
        if unread and n not in seq[i + 1 : t + 1]:
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


@njit(cache=True)
def _kept_alive(
    x: int,
    b: int,
    size: float,
    prof: np.ndarray,
    budget: float,
    ptr: np.ndarray,
    ids: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
) -> tuple[float, float]:
    """(excess added by keeping value x, of `size` bytes, alive from its last read before
    position b up to b; x's bytes when it is not live at instant b, since a recomputation
    inserted before b holds them there too). Infinite when x has no copy before b."""
    ex = -1
    for q in range(ptr[x + 1] - 1, ptr[x] - 1, -1):
        if start[ids[q]] < b:
            ex = end[ids[q]]
            break
    else:
        return np.inf, size
    if ex >= b:
        return 0.0, 0.0
    if b <= ex + 1 or prof[ex + 1 : b].max() + size <= budget:
        return 0.0, size
    return _segment_loss(prof, ex + 1, b, size, budget), size


@njit(cache=True)
def _sum_of_min(x: np.ndarray, lo: int, hi: int, cap: float) -> float:
    """``np.sum(np.minimum(x[lo:hi], cap))``, bit for bit: numpy's pairwise summation (runs
    under 8 added in turn, blocks up to 128 in eight lanes, longer ones halved at a multiple
    of 8), so the scores, and the ties between them, are numpy's."""
    n = hi - lo
    if n < 8:
        res = 0.0
        for i in range(lo, hi):
            res += min(x[i], cap)
        return res
    if n <= 128:
        r = np.empty(8)
        for j in range(8):
            r[j] = min(x[lo + j], cap)
        i = 8
        while i < n - (n % 8):
            for j in range(8):
                r[j] += min(x[lo + i + j], cap)
            i += 8
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        while i < n:
            res += min(x[lo + i], cap)
            i += 1
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _sum_of_min(x, lo, lo + n2, cap) + _sum_of_min(x, lo + n2, hi, cap)


@njit(cache=True)
def _live_across(
    t: int,
    candidate: np.ndarray,
    excess: np.ndarray,
    size: np.ndarray,
    ptr: np.ndarray,
    ids: np.ndarray,
    start: np.ndarray,
    end: np.ndarray,
    use_ptr: np.ndarray,
    uses: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each `candidate` value live across instant t (its first interval with start < t <
    end), by value: the value, its next read b after t, and the excess its bytes cover between
    its last read before t (or its start) and b -- what recomputing it right before b removes."""
    nv = len(size)
    vs = np.empty(nv, np.int64)
    bs = np.empty(nv, np.int64)
    gains = np.empty(nv)
    m = 0
    for v in range(nv):
        if not candidate[v]:
            continue
        for q in range(ptr[v], ptr[v + 1]):
            i = ids[q]
            if not (start[i] < t < end[i]):
                continue
            lo = start[i]
            b = -1
            for j in range(use_ptr[i], use_ptr[i + 1]):
                u = uses[j]
                if u < t:
                    lo = u
                elif u > t:
                    b = u
                    break
            vs[m] = v
            bs[m] = b
            gains[m] = _sum_of_min(excess, lo + 1, b, size[v])
            m += 1
            break
    return vs[:m], bs[:m], gains[:m]


def _best_split(
    a: Arrays,
    seq: list[int],
    prof: np.ndarray,
    intervals: Intervals,
    t: int,
    budget: float,
    depth: int,
    exact: int = 0,
) -> tuple[int, list[int]] | None:
    """The best (position, nodes to insert there) lowering the excess at instant t, if any.
    With `exact`, the first `exact` candidates (by the score bound) are inserted and decoded, and
    the one lowering (peak, total excess) the most wins: slower, but free of the estimates."""
    excess = np.maximum(prof - budget, 0.0)
    size, cost_of, evictable, ins, producer = a.size_l, a.cost_l, a.evictable_l, a.ins, a.producer
    ptr, ids, start, end = intervals.ptr, intervals.ids, intervals.start, intervals.end

    keep_memo: dict[tuple[int, int], tuple[float, float]] = {}
    plan_memo: dict[tuple[int, int, int], tuple[float, float, float, list[int]]] = {}

    def keep_alive(x: int, b: int) -> tuple[float, float]:
        key = (x, b)
        r = keep_memo.get(key)
        if r is None:
            r = keep_memo[key] = _kept_alive(x, b, size[x], prof, budget, ptr, ids, start, end)
        return r

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
    candidate = a.evictable.copy()
    candidate[list(touched)] = False
    vs, bs, gains = _live_across(t, candidate, excess, a.size, *intervals.flat)
    cands: list[tuple[float, int, int]] = []  # (gain per producer cost: a score bound, v, b)
    for v, b, gain in zip(vs.tolist(), bs.tolist(), gains.tolist(), strict=True):
        cands.append((gain / max(cost_of[producer[v]], 1e-9), v, b))
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
