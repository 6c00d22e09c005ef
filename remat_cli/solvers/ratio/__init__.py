"""ratio: a fast first schedule by dropping values in order of bytes freed per recompute cost.

Each value whose uses in the baseline order leave a gap across the baseline's peak (on a
training graph: a forward activation read again in the backward) is a candidate: *dropped*, it is
freed after its last use before the gap and its producer runs again right before its first use
after it; an input of that producer no longer live then (dropped too, or past its last use) is
made again first, in turn. Candidates are ranked by the bytes they free per unit of the cost of
making them again, those inputs included (the knapsack ratio by which Checkmate's LP rounding,
Jain et al., MLSys'20 §5, and Chen et al.'s segments, 2016, trade memory for compute). A candidate
is passed over when, dropped after those before it, it would make some dropped value again more
than a slack of positions before that value's own first use after its gap: a chain back through
the residual stream would make the whole forward again at the first backward layer and hold it.
The shortest prefix of the ranking whose schedule fits the budget is found by bisection (each
prefix measured as `steps_from_sequence` runs it), for the slacks from 0 up until two fit; the
cheapest is kept, then whole classes of dropped values (the same producer op, size and cost: one
class per position of a repeated block) are kept again, or swapped for a class not dropped, while
the schedule fits and is cheaper.

The rule reads only each value's size, the cost of making it again and the chains it would start,
so the blocks of a repeated stack (a decoder's layers) get the same pattern whatever the depth;
it takes a few dozen evaluations of a sequence, so it is the anytime first schedule that `auto`
hands its lanes as their warm start where greedy's does not fit or costs more."""

from __future__ import annotations

import math
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

from remat_cli.graph import Graph
from remat_cli.schedule import baseline_steps, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult

#: how early a dropped value may be made again, in positions of the baseline order
SLACKS = (0, 1, 2, 5, 10, 20, 40, 80)
#: slacks bisected after which fit (each wider one chains more)
FITS = 2
#: the refinement's swaps: the costliest dropped classes tried out, the next classes tried in
SWAP_OUT = 4
SWAP_IN = 6


@dataclass(frozen=True)
class Candidate:
    """A value that may be dropped across its widest gap in the baseline order."""

    value: str
    producer: str
    #: baseline positions of its last use before the gap and its first use after it
    before: int
    after: int
    ratio: float


def candidates(graph: Graph, order: list[str], peak_at: int) -> list[Candidate]:
    """The values whose widest gap between uses (the production counting as one) holds the
    baseline order's position `peak_at`, best ratio first."""
    nodes = graph.node_map
    pos = {n: k for k, n in enumerate(order)}
    uses: dict[str, list[int]] = defaultdict(list)
    for k, n_id in enumerate(order):
        for v in nodes[n_id].inputs:
            uses[v].append(k)
    out = []
    for n_id in order:
        n = nodes[n_id]
        if not n.recomputable:
            continue
        for v in n.outputs:
            at = [pos[n_id], *sorted(set(uses.get(v, ())))]
            gaps = [(at[i + 1] - at[i], i) for i in range(len(at) - 1)]
            if not gaps:
                continue
            _, i = max(gaps)
            if not at[i] < peak_at < at[i + 1]:
                continue
            out.append((v, n_id, at[i], at[i + 1]))
    across = {v for v, *_ in out}
    last = {v: at[-1] for v, at in uses.items()}
    memo: dict[str, float] = {}

    def remake(v: str) -> float:
        """What making `v` again after the peak costs: its producer and, recursively, the inputs
        it needs that are not live across the peak (used only before it)."""
        if v not in memo:
            p = nodes[graph.producer[v]]
            gone = [
                u for u in p.inputs if u in graph.producer and u not in across and last.get(u, -1) < peak_at
            ]
            # a chain through an operator that must not run twice cannot be made again
            memo[v] = p.cost + sum(remake(u) for u in gone) if p.recomputable else math.inf
        return memo[v]

    ranked = []
    for v, n_id, before, after in out:
        cost = remake(v)
        if math.isinf(cost):
            continue
        size = graph.value_map[v].size
        ranked.append(Candidate(v, n_id, before, after, size / cost if cost > 0 else float("inf")))
    ranked.sort(key=lambda c: (-c.ratio, c.before))
    return ranked


def chained(graph: Graph, ranked: list[Candidate], slack: int, peak_at: int) -> list[Candidate]:
    """`ranked` without the candidates that, dropped after those before them, would have a
    dropped value made again more than `slack` positions before its own first use after the gap:
    a chain back through the residual stream recomputes the whole forward at once and holds it
    (slack < 0: no such limit)."""
    if slack < 0:
        return ranked
    nodes = graph.node_map
    producer = graph.producer
    consumers = graph.consumers
    across = {c.value for c in ranked}
    last = last_uses(graph, list(graph.needed_order))
    after: dict[str, int] = {}  # dropped value -> its first use after its gap

    def gone(u: str) -> bool:  # made again by a recomputation that needs it after the peak
        return u in producer and (u in after or (u not in across and last.get(u, -1) < peak_at))

    def below(v: str) -> list[str]:
        """The dropped values that making v again needs first (through values gone by then)."""
        out, todo, seen = [], [v], {v}
        while todo:
            for u in nodes[producer[todo.pop()]].inputs:
                if u not in seen and gone(u):
                    seen.add(u)
                    (out.append if u in after else todo.append)(u)
        return out

    def above(v: str) -> list[str]:
        """The dropped values whose making again needs v (through values gone by then)."""
        out, todo, seen = [], [v], {v}
        while todo:
            for n_id in consumers.get(todo.pop(), ()):
                for w in nodes[n_id].outputs:
                    if w not in seen and gone(w):
                        seen.add(w)
                        (out.append if w in after else todo.append)(w)
        return out

    kept = []
    for c in ranked:
        if any(after[u] > c.after + slack for u in below(c.value)):
            continue
        if any(c.after > after[w] + slack for w in above(c.value)):
            continue
        after[c.value] = c.after
        kept.append(c)
    return kept


_LAST: dict[int, tuple[Graph, list[str], dict[str, int]]] = {}


def last_uses(graph: Graph, order: list[str]) -> dict[str, int]:
    """Each value's last reading position in `order` (the last order's kept)."""
    hit = _LAST.get(id(graph))
    if hit is not None and hit[0] is graph and hit[1] == order:
        return hit[2]
    nodes = graph.node_map
    last = {v: k for k, n_id in enumerate(order) for v in nodes[n_id].inputs}
    _LAST.clear()
    _LAST[id(graph)] = (graph, order, last)
    return last


def sequence(graph: Graph, order: list[str], dropped: dict[str, Candidate]) -> list[str]:
    """The baseline order with each dropped value's producer run again before its first use after
    its gap; an input of a producer run again that is no longer live (dropped, or past its last
    use in the baseline order) is made again first, recursively, unless its own producer may not
    run twice (a random draw's saved generator state): that value stays live until the run
    again reads it."""
    nodes = graph.node_map
    producer = graph.producer
    last = last_uses(graph, order)
    made: dict[str, int] = {}  # value -> position where it was last made again
    seq: list[str] = []

    def gone(u: str, k: int) -> bool:
        if u not in producer or made.get(u, -1) >= 0 or not nodes[producer[u]].recomputable:
            return False
        c = dropped.get(u)
        return k > c.before if c is not None else k > last.get(u, -1)

    def make(v: str, k: int) -> None:
        p = nodes[producer[v]]
        for u in p.inputs:
            if gone(u, k):
                make(u, k)
        seq.append(p.id)
        for w in p.outputs:
            made[w] = k

    for k, n_id in enumerate(order):
        for u in nodes[n_id].inputs:
            if gone(u, k):
                make(u, k)
        seq.append(n_id)
    return seq


@dataclass
class Arrays:
    """The graph as lists indexed by node and value number, for `measure`'s loops."""

    index: dict[str, int]  # node id -> number
    ins: list[list[int]]  # each node's inputs that are not resident
    outs: list[list[int]]
    out_size: list[int]
    work: list[int]
    cost: list[float]
    size: list[int]  # each value's bytes
    kept: list[bool]  # graph outputs: live at the end


_ARRAYS: dict[int, tuple[Graph, Arrays]] = {}


def arrays(graph: Graph) -> Arrays:
    """`graph`'s Arrays (the last graph's kept)."""
    hit = _ARRAYS.get(id(graph))
    if hit is not None and hit[0] is graph:
        return hit[1]
    vid = {v.id: k for k, v in enumerate(graph.values)}
    resident = {v.id for v in graph.values if v.resident}
    outputs = set(graph.outputs)
    a = Arrays(
        index={n.id: k for k, n in enumerate(graph.nodes)},
        ins=[[vid[v] for v in n.inputs if v not in resident] for n in graph.nodes],
        outs=[[vid[v] for v in n.outputs] for n in graph.nodes],
        out_size=[sum(graph.value_map[v].size for v in n.outputs) for n in graph.nodes],
        work=[n.workspace for n in graph.nodes],
        cost=[n.cost for n in graph.nodes],
        size=[v.size for v in graph.values],
        kept=[v.id in outputs for v in graph.values],
    )
    _ARRAYS.clear()
    _ARRAYS[id(graph)] = (graph, a)
    return a


def freed_after(a: Arrays, nums: list[int]) -> list[int]:
    """Bytes freed right after each step of the compute sequence `nums` (indices into `a`): a
    value is freed after its last read before its producer runs again, or after its last read
    (or its making) for good unless it is kept (a graph output)."""
    last = [-1] * len(a.size)
    free_at = [0] * len(nums)
    for k, i in enumerate(nums):
        for v in a.ins[i]:
            last[v] = k
        for v in a.outs[i]:
            if last[v] >= 0:
                free_at[last[v]] += a.size[v]
            last[v] = k
    for v, k in enumerate(last):
        if k >= 0 and not a.kept[v]:
            free_at[k] += a.size[v]
    return free_at


def measure(graph: Graph, seq: list[str]) -> tuple[int, float, int]:
    """Peak, cost and the position of the peak of `seq` run as `steps_from_sequence` runs it
    (each value freed after its last use before its producer runs again), without its steps."""
    a = arrays(graph)
    nums = [a.index[n] for n in seq]
    free_at = freed_after(a, nums)
    mem = graph.resident_bytes
    peak, at, cost = mem, 0, 0.0
    for k, i in enumerate(nums):
        top = mem + a.out_size[i] + a.work[i]
        if top > peak:
            peak, at = top, k
        mem += a.out_size[i] - free_at[k]
        cost += a.cost[i]
    return peak, cost, at


@dataclass
class Tried:
    dropped: list[Candidate]
    peak: float  # bytes; inf: the sequence is not a valid schedule
    cost: float
    seq: list[str]


def attempt(graph: Graph, order: list[str], dropped: list[Candidate]) -> Tried:
    """`dropped` applied to `order`; a sequence that runs an operator that must not run twice
    a second time (a chain of remakes reaching it) fits no budget."""
    seq = sequence(graph, order, {c.value: c for c in dropped})
    peak, cost, _ = measure(graph, seq)
    nodes = graph.node_map
    if len(seq) != len(order) and any(
        count > 1 and not nodes[n].recomputable for n, count in Counter(seq).items()
    ):
        peak = math.inf
    return Tried(dropped, peak, cost, seq)


def fits_first(graph: Graph, order: list[str], ranked: list[Candidate], budget: int) -> tuple[Tried, bool]:
    """The shortest prefix of `ranked` (by bisection) whose schedule fits `budget`, and True; or
    the whole of it and False when that does not fit."""
    whole = attempt(graph, order, ranked)
    if whole.peak > budget:
        return whole, False
    lo, hi, best = 0, len(ranked), whole  # the prefix of hi fits, that of lo is not known to
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t = attempt(graph, order, ranked[:mid])
        if t.peak <= budget:
            hi, best = mid, t
        else:
            lo = mid
    return best, True


def classes(graph: Graph, cands: list[Candidate]) -> dict[tuple, list[Candidate]]:
    """`cands` by class: the same producer op, value size, producer cost and output count (on a
    stack of identical blocks, one class per position in the block)."""
    nodes = graph.node_map
    out: dict[tuple, list[Candidate]] = defaultdict(list)
    for c in cands:
        n = nodes[c.producer]
        out[(n.op, graph.value_map[c.value].size, n.cost, len(n.outputs))].append(c)
    return out


def refine(
    graph: Graph, order: list[str], ranked: list[Candidate], budget: int, best: Tried, until: float
) -> Tried:
    """Local search over whole classes while the clock is before `until`: keep a dropped class
    again, the costliest first, where the schedule still fits; then swap a dropped class for one
    not dropped (the next SWAP_IN in the ranking) where that is cheaper and fits."""
    by = classes(graph, ranked)
    cost = {k: sum(graph.node_map[c.producer].cost for c in v) for k, v in by.items()}
    dropped = {c.value for c in best.dropped}

    def trial(keys_out: set, keys_in: set) -> Tried:
        out = {c.value for k in keys_out for c in by[k]}
        inn = {c.value for k in keys_in for c in by[k]}
        return attempt(graph, order, [c for c in ranked if (c.value in dropped - out) or c.value in inn])

    def keys_dropped() -> list[tuple]:
        return sorted((k for k in by if any(c.value in dropped for c in by[k])), key=lambda k: -cost[k])

    for key in keys_dropped():
        if time.monotonic() > until:
            return best
        t = trial({key}, set())
        if t.peak <= budget and t.cost < best.cost:
            best, dropped = t, {c.value for c in t.dropped}
    outside = [k for k in dict.fromkeys(by_key(graph, ranked)) if not any(c.value in dropped for c in by[k])]
    for key in keys_dropped()[:SWAP_OUT]:
        for new in outside[:SWAP_IN]:
            if time.monotonic() > until:
                return best
            if cost[new] >= cost[key]:
                continue
            t = trial({key}, {new})
            if t.peak <= budget and t.cost < best.cost:
                best, dropped = t, {c.value for c in t.dropped}
                break
    return best


def by_key(graph: Graph, ranked: list[Candidate]) -> list[tuple]:
    """The classes of `ranked` in the order of their first member."""
    nodes = graph.node_map
    return [
        (
            nodes[c.producer].op,
            graph.value_map[c.value].size,
            nodes[c.producer].cost,
            len(nodes[c.producer].outputs),
        )
        for c in ranked
    ]


class Ratio(Solver):
    name = "ratio"
    method = "drop values by bytes per recompute cost, shortest fitting prefix by bisection"
    paper = "Jain et al., Checkmate (MLSys'20) §5 rounding; Chen et al. 2016 (segments)"
    exact = False
    params = (Param("refine", bool, True, "keep classes of dropped values again while the schedule fits"),)

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        order = list(graph.needed_order)
        base_peak, _, peak_at = measure(graph, order)
        if base_peak <= budget:
            return SolverResult(steps=baseline_steps(graph), status="feasible", message="baseline fits")
        ranked = candidates(graph, order, peak_at)
        left = options.remaining()
        until = time.monotonic() + (left if left is not None else 60.0)
        best: Tried | None = None
        lowest: Tried | None = None
        fitted = 0
        for slack in SLACKS:
            if fitted == FITS or (time.monotonic() > until and (best is not None or lowest is not None)):
                break
            ranks = chained(graph, ranked, slack, peak_at)
            t, fits = fits_first(graph, order, ranks, budget)
            fitted += fits
            if not fits:
                lowest = t if lowest is None or t.peak < lowest.peak else lowest
            elif best is None or t.cost < best.cost:
                best = t
                options.incumbent(steps_from_sequence(graph, best.seq))
                options.progress(incumbent=best.cost, slack=slack)
        if best is None:
            usable = lowest is not None and not math.isinf(lowest.peak)
            t = lowest if usable else Tried([], base_peak, 0.0, order)
            return SolverResult(steps=steps_from_sequence(graph, t.seq), status="infeasible",
                                best_peak=t.peak, message="no prefix of the ranking fits")  # fmt: skip
        if options.params.get("refine", True):
            best = refine(graph, order, ranked, budget, best, until)
        steps = steps_from_sequence(graph, best.seq)
        return SolverResult(steps=steps, status="feasible", objective=best.cost)
