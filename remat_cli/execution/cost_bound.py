"""A lower bound on the recomputation cost of every schedule, in any operator order, that fits a
budget: the cost forced at one instant (the "cut bound").

Take the first time a node v is computed. By then every ancestor of v has run, and no descendant
has; a node that is neither (parallel to v) may have run or not. Let r_u = 1 when u runs after
the instant: r_u = 1 for every descendant; for an ancestor p it means p runs *again*, at cost
c_p (y_p below); for a parallel node it may be its first run, so it is free. A node that runs
after the instant needs each input b then, so b is either live at the instant (x_b, counted in
memory) or made again after it by its producer (r_prod(b)); a graph output likewise. With v's
inputs and outputs, its workspace and the resident bytes live at the instant (M_v), the cheapest
choice is the ILP

    min  sum_{p ancestor of v} c_p r_p
    s.t. x_b + r_prod(b) >= r_u           u runs after the instant, b an input of u
         x_b + r_prod(b) >= 1             b a graph output
         sum_b s_b x_b <= B - M_v
         r_u = 1 for descendants u; x, r binary; inputs and outputs of v are live (fixed)

over the values made before the instant (by ancestors and parallel nodes). Its optimum, or
HiGHS's dual bound when cut short, is a lower bound on the extra cost of every schedule within B:
each r_p = 1 of an ancestor is at least one recomputation. This is Checkmate's model (Jain et al.,
MLSys'20, §4, eq. 1-4) at a single stage with the order left free; at tight budgets the integral
knapsack at one stage binds where the LP relaxation of the whole model gives almost 0.
Parallel nodes matter on exported training graphs: a ReLU's backward mask
or a BatchNorm's saved statistics can be computed from forward values before the loss, so the
value kept across the loss may be theirs rather than the forward activation.

The bound is the maximum over the instants tried. Those are the needed nodes ranked by the bytes
that could have to cross them (values made by ancestors and read by some node not an ancestor),
the ILP at the `exact` largest.

**The chain bound.** One instant counts a recomputation once however often the schedule needs
it again later: on a training chain each backward layer reads a forward value that a tight
budget cannot keep, and the single instant at the first of them sees only what that one needs
(six layers at 4 units: 21 of the optimum's 59). Take instants v_1, ..., v_K, each a
descendant of the one before, so that their first computations t_1 < ... < t_K come in that
order in every schedule, and the windows W_k = (t_k, t_{k+1}) (W_K after t_K). With
live^k_b = 1 when b is live at t_k and run^k_u = 1 when u runs in W_k, every schedule within B
satisfies

    M_{v_k} + sum_b s_b live^k_b <= B                                  memory at each instant
    live^{k+1}_b <= live^k_b + run^k_prod(b)                           kept across, or made in W_k
    live^k_b + run^k_prod(b) >= run^k_u      b an input of u          inputs of what runs in W_k
    live^K_b + run^K_prod(b) >= 1            b a graph output
    sum_{k in K_u} run^k_u >= 1                                       u runs first in a window
                                                                      after the first v_k it
                                                                      descends from and before
                                                                      the first it precedes

(values in v_k's working set count as live at t_k; resident ones always). A run of an ancestor
of v_k in W_k (or of v_k itself) is a recomputation, and runs in different windows are
different runs, so sum_k sum_{u ancestor of v_k or v_k} c_u run^k_u bounds the extra cost;
each instant's single bound, a bound on the part of that sum after it, is added as a cut.
It is Checkmate's stages (Jain et al., MLSys'20, §4, eq. 1-4) at K instants with the order
between them left free. The chain is the one whose instants' LP bounds add up to the most;
ILPs over 4, 6, 8, ... of its instants (the largest bound of each even stretch) run in the time
the single instants leave.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, OptimizeResult, milp
from scipy.sparse import coo_matrix

from remat_cli.graph import Graph
from remat_cli.schedule import working_set


@dataclass(frozen=True)
class CostBound:
    """The bound, in the graph's cost unit (extra cost over the baseline), and where it came from."""

    extra_cost: float
    node: str | None  # the instant that gave it (None: no instant forces any recomputation)
    instants: int  # ILPs solved
    chain: tuple[str, ...] = ()  # the chain bound's instants where it gave the bound (`node` the last)

    def overhead(self, baseline_cost: float) -> float:
        """The bound as a fraction of the baseline's cost, the unit of a schedule's overhead."""
        return self.extra_cost / baseline_cost if baseline_cost > 0 else 0.0


def meets(cost: float, lower_bound: float) -> bool:
    """Whether a schedule of total `cost` meets a lower bound on the total cost, i.e. is optimal
    (a relative 1e-9 for the float sums of node costs)."""
    return cost <= lower_bound * (1 + 1e-9)


#: above this many needed nodes the bound is not computed (the trivial 0 is returned): its
#: ancestor matrix takes n^2 bytes, 1.6 GB here, and 10 GB for a 100,000-node export
MAX_NODES = 40_000

#: the chain bound's sizes (instants), tried in turn while time is left
CHAIN_SIZES = (4, 6, 8, 12, 16)


class OutOfTime(Exception):
    """The time limit ran out while the ancestor matrix or the crossing bytes were being built."""


class Instants:
    """The needed nodes' ancestor matrix and the ILP at any one of them."""

    def __init__(self, graph: Graph, deadline: float = float("inf")):
        self.graph = graph
        self.deadline = deadline
        self.order = graph.needed_order
        self.idx = {n: i for i, n in enumerate(self.order)}
        nodes, prod = graph.node_map, graph.producer
        n = len(self.order)
        self.anc = np.zeros((n, n), dtype=bool)  # anc[i, j]: j is a strict ancestor of i
        for i, nid in enumerate(self.order):
            self.clock(i)
            for v in nodes[nid].inputs:
                if (p := prod.get(v)) in self.idx:
                    j = self.idx[p]
                    self.anc[i, j] = True
                    self.anc[i] |= self.anc[j]

    def clock(self, i: int) -> None:
        """OutOfTime past the deadline, checked every 256th step of the O(n^2) passes (on a long
        chain they alone would overrun --bound-time-limit, before any ILP)."""
        if i % 256 == 0 and time.monotonic() > self.deadline:
            raise OutOfTime

    def live_at(self, nid: str) -> int:
        """M_v: the bytes live at v's compute instant in every schedule."""
        return self.graph.resident_bytes + working_set(self.graph, nid)

    def crossing_bytes(self) -> np.ndarray:
        """Per instant, the bytes of values made by an ancestor and read by a node not an ancestor
        (nor the instant itself) or kept as a graph output: at most these can have to cross it."""
        g, vm, n = self.graph, self.graph.value_map, len(self.order)
        desc = self.anc.T
        total = np.zeros(n, dtype=np.int64)
        outputs = set(g.outputs)
        for nid in self.order:
            p = self.idx[nid]
            self.clock(p)
            for a in g.node_map[nid].outputs:
                if vm[a].resident:
                    continue
                readers = [self.idx[c] for c in g.consumers.get(a, []) if c in self.idx]
                # instants v after p at which some reader is not an ancestor of v and is not v
                mask = desc[p].copy()
                if a not in outputs:
                    later = np.zeros(n, dtype=bool)
                    for r in readers:
                        col = ~self.anc[:, r]
                        col[r] = False
                        later |= col
                    mask &= later
                total[mask] += vm[a].size
        return total

    def bound_at(self, nid: str, budget: int, time_limit: float, *, integral: bool = True) -> float:
        """The ILP of the module docstring at v = `nid` (its LP relaxation unless `integral`): HiGHS's
        dual bound (the LP's optimum), a bound whether or not the search finished."""
        g = self.graph
        nodes, vm, prod = g.node_map, g.value_map, g.producer
        i = self.idx[nid]
        before = {n for j, n in enumerate(self.order) if j != i and not self.anc[j, i]}  # ancestors, parallel
        fixed = set(nodes[nid].inputs) | set(nodes[nid].outputs)
        r = {u: k for k, u in enumerate(n for n in self.order if n in before)}
        made = [b for u in r for b in nodes[u].outputs if not vm[b].resident and b not in fixed]
        x = {b: len(r) + k for k, b in enumerate(made)}
        rows: list[dict[int, float]] = []
        lower: list[float] = []
        for u in self.order:
            if u == nid:
                continue
            for b in set(nodes[u].inputs):
                if b not in x:
                    continue
                row = {x[b]: 1.0, r[prod[b]]: 1.0}
                if u in r:
                    row[r[u]] = -1.0
                rows.append(row)
                lower.append(0.0 if u in r else 1.0)
        for b in set(g.outputs):
            if b in x:
                rows.append({x[b]: 1.0, r[prod[b]]: 1.0})
                lower.append(1.0)
        nvar = len(r) + len(x)
        mem = np.zeros((1, nvar))
        for b, k in x.items():
            mem[0, k] = vm[b].size
        cost = np.zeros(nvar)
        for u, k in r.items():
            if self.anc[i, self.idx[u]]:
                cost[k] = nodes[u].cost
        unit = self.cost_unit
        room = np.array([budget - self.live_at(nid)])
        res = _solve(cost / unit, rows, lower, mem, room, max(time_limit, 0.1), integral=integral)
        if res.status == 2:  # infeasible: no schedule within the budget computes v at all
            return float("inf")
        if not integral:
            return float(res.fun) * unit if res.status == 0 else 0.0  # an unfinished LP bounds nothing
        return _dual(res) * unit

    @functools.cached_property
    def cost_unit(self) -> float:
        """The largest node cost: the ILPs are posed in it, since HiGHS takes a cost of 1e20 for
        infinite and coefficients past 1e15 for an error (flops of 1e16 a node made the chain
        bound's rows 'infeasible', an infinite bound)."""
        return max((self.graph.node_map[n].cost for n in self.order), default=0.0) or 1.0

    def chain_bound(
        self, chain: list[str], budget: int, deadline: float, floors: list[float] | None = None
    ) -> tuple[float, bool]:
        """The ILP of the module docstring's last section over the instants `chain` (each a
        descendant of the one before), solved until `deadline` (time.monotonic(); building the
        model counts): HiGHS's dual bound, a bound whether or not it finished, and whether it
        did (0 and False when the model took all the time)."""
        g = self.graph
        nodes, vm, prod = g.node_map, g.value_map, g.producer
        ids = [self.idx[v] for v in chain]
        K = len(ids)
        cost: list[float] = []

        def column(c: float) -> int:
            cost.append(c)
            return len(cost) - 1

        # run[k][j]: node j runs in window k (after v_k's instant, before v_{k+1}'s); it is a
        # recomputation, at its cost (in cost_unit), when j is v_k or one of its ancestors
        run: list[dict[int, int]] = []
        for k, i in enumerate(ids):
            nxt = ids[k + 1] if k + 1 < K else None
            run.append(
                {
                    j: column(nodes[u].cost / self.cost_unit if j == i or self.anc[i, j] else 0.0)
                    for j, u in enumerate(self.order)
                    if nxt is None or not (j == nxt or self.anc[j, nxt])
                }
            )
        # live[k][b]: value b, made before v_k's instant and not in its working set, is live then
        fixed = [set(nodes[v].inputs) | set(nodes[v].outputs) for v in chain]
        live: list[dict[str, int]] = [
            {
                b: column(0.0)
                for j, u in enumerate(self.order)
                if j != i and not self.anc[j, i]
                for b in nodes[u].outputs
                if not vm[b].resident and b not in fixed[k]
            }
            for k, i in enumerate(ids)
        ]

        def made(b: str) -> int | None:
            """The producer's index, None for a value every instant holds (resident, no producer)."""
            p = prod.get(b)
            return None if vm[b].resident or p not in self.idx else self.idx[p]

        rows: list[dict[int, float]] = []
        lower: list[float] = []

        def at_least(terms: dict[int, float], lo: float) -> None:
            rows.append(terms)
            lower.append(lo)

        def held(k: int, b: str, j: int) -> dict[int, float] | None:
            """b live at instant k or made again in window k (j its producer); None: surely held."""
            if b in fixed[k]:
                return None
            terms = {live[k][b]: 1.0} if b in live[k] else {}
            if j in run[k]:
                terms[run[k][j]] = 1.0
            return terms

        for k in range(K):
            # nodes run in window k find their inputs live at v_k's instant or made in the window
            for j, c in run[k].items():
                for b in set(nodes[self.order[j]].inputs):
                    p = made(b)
                    if p is not None and (terms := held(k, b, p)) is not None:
                        at_least(terms | {c: -1.0}, 0.0)
            if k + 1 < K:
                # what is live at the next instant was live at this one or made in the window
                for b, c in live[k + 1].items():
                    p = made(b)
                    if p is not None and (terms := held(k, b, p)) is not None:
                        at_least(terms | {c: -1.0}, 0.0)
                for b in set(nodes[chain[k + 1]].inputs):
                    p = made(b)
                    if p is not None and (terms := held(k, b, p)) is not None:
                        at_least(terms, 1.0)
        for b in set(g.outputs):  # graph outputs: live at the last instant or made after it
            p = made(b)
            if p is not None and (terms := held(K - 1, b, p)) is not None:
                at_least(terms, 1.0)
        # every node first runs in a window after the first instant it descends from and before
        # the first it is an ancestor of
        for j in range(len(self.order)):
            if j in ids:
                continue
            after = [k for k in range(K) if self.anc[j, ids[k]]]
            if not after:
                continue
            before = [k for k in range(after[0], K) if self.anc[ids[k], j]]
            end = before[0] if before else K
            if windows := {run[k][j]: 1.0 for k in range(after[0], end) if j in run[k]}:
                at_least(windows, 1.0)
        # each instant's own bound (`floors`, its single ILP's) holds for the recomputations of
        # its ancestors after it: a valid cut that lifts the LP relaxation
        for k, (i, floor) in enumerate(zip(ids, floors or [0.0] * K, strict=True)):
            if floor > 0:
                at_least(
                    {c: cost[c] for w in range(k, K) for j, c in run[w].items() if j == i or self.anc[i, j]},
                    floor / self.cost_unit,
                )
        nvar = len(cost)
        mem = np.zeros((K, nvar))
        room = np.zeros(K)
        for k, v in enumerate(chain):
            for b, c in live[k].items():
                mem[k, c] = vm[b].size
            room[k] = budget - self.live_at(v)
        time_limit = deadline - time.monotonic()
        if time_limit <= 0:
            return 0.0, False
        res = _solve(np.array(cost), rows, lower, mem, room, time_limit)
        if res.status == 2:
            return float("inf"), True
        return _dual(res) * self.cost_unit, res.status == 0


def _solve(
    cost: np.ndarray,
    rows: list[dict[int, float]],
    lower: list[float],
    mem: np.ndarray,
    room: np.ndarray,
    time_limit: float,
    *,
    integral: bool = True,
) -> OptimizeResult:
    """min cost . z over z in [0, 1] (binary where `integral`) with the cover rows (row . z >=
    lower, a row a sparse dict column -> coefficient) and the memory rows (mem z <= room), by
    HiGHS through scipy."""
    coo = [(k, j, c) for k, row in enumerate(rows) for j, c in row.items()]
    cover = coo_matrix(
        ([c for *_, c in coo], ([k for k, *_ in coo], [j for _, j, _ in coo])), shape=(len(rows), len(cost))
    )
    return milp(
        cost,
        constraints=[
            LinearConstraint(cover.tocsr(), lb=np.array(lower), ub=np.inf),
            LinearConstraint(mem, lb=-np.inf, ub=room),
        ],
        integrality=np.full(len(cost), int(integral)),
        bounds=Bounds(0, 1),
        options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 1e-7},
    )


def _dual(res: OptimizeResult) -> float:
    """The dual bound, not the incumbent, whether or not the search finished ("optimal" only
    means within mip_rel_gap of it); 0 where HiGHS gives none."""
    dual = getattr(res, "mip_dual_bound", None)
    return float(dual) if dual is not None and np.isfinite(dual) else 0.0


def cost_lower_bound(graph: Graph, budget: int, *, exact: int = 8, time_limit: float = 30.0) -> CostBound:
    """The cut bound of the module docstring for `budget` bytes. The LP relaxation runs at every
    instant where the bytes that could have to cross it exceed the budget (most such bytes first,
    until half of `time_limit`), the ILP at the `exact` instants of the largest LP bounds, then
    the chain bound over more and more of the instants with a positive LP bound (CHAIN_SIZES)
    until the limit or the first chain whose ILP does not finish. The trivial bound 0 (no
    instant solved) where the graph has over MAX_NODES needed nodes or the ancestor matrix is
    not built within half of `time_limit`."""
    start = time.monotonic()
    if len(graph.needed_nodes) > MAX_NODES:
        return CostBound(0.0, None, 0)
    try:
        inst = Instants(graph, start + time_limit / 2)
        crossing = inst.crossing_bytes()
    except OutOfTime:
        return CostBound(0.0, None, 0)  # the trivial bound, within the time limit
    need = sorted(((int(crossing[k]) + inst.live_at(v), v) for k, v in enumerate(inst.order)), reverse=True)
    relaxed: list[tuple[float, str]] = []
    for worst, v in need:
        if worst <= budget or time.monotonic() - start > time_limit / 2:
            break
        relaxed.append((inst.bound_at(v, budget, time_limit / 2, integral=False), v))
    if not relaxed:
        return CostBound(0.0, None, 0)
    relaxed.sort(reverse=True)
    best, where = relaxed[0]
    if best == float("inf"):
        return CostBound(best, where, 0)
    chain = _chain(inst, relaxed)
    # the single instants first (small ILPs, quick), the chains in
    # what they leave, at least a quarter of the limit
    deadline = start + (time_limit * 3 / 4 if len(chain) > 1 else time_limit)
    top = [v for value, v in relaxed[:exact] if value > 0]
    floors = {v: value for value, v in relaxed}
    solved = 0
    for k, v in enumerate(top):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        value = inst.bound_at(v, budget, left / (len(top) - k))
        floors[v] = max(floors[v], value)
        solved += 1
        if value > best:
            best, where = value, v
    found: tuple[str, ...] = ()
    # chains of more and more instants while time is left: a few finish in seconds, and each
    # instant more makes the ILP harder (doubling them can take it from seconds past any limit)
    for size in CHAIN_SIZES:
        left = start + time_limit - time.monotonic()
        if left <= 0 or len(chain) < 2:
            break
        sub = _spread(chain, floors, size)
        last = size >= len(chain) or size == CHAIN_SIZES[-1]
        ends = time.monotonic() + (left if last else left / 2)
        value, finished = inst.chain_bound(sub, budget, ends, [floors[v] for v in sub])
        solved += 1
        if value > best:
            best, where, found = value, sub[-1], tuple(sub)
        if last or not finished or value == float("inf"):
            break  # a chain of more instants is a harder ILP: it would not finish either
    return CostBound(best, where, solved, found)


def _chain(inst: Instants, relaxed: list[tuple[float, str]]) -> list[str]:
    """The instants, each a descendant of the one before, whose LP bounds add up to the most:
    where several instants force recomputations, the chain bound counts each of them once per
    window."""
    cands = sorted((inst.idx[v], value) for value, v in relaxed if 0 < value < float("inf"))
    if not cands:
        return []
    at = np.array([i for i, _ in cands])
    total = np.array([w for _, w in cands])
    back = np.full(len(cands), -1)
    for a in range(1, len(cands)):  # the longest path, over the candidates in topological order
        below = np.where(inst.anc[at[a], at[:a]], total[:a], -np.inf)
        b = int(np.argmax(below))
        if below[b] > -np.inf:
            total[a] += total[b]
            back[a] = b
    picked: list[int] = []
    a = int(np.argmax(total))
    while a >= 0:
        picked.append(a)
        a = int(back[a])
    return [inst.order[at[a]] for a in reversed(picked)]


def _spread(chain: list[str], floors: dict[str, float], size: int) -> list[str]:
    """`size` instants of `chain`: of each of `size` even stretches, the one of the largest bound
    (near neighbours force the same recomputations; the ILP grows with the instants)."""
    cuts = [round(k * len(chain) / size) for k in range(size + 1)]
    return [max(chain[a:b], key=lambda v: floors[v]) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
