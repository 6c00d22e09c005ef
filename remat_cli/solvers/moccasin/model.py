"""The retention-interval constraint program of MOCCASIN (its variables and constraints), for CP-SAT.

Paper: Bartan, Li, Teague, Lott, Dilkina, "MOCCASIN: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023, PMLR 202, arXiv:2304.14463, §2 whole:

- §2.1 eqs. (1)–(9): every node v owns up to C_v *retention intervals* [s_v^i, e_v^i] with a
  presence literal a_v^i; an interval's first event computes v, the rest retains its output.
- §2.2: memory (4) as a CP ``cumulative``; precedence (5) as ``reservoir`` constraints with
  actives built from the level changes of eq. (10) (``--precedence reservoir``), or — the
  default — as the disjunction of (5) written directly with one literal per predecessor copy
  ("this copy of u covers this start of v"). Both state the same constraint; CP-SAT's presolve
  expands each reservoir into such literals *plus* order literals between every pair of its
  events, a model several times larger (measured on 2 loaded cores: RL n100 at 90% proved
  optimal in 5.5 s vs 2.3 s; RL n250 at 90% after 60 s, 1.06% vs 0.90% duration increase).
- §2.3 eq. (11): the *staged* time domain that enforces the input topological order — stage j
  has j events, event k of a stage may only compute node k, and the first interval of node j is
  pinned to the last event of stage j. This is the default, as in the paper's tables.
- §2.4 eqs. (12)–(13): phase 1 minimises max(M_var, M) to reach a memory-feasible solution;
  phase 2 minimises the total duration (1) starting from it as a hint.

Conventions of this implementation (each is a relabelling, not a change of the model):

- **Half-open intervals.** CP-SAT intervals are [start, end): an interval occupies the events
  s ≤ t < e. Our ``e`` is the paper's e + 1, so the paper's closed (4) "s ≤ t ≤ e" and (5)
  "s_u + 1 ≤ s_v ≤ e_u" read s_u < s_v < e_u here — exactly what the reservoir of eq. (10)
  enforces, whose −1 at e_u makes an interval that ends at s_v not cover it.
- **Graph folding.** The model works on ``graph.node_view``: one memory block m_v per node
  (its outputs are kept and freed together), graph outputs (``keep``) retained to the end,
  nodes no output needs are not modelled, ``recomputable=False`` means C_v = 1, a node's
  ``workspace`` is an extra demand on its compute event only, and resident inputs/parameters
  reduce the capacity to M − resident.
- **Integer data.** CP-SAT is integral: memory is divided by the gcd of all sizes (exact), and
  durations w_v are scaled to integers preserving their ratios (exact for costs with at most
  six decimals, otherwise rounded at 1e-6 of the largest cost; `integer_costs`).
- **Stage numbering.** Staged events are numbered n·J + k instead of eq. (11)'s
  J(J−1)/2 + k + 1 (same events, same order, plus empty ones), so a copy's start is affine in
  its stage variable J (see `_Space`).
- **Symmetry.** Copies of a node are used in order (a^{i+1} ⇒ a^i) and absent copies are pinned;
  in the free-order variant present copies occupy events 1..K without gaps.
- **Starting points** (none from the paper). Phase 2 starts from the cheapest memory-feasible
  candidate among ``--hint``, the `greedy` solver (when installed; when its schedule does not fit once
  repaired, its split strategies run one by one at 98.5%, 97%, 95% of the budget until one fits), the baseline and a staged eviction heuristic
  (`staged_eviction`). A schedule with more than C_v computations of a node is cut to C_v and
  rid of recomputations the budget does not need (`repair_sequence`); one that ends up at most 5% over
  the budget is brought within it by splitting intervals (`lower_peak`). This is what closes
  the tight rows of Table 3: CP-SAT's search on these models is slowed by the cumulative over
  ~2n intervals (on large graphs one LNS neighbourhood takes seconds of wall time), so the start
  matters more than the search. Phase 1
  runs only when none fits, from the lowest-peak one, and its result is pruned by `repair_sequence`.
- **Decoding.** Present intervals sorted by start give the compute sequence; the shared
  ``steps_from_sequence`` frees every value right after its last use, which never uses more
  memory than the intervals retained, so the simulator confirms the budget.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

from ortools.sat.python import cp_model

from remat_cli.graph import NodeView

#: Interval = (start event, end event) with the half-open convention of the module docstring.
Interval = tuple[int, int]


def integer_costs(costs: Sequence[float]) -> tuple[list[int], float]:
    """Durations w_v as integers with the same ratios, and the factor back to the input units.

    Costs with up to six decimals are scaled exactly (then divided by their gcd); anything else
    is rounded to 1e-6 of the largest cost. Returns (w_int, unit) with w ≈ w_int * unit.
    """
    for digits in range(7):
        scaled = [c * 10**digits for c in costs]
        if all(abs(x - round(x)) <= 1e-9 * max(1.0, abs(x)) for x in scaled):
            ints = [round(x) for x in scaled]
            g = reduce(math.gcd, ints, 0) or 1
            return [x // g for x in ints], g / 10**digits
    top = max(costs)
    ints = [round(c / top * 1_000_000) for c in costs]
    g = reduce(math.gcd, ints, 0) or 1
    return [x // g for x in ints], float(Fraction(top) * g / 1_000_000)


@dataclass
class _Space:
    """The time domain D and which events may start which copy: §2.1 eq. (9) or §2.3 eq. (11).

    Nodes are the modelled (needed) nodes, indexed k = 0..n-1 in the input topological order.
    Staged events are numbered ``n·J + k`` for event k+1 of stage J (1-based) instead of eq.
    (11)'s ``J(J-1)/2 + k + 1``: the same events in the same order (k < n), plus empty events
    that change nothing (§2: memory only rises at compute events). The relabelling makes the
    start of a copy an affine function of its stage J, so CP-SAT works with the dense domain of
    J instead of a sparse set of O(n) values in a domain of size O(n²), which its presolve
    handles very slowly.
    """

    n: int
    copies: list[int]  # C_v after capping
    staged: bool
    horizon: int  # events lie in 1..horizon; a kept output's interval ends at horizon + 1

    @staticmethod
    def build(n: int, c_v: list[int], staged: bool) -> _Space:
        if staged:
            # node k can be computed at most once per stage k+1..n (§2.3)
            copies = [min(c, n - k) for k, c in enumerate(c_v)]
            return _Space(n, copies, True, n * n + n - 1)
        return _Space(n, list(c_v), False, sum(c_v))

    def event(self, k: int, stage: int) -> int:
        """Event k+1 of stage `stage` (1-based): node k's only slot in that stage (§2.3)."""
        return self.n * stage + k

    def first_stage(self, k: int, i: int) -> int:
        """Copy i (0-based) of node k: the first copy is pinned to stage k+1 (§2.3); copies lie in
        distinct increasing stages, so copy i is computed in stage k+1+i or later."""
        return k + 1 + i

    def last_start(self, k: int) -> int:
        if not self.staged:
            return self.horizon
        return self.event(k, self.n if self.copies[k] > 1 else k + 1)


Expr = cp_model.LinearExprT


@dataclass
class Model:
    """CP-SAT variables of eqs. (1)–(13) and the data they were built from."""

    model: cp_model.CpModel
    space: _Space
    nodes: list[int]  # NodeView index of each modelled node
    mem: list[int]  # m_v / gcd
    ws: list[int]  # workspace / gcd
    w: list[int]  # integer durations w_v
    preds: list[list[int]]
    keep: list[bool]
    s: list[list[Expr]]  # s_v^i (staged: n·J_v^i + k, with J the stage variable)
    stage: list[list[cp_model.IntVar | None]]  # J_v^i (staged, i ≥ 1)
    e: list[list[cp_model.IntVar]]
    size: list[list[cp_model.IntVar]]
    a: list[list[cp_model.IntVar | int]]
    absent: list[list[int]]  # the pinned start of an absent copy
    cover: list[tuple[int, int, int, int, cp_model.IntVar]]  # (u, j, v, i, literal)
    m_var: cp_model.IntVar
    duration: cp_model.LinearExpr


def build_model(
    view: NodeView, cap: int, unit_mem: int, w: list[int], c_v: int, staged: bool, precedence: str
) -> Model:
    """The CP-SAT model of eqs. (1)-(13) over the needed nodes of `view`: each node's copies as
    optional retention intervals, the memory cumulative against `cap` (in `unit_mem` units),
    eq. (5)'s precedence as `precedence` ("reservoir" or "literals"), staged (§2.3) or free."""
    nodes = list(view.needed_index)
    local = {v: k for k, v in enumerate(nodes)}
    n = len(nodes)
    preds = [[local[p] for p in view.preds[v]] for v in nodes]
    succs: list[list[int]] = [[] for _ in range(n)]
    for k, ps in enumerate(preds):
        for p in ps:
            succs[p].append(k)
    keep = [view.keep[v] for v in nodes]
    mem = [view.mem[v] // unit_mem for v in nodes]
    ws = [view.workspace[v] // unit_mem for v in nodes]
    cv = [c_v if view.recomputable[v] else 1 for v in nodes]
    space = _Space.build(n, cv, staged)
    H = space.horizon
    model = cp_model.CpModel()
    s: list[list[Expr]] = []
    stage: list[list[cp_model.IntVar | None]] = []
    e: list[list[cp_model.IntVar]] = []
    size: list[list[cp_model.IntVar]] = []
    a: list[list[cp_model.IntVar | int]] = []
    absent: list[list[int]] = []
    intervals = _Intervals([], [], [])
    for k in range(n):
        # An interval of a node that is not kept is useless after its last possible reader.
        end_ub = H + 1 if keep[k] else max((space.last_start(u) for u in succs[k]), default=0) + 1
        sk, jk, ek, zk, ak, absk = _copies(model, space, k, end_ub, keep[k], mem[k], ws[k], intervals)
        s.append(sk)
        stage.append(jk)
        e.append(ek)
        size.append(zk)
        a.append(ak)
        absent.append(absk)

    # eq. (13) (phase 1) / eq. (4) (phase 2, with M_var ≤ M): the memory of the present intervals
    # at every event, against the capacity M − resident.
    peak_ub = sum(mem) + max(ws, default=0)
    m_var = model.new_int_var(min(cap, peak_ub), max(cap, peak_ub), "M_var")
    if intervals.mem:
        model.add_cumulative(intervals.mem, intervals.demands, m_var)

    cover = _precedence(model, space, preds, s, e, a, staged, precedence)

    if not staged:
        # eq. (6): compute events never coincide. The staged domain implies it (§2.3); here the
        # unit compute intervals of present copies may not overlap.
        model.add_no_overlap(intervals.compute)
        # Idle events change nothing, so present copies use events 1..K without gaps.
        present = sum(x for ak in a for x in ak)
        for k in range(n):
            for i in range(space.copies[k]):
                if isinstance(a[k][i], int):
                    model.add(s[k][i] <= present)
                else:
                    model.add(s[k][i] <= present).only_enforce_if(a[k][i])
    duration = sum(w[k] * x for k in range(n) for x in a[k])  # eq. (1)
    return Model(
        model, space, nodes, mem, ws, w, preds, keep, s, stage, e, size, a, absent, cover, m_var, duration
    )


@dataclass
class _Intervals:
    """The intervals of the cumulative (eq. 4/13, with their demands) and the unit compute
    intervals (eq. 6)."""

    mem: list[cp_model.IntervalVar]
    demands: list[int]
    compute: list[cp_model.IntervalVar]


def _copies(
    model: cp_model.CpModel,
    space: _Space,
    k: int,
    end_ub: int,
    keep_k: bool,
    mem_k: int,
    ws_k: int,
    intervals: _Intervals,
) -> tuple[
    list[Expr], list[cp_model.IntVar | None], list[cp_model.IntVar], list[cp_model.IntVar],
    list[cp_model.IntVar | int], list[int],
]:  # fmt: skip
    """The retention intervals of node k's copies (eqs. 2, 3, 7; staged starts of §2.3): their
    starts s, stages J, ends e, sizes, presence literals a and the pinned starts of absent
    copies. A kept node's last present copy ends after the last event."""
    H = space.horizon
    n = space.n
    staged = space.staged
    sk: list[Expr] = []
    jk: list[cp_model.IntVar | None] = []
    ek: list[cp_model.IntVar] = []
    zk: list[cp_model.IntVar] = []
    ak: list[cp_model.IntVar | int] = []
    absk: list[int] = []
    for i in range(space.copies[k]):
        lit: cp_model.IntVar | int = 1 if i == 0 else model.new_bool_var(f"a{k}_{i}")  # eq. (7)
        jvar: cp_model.IntVar | None = None
        start: Expr
        if staged:
            lo_stage = space.first_stage(k, i)
            lo = space.event(k, lo_stage)
            if i == 0:
                start = lo  # §2.3: s_v^1 is pinned to the last event of stage v
            else:
                jvar = model.new_int_var(lo_stage, n, f"J{k}_{i}")
                start = n * jvar + k
        else:
            lo = 1
            start = model.new_int_var(1, H, f"s{k}_{i}")
        hi_end = max(end_ub, lo + 1)
        end = model.new_int_var(lo + 1, hi_end, f"e{k}_{i}")
        z = model.new_int_var(1, hi_end - lo, f"z{k}_{i}")
        # eq. (2) s ≤ e (strict when half-open: the compute event is part of the interval)
        iv = model.new_optional_interval_var(start, z, end, lit, f"r{k}_{i}")
        if mem_k > 0:
            intervals.mem.append(iv)
            intervals.demands.append(mem_k)
        unit = model.new_optional_fixed_size_interval_var(start, 1, lit, f"c{k}_{i}")
        intervals.compute.append(unit)
        if ws_k > 0:
            intervals.mem.append(unit)
            intervals.demands.append(ws_k)
        if i > 0:
            assert not isinstance(lit, int)
            # eq. (3) e_v^i ≤ s_v^{i+1}, for present copies; copies are interchangeable, so
            # using them in order (a^{i+1} ⇒ a^i) removes symmetric solutions only.
            model.add(ek[-1] <= start).only_enforce_if(lit)
            model.add_implication(lit, ak[-1])
            # absent copies are pinned, so the search never branches on them
            model.add(start == lo).only_enforce_if(~lit)
            model.add(end == lo + 1).only_enforce_if(~lit)
        sk.append(start)
        jk.append(jvar)
        ek.append(end)
        zk.append(z)
        ak.append(lit)
        absk.append(lo)
    if keep_k:
        # graph outputs stay live to the end: the last present copy ends after event H
        for i in range(len(ak)):
            cond = [ak[i]] if i + 1 == len(ak) else [ak[i], ~ak[i + 1]]  # type: ignore[operator]
            model.add(ek[i] == H + 1).only_enforce_if([c for c in cond if not isinstance(c, int)])
    return sk, jk, ek, zk, ak, absk


def _precedence(
    model: cp_model.CpModel,
    space: _Space,
    preds: list[list[int]],
    s: list[list[Expr]],
    e: list[list[cp_model.IntVar]],
    a: list[list[cp_model.IntVar | int]],
    staged: bool,
    precedence: str,
) -> list[tuple[int, int, int, int, cp_model.IntVar]]:
    """Eq. (5): at every present start of v, one present interval of each predecessor u covers
    it (s_u < s_v < e_u in the half-open convention); the cover literals (u, j, v, i, c)."""
    cover: list[tuple[int, int, int, int, cp_model.IntVar]] = []
    for v in range(space.n):
        for u in preds[v]:
            for i in range(space.copies[v]):
                if precedence == "reservoir":
                    # §2.2: a reservoir with actives and the level changes of eq. (10)
                    times = [s[v][i], s[v][i] + 1]
                    changes = [-1, 1]
                    actives = [a[v][i], a[v][i]]
                    for j in range(space.copies[u]):
                        times += [s[u][j], e[u][j]]
                        changes += [1, -1]
                        actives += [a[u][j], a[u][j]]
                    model.add_reservoir_constraint_with_active(times, changes, actives, 0, 1)
                    continue
                # The same disjunction with one literal per candidate copy j of u:
                # c ⇒ a_u^j ∧ s_u^j + 1 ≤ s_v^i ≤ e_u^j − 1. This is what CP-SAT's presolve
                # expands the reservoir into, minus the order literals between every pair of its
                # events, which make the expanded model several times larger.
                lits = []
                for j in range(space.copies[u]):
                    c = model.new_bool_var(f"c{u}_{j}_{v}_{i}")
                    if not isinstance(a[u][j], int):
                        model.add_implication(c, a[u][j])
                    if staged and i == 0 and j == 0:
                        pass  # s_u^1 < s_v^1 holds by the pinned stages (u precedes v)
                    else:
                        model.add(s[u][j] + 1 <= s[v][i]).only_enforce_if(c)
                    model.add(e[u][j] >= s[v][i] + 1).only_enforce_if(c)
                    lits.append(c)
                    cover.append((u, j, v, i, c))
                if isinstance(a[v][i], int):
                    model.add_bool_or(lits)
                else:
                    model.add_bool_or(lits).only_enforce_if(a[v][i])
    return cover
