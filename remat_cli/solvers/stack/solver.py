"""stack: a layer solved once, its patterns laid over the stack by dynamic programming.

A deep model is a stack of L copies of one block (a decoder layer). Its training graph's peak
comes in the backward pass: while block l's backward runs, what blocks 0..l-1 kept through the
forward pass is live, and block l's own working set (its saved values, kept or made again, and
the gradients in flight) on top. So the schedule is decided per block:

1. One block's keep patterns (:mod:`.pattern`): the Pareto front of the bytes a block keeps
   through the forward pass against the cost of making the rest again in its backward, each
   point proven by a small integer program.
2. Each pattern p is laid over the whole stack once and measured: for every block l, the peak
   of l's backward part, less the l·K(p) bytes the blocks below keep, is W_l(p), the block's
   working set with pattern p at depth l (it includes the parameter gradients of the blocks
   above, which grow down the stack).
3. A dynamic program over the blocks, bottom to top, picks one pattern per block: with P_l the
   bytes kept by the blocks below l, it needs P_l + W_l(p_l) <= budget for every l and
   P_L + H <= budget (H: the forward's end and the head's backward, from the same
   measurements), and minimises the sum of the patterns' costs. Blocks are not forced alike:
   the lower ones, under a smaller P_l, can keep more (the constraint is the one Chen et al.'s
   segment checkpointing, 2016 §4.2, balances per segment; HiREmate, Gusak et al., §4, solves
   its hierarchy the same way, one subgraph's options combined over the whole graph).
4. The chosen patterns become one compute sequence (the baseline order, each dropped value's
   producer run again right before its first backward use, its missing inputs first — the
   sequence of :mod:`remat_cli.solvers.ratio`), measured exactly; when the estimate was short
   the budget of the program is lowered by the excess and it runs again.

The front is found on one block and the program is linear in the depth, so a 96-layer stack
costs little more than a 12-layer one, and the overhead does not grow with depth.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import baseline_steps, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.blocks.structure import NoBlocks, Passes, blocks_of
from remat_cli.solvers.ratio import Candidate, arrays, freed_after, measure, sequence
from remat_cli.solvers.stack.pattern import Point, front, saved_values, value_keys

#: the dynamic program's memory grid: the budget in this many steps
GRID = 4000
#: the second search adds every FIRST_EVERY-th pattern of the front to its two ends: measuring a
#: pattern costs a pass over the whole stack, so the early schedules come at a fraction of the cost
FIRST_EVERY = 3
#: times the program is run again with its budget moved, by bisection, between one whose
#: schedule measured over the budget and one whose schedule fits
RETRIES = 8


@dataclass
class Stack:
    """The blocks of a graph and, per block, its saved values as dropping candidates by key."""

    graph: Graph
    order: list[str]
    blocks: list[list[str]]
    cands: list[dict[tuple, Candidate]]
    front: list[Point]
    block_of: dict[str, int]  # forward node -> its block
    forward: set[str]

    @classmethod
    def of(cls, graph: Graph, until: float | None = None) -> Stack:
        """The blocks of `graph` and the front of its middle block (found until `until`,
        time.monotonic(), at most)."""
        passes = Passes.of(graph)
        _, blocks = blocks_of(graph, passes.forward)
        fw, rest = set(passes.forward), set(passes.rest)
        order = list(graph.needed_order)
        pos = {n: i for i, n in enumerate(order)}
        cands = []
        for block in blocks:
            keys = value_keys(graph, block, _prefix(graph, block))
            out = {}
            for v in saved_values(graph, block, fw, rest):
                uses = [pos[c] for c in graph.consumers.get(v, ())]
                before = max([u for u in uses if order[u] in fw] + [pos[graph.producer[v]]])
                after = min(u for u in uses if order[u] in rest)
                out[keys[v]] = Candidate(v, graph.producer[v], before, after, 0.0)
            cands.append(out)
        middle = blocks[len(blocks) // 2]
        fw_saved = saved_values(graph, middle, fw, rest)
        pts = front(graph, middle, fw_saved, value_keys(graph, middle, _prefix(graph, middle)), until)
        block_of = {n: k for k, b in enumerate(blocks) for n in b}
        return cls(graph, order, blocks, cands, pts, block_of, fw)

    def seq(self, assign: list[Point | None]) -> list[str]:
        """The compute sequence with block k dropping what `assign[k]` drops (None: nothing)."""
        dropped: dict[str, Candidate] = {}
        for k, p in enumerate(assign):
            if p is None:
                continue
            for key in p.dropped:
                c = self.cands[k].get(key)
                if c is not None:
                    dropped[c.value] = c
        return sequence(self.graph, self.order, dropped)


def _prefix(graph: Graph, block: list[str]) -> str:
    """The module path of `block` with its index ("blocks.7."), from its nodes' scopes."""
    scopes = [graph.node_map[n].scope or "" for n in block]
    parts = min((s.split(".") for s in scopes if s), key=len, default=[])
    for k, p in enumerate(parts):
        if p.isdigit():
            return ".".join(parts[: k + 1]) + "."
    return ""


def profile(st: Stack, seq: list[str]) -> np.ndarray:
    """The peak of each part of `seq`: index l < L while block l's backward runs (from the first
    node that makes one of its saved values again or reads one, to
    the next block's), index L the forward pass and the head's backward before that."""
    graph = st.graph
    a = arrays(graph)
    nums = [a.index[n] for n in seq]
    free_at = freed_after(a, nums)
    L = len(st.blocks)
    region = np.zeros(L + 1, dtype=np.int64)
    mem, now = graph.resident_bytes, L
    seen: set[str] = set()
    nm = graph.node_map
    saved_in = {c.value: k for k, cs in enumerate(st.cands) for c in cs.values()}
    for k, n in enumerate(seq):
        if n in st.forward:
            if n in seen:
                for v in nm[n].outputs:
                    now = min(now, saved_in.get(v, now))
            seen.add(n)
        else:
            for v in nm[n].inputs:
                b = saved_in.get(v)
                if b is not None and b < now:
                    now = b
        i = nums[k]
        top = mem + a.out_size[i] + a.work[i]
        if top > region[now]:
            region[now] = top
        mem += a.out_size[i] - free_at[k]
    return region


@dataclass
class Measured:
    """Pattern p laid over every block: each block's working set W_l(p) = the peak of its
    backward part less the bytes the blocks below keep, and H(p), the same for the forward end."""

    point: Point
    kept: int  # the bytes a block keeps with it, measured (`kept_bytes`)
    work: np.ndarray  # W_l, l < L
    head: int  # H


def measured(st: Stack, p: Point) -> Measured:
    L = len(st.blocks)
    seq = st.seq([p] * L)
    region = profile(st, seq)
    kept = kept_bytes(st, seq, L // 2)
    below = np.arange(L, dtype=np.int64) * kept
    return Measured(p, kept, region[:L] - below, int(region[L]) - L * kept)


def kept_bytes(st: Stack, seq: list[str], block: int) -> int:
    """The bytes of `block`'s values live when the forward pass of `seq` ends: what the block
    keeps, the values the pattern keeps and those it has to (the block's output, values read
    by other blocks)."""
    graph = st.graph
    nm = graph.node_map
    end = next(k for k, n in enumerate(seq) if n not in st.forward)
    mine = {v for n in st.blocks[block] for v in nm[n].outputs}
    live: set[str] = set()  # read after the end before they are made again
    remade: set[str] = set()
    for n in seq[end:]:
        live.update(v for v in nm[n].inputs if v in mine and v not in remade)
        remade.update(nm[n].outputs)
    return sum(graph.value_map[v].size for v in live)


def program(ms: list[Measured], budget: int, L: int) -> list[int] | None:
    """The pattern (index in `ms`) of each block, cheapest in all, with P_l + W_l(p_l) <= budget
    for every block l (P_l: the bytes kept by the blocks below) and P_L + H(p_top) <= budget;
    None when no choice fits. Bytes on a grid of budget/GRID, rounded up."""
    if budget <= 0:  # a search that lowered its budget by more than the whole of it
        return None
    unit = max(1, budget // GRID)
    top = budget // unit
    kq = [-(-m.kept // unit) for m in ms]
    cost = np.array([m.point.cost for m in ms])
    dp = np.full(top + 1, np.inf)
    dp[0] = 0.0
    choice = np.zeros((L, top + 1), dtype=np.int32)
    for layer in range(L):
        new = np.full(top + 1, np.inf)
        for j, m in enumerate(ms):
            room = top - int(-(-int(m.work[layer]) // unit))
            if layer == L - 1:
                room = min(room, top - kq[j] - int(-(-m.head // unit)))
            room = min(room, top - kq[j])
            if room < 0:
                continue
            cand = dp[: room + 1] + cost[j]
            seg = new[kq[j] : kq[j] + room + 1]
            better = cand < seg
            seg[better] = cand[better]
            choice[layer, kq[j] : kq[j] + room + 1][better] = j
        dp = new
    if not np.isfinite(dp).any():
        return None
    at = int(np.argmin(dp))
    picks = []
    for layer in range(L - 1, -1, -1):
        j = int(choice[layer, at])
        picks.append(j)
        at -= kq[j]
    return picks[::-1]


@dataclass
class Found:
    """A schedule of the program: the compute sequence, its peak and cost as measured."""

    seq: list[str]
    peak: int
    cost: float


def search(
    st: Stack,
    ms: list[Measured],
    budget: int,
    retries: int,
    until: float,
    found: Searched,
    report: Callable[[Found], None],
) -> None:
    """The program's cheapest schedule that fits `budget` into `found` (each one cheaper than
    the best so far handed to `report` at once), and the lowest-peak one it measured. The
    program's own budget starts at `budget`; after a schedule over it, the next run's is
    lowered by the excess (or bisected, once one fitted), after one within it raised halfway to
    the last that did not fit."""
    graph, L = st.graph, len(st.blocks)
    hi, lo = budget, None  # the program's budgets known too high (over) / that fit
    b = budget
    for _ in range(retries + 1):
        picks = program(ms, b, L)
        if picks is None:
            lo = lo if lo is not None else b
            hi = b
        else:
            seq = st.seq([ms[j].point for j in picks])
            peak, cost, _ = measure(graph, seq)
            f = Found(seq, peak, cost)
            if found.lowest is None or peak < found.lowest.peak:
                found.lowest = f
            if peak <= budget:
                if found.best is None or cost < found.best.cost:
                    found.best = f
                    report(f)
                lo = b
            else:
                hi = b
        if lo is None:
            b = b - (peak - budget) if picks is not None else b // 2
        elif hi - lo <= max(1, budget // GRID):
            break
        else:
            b = (lo + hi) // 2
        if time.monotonic() > until:
            break


@dataclass
class Searched:
    """What the searches found so far: the cheapest schedule within the budget, the lowest peak."""

    best: Found | None = None
    lowest: Found | None = None


def batches(n: int) -> list[list[int]]:
    """The front's points (indices, most bytes kept first) in the order they are measured, the
    program searched again after each batch: first the two ends (keep everything, keep the
    fewest bytes: some mix of the two fits whatever fits at all), for a schedule at once; then
    every FIRST_EVERY-th; then the others."""
    ends = sorted({0, n - 1})
    every = [i for i in range(0, n, FIRST_EVERY) if i not in ends]
    rest = [i for i in range(n) if i not in ends and i not in every]
    return [b for b in (ends, every, rest) if b]


class StackSolver(Solver):
    """One block's patterns over the stack (module docstring). solve(): "feasible" with the
    cheapest schedule found within the budget, else "infeasible" with the lowest peak found."""

    name = "stack"
    method = "one block's keep patterns (Pareto front by ILP), combined over the stack by dynamic programming"
    paper = (
        "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016, §4.2 (segments within a budget); "
        "Gusak et al., HiREmate, §4 (one subgraph's options combined over the graph)"
    )
    exact = False
    params = (Param("retries", int, RETRIES, "program reruns, bisecting its budget", low=0, high=50),)

    def supports(self, graph: Graph) -> str | None:
        why = super().supports(graph)
        if why is not None:
            return why
        try:
            _, blocks = blocks_of(graph, Passes.of(graph).forward)
        except NoBlocks as e:
            return str(e)
        if len(blocks) < 2:
            return "its module scopes hold fewer than two repeated blocks"
        return None

    def notes(self) -> str:
        return "needs module scopes (Node.scope, written by remat export-torch) with repeated blocks"

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        base_peak, _, _ = measure(graph, list(graph.needed_order))
        if base_peak <= budget:
            return SolverResult(steps=baseline_steps(graph), status="feasible", message="baseline fits")
        left = options.remaining()
        until = time.monotonic() + (left if left is not None else 60.0)
        st = Stack.of(graph, until)
        retries = int(options.params["retries"])
        found = Searched()

        def report(f: Found) -> None:  # the watchdog's answer should the time run out
            options.incumbent(steps_from_sequence(graph, f.seq))
            options.progress(incumbent=f.cost)

        ms: list[Measured] = []
        for batch in batches(len(st.front)):
            if ms and time.monotonic() > until:
                break
            ms.extend(measured(st, st.front[i]) for i in batch)
            search(st, ms, budget, retries, until, found, report)
        how = f"{len(st.blocks)} blocks, {len(ms)} patterns of one block"
        best, lowest = found.best, found.lowest
        if best is None:
            seq = lowest.seq if lowest is not None else list(graph.needed_order)
            peak = lowest.peak if lowest is not None else base_peak
            return SolverResult(steps=steps_from_sequence(graph, seq), status="infeasible", best_peak=peak,
                                message=f"no combination of patterns fits ({how})")  # fmt: skip
        steps = steps_from_sequence(graph, best.seq)
        return SolverResult(steps=steps, status="feasible", objective=best.cost, message=how)
