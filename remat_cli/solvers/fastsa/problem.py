"""FastSA's representation: the SA's node set (original nodes or groups, App. C.1 / Algorithm
1) and the state of a sequence with nop slots (§2.2, App. D.4).

Imanishi et al., NeurIPS'23 (``papers/fastsa.txt``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import NodeView
from remat_cli.solvers.fastsa import kernel as K

#: iterations per kernel call; stopping is only decided between chunks
CHUNK = 1 << 16
#: nop slots per node when (re)spreading a sequence (T is the next power of two)
SPACING = 8
#: extra copies a node may gain over its initial count (more is rejected as an invalid add)
COPIES = 4


@dataclass
class Problem:
    """The SA's node set: original nodes (one per needed node) or groups (App. C.1).

    ``members[i]`` lists the NodeView indices node i runs, in topological order; ``mem`` is the
    block it outputs, ``ws`` its node-intermediate memory (App. B.1).
    """

    members: list[list[int]]
    preds: list[list[int]]
    mem: np.ndarray
    ws: np.ndarray
    cost: np.ndarray
    keep: np.ndarray
    addrem: np.ndarray  # may be added / removed (recomputable); rotation is always allowed

    def __post_init__(self) -> None:
        n = self.size
        self.pred_ptr = np.zeros(n + 1, dtype=np.int64)
        self.pred_ptr[1:] = np.cumsum([len(ps) for ps in self.preds])
        self.pred_idx = np.array([q for ps in self.preds for q in ps], dtype=np.int64)
        self.edge_consumer = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.pred_ptr))
        biggest = float(max(1, int(self.mem.max(initial=0)), int(self.ws.max(initial=0))))
        self.lscale = 10.0 / biggest  # App. C.2: the largest value becomes 10

    @property
    def size(self) -> int:
        return len(self.members)

    def layout(self, copies: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """NI (static columns), NX and the size of PU for nodes that now run ``copies`` times.

        A node may gain COPIES more copies before the next re-layout (more adds are rejected as
        invalid); one spare production slot lets a rotation add before it removes.
        """
        n = self.size
        pcap = np.where(self.addrem, copies + COPIES, np.maximum(copies, 1)).astype(np.int64) + 1
        ucap = np.bincount(self.pred_idx, weights=pcap[self.edge_consumer], minlength=n).astype(np.int64)
        region = pcap + ucap
        pbase = np.zeros(n, dtype=np.int64)
        pbase[1:] = np.cumsum(region)[:-1]
        NI = np.zeros((n, 8), dtype=np.int64)
        NI[:, K.PB] = pbase
        NI[:, K.UB] = pbase + pcap
        NI[:, K.MEM] = self.mem
        NI[:, K.PS] = self.pred_ptr[:-1]
        NI[:, K.PE] = self.pred_ptr[1:]
        NI[:, K.FL] = self.keep.astype(np.int64) * K.KEEP + self.addrem.astype(np.int64) * K.ADDREM
        NX = np.stack([self.ws.astype(np.int64), pcap], axis=1)
        return NI, np.ascontiguousarray(NX), int(region.sum())


def original_problem(nv: NodeView) -> Problem:
    """The needed nodes of the NodeView, one SA node each; unneeded nodes never run."""
    ids = [i for i in range(len(nv)) if nv.needed[i]]
    local = {v: k for k, v in enumerate(ids)}
    return Problem(
        members=[[i] for i in ids],
        preds=[[local[q] for q in nv.preds[i]] for i in ids],
        mem=np.array([nv.mem[i] for i in ids], dtype=np.int64),
        ws=np.array([nv.workspace[i] for i in ids], dtype=np.int64),
        cost=np.array([nv.cost[i] for i in ids], dtype=np.float64),
        keep=np.array([nv.keep[i] for i in ids], dtype=bool),
        addrem=np.array([nv.recomputable[i] for i in ids], dtype=bool),
    )


def group_nodes(nv: NodeView, max_group: int = 0) -> Problem:
    """Node grouping, Algorithm 1 of App. C.1 over the needed nodes in topological order.

    ``do_fuse(n_i)``: fuse n_i into every later node that consumes its output when its inputs take
    no more memory than its output, ``sum s(input(n_i)) <= sum s(output(n_i))``; n_i becomes nop.
    The grouped node of n_i and n_j follows §2.2.2: c(g) = c(n_i) + c(n_j), input(g) =
    input(n_i) ∪ (input(n_j) \\ output(n_i)), output(g) = output(n_j) (the block of n_i is consumed
    inside). Constituents shared by both are run once (the groups are sets of original nodes).
    Resident inputs (model inputs, parameters) are always in memory, so they count as 0 in
    do_fuse. Graph outputs are never fused (their block must stay), nor are ``recomputable:
    false`` nodes, which fusing into several consumers would duplicate (§2.3).
    ``max_group`` (0: no limit) keeps groups at most that many members: on graphs whose model
    inputs are small or absent (all the Moccasin graphs) do_fuse holds transitively from the
    sources and Algorithm 1 alone folds the whole graph into one group.
    The node-intermediate memory of a group is estimated from the values produced and used
    within it (App. B.1): the most its internal blocks (plus a member's workspace) take at any
    member's compute instant, an upper bound on what running the members in order needs beyond
    the group's inputs and output.
    """
    ids = [i for i in range(len(nv)) if nv.needed[i]]
    inputs: dict[int, set[int]] = {i: set(nv.preds[i]) for i in ids}
    consumers: dict[int, set[int]] = {i: {c for c in nv.succs[i] if nv.needed[c]} for i in ids}
    members: dict[int, set[int]] = {i: {i} for i in ids}
    alive = dict.fromkeys(ids, True)
    for i in ids:
        if nv.keep[i] or not nv.recomputable[i] or not consumers[i]:
            continue
        if sum(nv.mem[q] for q in inputs[i]) > nv.mem[i]:  # do_fuse
            continue
        if max_group and any(len(members[j] | members[i]) > max_group for j in consumers[i]):
            continue
        for j in consumers[i]:
            members[j] |= members[i]
            inputs[j] = (inputs[j] | inputs[i]) - {i}
        for q in inputs[i]:
            consumers[q].discard(i)
            consumers[q] |= consumers[i]
        alive[i] = False
    heads = [i for i in ids if alive[i]]
    local = {h: k for k, h in enumerate(heads)}
    mlists = [sorted(members[h]) for h in heads]
    return Problem(
        members=mlists,
        preds=[sorted(local[q] for q in inputs[h]) for h in heads],
        mem=np.array([nv.mem[h] for h in heads], dtype=np.int64),
        ws=np.array([_group_workspace(nv, ms) for ms in mlists], dtype=np.int64),
        cost=np.array([sum(nv.cost[m] for m in ms) for ms in mlists], dtype=np.float64),
        keep=np.array([nv.keep[h] for h in heads], dtype=bool),
        addrem=np.array([all(nv.recomputable[m] for m in ms) for ms in mlists], dtype=bool),
    )


def _group_workspace(nv: NodeView, ms: list[int]) -> int:
    """App. B.1 estimate for a group run as ``ms`` (topological; the head, last, is its output)."""
    head = ms[-1]
    inside = set(ms)
    last_use = {m: k for k, m in enumerate(ms)}
    for k, m in enumerate(ms):
        for q in nv.preds[m]:
            if q in inside:
                last_use[q] = k
    live = 0
    worst = 0
    for k, m in enumerate(ms):
        out = nv.mem[m] if m != head else 0
        worst = max(worst, live + out + nv.workspace[m])
        live += out
        for q in nv.preds[m]:
            if q in inside and q != head and last_use[q] == k:
                live -= nv.mem[q]
    return worst


@dataclass
class Best:
    order: np.ndarray | None = None  # compact sequence of SA node indices
    cost: float = math.inf
    peak: float = math.inf


class State:
    """The mutable half of the kernel state for a problem and T slots."""

    def __init__(self, prob: Problem, order: np.ndarray, seed: int, log_cap: int, lse: bool = False):
        self.prob = prob
        mixed = ((seed + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        self.rng = np.array([mixed | 1], dtype=np.uint64)
        self.fstate = np.zeros(K.F_LEN, dtype=np.float64)
        self.istate = np.zeros(K.I_LEN, dtype=np.int64)
        self.log_t = np.zeros(log_cap, dtype=np.int32)
        self.log_n = np.zeros(log_cap, dtype=np.int32)
        self.T = 0
        self.lse = lse
        self.respread(np.asarray(order, dtype=np.int64))

    def set_lse(self, lse: bool) -> None:
        """Keep the logaddexp tree of App. C.2 beside the max tree (or drop it) from now on."""
        if lse != self.lse:
            self.lse = lse
            self.lz = np.zeros(4 * self.T if lse else 0, dtype=np.float64)
            K.rebuild(self.kt, self.st)

    def respread(self, order: np.ndarray) -> None:
        """Lay ``order`` out evenly (App. D.4) in T >= SPACING·len slots and rebuild everything."""
        T = 64
        while T < SPACING * (len(order) + 1):
            T *= 2
        if T != self.T:
            self.T = T
            self.occ = np.zeros(T, dtype=np.int32)
            self.occpos = np.zeros(T, dtype=np.int32)
            self.tz = np.zeros(4 * T, dtype=np.int64)
            self.lz = np.zeros(4 * T if self.lse else 0, dtype=np.float64)
        copies = np.bincount(order, minlength=self.prob.size).astype(np.int64)
        self.NI, NX, pu = self.prob.layout(copies)
        self.PU = np.zeros(max(pu, 1), dtype=np.int32)
        p = self.prob
        add_list = np.flatnonzero(p.addrem).astype(np.int64)
        self.kt = (T, T, p.lscale, NX, p.cost.astype(np.float64), p.pred_idx, add_list)
        self.seq = K.spread(order.astype(np.int32), T)
        K.rebuild(self.kt, self.st)

    @property
    def st(self) -> tuple:
        return (
            self.seq,
            self.occ,
            self.occpos,
            self.NI,
            self.PU,
            self.tz,
            self.lz,
            self.fstate,
            self.istate,
            self.rng,
            self.log_t,
            self.log_n,
        )

    def order(self) -> np.ndarray:
        return self.seq[self.seq >= 0].astype(np.int64)

    @property
    def peak(self) -> int:
        """M(S) without the resident bytes: the root of the max tree."""
        return int(self.tz[2])

    @property
    def cost(self) -> float:
        return float(self.fstate[K.F_COST])


def expand(prob: Problem, order: np.ndarray) -> list[int]:
    """Decompose grouped nodes into their members (§2.2.2): NodeView indices in sequence."""
    out: list[int] = []
    for g in order:
        out.extend(prob.members[int(g)])
    return out


def to_base(base_prob: Problem, nv_indices: list[int]) -> list[int]:
    local = {m[0]: k for k, m in enumerate(base_prob.members)}
    return [local[i] for i in nv_indices]
