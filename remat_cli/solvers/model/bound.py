"""A lower bound on the fragmentation-free peak of every operator order: the minimum cut at each
operator, a strengthening of MODeL's forced preservation (eq. 12) that the paper does not make.

When operator v runs, the operators already run form a down-closed set S (every ancestor of v
is in it, no descendant is). Whatever S is, the resident tensors include v's own inputs,
outputs and workspace, plus every tensor created in S and read by an operator outside S (or
kept to the end). Minimising that sum over the down-closed S with anc(v) inside and desc(v)
outside is a closure problem, i.e. one s-t minimum cut (Picard 1976):

* an operator on the source side is run (in S); an arc w -> u of infinite capacity for every
  edge u -> w makes S down-closed; the source holds anc(v) + v, the sink desc(v);
* tensor e gets a node y_e, an arc src(e) -> y_e of capacity S_e and arcs y_e -> sink(e) of
  infinite capacity: y_e can stay on the source side (free) only when every reader ran, so the
  arc is cut, and S_e counted, exactly when src(e) ran and some reader did not; a graph output
  is tied to the sink (it is always counted once created).

max over v of the cut is a bound for any order's peak, hence (§5.5) for any arena. Eq. 12's
forced set (tensors live for *every* such S) is contained in each cut, so this bound is never
weaker; on the exported ResNet training step it is 34.1 MB where eq. 12 gives 8.4 MB, because
the exporter's backward reads forward activations through ops (transposes, ReLU masks) that may
run early, which eq. 12 cannot see through.

The cut at v is at most the live bytes at v in any order, so operators are visited from the
incumbent's highest step down and the search stops once the incumbent's live bytes at the
remaining operators cannot beat the bound (or the bound reaches the incumbent's peak: proven).

The cuts see one step at a time, and the optimum is often set at the end of a training step,
where every weight gradient (a graph output, kept to the end) is live and the last ones are
still being made. A second bound looks at that: of any set W of operators with no successor,
one runs last, and when it does every other operator of W and all their ancestors have run.
So min over u in W of the cut at u with W and its fan-in on the source side is a bound, for
every such W. W starts as all of them and loses the operator of the smallest cut each round
(peeling); the largest of the rounds' minima counts. On the exported AlexNet step (batch 1) it
is 23,563,712 B, the best arena found, where the cuts give 18.9 MB and all outputs together
23,559,552 B; on ResNet-18 (batch 1) 45.29 MB against 44.72 MB.

A third bound pairs the cuts. Each cut picks its own best S, and two of them may disagree on
which of two operators u and v ran first: each cut defers the other's branch. Of two operators
neither of which depends on the other, one runs first in every order; if u does, v (and all it
feeds) has not run while u runs, and u (and all that feeds it) has run while v runs. So
min(max(cut(u | v not run), cut(v | u run)), max(cut(v | u not run), cut(u | v run))) is a bound;
the pairs tried are those of the operators with the largest cuts and of the incumbent's largest
live bytes (``PAIR_CANDIDATES`` of each), then those of a few anchors with every operator. On
the exported Transformer step (batch 1) it is 18,362,368 B, the best order's peak, where the
cuts give 17,850,628 B; on ResNet-18 (batch 32) 168.9 MB against 160.5 MB, on ResNet-50
(batch 32) 831.7 MB against 827.6 MB.

A fourth bound orders a few operators at once. A training step ends by making its weight
gradients, each a graph output kept to the end, and each through a short chain of its own (the
exported convolution's gradient is made transposed, permuted, sometimes cropped: 2 x its size live
at the permute). Whichever order they run in, the one made at step i sees the i - 1 before it
kept. For a set K of operators, any order runs them in some sequence, and the bytes live at each
are at least its cut with the operators before it in K run (with their fan-in) and those after
it not (with what they feed); the least over all sequences of the largest of those cuts is a
bound. It is a dynamic program over the subsets of K that run last (``sequence_bound``): each
subset keeps the least largest cut of its sequences, and sequences that reach the incumbent's
peak are dropped, so few subsets survive. K: the operators without successors that create at
least ``SEQUENCE_SHARE`` of the peak (the largest, at most ``SEQUENCE_ITEMS`` with their chains),
each with the operator of its own chain that creates or reads the most bytes. On the exported
ResNet-18 step (batch 1, 15 operators, 1,237 cuts, 0.3 s) it is 46,080,812 B, the best order's
peak, where the other three give 45,294,380 B.

Where the pair bound set the best bound and that is below the incumbent's peak, the sequence
bound runs again over a second K: the incumbent's peak operator and the pair's two, each with
the operators it feeds (``neighbourhood_items``). On the exported ResNet-50 step (batch 32) the
pair is a flipped weight for one data-gradient convolution and the first temporary of a batch
norm's backward, the peak another flipped weight: their 9 operators (with both convolutions and
the batch norm's four readers) give 833,814,316 B, the best order's peak, where the pairs give
833,806,124 B.
"""

from __future__ import annotations

import time

import numpy as np
from ortools.graph.python import max_flow

from remat_cli.solvers.model.lifetimes import Problem

#: operators whose pairs the pair bound tries: this many of the largest cuts, and as many of the
#: incumbent's largest live bytes
PAIR_CANDIDATES = 40
#: operators of the largest cuts whose pairs with every other operator the pair bound tries
ANCHORS = 3
#: the sequence bound's operators without successors: those creating at least this share of the
#: incumbent's peak ...
SEQUENCE_SHARE = 0.01
#: ... and at most this many operators in all (their chains' counted): the subsets it keeps grow
#: as 2 ** this where nothing prunes them
SEQUENCE_ITEMS = 16


def live_profile(p: Problem, order: list[int]) -> np.ndarray:
    """Resident bytes at each operator (indexed by operator, not step) when `order` runs."""
    life = p.lives
    start, end = life.of(order)
    delta = np.zeros(len(order) + 1, dtype=np.int64)
    np.add.at(delta, start, life.size)
    np.add.at(delta, end, -life.size)
    by_step = np.cumsum(delta)[: len(order)]
    return by_step[np.asarray(order, dtype=np.int64).argsort()]


class CutNetwork:
    """The flow network of the module docstring, built once per problem and shared by the bound
    and the descents; the terminals' arcs and v's own tensors are re-weighted per operator v. The
    plain cut at v does not depend on any order, so it is computed once (`_plain`)."""

    def __init__(self, p: Problem):
        n = len(p)
        self.n = n
        tensors = [t for t in p.tensors if t.size > 0]
        m = len(tensors)
        self.source, self.sink = n + m, n + m + 1
        self.inf = inf = sum(t.size for t in tensors) + 1
        tails: list[int] = []
        heads: list[int] = []
        caps: list[int] = []

        def arc(a: int, b: int, c: int) -> int:
            tails.append(a)
            heads.append(b)
            caps.append(c)
            return len(tails) - 1

        for w, preds in enumerate(p.preds):
            for u in preds:
                arc(w, u, inf)  # w run => its predecessor u run
        self.size_arc = np.empty(m, dtype=np.int64)  # src -> y_e, capacity S_e
        self.touching: list[list[int]] = [[] for _ in range(n)]  # tensors v reads, creates, works in
        for k, t in enumerate(tensors):
            y = n + k
            self.size_arc[k] = arc(t.src, y, t.size)
            for s in t.sinks:
                arc(y, s, inf)
                self.touching[s].append(k)
            self.touching[t.src].append(k)
            if t.to_end:
                arc(y, self.sink, inf)
        self.from_source = np.array([arc(self.source, u, 0) for u in range(n)], dtype=np.int64)
        self.to_sink = np.array([arc(u, self.sink, 0) for u in range(n)], dtype=np.int64)
        self.sizes = np.array([t.size for t in tensors], dtype=np.int64)
        self._own: list[int] = []  # the tensors of the operator cut last, their arcs at 0
        self._plain: dict[int, int] = {}  # v -> cut(v), neither `before` nor `after`
        self.up = [a | (1 << i) for i, a in enumerate(p.ancestors)]
        self.down = p.descendants
        #: v and every operator it feeds: what has not run while v has not
        self.from_ = [d | (1 << i) for i, d in enumerate(p.descendants)]
        self.flow = max_flow.SimpleMaxFlow()
        self.flow.add_arcs_with_capacity(
            np.array(tails, dtype=np.int32), np.array(heads, dtype=np.int32), np.array(caps, dtype=np.int64)
        )

    def cut(self, v: int, before: int = 0, after: int = 0) -> int:
        """The fewest bytes resident while v runs, over every order that runs the operators of
        the bitset `before` (closed under ancestors) before v and those of `after` (closed under
        descendants) after it."""
        plain = not before and not after
        if plain and v in self._plain:
            return self._plain[v]
        value = self._solve(v, before, after)
        if plain:
            self._plain[v] = value
        return value

    def _solve(self, v: int, before: int, after: int) -> int:
        """`cut`, solved: the flow's source side is then that cut's closure."""
        n, inf, flow = self.n, self.inf, self.flow
        flow.set_arcs_capacity(self.size_arc[self._own], self.sizes[self._own])  # the last v's
        flow.set_arcs_capacity(self.from_source, np.where(_bits(self.up[v] | before, n), inf, 0))
        flow.set_arcs_capacity(self.to_sink, np.where(_bits(self.down[v] | after, n), inf, 0))
        self._own = own = self.touching[v]
        flow.set_arcs_capacity(self.size_arc[own], np.zeros(len(own), dtype=np.int64))  # counted below
        if flow.solve(self.source, self.sink) != flow.OPTIMAL:  # cannot happen: capacities are finite
            raise RuntimeError("the minimum cut of the order bound failed")
        return int(flow.optimal_flow()) + int(self.sizes[own].sum())

    def independent(self, u: int, v: int) -> bool:
        """Neither of u and v depends on the other: either may run first."""
        return u != v and not (self.up[v] >> u) & 1 and not (self.up[u] >> v) & 1

    def closure(self, v: int, before: int = 0, after: int = 0) -> set[int]:
        """The operators run before v in an order that reaches `cut(v, before, after)` at v."""
        self._solve(v, before, after)
        return {u for u in self.flow.get_source_side_min_cut() if u < self.n and u != v}


def cut_bound(
    p: Problem,
    order: list[int],
    deadline: float | None = None,
    pair: list[int] | None = None,
    net: CutNetwork | None = None,
) -> int:
    """The largest of the bounds of the module docstring (the cut at each operator, the peeling
    over the operators without successors, the pairs of cuts, the sequences); `order` is any valid
    order (the incumbent): nothing above its peak can be proven, and its live bytes pick the
    pairs. Stops at `deadline` (time.monotonic()) with the best bound so far, which is still a
    bound. `pair`, when given, receives the pair that set the bound, the one to run first first
    (empty where no pair raised it). `net`: the problem's CutNetwork, when the caller has one."""
    if len(p) == 0:
        return 0
    net = CutNetwork(p) if net is None else net
    ub = live_profile(p, order)
    peak = int(ub.max())
    cuts = np.zeros(len(p), dtype=np.int64)
    for v in np.argsort(-ub, kind="stable").tolist():
        if deadline is not None and time.monotonic() > deadline:
            return int(cuts.max())
        cuts[v] = net.cut(v)
    best = max(int(cuts.max()), last_of_bound(p, net, peak, deadline))
    found: list[int] = [] if pair is None else pair
    best = max(best, pair_bound(net, cuts, ub, best, peak, deadline, found))
    best = max(best, sequence_bound(p, net, peak, deadline))
    if found and best < peak:
        # the same over the incumbent's peak operator, the best pair and what each feeds
        around = neighbourhood_items(p, [int(np.argmax(ub)), *found])
        best = max(best, sequence_bound(p, net, peak, deadline, around))
    return best


def pair_bound(
    net: CutNetwork,
    cuts: np.ndarray,
    live: np.ndarray,
    best: int,
    peak: int,
    deadline: float | None = None,
    found: list[int] | None = None,
) -> int:
    """The pair bound of the module docstring: over the pairs of the operators with the largest
    `cuts` and the largest incumbent `live` bytes, then over every pair of an anchor (the
    ``ANCHORS`` largest cuts, the incumbent's peak and the operators of the best pair so far) with
    any operator. Returns `best` where no pair exceeds it; stops at `peak` or `deadline`. `found`
    receives the best pair, the one that runs first in its cheaper order first."""
    n = len(cuts)
    k = PAIR_CANDIDATES
    ops = sorted(
        set(np.argsort(-cuts, kind="stable")[:k].tolist())
        | set(np.argsort(-live, kind="stable")[:k].tolist())
    )
    up, after = net.up, net.from_
    found = [] if found is None else found

    def pair(u: int, v: int) -> bool:
        nonlocal best
        if not net.independent(u, v):
            return False  # one depends on the other: a single order, which the cuts see
        first_u = max(net.cut(u, after=after[v]), net.cut(v, before=up[u]))
        if first_u <= best:
            return False
        first_v = max(net.cut(v, after=after[u]), net.cut(u, before=up[v]))
        if min(first_u, first_v) <= best:
            return False
        best = min(first_u, first_v)
        found[:] = [u, v] if first_u <= first_v else [v, u]
        return True

    def over() -> bool:
        return best >= peak or (deadline is not None and time.monotonic() > deadline)

    for i, u in enumerate(ops):
        for v in ops[i + 1 :]:
            if over():
                return best
            pair(u, v)
    # ResNet-18 (batch 32): the pairs of the 40 give 167.8 MB, (294, 329) of the anchor 294
    # 168.9 MB, as do all pairs of the 150 largest cuts and live bytes at 50 times the work
    anchors = [int(u) for u in np.argsort(-cuts, kind="stable")[:ANCHORS]] + [int(np.argmax(live)), *found]
    done: set[int] = set()
    while anchors:
        u = anchors.pop(0)
        if u in done:
            continue
        done.add(u)
        for v in range(n):
            if over():
                return best
            if pair(u, v):
                anchors.extend(found)
    return best


def last_of_bound(p: Problem, net: CutNetwork, peak: int, deadline: float | None = None) -> int:
    """The peeling bound over the operators without successors (module docstring); stops at
    `peak` (the incumbent's: nothing can be proven above it) or at `deadline`."""
    last = [i for i in range(len(p)) if not p.succs[i]]
    best = 0
    while len(last) > 1 and best < peak:
        cuts = []
        for u in last:
            if deadline is not None and time.monotonic() > deadline:
                return best
            others = 0
            for w in last:
                if w != u:
                    others |= net.up[w]
            cuts.append(net.cut(u, others))
        k = int(np.argmin(cuts))
        best = max(best, cuts[k])
        last.pop(k)
    return best


def sequence_items(p: Problem, net: CutNetwork, peak: int) -> list[int]:
    """K of the sequence bound (module docstring): the largest operators without successors, by
    the bytes they create, each followed by the operator of its own chain (feeding that sink and
    no other) that creates or reads the most bytes, where that is more than the sink."""
    created = np.zeros(len(p), dtype=np.int64)
    for t in p.tensors:
        created[t.src] += t.size
    touched = np.array([int(net.sizes[k].sum()) for k in net.touching], dtype=np.int64)
    sinks = [i for i in np.argsort(-created, kind="stable").tolist() if not p.succs[i]]
    sinks = [i for i in sinks if created[i] >= SEQUENCE_SHARE * peak]
    mask = 0
    for i in sinks:
        mask |= 1 << i
    chain: dict[int, int] = {}  # sink -> its chain's operator touching the most bytes
    for i in range(len(p)):
        reach = p.descendants[i] & mask
        if not reach or reach & (reach - 1):  # feeds no sink of K, or several
            continue
        s = reach.bit_length() - 1
        if touched[i] > touched[s] and touched[i] > touched[chain.get(s, s)]:
            chain[s] = i
    items: list[int] = []
    for s in sinks:
        take = [s] + ([chain[s]] if s in chain else [])
        if len(items) + len(take) > SEQUENCE_ITEMS:
            break
        items += take
    return items


def neighbourhood_items(p: Problem, centres: list[int]) -> list[int]:
    """A second K for the sequence bound (module docstring): each of `centres` followed by the
    operators it feeds, at most SEQUENCE_ITEMS in all."""
    items: list[int] = []
    for c in centres:
        for u in [c, *sorted(p.succs[c])]:
            if u not in items and len(items) < SEQUENCE_ITEMS:
                items.append(u)
    return items


def sequence_bound(
    p: Problem, net: CutNetwork, peak: int, deadline: float | None = None, items: list[int] | None = None
) -> int:
    """The sequence bound of the module docstring over `items` (by default `sequence_items`);
    `peak` (the incumbent's) when no sequence stays below it. Sets T that run last, grown one
    operator u at a time in front: u runs with every other operator of K before it, T after it.
    Returns 0 at `deadline` (no bound proven)."""
    items = sequence_items(p, net, peak) if items is None else items
    k = len(items)
    if k < 2:
        return 0
    up = [net.up[v] for v in items]
    down = [net.from_[v] for v in items]
    level: dict[int, int] = {0: 0}  # T (bitset over items) -> least largest cut of its sequences
    for _ in range(k):
        grown: dict[int, int] = {}
        for last, worst in level.items():
            after = 0
            for j in range(k):
                if (last >> j) & 1:
                    after |= down[j]
            for i in range(k):
                t = last | (1 << i)
                if t == last or (after >> items[i]) & 1:  # in T already, or T feeds it
                    continue
                before = 0
                for j in range(k):
                    if not (t >> j) & 1:
                        before |= up[j]
                if (before >> items[i]) & 1:  # it feeds an operator that runs before it
                    continue
                if deadline is not None and time.monotonic() > deadline:
                    return 0
                value = max(worst, net.cut(items[i], before, after))
                if value < peak and value < grown.get(t, peak):
                    grown[t] = value
        level = grown
        if not level:
            return peak
    return level[(1 << k) - 1]


def _bits(mask: int, n: int) -> np.ndarray:
    """A python-int bitset as a bool array of length n."""
    raw = np.frombuffer(mask.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n].astype(bool)
