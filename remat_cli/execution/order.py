"""The model's own order, as far as a schedule's peak allows.

The simulator costs an operator the same wherever it runs, but a runtime does not: a kernel
reading tensors made long before, or interleaved with another branch's, runs slower than in the
order the model was written in, where each tensor is read soon after it is made. A solver that
only lowers the peak (where no schedule reaches the budget, the lowest peak is all it is asked
for) leaves an order as good as any other to it, often far from the model's. :func:`restore_order`
brings it back: adjacent operators that run out of the model's order and do not depend on each
other are swapped, as long as neither instant then rises above the peak; a bubble sort whose
every swap keeps the peak, computed on the two instants it changes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from remat_cli.graph import Graph
from remat_cli.schedule import Step, steps_from_sequence
from remat_cli.solvers.fastsa.repair import Ops, SeqMemory


def restore_order(graph: Graph, steps: Sequence[Step], deadline: float | None = None) -> list[Step]:
    """`steps` with the same computations and a peak no higher, its operators swapped towards
    the graph's node order (module docstring); `steps` as they are where an operator runs twice
    (a recomputation ties its order to what it makes again). Ends at `deadline`
    (time.monotonic()) with the swaps made so far."""
    seq = [s.node for s in steps if s.op == "compute" and s.node is not None]
    if graph.devices or len(set(seq)) != len(seq):
        return list(steps)
    ops = Ops(graph)
    state = SeqMemory(ops, seq)
    mem, peak = state.mem.copy(), int(state.mem.max())
    made = {v: spans[0][0] for v, spans in state.lives.items()}
    last = {v: spans[0][1] for v, spans in state.lives.items()}
    rank = {n.id: k for k, n in enumerate(graph.nodes)}
    swapped = True
    while swapped:
        swapped = False
        for i in range(len(seq) - 1):
            a, b = seq[i], seq[i + 1]
            if rank[a] < rank[b] or set(ops.outs[a]) & set(ops.ins[b]):
                continue
            moves = swap_moves(ops, a, b, i, made, last)
            d_i, d_next = swap_delta(ops, a, b, i, moves, made, last)
            if mem[i] + d_i > peak or mem[i + 1] + d_next > peak:
                continue
            mem[i] += d_i
            mem[i + 1] += d_next
            for v, (p, q) in moves.items():
                made[v], last[v] = p, q
            seq[i], seq[i + 1] = b, a
            swapped = True
        if deadline is not None and time.monotonic() >= deadline:
            break
    return steps_from_sequence(graph, seq)


def swap_moves(
    ops: Ops, a: str, b: str, i: int, made: dict[str, int], last: dict[str, int]
) -> dict[str, tuple[int, int]]:
    """value -> its (production, last instant live) once `a` at `i` and `b` at `i + 1` trade
    places, for every value that changes: what they make moves with them (an output nothing reads
    is live only at its making), an input whose last reader moves later or earlier follows it."""
    keep = ops.outputs
    moves: dict[str, tuple[int, int]] = {}
    for v in ops.outs[a]:
        moves[v] = (i + 1, i + 1 if last[v] == i and v not in keep else last[v])
    for v in ops.outs[b]:
        moves[v] = (i, i if last[v] == i + 1 and v not in keep else last[v])
    both = set(ops.ins[a]) & set(ops.ins[b])
    for v in ops.ins[a]:
        if last[v] == i and v not in both:
            moves[v] = (made[v], i + 1)
    for v in ops.ins[b]:
        if last[v] == i + 1 and v not in both and v not in keep:
            moves[v] = (made[v], i)
    return moves


def swap_delta(
    ops: Ops,
    a: str,
    b: str,
    i: int,
    moves: dict[str, tuple[int, int]],
    made: dict[str, int],
    last: dict[str, int],
) -> tuple[int, int]:
    """The change of the memory at instants `i` and `i + 1` when `moves` are made, the two
    operators' workspaces trading instants too."""
    d = [ops.work[b] - ops.work[a], ops.work[a] - ops.work[b]]
    for v, (p, q) in moves.items():
        for k in (0, 1):
            at = i + k
            d[k] += ops.size[v] * (int(p <= at <= q) - int(made[v] <= at <= last[v]))
    return d[0], d[1]
