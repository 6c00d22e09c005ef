"""greedy, family 1: DTR-style eviction (Kirisame et al., "Dynamic Tensor Rematerialization",
ICLR'21, §2-§3: h_DTR(t) = c(t) / (m(t) · s(t)) and its e* variant; Belady's rule for the
`belady-*` variants). See the package docstring."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit

from remat_cli.solvers.greedy.arrays import Abandon, Arrays

#: the e* cost is evaluated on at most this many of the best candidates by the local h
ESTAR_TOP = 64
#: graphs with more values than this keep a pool of eviction candidates between full scans
SCAN_ALL = 5_000
#: candidates kept from a full scan (see pick)
POOL = 256
#: a variant that computes more than this many times the needed nodes is abandoned (thrashing)
MAX_BLOWUP = 4


@njit(cache=True)
def _projected_cost(
    v: int,
    due: float,
    limit: float,
    lazy: bool,
    ins_ptr: np.ndarray,
    ins_idx: np.ndarray,
    producer: np.ndarray,
    live: np.ndarray,
    free_at: np.ndarray,
    size: np.ndarray,
    c0: np.ndarray,
    seen: np.ndarray,
    stamp: int,
    stack: np.ndarray,
) -> tuple[float, float]:
    """The e* walk of `run_dtr`'s projected_cost, compiled: a depth-first search over the inputs of
    the producers to rebuild, `seen[w] == stamp` marking the values visited in this call."""
    total, kept = c0[v], 0.0
    seen[v] = stamp
    stack[0] = v
    top = 1
    while top > 0:
        top -= 1
        p = producer[stack[top]]
        if p < 0:
            continue
        for j in range(ins_ptr[p], ins_ptr[p + 1]):
            w = ins_idx[j]
            if seen[w] == stamp:
                continue
            seen[w] = stamp
            if live[w]:
                if free_at[w] >= due:
                    continue
                if lazy:
                    kept += size[w]
                    continue
            total += c0[w]
            if total > limit:
                return total, kept
            stack[top] = w
            top += 1
    return total, kept


def run_dtr(
    a: Arrays,
    threshold: float,
    variant: str,
    stop: Callable[[], bool] | None = None,
    bound: float = float("inf"),
) -> tuple[list[int], int]:
    """One DTR pass with eviction threshold `threshold`; returns (compute sequence of node
    indices, peak of this simulation, which bounds the decoded schedule's peak from above).
    Abandoned (Abandon) once the sequence costs more than `bound`, the cheapest schedule within
    the budget found so far: it could not win (branch and bound)."""
    nv = len(a.size)
    live = a.resident.copy()
    locked = np.zeros(nv, dtype=np.int32)
    last_access = np.zeros(nv, dtype=np.float64)
    inf = float("inf")
    next_use = np.full(nv, inf)
    use_ptr = [0] * nv
    for v in range(nv):
        if a.uses[v]:
            next_use[v] = a.uses[v][0]
    # c(t): the producer's cost, per value
    c0 = np.array([a.cost[p] if p >= 0 else 0.0 for p in a.producer], dtype=np.float64)
    # when each value would be freed as dead; the e* of the Belady variants counts an input that
    # is live now but dead before the evicted value's next use as one to recompute
    free_at = np.full(nv, inf)
    for i, vs in enumerate(a.free_after):
        free_at[vs] = i
    belady = variant.startswith("belady")
    estar = "estar" in variant
    lazy = "lazy" in variant
    size = a.size
    evictable = a.evictable
    seq: list[int] = []
    zombies: list[int] = []
    mem = float(a.resident_bytes)
    peak = mem
    clock = 1.0
    position = 0
    cap = MAX_BLOWUP * max(1, len(a.program))
    spent = 0.0

    # the inputs per node as CSR arrays for the compiled e* walk
    ins_ptr = np.zeros(len(a.ins) + 1, dtype=np.int64)
    ins_ptr[1:] = np.cumsum([len(x) for x in a.ins])
    ins_idx = np.array([w for x in a.ins for w in x], dtype=np.int64)
    producer = np.array(a.producer, dtype=np.int64)
    seen = np.zeros(nv, dtype=np.int64)
    stack = np.zeros(nv + 1, dtype=np.int64)
    stamp = [0]

    def projected_cost(v: int, due: float, limit: float) -> tuple[float, float]:
        """e*: (cost, kept bytes) of recomputing v at time `due`: its producer plus, recursively,
        the producers of inputs that will not be live then; stops once the cost exceeds `limit`.
        Lazy variants keep a live input that dies before `due` cached instead (its bytes are
        returned: they no longer count as freed by the eviction)."""
        stamp[0] += 1
        return _projected_cost(
            v, due, limit, lazy, ins_ptr, ins_idx, producer, live, free_at, size, c0, seen, stamp[0], stack
        )

    def relying_children(v: int) -> tuple[float, float]:
        """(earliest next use, total producer cost) of the evicted values whose recomputation
        reads v: evicting v makes each of them more expensive (DTR's evicted descendants)."""
        due, cost = inf, 0.0
        for c in a.consumers[v]:
            for o in a.outs[c]:
                if not live[o] and a.born[o] < position and next_use[o] < inf:
                    due = min(due, next_use[o])
                    cost += c0[o]
        return due, cost

    def scan() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidates in id order, size x age, h with the producer's cost alone: a lower bound of
        e*'s h) over every evictable live unlocked value."""
        cand = np.flatnonzero(live & evictable & (locked == 0))
        return (cand, *h_of(cand))

    def h_of(cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if belady:
            age = next_use[cand] - position  # inf when never used again
        else:
            age = clock - last_access[cand]
        denom = size[cand] * age
        with np.errstate(divide="ignore", invalid="ignore"):
            return denom, c0[cand] / denom

    # On large graphs a full scan per eviction makes the pass quadratic (issue 20, scale). Belady's
    # h only grows while a value waits (its next use comes closer), so a scan's POOL best stay
    # near the top until a value changes otherwise: is read (its next use moves away), becomes
    # live or unlocked (`dirty`, admitted when its h is <= the scan's floor). pick() takes from
    # the pool while its k-th best is <= floor and scans again when not: the same choice as a
    # full scan up to ties and pool members overtaken by others. Graphs up to SCAN_ALL values
    # scan every time (exact, and bit-identical to before).
    pooling = belady and nv > SCAN_ALL
    pool = np.zeros(0, dtype=np.int64)  # ascending ids, as a scan lists them
    floor = [-inf]
    dirty: list[int] = []  # filled only when pooling

    def pooled(k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        nonlocal pool
        if dirty:
            d = np.array(dirty, dtype=np.int64)
            dirty.clear()
            d = d[live[d] & evictable[d] & (locked[d] == 0)]
            pool = np.union1d(pool, d[~(h_of(d)[1] > floor[0])])
        pool = pool[live[pool] & evictable[pool] & (locked[pool] == 0)]
        denom, h0 = h_of(pool)
        if k <= len(pool) <= 4 * POOL and np.partition(h0, k - 1)[k - 1] <= floor[0]:
            return pool, denom, h0
        cand, denom, h0 = scan()
        if len(cand) <= POOL:
            pool, floor[0] = cand, inf
            return cand, denom, h0
        keep = np.sort(np.argsort(h0, kind="stable")[:POOL])
        floor[0] = float(h0[keep].max())
        pool = cand[keep]
        return cand, denom, h0  # this pick sees every candidate, as the full scan does

    def pick() -> int:
        if pooling:
            cand, denom, h0 = pooled(ESTAR_TOP if estar else 1)
        else:
            cand, denom, h0 = scan()
        if len(cand) == 0:
            return -1
        if not estar:
            return int(cand[np.argmin(h0)])
        order = smallest(h0, ESTAR_TOP)
        best, best_h = int(cand[order[0]]), inf
        for j in order[:ESTAR_TOP]:
            if h0[j] >= best_h:
                break  # every later candidate is at least as bad
            v = int(cand[j])
            child_due, child_cost = relying_children(v)
            if belady:
                # an evicted child rematerialized first needs v then: v's real next use
                due = min(next_use[v], child_due)
                if due == inf:
                    return v  # dead and nothing evicted reads it: free
                gap = due - position
                if gap <= 0:
                    continue
                cost, kept = projected_cost(v, due, best_h * size[v] * gap)
                if kept >= size[v]:
                    continue
                h = cost / ((size[v] - kept) * gap)
            else:
                d = denom[j]
                h = (child_cost + projected_cost(v, inf, best_h * d - child_cost)[0]) / d
            if h < best_h:
                best, best_h = v, h
        return best

    def compute(n: int) -> None:
        nonlocal mem, peak, clock, spent
        spent += a.cost[n]
        if spent > bound:
            raise Abandon
        for o in a.outs[n]:
            if live[o]:  # a sibling of the value being rematerialized: rebuilt by this compute
                live[o] = False
                mem -= size[o]
        need = a.out_size[n] + a.workspace[n]
        while mem + need > threshold:
            v = pick()
            if v < 0:
                break
            live[v] = False
            mem -= size[v]
        peak = max(peak, mem + need)
        mem += a.out_size[n]
        for o in a.outs[n]:
            live[o] = True
            if pooling:
                dirty.append(o)
            last_access[o] = clock
            if next_use[o] == inf and evictable[o]:
                zombies.append(o)
        for v in a.ins[n]:
            last_access[v] = clock
        clock += 1.0
        seq.append(n)
        if len(seq) > cap or (stop is not None and len(seq) % 64 == 0 and stop()):
            raise Abandon

    def open_frame(n: int) -> list:
        # lock the inputs that are live now, so making the others live cannot evict them
        held = [v for v in a.ins[n] if live[v]]
        for v in held:
            locked[v] += 1
        return [n, 0, held]

    def materialize(target: int) -> None:
        stack = [open_frame(target)]
        while stack:
            frame = stack[-1]
            n, k, held = frame
            ins = a.ins[n]
            while k < len(ins):
                v = ins[k]
                if v in held:
                    k += 1
                elif live[v]:
                    locked[v] += 1
                    held.append(v)
                    k += 1
                else:
                    break
            frame[1] = k
            if k < len(ins):
                stack.append(open_frame(a.producer[ins[k]]))
                continue
            compute(n)
            for v in held:
                locked[v] -= 1
                if pooling and locked[v] == 0:
                    dirty.append(v)
            stack.pop()

    for position, n in enumerate(a.program):  # noqa: B007 (read by pick through the closure)
        materialize(n)
        for v in a.ins[n]:
            p = use_ptr[v] + 1
            use_ptr[v] = p
            next_use[v] = a.uses[v][p] if p < len(a.uses[v]) else inf
            if pooling:
                dirty.append(v)
        for v in a.free_after[position]:
            # lazy: a dead value stays cached until memory is short (it is then the cheapest
            # to evict unless an evicted value's recomputation will read it)
            if live[v] and not (lazy and evictable[v]):
                live[v] = False
                mem -= size[v]
        if not lazy:
            # values rebuilt for a rematerialization after their last use are dead again now
            for v in zombies:
                if live[v] and next_use[v] == inf:
                    live[v] = False
                    mem -= size[v]
        zombies.clear()
    return seq, int(round(peak))


def smallest(h: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(h, kind="stable")[:k]`` in O(len(h)) rather than O(len(h) log len(h)): the
    eviction scan calls this once per eviction (issue 20, scale)."""
    if k >= len(h):
        return np.argsort(h, kind="stable")
    threshold = np.partition(h, k - 1)[k - 1]
    if np.isnan(threshold):
        return np.argsort(h, kind="stable")[:k]
    idx = np.flatnonzero(h <= threshold)  # ascending: ties stay in index order, as in a stable sort
    return idx[np.argsort(h[idx], kind="stable")][:k]
