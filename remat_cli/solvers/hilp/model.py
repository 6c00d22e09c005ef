"""The H-ILP over an instance (instance.py), its MILP (Gusak et al., *HiREmate*, App. B.2-B.3,
eqs. 2 and 5-10), and decoding a solution into operator sequences.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from remat_cli.milp import LinearModel
from remat_cli.solvers.hilp.instance import Instance


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
    b = _Builder(inst, budget, deadline)
    b.variables()
    b.options_and_phantoms()
    b.dependencies()
    b.liveness()
    b.memory(corrections, kept_budget)
    return b.finish(integral), b.R


class _Builder:
    """The rows of one H-ILP, family by family, in the order the model lists them."""

    def __init__(self, inst: Instance, budget: int, deadline: float | None) -> None:
        self.inst = inst
        self.deadline = deadline
        self.items = inst.items
        self.T = len(inst.items)
        self.nd = len(inst.sizes)
        allsizes = [s for s in inst.sizes if s > 0]
        allsizes += [x for it in self.items for x in it.m + it.phantom if x > 0]
        g = 0
        for s in allsizes:
            g = math.gcd(g, int(s))
        g = max(g, 1)
        # coarsen huge byte counts so the memory rows stay well-scaled (rounding up: conservative)
        self.g = max(g, max(allsizes, default=1) // 1_000_000 or 1)
        self.s_d = [self.sc(s) for s in inst.sizes]
        self.B = int(budget // self.g)
        self.cost: list[float] = []
        self.layers = sorted(inst.layer_of.items())
        self.rows = _Rows()
        self.mem_rows: list[tuple[int, int, int]] = []
        self.udef = _Rows()  # U^t_k's terms other than U^t_{k-1}, for `complete`

    def tick(self) -> None:
        if self.deadline is not None and time.time() > self.deadline:
            raise OutOfTime

    def sc(self, x: int) -> int:
        return -(-int(x) // self.g)

    def var(self, c: float = 0.0) -> int:
        self.cost.append(c)
        return len(self.cost) - 1

    def CR(self, t: int, k: int) -> list[tuple[int | None, float]]:
        R = self.R
        return [(R[(t, k, o)], 1.0) for o in range(len(self.items[k].times))] if k <= t else []

    def Rsum(self, t: int, k: int, opts: list[int]) -> list[tuple[int | None, float]]:
        R = self.R
        return [(R[(t, k, o)], 1.0) for o in opts] if k <= t else []

    def variables(self) -> None:
        """R^t_{k,o} (with the objective, eq. 2), P^t_d, Sp^t_{j,o}, C^t_d and D^t_{k,d}, then
        the U^t_k columns after them."""
        inst, items, T, nd, tick, var = self.inst, self.items, self.T, self.nd, self.tick, self.var
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
        Sp: dict[tuple[int, int, int], int] = {}
        for j, (f, _b) in self.layers:
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
        # U^t_k of App. B.3 (the memory after node k of phase t), continuous and defined
        # iteratively as the paper does: substituted into eq. (10) each memory row would hold
        # every data node's P^t_d and every earlier C and D of its phase, several times the
        # nonzeros
        n_bin = len(self.cost)
        U: dict[tuple[int, int], int] = {}
        for t in range(T):
            for k in range(t + 1):
                U[(t, k)] = n_bin + len(U)
        self.R, self.P, self.Sp, self.C, self.D, self.U = R, P, Sp, C, D, U
        self.related, self.use_opts = related, use_opts
        self.m = LinearModel("hilp")
        self.m.add_vars(n_bin, lb=0.0, ub=1.0, integer=True, cost=np.array(self.cost))

    def options_and_phantoms(self) -> None:
        """Eq. (5), at most one option per computation (node t computed in phase t), the loss
        run once, and the phantom nodes' rows, eqs. (6)-(9)."""
        inst, items, T, rows, CR, R, Sp = self.inst, self.items, self.T, self.rows, self.CR, self.R, self.Sp
        inf = math.inf
        for t in range(T):
            self.tick()
            for k in range(t + 1):
                rows.add(CR(t, k), 1.0 if k == t else 0.0, 1.0)
        # the loss node runs exactly once
        if inst.loss is not None:
            rows.add([term for t in range(inst.loss, T) for term in CR(t, inst.loss)], 1.0, 1.0)
        for j, (f, b) in self.layers:
            self.tick()
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
                    # (8) as two rows: deleted only by B_j (8a), created by F_j (8b). The
                    # paper's single row Sp^{t+1} >= Sp^t + R_F - R_B also forbids running F_j
                    # again while its phantom is in memory, i.e. recomputing F_j's outputs
                    # before B_j -- the checkpointing lever between top-level layers
                    rows.add([(sp_n, 1.0), (sp_t, -1.0), (rb, 1.0)], 0.0, inf)  # (8a)
                    rows.add([(sp_n, 1.0), (rf, -1.0), (rb, 1.0)], 0.0, inf)  # (8b)
                    if rb is not None:
                        rows.add([(rb, 1.0), (sp_t, -1.0), (rf, -1.0)], -inf, 0.0)  # (9)

    def dependencies(self) -> None:
        """Final data nodes in memory after the last phase, and the data dependencies (incl.
        option-specific ones): R^t_{k',o} <= CR^t_k + P^t_d."""
        inst, T, rows, CR, R, P = self.inst, self.T, self.rows, self.CR, self.R, self.P
        for d in range(self.nd):
            self.tick()
            if inst.final[d]:
                rows.add([(P[(T, d)], 1.0)], 1.0, 1.0)
        for d in range(self.nd):
            self.tick()
            k = inst.producer[d]
            for k2, o in inst.users[d]:
                for t in range(k2, T):
                    rows.add(
                        [(R[(t, k2, o)], 1.0), *[(c, -1.0) for c, _ in CR(t, k)], (P.get((t, d)), -1.0)],
                        -math.inf,
                        0.0,
                    )

    def liveness(self) -> None:
        """Liveness A^t_{k,d} = P^t_d + C^t_d - sum_{k' <= k related} D^t_{k',d} and the
        linearised deletion rule (Checkmate §4.5 style, App. B.3)."""
        inst, T, rows, CR, Rsum = self.inst, self.T, self.rows, self.CR, self.Rsum
        P, C, D, related, use_opts = self.P, self.C, self.D, self.related, self.use_opts
        inf = math.inf
        for d in range(self.nd):
            self.tick()
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

    def memory(self, corrections: bool, kept_budget: int | None) -> None:
        """U^t_0 = M_t + IF_0 and U^t_k = U^t_{k-1} + IF_k (or IB_k), then eq. (10) per (t, k),
        or App. B.3's correction terms in its place."""
        for t in range(self.T):
            self.tick()
            # M_t: the data and phantom nodes in memory before phase t
            base: list[tuple[int | None, float]] = [
                (self.P.get((t, d)), float(self.s_d[d])) for d in range(self.nd) if self.s_d[d]
            ]
            for j, (f, _b) in self.layers:
                for o in range(len(self.items[f].seqs)):
                    pj = self.sc(self.items[f].phantom[o])
                    if pj:
                        base.append((self.Sp.get((t, j, o)), float(pj)))
            for k in range(t + 1):
                self._memory_after(t, k, base, corrections, kept_budget)

    def _memory_after(
        self, t: int, k: int, base: list[tuple[int | None, float]], corrections: bool, kept_budget: int | None
    ) -> None:
        """U^t_k's definition and its rows of eq. (10) (or the corrections)."""
        inst, rows, R, Sp, C, D, U, s_d, sc = (
            self.inst,
            self.rows,
            self.R,
            self.Sp,
            self.C,
            self.D,
            self.U,
            self.s_d,
            self.sc,
        )
        inf = math.inf
        it = self.items[k]
        inc = list(base) if k == 0 else []  # IF_k / IB_k
        for d in it.outs:
            if s_d[d]:
                inc.append((C[(t, d)], float(s_d[d])))
        del_d = [d for d in range(self.nd) if (t, k, d) in D and s_d[d]]
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
        self.udef.add(inc, 0.0, 0.0)
        acc = [(U[(t, k)], 1.0)]
        over = [(R[(t, k, o)], float(sc(it.m[o]))) for o in range(len(it.seqs)) if it.m[o]]
        self.mem_rows.append((len(rows.lb), t, k))
        if kept_budget is not None and k == inst.loss and t == inst.loss:
            # what the forward part leaves for the backward part (the layer's phantom)
            rows.add(acc, -inf, float(kept_budget // self.g))
        if not (corrections and any(len(sq) > 1 for sq in it.seqs)):
            rows.add([*acc, *over, *dels], -inf, float(self.B))  # (10)
        else:
            # App. B.3 correction terms, in place of (10): one row per option and per class
            # of sub-steps, the inputs no sub-step from i on reads being deleted early
            for o in range(len(it.seqs)):
                for excess, done in it.corr[o]:
                    freed = {inst.data[v] for v in done if v in inst.data}
                    keep = [(c, v) for (c, v), d in zip(dels, del_d, strict=True) if d not in freed]
                    rows.add([*acc, (R[(t, k, o)], float(sc(excess))), *keep], -inf, float(self.B))

    def finish(self, integral: bool) -> LinearModel:
        """The U^t_k columns, the rows in one block, and what the warm starts and the decoder
        read from the model."""
        m, U, udef = self.m, self.U, self.udef
        u_first = np.array([t * (t + 1) // 2 for t, _k in U], dtype=np.int64)
        if integral:
            # |U^t_k| is at most the running sum of its phase's term magnitudes up to k
            reach = _phase_sums(np.bincount(udef.r, weights=np.abs(udef.v), minlength=len(U)), u_first)
            u_cols = m.add_vars(len(U), lb=-reach, ub=reach, integer=True)
        else:
            u_cols = m.add_vars(len(U), lb=-math.inf, ub=math.inf, integer=False)
        first = m.num_constraints
        self.rows.flush(m)
        m.mem_rows = [(first + r, t, k) for r, t, k in self.mem_rows]  # type: ignore[attr-defined]
        m.mem_scale = self.g  # type: ignore[attr-defined]
        m.mem_budget = float(self.B)  # type: ignore[attr-defined]
        m.var_maps = (self.R, self.P, self.Sp, self.C, self.D)  # type: ignore[attr-defined]
        m.u_cols = u_cols  # type: ignore[attr-defined]
        m.u_def = sp.csr_matrix(  # type: ignore[attr-defined]
            (np.array(udef.v), (np.array(udef.r, dtype=np.int64), np.array(udef.c, dtype=np.int64))),
            shape=(len(u_cols), m.num_vars),
        )
        m.u_first = u_first  # type: ignore[attr-defined]
        return m


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
