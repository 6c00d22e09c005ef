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
_INF = float("inf")


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
    return _Pass(a, threshold, variant, stop, bound).run()


class _Pass:
    """The state of one DTR pass: which values are live, locked, when each is used next, and
    the memory, clock and cost so far."""

    def __init__(
        self, a: Arrays, threshold: float, variant: str, stop: Callable[[], bool] | None, bound: float
    ) -> None:
        self.a = a
        self.threshold = threshold
        self.stop = stop
        self.bound = bound
        nv = len(a.size)
        self.live = a.resident.copy()
        self.locked = np.zeros(nv, dtype=np.int32)
        self.last_access = np.zeros(nv, dtype=np.float64)
        inf = float("inf")
        self.next_use = np.full(nv, inf)
        self.use_ptr = [0] * nv
        for v in range(nv):
            if a.uses[v]:
                self.next_use[v] = a.uses[v][0]
        # c(t): the producer's cost, per value
        self.c0 = np.array([a.cost[p] if p >= 0 else 0.0 for p in a.producer], dtype=np.float64)
        # when each value would be freed as dead; the e* of the Belady variants counts an input
        # that is live now but dead before the evicted value's next use as one to recompute
        self.free_at = np.full(nv, inf)
        for i, vs in enumerate(a.free_after):
            self.free_at[vs] = i
        self.belady = variant.startswith("belady")
        self.estar = "estar" in variant
        self.lazy = "lazy" in variant
        self.size = a.size
        self.evictable = a.evictable
        self.seq: list[int] = []
        self.zombies: list[int] = []
        self.mem = float(a.resident_bytes)
        self.peak = self.mem
        self.clock = 1.0
        self.position = 0
        self.cap = MAX_BLOWUP * max(1, len(a.program))
        self.spent = 0.0
        # the inputs per node as CSR arrays for the compiled e* walk
        self.ins_ptr = np.zeros(len(a.ins) + 1, dtype=np.int64)
        self.ins_ptr[1:] = np.cumsum([len(x) for x in a.ins])
        self.ins_idx = np.array([w for x in a.ins for w in x], dtype=np.int64)
        self.producer = np.array(a.producer, dtype=np.int64)
        self.seen = np.zeros(nv, dtype=np.int64)
        self.stack = np.zeros(nv + 1, dtype=np.int64)
        self.stamp = 0
        # On large graphs a full scan per eviction makes the pass quadratic. Belady's h only
        # grows while a value waits (its next use comes closer), so a scan's POOL best stay near
        # the top until a value changes otherwise: is read (its next use moves away), becomes
        # live or unlocked (`dirty`, admitted when its h is <= the scan's floor). pick() takes
        # from the pool while its k-th best is <= floor and scans again when not: the same
        # choice as a full scan up to ties and pool members overtaken by others. Graphs up to
        # SCAN_ALL values scan every time (exact).
        self.pooling = self.belady and nv > SCAN_ALL
        self.pool = np.zeros(0, dtype=np.int64)  # ascending ids, as a scan lists them
        self.floor = -inf
        self.dirty: list[int] = []  # filled only when pooling

    def run(self) -> tuple[list[int], int]:
        a, live, next_use, use_ptr, size = self.a, self.live, self.next_use, self.use_ptr, self.size
        lazy, evictable, pooling, dirty, zombies = (
            self.lazy,
            self.evictable,
            self.pooling,
            self.dirty,
            self.zombies,
        )
        inf = float("inf")
        for position, n in enumerate(a.program):
            self.position = position  # read by pick
            self.materialize(n)
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
                    self.mem -= size[v]
            if not lazy:
                # values rebuilt for a rematerialization after their last use are dead again now
                for v in zombies:
                    if live[v] and next_use[v] == inf:
                        live[v] = False
                        self.mem -= size[v]
            zombies.clear()
        return self.seq, int(round(self.peak))

    def projected_cost(self, v: int, due: float, limit: float) -> tuple[float, float]:
        """e*: (cost, kept bytes) of recomputing v at time `due`: its producer plus, recursively,
        the producers of inputs that will not be live then; stops once the cost exceeds `limit`.
        Lazy variants keep a live input that dies before `due` cached instead (its bytes are
        returned: they no longer count as freed by the eviction)."""
        self.stamp += 1
        return _projected_cost(
            v, due, limit, self.lazy, self.ins_ptr, self.ins_idx, self.producer, self.live, self.free_at,
            self.size, self.c0, self.seen, self.stamp, self.stack,
        )  # fmt: skip

    def relying_children(self, v: int) -> tuple[float, float]:
        """(earliest next use, total producer cost) of the evicted values whose recomputation
        reads v: evicting v makes each of them more expensive (DTR's evicted descendants)."""
        a, live, next_use, c0, position = self.a, self.live, self.next_use, self.c0, self.position
        inf = float("inf")
        due, cost = inf, 0.0
        for c in a.consumers[v]:
            for o in a.outs[c]:
                if not live[o] and a.born[o] < position and next_use[o] < inf:
                    due = min(due, next_use[o])
                    cost += c0[o]
        return due, cost

    def scan(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(candidates in id order, size x age, h with the producer's cost alone: a lower bound of
        e*'s h) over every evictable live unlocked value."""
        cand = np.flatnonzero(self.live & self.evictable & (self.locked == 0))
        return (cand, *self.h_of(cand))

    def h_of(self, cand: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.belady:
            age = self.next_use[cand] - self.position  # inf when never used again
        else:
            age = self.clock - self.last_access[cand]
        denom = self.size[cand] * age
        with np.errstate(divide="ignore", invalid="ignore"):
            return denom, self.c0[cand] / denom

    def pooled(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The candidates from the pool while its k-th best is within the floor, else a scan
        that refills it (see __init__)."""
        live, evictable, locked = self.live, self.evictable, self.locked
        if self.dirty:
            d = np.array(self.dirty, dtype=np.int64)
            self.dirty.clear()
            d = d[live[d] & evictable[d] & (locked[d] == 0)]
            self.pool = np.union1d(self.pool, d[~(self.h_of(d)[1] > self.floor)])
        pool = self.pool = self.pool[live[self.pool] & evictable[self.pool] & (locked[self.pool] == 0)]
        denom, h0 = self.h_of(pool)
        if k <= len(pool) <= 4 * POOL and np.partition(h0, k - 1)[k - 1] <= self.floor:
            return pool, denom, h0
        cand, denom, h0 = self.scan()
        if len(cand) <= POOL:
            self.pool, self.floor = cand, float("inf")
            return cand, denom, h0
        keep = np.sort(np.argsort(h0, kind="stable")[:POOL])
        self.floor = float(h0[keep].max())
        self.pool = cand[keep]
        return cand, denom, h0  # this pick sees every candidate, as the full scan does

    def pick(self) -> int:
        """The value to evict: least h (DTR's h_DTR, or e*'s on the ESTAR_TOP best by the local
        h); -1 when none can be."""
        estar, belady = self.estar, self.belady
        if self.pooling:
            cand, denom, h0 = self.pooled(ESTAR_TOP if estar else 1)
        else:
            cand, denom, h0 = self.scan()
        if len(cand) == 0:
            return -1
        if not estar:
            return int(cand[np.argmin(h0)])
        inf = float("inf")
        size, next_use, position = self.size, self.next_use, self.position
        order = smallest(h0, ESTAR_TOP)
        best, best_h = int(cand[order[0]]), inf
        for j in order[:ESTAR_TOP]:
            if h0[j] >= best_h:
                break  # every later candidate is at least as bad
            v = int(cand[j])
            child_due, child_cost = self.relying_children(v)
            if belady:
                # an evicted child rematerialized first needs v then: v's real next use
                due = min(next_use[v], child_due)
                if due == inf:
                    return v  # dead and nothing evicted reads it: free
                gap = due - position
                if gap <= 0:
                    continue
                cost, kept = self.projected_cost(v, due, best_h * size[v] * gap)
                if kept >= size[v]:
                    continue
                h = cost / ((size[v] - kept) * gap)
            else:
                d = denom[j]
                h = (child_cost + self.projected_cost(v, inf, best_h * d - child_cost)[0]) / d
            if h < best_h:
                best, best_h = v, h
        return best

    def compute(self, n: int) -> None:
        """Run node n: evict (pick) while its outputs and workspace do not fit the threshold."""
        a, live, size = self.a, self.live, self.size
        self.spent += a.cost[n]
        if self.spent > self.bound:
            raise Abandon
        mem = self.mem
        for o in a.outs[n]:
            if live[o]:  # a sibling of the value being rematerialized: rebuilt by this compute
                live[o] = False
                mem -= size[o]
        need = a.out_size[n] + a.workspace[n]
        threshold = self.threshold
        while mem + need > threshold:
            self.mem = mem
            v = self.pick()
            if v < 0:
                break
            live[v] = False
            mem -= size[v]
        self.peak = max(self.peak, mem + need)
        mem += a.out_size[n]
        self.mem = mem
        clock, last_access, next_use, evictable = self.clock, self.last_access, self.next_use, self.evictable
        for o in a.outs[n]:
            live[o] = True
            if self.pooling:
                self.dirty.append(o)
            last_access[o] = clock
            if next_use[o] == _INF and evictable[o]:
                self.zombies.append(o)
        for v in a.ins[n]:
            last_access[v] = clock
        self.clock = clock + 1.0
        seq = self.seq
        seq.append(n)
        if len(seq) > self.cap or (self.stop is not None and len(seq) % 64 == 0 and self.stop()):
            raise Abandon

    def open_frame(self, n: int) -> list:
        # lock the inputs that are live now, so making the others live cannot evict them
        held = [v for v in self.a.ins[n] if self.live[v]]
        for v in held:
            self.locked[v] += 1
        return [n, 0, held]

    def materialize(self, target: int) -> None:
        """Compute `target`, first (depth first) the producers of its inputs that are not live."""
        a, live, locked, pooling = self.a, self.live, self.locked, self.pooling
        stack = [self.open_frame(target)]
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
                stack.append(self.open_frame(a.producer[ins[k]]))
                continue
            self.compute(n)
            for v in held:
                locked[v] -= 1
                if pooling and locked[v] == 0:
                    self.dirty.append(v)
            stack.pop()


def smallest(h: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(h, kind="stable")[:k]`` in O(len(h)) rather than O(len(h) log len(h)): the
    eviction scan calls this once per eviction."""
    if k >= len(h):
        return np.argsort(h, kind="stable")
    threshold = np.partition(h, k - 1)[k - 1]
    if np.isnan(threshold):
        return np.argsort(h, kind="stable")[:k]
    idx = np.flatnonzero(h <= threshold)  # ascending: ties stay in index order, as in a stable sort
    return idx[np.argsort(h[idx], kind="stable")][:k]
