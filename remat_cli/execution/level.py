"""Levelling: a schedule's memory lowered where it comes near its peak, at no added cost.

A solver that minimises compute under a budget fills the budget: once the peak is under it,
nothing in its objective lowers the memory anywhere else, and fastsa's schedules of a training
step sit within a few percent of their peak over hundreds of steps. Such a plateau is what a placement cannot pack at its bound: each near-peak
instant holds a different set of buffers, and no single set of offsets packs them all tightly
(dynamic storage allocation, Garey & Johnson's SR2; MODeL, Steiner et al., ICML 2023, §4,
places and schedules jointly for this reason), while a schedule whose peak is a few isolated
instants places at or near its bound.

Most of a plateau is the order, not the recomputations: an operator run long before its first
consumer keeps its output live across instants that do not need it, and one run long after its
last input's other readers keeps that input live. Moving such an operator towards its
consumers (sinking) or towards its inputs (hoisting) changes no computation, so no cost, and
takes its bytes off the instants in between. :func:`level` makes such moves, one operator at a
time, at the instants most above a level, as long as one lowers the memory above the level
(summed over the compute instants) without raising the peak; the memory of a sequence is that of
:func:`remat_cli.schedule.steps_from_sequence` (each value freed after its last use).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import Step, steps_from_sequence
from remat_cli.solvers.fastsa.repair import Ops, SeqMemory

#: operators before and after an instant that are tried as moves across it
WINDOW = 40
#: instants above the level tried per pass, highest first
HOT = 200


def level(graph: Graph, steps: Sequence[Step], mark: int, deadline: float | None = None) -> list[Step]:
    """`steps` reordered so that less memory lies above `mark` (bytes, resident ones included),
    with the same computations and a peak no higher (module docstring). Ends when no move
    lowers it, or at `deadline` (time.monotonic()) with the moves made so far."""
    if graph.devices:  # one memory only: the sequence's memory model has no copies
        return list(steps)
    ops = Ops(graph)
    state = SeqMemory(ops, [s.node for s in steps if s.op == "compute" and s.node is not None])
    moved = True
    while moved:
        moved = False
        for p in np.argsort(-state.mem, kind="stable")[:HOT].tolist():
            if deadline is not None and time.monotonic() >= deadline:
                return steps_from_sequence(graph, state.seq)
            if p >= len(state.seq) or state.mem[p] <= mark:
                continue
            over, peak = state.over(mark), int(state.mem.max())
            for cand in moves_across(ops, state.seq, p):
                s = SeqMemory(ops, cand)
                if s.over(mark) < over and int(s.mem.max()) <= max(peak, mark):
                    state, moved = s, True
                    break
    return steps_from_sequence(graph, state.seq)


def moves_across(ops: Ops, seq: list[str], p: int) -> list[list[str]]:
    """The sequences one move of an operator across compute instant `p` gives: an operator in
    the WINDOW before `p` whose outputs nothing reads (nor makes again) until after `p`, moved
    just before the first that does; an operator in the WINDOW after `p` whose inputs are all
    made before `p`, moved just after the last of them made."""
    found: list[list[str]] = []
    n = len(seq)
    for i in range(max(0, p - WINDOW), p):
        outs = set(ops.outs[seq[i]])
        j = next((k for k in range(i + 1, n) if outs & {*ops.ins[seq[k]], *ops.outs[seq[k]]}), n)
        if j > p:
            found.append(seq[:i] + seq[i + 1 : j] + [seq[i]] + seq[j:])
    for i in range(p + 1, min(n, p + WINDOW)):
        ins = set(ops.ins[seq[i]])
        lo = 1 + max((k for k in range(i) if ins & set(ops.outs[seq[k]])), default=-1)
        if lo <= p:
            found.append(seq[:lo] + [seq[i]] + seq[lo:i] + seq[i + 1 :])
    return found
