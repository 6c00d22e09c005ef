"""chen-sqrtn and chen-greedy: Chen et al., "Training Deep Nets with Sublinear Memory Cost" (2016),
§4.1 (split the forward pass into segments, keep only the segment boundaries, recompute each
segment's forward during the backward pass) with Algorithm 2's two checkpoint rules:
- sqrt(n): keep every k-th candidate with k = sqrt(#candidates) (§4.3, O(sqrt n) memory);
- greedy: walk the forward pass accumulating the outputs' bytes and keep a candidate once the sum
  exceeds a threshold b (Algorithm 2, "memory-planning with budget"); b is swept and the cheapest
  schedule within the budget is kept.

Generalised to DAGs as Checkmate does for its Chen baselines (Jain et al., MLSys'20, §6; their
`strategy_chen.py`): the candidates are the articulation points of the forward graph — positions
of the forward order that no other forward value crosses, so a segment can be recomputed from the
checkpoint before it alone. When a graph has none (or no more than one), every forward node is a
candidate (Checkmate's "no articulation points" variant); a segment is then recomputed together
with whatever it reads across the boundary, on demand.

The forward pass is the needed nodes that are not `phase: backward` and do not depend on one; the
rest runs afterwards in `order`. A graph without backward nodes has no backward pass: its `order`
is treated as the forward pass, values of finished segments are dropped, and a value needed again
later is recomputed on demand (recursively) from what is still kept.

Each rule yields a compute sequence decoded by `steps_from_sequence` (frees at last use).
"""

from __future__ import annotations

import math

from remat_cli.graph import Graph
from remat_cli.schedule import SimResult, Step, simulate, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult, cheapest_fitting

#: chen-greedy skips a checkpoint set whose sequence computes more than this many times the nodes
MAX_GROWTH = 3


class _TooLong(Exception):
    """A sequence grew past its cap (on-demand recomputation thrashing); the rule is skipped."""


class Passes:
    """The forward pass, what runs after it, and the checkpoint candidates."""

    def __init__(self, graph: Graph):
        self.graph = graph
        program = graph.needed_order
        nm = graph.node_map
        producer = graph.producer
        backward = {n for n in program if nm[n].phase == "backward"}
        self.has_phases = bool(backward) and len(backward) < len(program)
        after = set(backward)
        for n in program:  # a node that reads a backward value belongs after the forward pass
            if n not in after and any(producer.get(v) in after for v in nm[n].inputs):
                after.add(n)
        self.forward = [n for n in program if n not in after]
        self.rest = [n for n in program if n in after]
        pos = {n: i for i, n in enumerate(self.forward)}
        # reach[i]: the last forward position reading an output of forward node i
        reach = list(range(len(self.forward)))
        for j, n in enumerate(self.forward):
            for v in nm[n].inputs:
                p = producer.get(v)
                if p in pos:
                    reach[pos[p]] = max(reach[pos[p]], j)
        # articulation points: forward position i is one when nothing produced before i is read
        # after i; the last forward node (the loss) bounds no segment and is left out
        self.articulation: list[str] = []
        crossing = -1
        for i, n in enumerate(self.forward[:-1]):
            if crossing <= i:
                self.articulation.append(n)
            crossing = max(crossing, reach[i])
        self.out_bytes = {n: sum(graph.value_map[v].size for v in nm[n].outputs) for n in self.forward}

    def candidates(self, use_articulation: bool) -> list[str]:
        if use_articulation and len(self.articulation) > 1:
            return self.articulation
        return self.forward[:-1]

    def sequence(self, checkpoints: set[str], cap: int | None = None) -> list[str]:
        """Run the forward pass keeping only the checkpoints' outputs past their segment, then
        the rest, recomputing a dropped segment (the part still needed) when first read."""
        g = self.graph
        nm = g.node_map
        producer = g.producer
        keep = {v for n in checkpoints for v in nm[n].outputs} | set(g.outputs)
        keep |= {v for n in self.forward if not nm[n].recomputable for v in nm[n].outputs}
        available = {v.id for v in g.values if v.resident}
        seq: list[str] = []
        made: list[str] = []  # values made since the last segment boundary

        def run(n: str) -> None:
            seq.append(n)
            if cap is not None and len(seq) > cap:
                raise _TooLong
            available.update(nm[n].outputs)
            made.extend(nm[n].outputs)

        def ensure(value: str) -> None:
            # recompute `value` from what is available, depth first (explicit stack)
            stack = [producer[value]]
            while stack:
                n = stack[-1]
                missing = [v for v in nm[n].inputs if v not in available]
                if missing:
                    stack.append(producer[missing[0]])
                    continue
                stack.pop()
                if not all(v in available for v in nm[n].outputs):
                    run(n)

        # the forward pass, segment by segment
        segment_of: dict[str, int] = {}
        segments: list[list[str]] = [[]]
        last_cut = max((i for i, n in enumerate(self.forward) if n in checkpoints), default=-1)
        for i, n in enumerate(self.forward):
            segment_of[n] = len(segments) - 1
            segments[-1].append(n)
            for v in nm[n].inputs:
                if v not in available:
                    ensure(v)
            run(n)
            if n in checkpoints:
                segments.append([])
                if i <= last_cut:
                    # Chen §4.1: only the boundary survives the segment; the final segment is
                    # kept, the backward pass starts with it
                    for v in made:
                        if v not in keep:
                            available.discard(v)
                    made.clear()
        made.clear()

        # the backward pass: a dropped segment is recomputed, as far as it is still needed,
        # right before the first node that reads it
        last_read: dict[str, int] = {}
        for j, n in enumerate(self.rest):
            for v in nm[n].inputs:
                last_read[v] = j
        for j, n in enumerate(self.rest):
            for v in nm[n].inputs:
                if v in available:
                    continue
                p = producer[v]
                if p in segment_of:
                    wanted = {
                        u
                        for u in (w for m in segments[segment_of[p]] for w in nm[m].outputs)
                        if last_read.get(u, -1) >= j and u not in available
                    }
                    todo: list[str] = []
                    for m in reversed(segments[segment_of[p]]):
                        if any(u in wanted for u in nm[m].outputs):
                            todo.append(m)
                            wanted.update(u for u in nm[m].inputs if u not in available and u in producer)
                    for m in reversed(todo):
                        for u in nm[m].inputs:
                            if u not in available:
                                ensure(u)
                        if not all(u in available for u in nm[m].outputs):
                            run(m)
                if v not in available:
                    ensure(v)
            run(n)
        return seq


def _evaluate(graph: Graph, seq: list[str]) -> tuple[list[Step], SimResult]:
    steps = steps_from_sequence(graph, seq)
    return steps, simulate(graph, steps)


_NOTES = (
    "graphs without backward nodes: `order` is treated as the forward pass (segments of the order, "
    "dropped values recomputed on demand when a later node reads them)"
)


class ChenSqrtN(Solver):
    """Every ⌊√n⌋-th articulation point of the forward pass is a checkpoint (Chen et al. §4.1).
    solve(): "feasible" when that schedule fits the budget, else "infeasible" with its steps
    and peak as `best_peak`."""

    name = "chen-sqrtn"
    method = "Chen sqrt(n) checkpointing at articulation points, segments recomputed in backward"
    paper = "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016 (DAG form as in Checkmate)"

    def notes(self) -> str:
        return _NOTES

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        passes = Passes(graph)
        cands = passes.candidates(use_articulation=True)
        k = max(1, int(math.sqrt(len(cands))))
        checkpoints = {n for i, n in enumerate(cands) if (i + 1) % k == 0}
        steps, sim = _evaluate(graph, passes.sequence(checkpoints))
        kind = "articulation points" if cands is passes.articulation else "all forward nodes"
        how = f"{len(checkpoints)} checkpoints, every {k}-th of {len(cands)} {kind}"
        if not passes.has_phases:
            how += "; no backward pass: order treated as the forward pass"
        return cheapest_fitting(budget, [(steps, sim, how)], options)


class ChenGreedy(Solver):
    """Chen et al.'s Algorithm 2 with the segment size b swept over a geometric grid.
    solve(): the cheapest schedule of the sweep within budget ("feasible"), else "infeasible"
    with the lowest-peak one's steps and peak as `best_peak`."""

    name = "chen-greedy"
    method = "Chen greedy checkpointing by segment memory b (b swept), segments recomputed in backward"
    paper = "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016 (DAG form as in Checkmate)"
    params = (Param("sweep", int, 40, "number of segment sizes b tried (geometric grid)", low=1, high=10000),)

    def notes(self) -> str:
        return _NOTES

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        passes = Passes(graph)
        total = max(1, sum(passes.out_bytes.values()))
        smallest = max(1, min((b for b in passes.out_bytes.values() if b > 0), default=1))
        count = max(2, options.params["sweep"])
        # b from one value's size to the whole forward pass, geometrically
        grid = sorted({int(smallest * (total / smallest) ** (i / (count - 1))) for i in range(count)})
        tried: list[tuple[list[Step], SimResult, str]] = []
        seen: set[frozenset[str]] = set()
        cap = MAX_GROWTH * (len(passes.forward) + len(passes.rest))
        for use_ap in (True, False):
            cands = set(passes.candidates(use_ap))
            if not use_ap and cands == set(passes.articulation):
                continue
            for b in grid:
                checkpoints: set[str] = set()
                acc = 0
                for n in passes.forward:  # Algorithm 2: checkpoint once the segment exceeds b
                    acc += passes.out_bytes[n]
                    if n in cands and acc > b:
                        checkpoints.add(n)
                        acc = 0
                key = frozenset(checkpoints)
                if key in seen:
                    continue
                seen.add(key)
                # a binding time limit makes the result depend on the clock; with one worker (the
                # deterministic mode) the sweep always runs to the end
                if tried and options.workers != 1 and options.remaining() == 0.0:
                    break
                try:
                    steps, sim = _evaluate(graph, passes.sequence(checkpoints, cap))
                except _TooLong:
                    continue
                kind = "articulation points" if use_ap and len(passes.articulation) > 1 else "any node"
                tried.append((steps, sim, f"b={b} bytes, {len(checkpoints)} checkpoints at {kind}"))
                if sim.peak_memory <= budget:
                    options.progress(incumbent=sim.cost)
        return cheapest_fitting(budget, tried, options)
