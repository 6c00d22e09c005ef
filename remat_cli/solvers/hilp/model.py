"""The H-ILP: the instance over a list of units and its MILP (Gusak et al., *HiREmate*,
App. B.2-B.3, eqs. 2 and 5-10), and decoding a solution into operator sequences.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import scipy.sparse as sp

from remat_cli.milp import LinearModel
from remat_cli.solvers.hilp.context import TOKEN, Ctx
from remat_cli.solvers.hilp.units import (
    Unit,
)

# ------------------------------------------------------------------------------------------------
# The H-ILP instance over a list of units (App. B.2)


@dataclass
class Item:
    kind: str  # "plain" | "F" | "B" | "loss"
    unit: int  # index in the instance's units (-1 for the loss)
    side: int  # 0 forward, 1 loss, 2 backward (tie-break of the topological order)
    seqs: list[tuple[str, ...]]
    times: list[float]
    m: list[int]
    phantom: list[int]
    deps: list[frozenset[str]]
    corr: list[tuple[tuple[int, frozenset[str]], ...]] = field(default_factory=list)
    outs: list[int] = field(default_factory=list)  # data nodes it produces


@dataclass
class Instance:
    units: list[Unit]
    items: list[Item]
    sizes: list[int]  # s_d
    producer: list[int]  # item producing data node d
    users: list[list[tuple[int, int]]]  # (item, option) pairs that read d
    final: list[bool]
    layer_of: dict[int, tuple[int, int]]  # unit index -> (F item, B item)
    loss: int | None
    data: dict[str, int] = field(default_factory=dict)


def build_instance(
    ctx: Ctx, units: list[Unit], with_loss: bool, order: dict[str, int] | None = None
) -> Instance:
    """Compute nodes (F_j/B_j per layer, one per plain unit, the virtual loss when the instance
    is a layer being solved for its options) and data nodes (values crossing between them).
    ``order`` (operator -> position in a whole-graph schedule) orders the compute nodes by
    their last operator there (when the schedule has run all of it), so that the schedule
    reads as phases of this instance (:func:`remat_cli.solvers.hilp.warmstart.flat_hint`)."""
    raw: list[Item] = []
    for ui, u in enumerate(units):
        if u.layer:
            raw.append(
                Item(
                    "F",
                    ui,
                    0,
                    [o.fwd for o in u.options],
                    [o.time_f for o in u.options],
                    [o.m_f for o in u.options],
                    [o.phantom for o in u.options],
                    [o.deps_f for o in u.options],
                    [o.corr_f for o in u.options],
                )
            )
            raw.append(
                Item(
                    "B",
                    ui,
                    2,
                    [o.bwd for o in u.options],
                    [o.time_b for o in u.options],
                    [o.m_b for o in u.options],
                    [o.phantom for o in u.options],
                    [o.deps_b for o in u.options],
                    [o.corr_b for o in u.options],
                )
            )
        else:
            side = 0 if (not ctx.forward or set(u.fwd) <= ctx.forward) else 2
            raw.append(
                Item(
                    "plain",
                    ui,
                    side,
                    [o.fwd for o in u.options],
                    [o.time_f for o in u.options],
                    [o.m_f for o in u.options],
                    [0] * len(u.options),
                    [o.deps_f for o in u.options],
                    [o.corr_f for o in u.options],
                )
            )
    if with_loss:
        raw.append(Item("loss", -1, 1, [()], [0.0], [0], [0], [frozenset()], [()]))
    owner: dict[str, int] = {}
    for k, it in enumerate(raw):
        if it.kind == "loss":
            continue
        u = units[it.unit]
        for n in u.bwd if it.kind == "B" else u.fwd:
            owner[n] = k
    all_owned = set(owner)
    loss_k = len(raw) - 1 if with_loss else None
    # data nodes: values that cross their unit's boundary
    data: dict[str, int] = {}
    sizes: list[int] = []
    prod: list[int] = []
    final: list[bool] = []
    loss_uses: list[str] = []
    for k, it in enumerate(raw):
        if it.kind == "loss":
            continue
        u = units[it.unit]
        owned_u = u.owned
        for n in u.bwd if it.kind == "B" else u.fwd:
            for v in ctx.nodes[n].outputs:
                if not ctx.crossing(v, owned_u):
                    continue
                outside = v in ctx.outputs or any(c not in all_owned for c in ctx.consumers[v])
                is_final = outside
                if outside and with_loss and n in ctx.forward:
                    is_final = v in ctx.outputs
                    loss_uses.append(v)
                data[v] = len(sizes)
                sizes.append(ctx.size(v))
                prod.append(k)
                final.append(is_final)
    users: list[list[tuple[int, int]]] = [[] for _ in sizes]

    def add_data(v: str, size: int, producer: int) -> int:
        data[v] = len(sizes)
        sizes.append(size)
        prod.append(producer)
        final.append(False)
        users.append([])
        return data[v]

    for k, it in enumerate(raw):
        for o, deps in enumerate(it.deps):
            for v in sorted(deps):
                if v in data:
                    if prod[data[v]] != k:
                        users[data[v]].append((k, o))
                elif with_loss and v not in ctx.resident and ctx.producer.get(v) not in ctx.forward:
                    # an incoming gradient: produced after the forward part, i.e. by the loss
                    add_data(v, ctx.size(v), loss_k)  # type: ignore[arg-type]
                    users[data[v]].append((k, o))
    if with_loss:
        assert loss_k is not None
        for v in loss_uses:
            users[data[v]].append((loss_k, 0))
        d = add_data(TOKEN, 0, loss_k)
        for k, it in enumerate(raw):
            if it.side == 2:
                users[d].extend((k, o) for o in range(len(it.seqs)))
    # topological order of the items (by data dependencies and F_j before B_j)
    n_items = len(raw)
    succ: list[set[int]] = [set() for _ in range(n_items)]
    for d, us in enumerate(users):
        for k, _ in us:
            if k != prod[d]:
                succ[prod[d]].add(k)
    for k, it in enumerate(raw):
        if it.kind == "F":
            succ[k].add(k + 1)
    indeg = [0] * n_items
    for k in range(n_items):
        for s in succ[k]:
            indeg[s] += 1

    def key(k: int) -> tuple[int, int, int]:
        # among ready items, the one the graph's own order finishes first: a forward item by
        # its first operator, a backward one by its last (a backward block can hold operators
        # that the order runs early, e.g. ONNX's max-pool index arithmetic; by its first one
        # such a block would jump ahead and keep large gradients alive across it)
        it = raw[k]
        if order is not None and it.kind != "loss":
            u = units[it.unit]
            return (
                0,
                max((order[n] for n in (u.bwd if it.kind == "B" else u.fwd) if n in order), default=0),
                k,
            )
        pos = [ctx.pos[n] for n in it.seqs[0]]
        at = (max(pos) if it.side == 2 else min(pos)) if pos else 0
        return (it.side, at, k)

    ready = [key(k) for k in range(n_items) if indeg[k] == 0]
    heapq.heapify(ready)
    ranked: list[int] = []
    while ready:
        *_, k = heapq.heappop(ready)
        ranked.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, key(s))
    if len(ranked) != n_items:
        raise AssertionError("H-ILP instance has a cyclic dependency between compute nodes")
    new_index = {k: i for i, k in enumerate(ranked)}
    items = [raw[k] for k in ranked]
    prod = [new_index[p] for p in prod]
    users = [sorted((new_index[k], o) for k, o in us) for us in users]
    for d, p in enumerate(prod):
        items[p].outs.append(d)
    layer_of: dict[int, tuple[int, int]] = {}
    for i, it in enumerate(items):
        if it.kind in ("F", "B"):
            f, b = layer_of.get(it.unit, (-1, -1))
            layer_of[it.unit] = (i, b) if it.kind == "F" else (f, i)
    loss = next((i for i, it in enumerate(items) if it.kind == "loss"), None)
    return Instance(units, items, sizes, prod, users, final, layer_of, loss, data)


class _Rows:
    """Collects sparse rows, then hands them to the LinearModel in one block."""

    def __init__(self) -> None:
        self.r: list[int] = []
        self.c: list[int] = []
        self.v: list[float] = []
        self.lb: list[float] = []
        self.ub: list[float] = []

    def add(self, terms: Sequence[tuple[int | None, float]], lb: float, ub: float) -> None:
        row = len(self.lb)
        for c, v in terms:
            if c is not None and v != 0:
                self.r.append(row)
                self.c.append(c)
                self.v.append(v)
        self.lb.append(lb)
        self.ub.append(ub)

    def flush(self, m: LinearModel) -> None:
        if self.lb:
            m.add_constraints(self.r, self.c, self.v, np.array(self.lb), np.array(self.ub))


class OutOfTime(Exception):
    """Building an H-ILP passed its deadline: the model is O(T^2) rows in the items T, and a top
    level the H-Partition could not shrink (e.g. a random DAG) takes minutes to build."""


def hilp_model(
    inst: Instance,
    budget: int,
    corrections: bool = False,
    kept_budget: int | None = None,
    deadline: float | None = None,
    integral: bool = False,
) -> tuple[LinearModel, dict[tuple[int, int, int], int]]:
    """The H-ILP of App. B.2-B.3 for `inst` under `budget` (bytes, scaled by their gcd).

    One deliberate departure: eq. (8) is split in two rows (see there) so that F_j may run again
    before B_j with its phantom in memory, to recompute its outputs; every schedule the paper's
    rows allow is still allowed.

    Variables (all binary): R^t_{k,o}, P^t_d, Sp^t_{j,o}, C^t_d, D^t_{k,d}. Every data node here
    has one producer, so S^t_{k,d} coincides with P^t_d (with a single contribution, "d holds
    k's contribution" and "d is in memory" are the same event) and is not duplicated.
    The memory after each node, U^t_k, is continuous and free; with ``integral`` (CP-SAT takes
    integer variables with finite bounds only) it is an integer between minus and plus the sum
    of its defining terms' magnitudes: every coefficient is a scaled byte count, so U^t_k is an
    integer wherever the binaries are, and the model's solutions are the same.
    Returns the model and the column of each R^t_{k,o} keyed (t, k, o). OutOfTime once the
    wall clock passes `deadline` (epoch seconds)."""

    def tick() -> None:
        if deadline is not None and time.time() > deadline:
            raise OutOfTime

    items = inst.items
    T = len(items)
    nd = len(inst.sizes)
    allsizes = [s for s in inst.sizes if s > 0]
    allsizes += [x for it in items for x in it.m + it.phantom if x > 0]
    g = 0
    for s in allsizes:
        g = math.gcd(g, int(s))
    g = max(g, 1)
    # coarsen huge byte counts so the memory rows stay well-scaled (rounding up: conservative)
    g = max(g, max(allsizes, default=1) // 1_000_000 or 1)

    def sc(x: int) -> int:
        return -(-int(x) // g)

    s_d = [sc(s) for s in inst.sizes]
    B = int(budget // g)
    cost: list[float] = []

    def var(c: float = 0.0) -> int:
        cost.append(c)
        return len(cost) - 1

    R: dict[tuple[int, int, int], int] = {}
    for t in range(T):
        tick()
        for k in range(t + 1):
            for o, tm in enumerate(items[k].times):
                R[(t, k, o)] = var(tm)  # objective, eq. (2)
    P: dict[tuple[int, int], int] = {}
    for d in range(nd):
        tick()
        for t in range(inst.producer[d] + 1, T + 1):
            P[(t, d)] = var()
    layers = sorted(inst.layer_of.items())
    Sp: dict[tuple[int, int, int], int] = {}
    for j, (f, _b) in layers:
        tick()
        for t in range(f + 1, T + 1):
            for o in range(len(items[f].seqs)):
                Sp[(t, j, o)] = var()
    C: dict[tuple[int, int], int] = {}
    for d in range(nd):
        tick()
        for t in range(inst.producer[d], T):
            C[(t, d)] = var()
    # related compute nodes of each data node: its producer and the items of its users
    related: list[list[int]] = []
    use_opts: list[dict[int, list[int]]] = []
    for d in range(nd):
        tick()
        uo: dict[int, list[int]] = defaultdict(list)
        for k, o in inst.users[d]:
            uo[k].append(o)
        use_opts.append(uo)
        related.append(sorted({inst.producer[d], *uo}))
    D: dict[tuple[int, int, int], int] = {}
    for d in range(nd):
        tick()
        for t in range(inst.producer[d], T):
            for k in related[d]:
                if k <= t:
                    D[(t, k, d)] = var()
    # U^t_k of App. B.3 (the memory after node k of phase t), continuous and defined iteratively
    # as the paper does: substituted into eq. (10) each memory row would hold every data node's
    # P^t_d and every earlier C and D of its phase (torch_transformer_train's refined top at
    # 50%: 1.36M nonzeros built in 0.71 s; with U^t_k 263k in 0.23 s)
    n_bin = len(cost)
    U: dict[tuple[int, int], int] = {}
    for t in range(T):
        for k in range(t + 1):
            U[(t, k)] = n_bin + len(U)
    m = LinearModel("hilp")
    m.add_vars(n_bin, lb=0.0, ub=1.0, integer=True, cost=np.array(cost))
    rows = _Rows()
    inf = math.inf

    def CR(t: int, k: int) -> list[tuple[int | None, float]]:
        return [(R[(t, k, o)], 1.0) for o in range(len(items[k].times))] if k <= t else []

    def Rsum(t: int, k: int, opts: list[int]) -> list[tuple[int | None, float]]:
        return [(R[(t, k, o)], 1.0) for o in opts] if k <= t else []

    # (5) at most one option per computation; validity: node t is computed in phase t
    for t in range(T):
        tick()
        for k in range(t + 1):
            rows.add(CR(t, k), 1.0 if k == t else 0.0, 1.0)
    # the loss node runs exactly once
    if inst.loss is not None:
        rows.add([term for t in range(inst.loss, T) for term in CR(t, inst.loss)], 1.0, 1.0)
    # phantom nodes, (6)-(9)
    for j, (f, b) in layers:
        tick()
        nopt = len(items[f].seqs)
        for t in range(f + 1, T + 1):
            rows.add([(Sp[(t, j, o)], 1.0) for o in range(nopt)], -inf, 1.0)  # (6)
        for t in range(f, T):
            for o in range(nopt):
                sp_t = Sp.get((t, j, o))
                sp_n = Sp[(t + 1, j, o)]
                rf = R[(t, f, o)]
                rb = R.get((t, b, o))
                rows.add([(sp_n, 1.0), (sp_t, -1.0), (rf, -1.0)], -inf, 0.0)  # (7)
                # (8) as two rows: deleted only by B_j (8a), created by F_j (8b). The paper's
                # single row Sp^{t+1} >= Sp^t + R_F - R_B also forbids running F_j again while
                # its phantom is in memory, i.e. recomputing F_j's outputs before B_j -- the
                # checkpointing lever between top-level layers
                rows.add([(sp_n, 1.0), (sp_t, -1.0), (rb, 1.0)], 0.0, inf)  # (8a)
                rows.add([(sp_n, 1.0), (rf, -1.0), (rb, 1.0)], 0.0, inf)  # (8b)
                if rb is not None:
                    rows.add([(rb, 1.0), (sp_t, -1.0), (rf, -1.0)], -inf, 0.0)  # (9)
    # final data nodes are in memory after the last phase
    for d in range(nd):
        tick()
        if inst.final[d]:
            rows.add([(P[(T, d)], 1.0)], 1.0, 1.0)
    # data dependencies (incl. option-specific ones): R^t_{k',o} <= CR^t_k + P^t_d
    for d in range(nd):
        tick()
        k = inst.producer[d]
        for k2, o in inst.users[d]:
            for t in range(k2, T):
                rows.add(
                    [(R[(t, k2, o)], 1.0), *[(c, -1.0) for c, _ in CR(t, k)], (P.get((t, d)), -1.0)],
                    -inf,
                    0.0,
                )
    # liveness: A^t_{k,d} = P^t_d + C^t_d - sum_{k' <= k related} D^t_{k',d}
    for d in range(nd):
        tick()
        p = inst.producer[d]
        for t in range(p, T):
            rel = [k for k in related[d] if k <= t]
            acc: list[tuple[int | None, float]] = [(P.get((t, d)), 1.0)]
            for k in rel:
                if k == p:
                    acc.append((C[(t, d)], 1.0))
                acc.append((D[(t, k, d)], -1.0))
                rows.add(acc, 0.0, 1.0)  # 0 <= A <= 1
                if k == p:
                    # A >= CR_k - D_{k,d};  C <= CR_k
                    rows.add([*acc, *[(c, -1.0) for c, _ in CR(t, k)], (D[(t, k, d)], 1.0)], 0.0, inf)
                    rows.add([(C[(t, d)], 1.0), *[(c, -1.0) for c, _ in CR(t, k)]], -inf, 0.0)
            # P^{t+1}_d = A^t at the last related node
            rows.add([*acc, (P[(t + 1, d)], -1.0)], 0.0, 0.0)
            # linearised deletion rule (Checkmate §4.5 style, App. B.3)
            for k in rel:
                X = CR(t, k) if k == p else Rsum(t, k, use_opts[d][k])
                later = [(k2, opts) for k2, opts in use_opts[d].items() if k < k2 <= t]
                use = [term for k2, opts in later for term in Rsum(t, k2, opts)]
                h = 2 + len(later)
                dv = D[(t, k, d)]
                pn = P[(t + 1, d)]
                rows.add([(dv, 1.0), *[(c, -1.0) for c, _ in X], (pn, 1.0), *use], 0.0, inf)
                neg_use = [(c, -v) for c, v in use]
                rows.add([(dv, -float(h)), *X, (pn, -1.0), *neg_use], 1.0 - h, inf)
    # memory: U^t_0 = M_t + IF_0 and U^t_k = U^t_{k-1} + IF_k (or IB_k), then eq. (10) per (t, k)
    mem_rows: list[tuple[int, int, int]] = []
    udef = _Rows()  # U^t_k's terms other than U^t_{k-1}, for `complete`
    for t in range(T):
        tick()
        # M_t: the data and phantom nodes in memory before phase t
        base: list[tuple[int | None, float]] = [(P.get((t, d)), float(s_d[d])) for d in range(nd) if s_d[d]]
        for j, (f, _b) in layers:
            for o in range(len(items[f].seqs)):
                pj = sc(items[f].phantom[o])
                if pj:
                    base.append((Sp.get((t, j, o)), float(pj)))
        for k in range(t + 1):
            it = items[k]
            inc = list(base) if k == 0 else []  # IF_k / IB_k
            for d in it.outs:
                if s_d[d]:
                    inc.append((C[(t, d)], float(s_d[d])))
            del_d = [d for d in range(nd) if (t, k, d) in D and s_d[d]]
            dels = [(D[(t, k, d)], float(s_d[d])) for d in del_d]
            inc.extend((c, -v) for c, v in dels)
            if it.kind == "F":
                for o in range(len(it.seqs)):
                    pj = sc(it.phantom[o])
                    if pj:
                        inc.append((R[(t, k, o)], float(pj)))
            elif it.kind == "B":
                j = it.unit
                f = inst.layer_of[j][0]
                for o in range(len(it.seqs)):
                    pj = sc(it.phantom[o])
                    if pj:
                        inc.extend([(R[(t, f, o)], -pj), (Sp.get((t, j, o)), -pj), (Sp[(t + 1, j, o)], pj)])
            prev = [(U[(t, k - 1)], -1.0)] if k else []
            rows.add([(U[(t, k)], 1.0), *prev, *[(c, -v) for c, v in inc]], 0.0, 0.0)
            udef.add(inc, 0.0, 0.0)
            acc = [(U[(t, k)], 1.0)]
            over = [(R[(t, k, o)], float(sc(it.m[o]))) for o in range(len(it.seqs)) if it.m[o]]
            mem_rows.append((len(rows.lb), t, k))
            if kept_budget is not None and k == inst.loss and t == inst.loss:
                # what the forward part leaves for the backward part (the layer's phantom)
                rows.add(acc, -inf, float(kept_budget // g))
            if not (corrections and any(len(sq) > 1 for sq in it.seqs)):
                rows.add([*acc, *over, *dels], -inf, float(B))  # (10)
            else:
                # App. B.3 correction terms, in place of (10): one row per option and per class
                # of sub-steps, the inputs no sub-step from i on reads being deleted early
                for o in range(len(it.seqs)):
                    for excess, done in it.corr[o]:
                        freed = {inst.data[v] for v in done if v in inst.data}
                        keep = [(c, v) for (c, v), d in zip(dels, del_d, strict=True) if d not in freed]
                        rows.add([*acc, (R[(t, k, o)], float(sc(excess))), *keep], -inf, float(B))
    u_first = np.array([t * (t + 1) // 2 for t, _k in U], dtype=np.int64)
    if integral:
        # |U^t_k| is at most the running sum of its phase's term magnitudes up to k
        reach = _phase_sums(np.bincount(udef.r, weights=np.abs(udef.v), minlength=len(U)), u_first)
        u_cols = m.add_vars(len(U), lb=-reach, ub=reach, integer=True)
    else:
        u_cols = m.add_vars(len(U), lb=-math.inf, ub=math.inf, integer=False)
    first = m.num_constraints
    rows.flush(m)
    m.mem_rows = [(first + r, t, k) for r, t, k in mem_rows]  # type: ignore[attr-defined]
    m.mem_scale = g  # type: ignore[attr-defined]
    m.mem_budget = float(B)  # type: ignore[attr-defined]
    m.var_maps = (R, P, Sp, C, D)  # type: ignore[attr-defined]
    m.u_cols = u_cols  # type: ignore[attr-defined]
    m.u_def = sp.csr_matrix(  # type: ignore[attr-defined]
        (np.array(udef.v), (np.array(udef.r, dtype=np.int64), np.array(udef.c, dtype=np.int64))),
        shape=(len(u_cols), m.num_vars),
    )
    m.u_first = u_first  # type: ignore[attr-defined]
    return m, R


def _phase_sums(inc: np.ndarray, first: np.ndarray) -> np.ndarray:
    """Running sums of ``inc`` (one entry per U^t_k, in (t, k) order) restarted at each phase:
    ``first`` is the index of U^t_0 for each entry's phase t."""
    run = np.cumsum(inc)
    before = np.where(first > 0, run[np.maximum(first - 1, 0)], 0.0)
    return run - before


def complete(model: LinearModel, x: np.ndarray) -> np.ndarray:
    """``x`` with its U^t_k set from the binary variables (their defining rows hold): every start
    the warm-start code builds sets only the binaries."""
    x[model.u_cols] = _phase_sums(model.u_def @ x, model.u_first)  # type: ignore[attr-defined]
    return x


def decode(inst: Instance, x: np.ndarray, R: dict[tuple[int, int, int], int]) -> list[tuple[int, int]]:
    """The (compute node, option) sequence of an H-ILP solution, phase by phase."""
    out: list[tuple[int, int]] = []
    T = len(inst.items)
    for t in range(T):
        for k in range(t + 1):
            for o in range(len(inst.items[k].seqs)):
                if x[R[(t, k, o)]] > 0.5:
                    out.append((k, o))
    return out


def flatten(inst: Instance, sched: list[tuple[int, int]]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Operator sequences of a schedule: (before the loss, after it); all in the first part
    when the instance has no loss."""
    fwd: list[str] = []
    bwd: list[str] = []
    cur = fwd
    for k, o in sched:
        if inst.items[k].kind == "loss":
            cur = bwd
            continue
        cur.extend(inst.items[k].seqs[o])
    return tuple(fwd), tuple(bwd)


def trivial(inst: Instance, pick: str) -> list[tuple[int, int]]:
    """Every compute node once, in order, with its fastest ("time"), smallest-peak ("peak") or
    least-kept ("kept") option."""
    out = []
    for k, it in enumerate(inst.items):
        if it.kind == "loss":
            out.append((k, 0))
            continue
        u = inst.units[it.unit]
        if pick == "time":
            o = min(range(len(u.options)), key=lambda i: (u.options[i].time, u.options[i].peak))
        elif pick == "peak":
            o = min(range(len(u.options)), key=lambda i: (u.options[i].peak, u.options[i].time))
        else:  # "kept": the least memory held from forward to backward
            o = min(range(len(u.options)), key=lambda i: (u.options[i].phantom, u.options[i].peak))
        out.append((k, o))
    return out
