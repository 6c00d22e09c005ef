"""MODeL §4.1-4.2 and App. A.1: the graph as operators and tensors, and the windows of their steps.

Steps s = 0..n-1 run exactly one operator each (n = number of operators some output needs), so
an operator's position is its step; the public code's shorter horizon (several operators per
step, their tensors all counted together) is what the notes list as its first defect. A tensor
e is created at pos(src(e)) and preserved up to max pos over its sinks (eqs. 1-4 in one
interval); a graph output is preserved to the last step; siblings share their creation step
(eq. 5) because they are outputs of the same position. Resident values (inputs, parameters)
live outside the arena and are not tensors here.

App. A.1's ASAP/ALAP become, with one operator per step, the number of ancestors and of
descendants: pos(v) >= |anc(v)| and pos(v) <= n - 1 - |desc(v)|, a tighter window than the
longest path (eq. 10).

`Lifetimes` computes every tensor's [start, end) for an order with numpy, for the searches that
evaluate thousands of orders (hill climbing, the plateau walk).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from remat_cli.graph import Graph
from remat_cli.planning.memory_plan import Buffer, best_fit_arrays


def _align(x: int, alignment: int) -> int:
    return -(-x // alignment) * alignment


@dataclass(frozen=True)
class Tensor:
    value: str | None  # None: the workspace of `src`
    src: int  # index of the producing operator
    sinks: tuple[int, ...]  # consuming operators (needed ones)
    size: int  # bytes, rounded up to the alignment
    to_end: bool  # a graph output: preserved to the last step


class Problem:
    """Operators 0..n-1 in program order, their precedences and the tensors they create."""

    def __init__(self, graph: Graph, alignment: int = 1):
        self.graph = graph
        self.alignment = alignment
        needed = graph.needed_nodes
        self.ops: list[str] = [n for n in graph.topo_order if n in needed]
        self.index = {n: i for i, n in enumerate(self.ops)}
        nm, vm = graph.node_map, graph.value_map
        outputs = set(graph.outputs)
        self.preds: list[set[int]] = [set() for _ in self.ops]
        tensors: list[Tensor] = []
        for i, n_id in enumerate(self.ops):
            node = nm[n_id]
            for v in node.inputs:
                p = graph.producer.get(v)
                if p is not None:
                    self.preds[i].add(self.index[p])
            for v in node.outputs:
                sinks = tuple(sorted(self.index[c] for c in graph.consumers[v] if c in self.index))
                tensors.append(Tensor(v, i, sinks, _align(vm[v].size, alignment), v in outputs))
            if node.workspace:
                tensors.append(Tensor(None, i, (), _align(node.workspace, alignment), False))
        self.tensors = tensors
        self.succs: list[set[int]] = [set() for _ in self.ops]
        for i, ps in enumerate(self.preds):
            for p in ps:
                self.succs[p].add(i)

    def __len__(self) -> int:
        return len(self.ops)

    @cached_property
    def ancestors(self) -> list[int]:
        """Bitsets (python ints) of each operator's transitive fan-in."""
        anc = [0] * len(self.ops)
        for i in range(len(self.ops)):  # program order is topological
            for p in self.preds[i]:
                anc[i] |= anc[p] | (1 << p)
        return anc

    @cached_property
    def descendants(self) -> list[int]:
        desc = [0] * len(self.ops)
        for i in reversed(range(len(self.ops))):
            for s in self.succs[i]:
                desc[i] |= desc[s] | (1 << s)
        return desc

    @cached_property
    def window(self) -> list[tuple[int, int]]:
        """[earliest, latest] position of every operator (App. A.1 with one operator per step)."""
        n = len(self.ops)
        return [
            (a.bit_count(), n - 1 - d.bit_count())
            for a, d in zip(self.ancestors, self.descendants, strict=True)
        ]

    def _key(self, t: Tensor) -> tuple[str | None, str]:
        """What names a tensor and its buffer alike: the value, or the workspace's node."""
        return t.value, self.ops[t.src] if t.value is None else ""

    def by_buffer(self, tensor_offsets: Sequence[int], buffers: Sequence[Buffer]) -> list[int]:
        """Offsets per tensor (of `tensors`) as offsets per buffer of the schedule (`buffers_of`)."""
        at = {self._key(t): o for t, o in zip(self.tensors, tensor_offsets, strict=True)}
        return [at[_buffer_key(b)] for b in buffers]

    def by_tensor(self, buffer_offsets: Sequence[int], buffers: Sequence[Buffer]) -> list[int]:
        """The inverse of `by_buffer` (0 for a tensor without a buffer)."""
        at = {_buffer_key(b): o for b, o in zip(buffers, buffer_offsets, strict=True)}
        return [at.get(self._key(t), 0) for t in self.tensors]

    @cached_property
    def lives(self) -> Lifetimes:
        """The vectorised lifetimes of the tensors, for scoring many orders."""
        return Lifetimes(self)

    def peak(self, order: list[int]) -> int:
        """Largest sum of resident tensor sizes at one step (fragmentation-free), for `order`."""
        return self.lives.peak(*self.lives.of(order))


def _buffer_key(b: Buffer) -> tuple[str | None, str]:
    return b.value, b.node if b.value is None else ""


#: the tie-breaks of `Lifetimes.greedy`
TIES = ("src", "start", "end")


class Lifetimes:
    """Every tensor's steps [start, end) under an order, vectorised: one operator per step, a
    tensor created at its producer's step and kept through its last reader's (to the end for a
    graph output), so the same overlaps as the schedule's buffers."""

    def __init__(self, p: Problem):
        n = len(p)
        self.n = n
        self.src = np.array([t.src for t in p.tensors], dtype=np.int64)
        width = max((len(t.sinks) for t in p.tensors), default=0)
        # readers padded with the producer itself: a tensor nobody reads ends right after it
        self.readers = np.array(
            [list(t.sinks) + [t.src] * (width + 1 - len(t.sinks)) for t in p.tensors], dtype=np.int64
        ).reshape(len(p.tensors), width + 1)
        self.to_end = np.array([t.to_end for t in p.tensors], dtype=bool)
        self.size = np.array([t.size for t in p.tensors], dtype=np.int64)
        self.by_size = np.lexsort((self.src, -self.size))  # placement order: larger first

    @cached_property
    def touched(self) -> list[np.ndarray]:
        """Per operator, the tensors it creates or reads: the only ones whose overlaps change
        when that operator alone moves in an order."""
        out: list[list[int]] = [[] for _ in range(self.n)]
        for k, (s, rs) in enumerate(zip(self.src.tolist(), self.readers.tolist(), strict=True)):
            for o in {s, *rs}:
                out[o].append(k)
        return [np.array(t, dtype=np.int64) for t in out]

    def of(self, order: list[int]) -> tuple[np.ndarray, np.ndarray]:
        pos = np.empty(self.n, dtype=np.int64)
        pos[np.asarray(order, dtype=np.int64)] = np.arange(self.n)
        start = pos[self.src]
        end = np.where(self.to_end, self.n, pos[self.readers].max(axis=1) + 1)
        return start, end

    def profile(self, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Resident bytes at each step."""
        delta = np.zeros(self.n + 1, dtype=np.int64)
        np.add.at(delta, start, self.size)
        np.add.at(delta, end, -self.size)
        return np.cumsum(delta)[: self.n]

    def peak(self, start: np.ndarray, end: np.ndarray) -> int:
        return int(self.profile(start, end).max()) if self.n else 0

    def greedy(self, start: np.ndarray, end: np.ndarray, ties: str = "src") -> np.ndarray:
        """Offsets by best fit in decreasing size; equal sizes by `ties` (one of TIES): the
        producer's place in program order (fixed, whatever the order), or the tensor's first
        step, or its last step latest first, in the order scored (two of `greedy_offsets`' keys)."""
        if ties == "start":
            by = np.lexsort((start, -self.size))
        elif ties == "end":
            by = np.lexsort((-end, -self.size))
        else:
            by = self.by_size
        return best_fit_arrays(start, end, self.size, by.tolist())

    def arena(self, offsets: np.ndarray) -> int:
        return int((offsets + self.size).max()) if len(offsets) else 0

    def on_top(self, offsets: np.ndarray, arena: int) -> np.ndarray:
        """The operators creating or reading a tensor that reaches the arena's top: moving them
        shortens or shifts what sets the arena."""
        return self.operators_of(np.nonzero(offsets + self.size == arena)[0])

    def operators_of(self, tensors: np.ndarray) -> np.ndarray:
        """The operators creating or reading any of `tensors` (indices), ascending."""
        return np.unique(np.concatenate([self.src[tensors], self.readers[tensors].ravel()]))
