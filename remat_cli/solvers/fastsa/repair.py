"""Peak repair: a schedule above the budget brought under it by moves made at its peak.

A deviation from Imanishi et al. (NeurIPS'23), whose annealing (§2.2) adds, removes or moves one
node at a time. On bert_b8 at 60% (a PyTorch export of a 3-layer encoder, held out) every round
of fastsa, and every other solver here, ended 0.55 MB above the budget (25.71 MB of 25.16 MB,
60 to 300 s). Two moves no single mutation makes bring it under:

- **evict**: a value live across the peak that the peak does not read (an attention layer's
  scaled Q, K and V kept for its backward) is dropped there and made again, with every input
  it needs that is not live then, just before its next use. Each value alone lowers the
  peak by a fraction of what the three together do, so the annealing sees a plateau of higher
  cost.
- **defer**: an operator that makes only graph outputs (a weight gradient) moves after the peak,
  to where the memory is lowest: it then holds its gradient input (0.29 MB) instead of its
  output (0.59 MB) across the peak, and its activation input is made again where it runs.

Each step tries every evict of a value live at the compute instant most above the budget, and
every defer of an output operator run before it to the few lowest-memory positions after it (its
inputs kept, or the largest made again); of the moves that lower the memory above the budget
(summed over the compute instants), the one that lowers it most per unit of added cost is made.
Where none at that instant helps, the next highest instants are tried. It ends when the
schedule fits, or when no move helps. On bert_b8 at 60% (fastsa's 60 s schedule) it takes 7
moves, about 1 s, to a schedule within budget at 42.6%; the rounds after it, hinted with that,
end at 23.9% (the free-order bound: 10.2%). A hand-made sequence of the same moves came first.

Moves are scored on the operator sequence with the memory of
:func:`remat_cli.schedule.steps_from_sequence` (each value freed after its last use), computed
with numpy; only the result goes through the simulator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import Step, simulate, steps_from_sequence

#: most moves made
MOVES = 60
#: most operators one move may add (a recomputation chain)
CHAIN = 200
#: lowest-memory positions after the peak tried for a deferred operator (besides the end)
SPOTS = 3
#: instants above the budget tried, highest first, until one has a move that helps
INSTANTS = 4
#: a move's added cost is counted at least this share of the schedule's
COST_EPS = 1e-4


class Ops:
    """The graph's operators as plain lookups (scoring thousands of sequences reads them often)."""

    def __init__(self, graph: Graph) -> None:
        values = graph.value_map
        self.graph = graph
        self.ins = {n.id: tuple(v for v in n.inputs if not values[v].resident) for n in graph.nodes}
        self.outs = {n.id: tuple(n.outputs) for n in graph.nodes}
        self.work = {n.id: n.workspace for n in graph.nodes}
        self.cost = {n.id: n.cost for n in graph.nodes}
        self.size = {v.id: v.size for v in graph.values}
        self.outputs = frozenset(graph.outputs)


class SeqMemory:
    """Memory at each compute instant of an operator sequence, as steps_from_sequence frees."""

    def __init__(self, ops: Ops, seq: list[str]) -> None:
        self.ops, self.seq = ops, seq
        n = len(seq)
        #: value -> [production index, last index live] of each production
        self.lives: dict[str, list[list[int]]] = {}
        lives = self.lives
        for k, node in enumerate(seq):
            for v in ops.ins[node]:
                lives[v][-1][1] = k
            for v in ops.outs[node]:
                lives.setdefault(v, []).append([k, k])
        starts, ends, sizes = [], [], []
        for v, spans in lives.items():
            if v in ops.outputs:
                spans[-1][1] = n - 1
            for a, b in spans:
                starts.append(a)
                ends.append(b + 1)
                sizes.append(ops.size[v])
        # bytes made at each index less bytes freed after the one before (exact in float64 below 2**53)
        diff = np.bincount(starts, sizes, n + 1) - np.bincount(ends, sizes, n + 1)
        work = np.fromiter((ops.work[node] for node in seq), dtype=np.int64, count=n)
        self.mem = ops.graph.resident_bytes + np.rint(np.cumsum(diff[:n])).astype(np.int64) + work
        self.cost = sum(ops.cost[node] for node in seq)

    def over(self, budget: int) -> int:
        return int(np.maximum(self.mem - budget, 0).sum())

    def live_at(self, v: str, i: int) -> bool:
        """Whether `v` is live when seq[i] runs (made before, read at i or after)."""
        return any(a < i <= b for a, b in self.lives.get(v, ()))

    def remake(self, values: Sequence[str], at: int) -> list[str] | None:
        """The operators, in order, that make `values` again just before seq[at], each input
        that is not live then made again too (None past CHAIN operators, or when one of them
        may not run twice)."""
        g = self.ops.graph
        chain: list[str] = []
        seen: set[str] = set()

        def need(v: str) -> bool:
            node = g.producer[v]
            if node in seen:
                return True
            if not g.node_map[node].recomputable:
                return False
            seen.add(node)
            for u in self.ops.ins[node]:
                if not (self.live_at(u, at) or need(u)):
                    return False
            chain.append(node)  # after its inputs' producers: a topological order
            return len(chain) <= CHAIN

        return chain if all(need(v) for v in values) else None


def _moves(state: SeqMemory, p: int) -> list[list[str]]:
    """The sequences one evict or defer at compute instant `p` gives."""
    g, seq = state.ops.graph, state.seq
    nodes, values, outputs = g.node_map, g.value_map, set(g.outputs)
    at_peak = set(nodes[seq[p]].inputs) | set(nodes[seq[p]].outputs)
    found: list[list[str]] = []
    for v in sorted(state.lives):
        if v in outputs or v in at_peak or not state.live_at(v, p):
            continue
        nxt = next((k for k in range(p + 1, len(seq)) if v in nodes[seq[k]].inputs), None)
        chain = None if nxt is None else state.remake([v], nxt)
        if chain:
            found.append(seq[:nxt] + chain + seq[nxt:])
    after = np.argsort(state.mem[p + 1 :], kind="stable")[:SPOTS] + p + 1
    spots = sorted({*after.tolist(), len(seq)})
    later = set(seq[p:])
    for node in dict.fromkeys(seq[:p]):
        outs = nodes[node].outputs
        only_outputs = all(v in outputs and not values[v].resident and not g.consumers[v] for v in outs)
        if not only_outputs or node in later:
            continue
        rest = [m for m in seq if m != node]
        shift = len(seq) - len(rest)  # its runs, all before the peak and so before every spot
        inputs = sorted(state.ops.ins[node], key=lambda u: -values[u].size)
        for q in spots:
            at = q - shift
            for remade in ([], inputs[:1]):
                chain = state.remake(remade, q) if remade else []
                if chain is not None:
                    found.append(rest[:at] + chain + [node] + rest[at:])
    return found


def repair(
    graph: Graph, steps: Sequence[Step], budget: int, deadline: float | None = None
) -> list[Step] | None:
    """A schedule within `budget` made from `steps` by evict and defer moves (module docstring),
    or None when the moves stop helping first. `deadline` (time.monotonic()) cuts it short."""
    if graph.devices:  # one memory only: the sequence's memory model has no copies
        return None
    seq = [s.node for s in steps if s.op == "compute" and s.node is not None]
    ops = Ops(graph)
    state = SeqMemory(ops, seq)
    for _ in range(MOVES):
        over = state.over(budget)
        if over == 0:
            break
        if deadline is not None and time.monotonic() > deadline:
            return None
        best, key = None, 0.0
        floor = COST_EPS * state.cost or 1.0  # a graph whose operators cost nothing
        for p in np.argsort(-state.mem, kind="stable")[:INSTANTS]:
            if state.mem[p] <= budget or best is not None:
                break
            for cand in _moves(state, int(p)):
                if deadline is not None and time.monotonic() > deadline:
                    return None
                s = SeqMemory(ops, cand)
                gain = over - s.over(budget)
                k = gain / (max(s.cost - state.cost, 0.0) + floor) if gain > 0 else 0.0
                if k > key:
                    best, key = s, k
        if best is None:
            return None
        state = best
    if state.over(budget) > 0:
        return None
    out = steps_from_sequence(graph, state.seq)
    return out if simulate(graph, out).peak_memory <= budget else None
