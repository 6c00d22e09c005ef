"""H-Partition: HiREmate's recursive bottom-to-top graph partitioning.

Gusak et al., *HiREmate: Hierarchical Approach for Efficient Re-materialization of Large Neural
Networks*, §3.1 and Appendix A (Algorithm 2). Each level groups the nodes of the level below
into convex subgraphs of at most ``M^l`` nodes, until the top graph has at most ``M^t`` nodes:

- candidate groups (line 5): for each node x, all nodes on all paths from a(x) to x, in four
  variants (with or without x, with or without a(x)). a(x), "the closest common ancestor of the
  predecessors of x" with a virtual global source, is x's immediate dominator: every path
  from the source to x passes through it, which is exactly what makes the candidate satisfy
  Property 1 (eqs. 3-4) with head h(C) = a(x);
- selection (line 7): the candidate minimising the score s_α of eq. (1),
  ``(Σ sizes of C's input and output values) · (#compute nodes / #nodes)^α``, where the
  compute nodes are the basic operations inside C and the nodes are the current level's nodes;
- update (line 9): every remaining candidate that meets the chosen one absorbs it (Theorem A.4
  keeps it a valid candidate); candidates that grow past ``M^l`` are dropped.

The paper's proof covers Property 1 in the original graph; we additionally check, before each
merge, that the group is convex in the graph where earlier groups are already contracted, so
that every quotient graph is acyclic by construction (Definition A.1), whatever the variant.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx


@dataclass
class LevelGraph:
    """A DAG to partition. Nodes 0..n-1 are in a topological order.

    ``values`` lists (size, producer, consumers, final) for the values that flow between nodes:
    the terms of eq. (1). ``ops[i]`` is the number of basic operations node i stands for.
    """

    preds: list[list[int]]
    values: list[tuple[int, int, tuple[int, ...], bool]]
    ops: list[int]

    @property
    def n(self) -> int:
        return len(self.preds)

    def succs(self) -> list[list[int]]:
        out: list[list[int]] = [[] for _ in range(self.n)]
        for i, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(i)
        return out


def quotient(g: LevelGraph, groups: Sequence[Sequence[int]]) -> LevelGraph:
    """The graph where each group is one node (the next level of the hierarchy)."""
    gid = [0] * g.n
    for k, grp in enumerate(groups):
        for i in grp:
            gid[i] = k
    preds = [sorted({gid[p] for i in grp for p in g.preds[i]} - {k}) for k, grp in enumerate(groups)]
    values = []
    for size, prod, cons, final in g.values:
        q = gid[prod]
        qc = tuple(sorted({gid[c] for c in cons} - {q}))
        if qc or final:
            values.append((size, q, qc, final))
    ops = [sum(g.ops[i] for i in grp) for grp in groups]
    return LevelGraph(preds, values, ops)


def is_convex(succs: Sequence[Sequence[int]], members: set[int]) -> bool:
    """Definition A.1: no path leaves `members` and comes back."""
    stack = [s for u in members for s in succs[u] if s not in members]
    seen = set(stack)
    while stack:
        u = stack.pop()
        for s in succs[u]:
            if s in members:
                return False
            if s not in seen:
                seen.add(s)
                stack.append(s)
    return True


def is_acyclic_quotient(g: LevelGraph, groups: Sequence[Sequence[int]]) -> bool:
    q = quotient(g, groups)
    dg = nx.DiGraph()
    dg.add_nodes_from(range(q.n))
    dg.add_edges_from((p, i) for i, ps in enumerate(q.preds) for p in ps)
    return nx.is_directed_acyclic_graph(dg)


def _immediate_dominators(g: LevelGraph) -> list[int]:
    """a(x) of Algorithm 2, line 5; -1 stands for the virtual global source."""
    dg = nx.DiGraph()
    src = -1
    dg.add_node(src)
    dg.add_nodes_from(range(g.n))
    for i, ps in enumerate(g.preds):
        if not ps:
            dg.add_edge(src, i)
        for p in ps:
            dg.add_edge(p, i)
    idom = nx.immediate_dominators(dg, src)
    return [idom[i] for i in range(g.n)]


def _between(g: LevelGraph, a: int, x: int, limit: int) -> set[int] | None:
    """All nodes on paths from a to x, a excluded (None when more than `limit`). Since a
    dominates x, walking back from x without crossing a finds exactly those (Appendix A)."""
    found = {x}
    stack = [x]
    while stack:
        u = stack.pop()
        for p in g.preds[u]:
            if p != a and p not in found:
                found.add(p)
                if len(found) > limit:
                    return None
                stack.append(p)
    return found


class _Partitioner:
    def __init__(self, g: LevelGraph, max_sub: int, max_top: int, alpha: float):
        self.g = g
        self.max_sub = max_sub
        self.max_top = max_top
        self.alpha = alpha
        self.succs = g.succs()
        self.ins: list[list[int]] = [[] for _ in range(g.n)]
        self.outs: list[list[int]] = [[] for _ in range(g.n)]
        for k, (_, prod, cons, _) in enumerate(g.values):
            self.outs[prod].append(k)
            for c in cons:
                self.ins[c].append(k)
        # Groups formed so far: group id of each node and its members (contracted graph).
        self.group = list(range(g.n))
        self.members: dict[int, set[int]] = {i: {i} for i in range(g.n)}
        self.min_pos = list(range(g.n))  # smallest node index in each group (for pruning)

    def score(self, c: frozenset[int]) -> float:
        """s_α(C), eq. (1)."""
        vals = self.g.values
        io = 0
        seen: set[int] = set()
        for u in c:
            for k in self.ins[u]:
                if k not in seen and vals[k][1] not in c:
                    seen.add(k)
                    io += vals[k][0]
            for k in self.outs[u]:
                if k not in seen and (vals[k][3] or any(w not in c for w in vals[k][2])):
                    seen.add(k)
                    io += vals[k][0]
        compute = sum(self.g.ops[u] for u in c)
        return io * (compute / len(c)) ** self.alpha

    def contracted_convex(self, c: set[int]) -> bool:
        """Convexity of `c` (a union of whole groups) in the graph with groups contracted."""
        hi = max(c)
        group, members = self.group, self.members
        stack: list[int] = []
        seen: set[int] = set()

        def visit(v: int) -> None:
            gv = group[v]
            if gv in seen or self.min_pos[gv] > hi:  # a group past every member reaches none
                return
            seen.add(gv)
            stack.extend(members[gv])

        for u in c:
            for s in self.succs[u]:
                if s not in c:
                    visit(s)
        while stack:
            u = stack.pop()
            for s in self.succs[u]:
                if s in c:
                    return False
                visit(s)
        return True

    def candidates(self) -> list[frozenset[int]]:
        """Line 5: the four variants of the nodes between a(x) and x, at most M^l nodes."""
        idom = _immediate_dominators(self.g)
        out: dict[frozenset[int], None] = {}
        for x in range(self.g.n):
            a = idom[x]
            if a == x:
                continue
            between = _between(self.g, a, x, self.max_sub + 1)
            if between is None:
                continue
            variants = [between, between - {x}]
            if a >= 0:
                variants += [between | {a}, (between | {a}) - {x}]
            for v in variants:
                if 2 <= len(v) <= self.max_sub:
                    out.setdefault(frozenset(v), None)
        return list(out)

    def run(self) -> list[list[int]]:
        cands: dict[int, frozenset[int]] = dict(enumerate(self.candidates()))
        version: dict[int, int] = dict.fromkeys(cands, 0)
        by_node: dict[int, set[int]] = {}
        heap: list[tuple[float, tuple[int, ...], int, int]] = []
        for cid, c in cands.items():
            for u in c:
                by_node.setdefault(u, set()).add(cid)
            heapq.heappush(heap, (self.score(c), tuple(sorted(c)), cid, 0))
        count = self.g.n
        while heap and count > self.max_top:
            _, _, cid, ver = heapq.heappop(heap)
            if cid not in cands or version[cid] != ver:
                continue  # stale entry: the candidate grew or was dropped since
            c = set(cands.pop(cid))
            groups = {self.group[u] for u in c}
            if len(groups) < 2 or not self.contracted_convex(c):
                continue
            # Line 8: wrap C into one group.
            new = min(groups)
            for gid in groups:
                if gid != new:
                    for u in self.members.pop(gid):
                        self.group[u] = new
            self.members[new] = set(c)
            self.min_pos[new] = min(c)
            count -= len(groups) - 1
            # Line 9: every candidate meeting C absorbs it (Theorem A.4), or goes if too large.
            touched = sorted({k for u in c for k in by_node.get(u, ())} - {cid})
            for k in touched:
                if k not in cands:
                    continue
                merged = cands[k] | c
                if len(merged) > self.max_sub:
                    del cands[k]
                    continue
                if merged != cands[k]:
                    for u in merged - cands[k]:
                        by_node.setdefault(u, set()).add(k)
                    cands[k] = frozenset(merged)
                    version[k] += 1
                    heapq.heappush(heap, (self.score(cands[k]), tuple(sorted(merged)), k, version[k]))
        # Line 11: groups (and untouched nodes) become the subgraphs, in topological order.
        groups_list = [sorted(m) for m in self.members.values()]
        return _topo_groups(self.g, groups_list)


def _topo_groups(g: LevelGraph, groups: list[list[int]]) -> list[list[int]]:
    gid = [0] * g.n
    for k, grp in enumerate(groups):
        for i in grp:
            gid[i] = k
    q = quotient(g, groups)
    indeg = [len(ps) for ps in q.preds]
    succs = q.succs()
    ready = [(min(groups[k]), k) for k in range(len(groups)) if indeg[k] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(k)
        for s in succs[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (min(groups[s]), s))
    if len(order) != len(groups):
        raise AssertionError("H-Partition produced a cyclic quotient graph")
    return [groups[k] for k in order]


def partition_level(g: LevelGraph, max_subgraph: int, max_top: int, alpha: float = 0.5) -> list[list[int]]:
    """One pass of the outer loop of Algorithm 2 (lines 5-11): the groups of `g`'s nodes, in a
    topological order of the quotient graph."""
    return _Partitioner(g, max_subgraph, max_top, alpha).run()


def h_partition(
    g: LevelGraph, max_subgraph: int, max_top: int, alpha: float = 0.5, max_levels: int = 16
) -> list[list[list[int]]]:
    """Algorithm 2: the hierarchy as a list of levels; level L groups the nodes of level L-1
    (level 0 is `g` itself). Stops when the top graph has at most `max_top` nodes, or when a
    level can merge nothing more (every candidate would exceed M^l)."""
    levels: list[list[list[int]]] = []
    cur = g
    while cur.n > max_top and len(levels) < max_levels:
        groups = partition_level(cur, max_subgraph, max_top, alpha)
        if len(groups) == cur.n:
            break
        levels.append(groups)
        cur = quotient(cur, groups)
    return levels
