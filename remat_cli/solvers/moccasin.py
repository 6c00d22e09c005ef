"""moccasin: the retention-interval constraint program of MOCCASIN, solved with OR-Tools CP-SAT.

Paper: Bartan, Li, Teague, Lott, Dilkina, "MOCCASIN: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023 (`shared/papers/moccasin.txt`), §2 whole:

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
  six decimals, otherwise rounded at 1e-6 of the largest cost; `_integer_costs`).
- **Stage numbering.** Staged events are numbered n·J + k instead of eq. (11)'s
  J(J−1)/2 + k + 1 (same events, same order, plus empty ones), so a copy's start is affine in
  its stage variable J (see `_Space`).
- **Symmetry.** Copies of a node are used in order (a^{i+1} ⇒ a^i) and absent copies are pinned;
  in the free-order variant present copies occupy events 1..K without gaps.
- **Starting points** (none from the paper). Phase 2 starts from the cheapest memory-feasible
  candidate among ``--hint``, the `greedy` solver (when installed; when its schedule does not fit once
  repaired, its split strategies run one by one at 98.5%, 97%, 95% of the budget until one fits), the baseline and a staged eviction heuristic
  (`_staged_eviction`). A schedule with more than C_v computations of a node is cut to C_v and
  rid of recomputations the budget does not need (`_repair`); one that ends up at most 5% over
  the budget is brought within it by splitting intervals (`_lower_peak`). This is what closes
  the tight rows of Table 3 in 120 s on 2 cores: CP-SAT's search on these models is slowed by
  the cumulative over ~2n intervals (at n = 1000, one LNS neighbourhood takes 10-30 s of wall
  time for 0.1 s of deterministic time), so the start matters more than the search. Phase 1
  runs only when none fits, from the lowest-peak one, and its result is pruned by `_repair`.
- **Decoding.** Present intervals sorted by start give the compute sequence; the shared
  ``steps_from_sequence`` frees every value right after its last use, which never uses more
  memory than the intervals retained, so the simulator confirms the budget.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import reduce

from ortools.sat.python import cp_model

from remat_cli.graph import Graph, NodeView
from remat_cli.schedule import Step, baseline_steps, simulate, steps_from_sequence
from remat_cli.solvers.base import Param, SolveOptions, Solver, SolverResult

#: with one worker the search is stopped on CP-SAT's deterministic time (so a seed gives the same
#: schedule twice); this fraction of the wall-clock budget is the deterministic limit, leaving
#: headroom on a loaded machine, where deterministic time runs slower than the wall clock.
DETERMINISTIC_FRACTION = 0.5

#: phase 2 with a time limit and several workers: the full CP-SAT portfolio runs for this share
#: of the time left (at most LNS_AFTER_CAP seconds), then only LNS workers. On two cores the
#: portfolio is one tree-search worker plus one thread cycling through a dozen LNS
#: neighbourhoods; the tree search proves RL n100 optimal in a second but on RL n250 at 80%
#: never improves the incumbent, and LNS-only workers reach 4.92% in 60 s where the portfolio
#: stays at 5.03% for 120 s (measured alone on the 2-core machine).
LNS_AFTER = 0.25
LNS_AFTER_CAP = 30.0

#: Interval = (start event, end event) with the half-open convention of the module docstring.
Interval = tuple[int, int]

#: a start at most this fraction over the budget is brought within it by `_lower_peak`
NEAR_OVER = 0.05
#: with one worker `_lower_peak` stops after this many recomputations instead of on the clock
LOWER_STEPS = 64
#: greedy runs at these fractions of the budget until one (repaired) fits, within GREEDY_SHARE
#: of the time limit
GREEDY_TARGETS = (1.0, 0.985, 0.97, 0.95)
GREEDY_SHARE = 0.25
GREEDY_STRATEGIES = ("split", "split-shallow")
#: with one worker greedy ignores the clock, so its runs are counted instead
GREEDY_CALLS_ONE_WORKER = 3


def _integer_costs(costs: Sequence[float]) -> tuple[list[int], float]:
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
class _Model:
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


def _build(
    view: NodeView, cap: int, unit_mem: int, w: list[int], c_v: int, staged: bool, precedence: str
) -> _Model:
    nodes = [i for i in range(len(view)) if view.needed[i]]
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
    mem_intervals: list[cp_model.IntervalVar] = []
    mem_demands: list[int] = []
    compute_intervals: list[cp_model.IntervalVar] = []
    for k in range(n):
        # An interval of a node that is not kept is useless after its last possible reader.
        end_ub = H + 1 if keep[k] else max((space.last_start(u) for u in succs[k]), default=0) + 1
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
            if mem[k] > 0:
                mem_intervals.append(iv)
                mem_demands.append(mem[k])
            unit = model.new_optional_fixed_size_interval_var(start, 1, lit, f"c{k}_{i}")
            compute_intervals.append(unit)
            if ws[k] > 0:
                mem_intervals.append(unit)
                mem_demands.append(ws[k])
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
        if keep[k]:
            # graph outputs stay live to the end: the last present copy ends after event H
            for i in range(len(ak)):
                cond = [ak[i]] if i + 1 == len(ak) else [ak[i], ~ak[i + 1]]  # type: ignore[operator]
                model.add(ek[i] == H + 1).only_enforce_if([c for c in cond if not isinstance(c, int)])
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
    if mem_intervals:
        model.add_cumulative(mem_intervals, mem_demands, m_var)

    # eq. (5): at every present start of v, one present interval of each predecessor u covers
    # it (s_u < s_v < e_u in the half-open convention).
    cover: list[tuple[int, int, int, int, cp_model.IntVar]] = []
    for v in range(n):
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

    if not staged:
        # eq. (6): compute events never coincide. The staged domain implies it (§2.3); here the
        # unit compute intervals of present copies may not overlap.
        model.add_no_overlap(compute_intervals)
        # Idle events change nothing, so present copies use events 1..K without gaps.
        present = sum(x for ak in a for x in ak)
        for k in range(n):
            for i in range(space.copies[k]):
                if isinstance(a[k][i], int):
                    model.add(s[k][i] <= present)
                else:
                    model.add(s[k][i] <= present).only_enforce_if(a[k][i])
    duration = sum(w[k] * x for k in range(n) for x in a[k])  # eq. (1)
    return _Model(
        model, space, nodes, mem, ws, w, preds, keep, s, stage, e, size, a, absent, cover, m_var, duration
    )


# ---------------------------------------------------------------- solutions <-> sequences


def _intervals_of_sequence(m: _Model, seq: list[int], events: list[int]) -> list[list[Interval]]:
    """Retention intervals for local compute sequence `seq` run at `events`: each production is
    retained until its last reader before the next production of the same node (§2, Fig. 3),
    and a kept output's last production until the end."""
    H = m.space.horizon
    n = len(m.nodes)
    out: list[list[Interval]] = [[] for _ in range(n)]
    open_: dict[int, list[int]] = {}  # node -> [start, last use]
    for k, t in zip(seq, events, strict=True):
        for u in m.preds[k]:
            if u in open_:
                open_[u][1] = t
        if k in open_:
            st, last = open_.pop(k)
            out[k].append((st, last + 1))
        open_[k] = [t, t]
    for k, (st, last) in open_.items():
        out[k].append((st, H + 1 if m.keep[k] else last + 1))
    for lst in out:
        lst.sort()
    return out


def _map_sequence(m: _Model, seq: list[int]) -> list[list[Interval]] | None:
    """Place a local compute sequence in the time domain; None when it does not fit.

    Staged (§2.3): the first computations must follow the input order; a recomputation belongs
    to the stage of the next first computation, where copies run in node order (reordering
    nodes within a stage keeps dependencies, since the input order is topological).
    """
    sp = m.space
    if not sp.staged:
        return _intervals_of_sequence(m, seq, list(range(1, len(seq) + 1)))
    seen: set[int] = set()
    stages: list[set[int]] = []
    pending: set[int] = set()
    for k in seq:
        if k in seen:
            pending.add(k)
            continue
        if k != len(stages):
            return None  # first computations out of the input order
        seen.add(k)
        pending.discard(k)
        stages.append(pending)
        pending = set()
    if len(stages) != sp.n or pending:
        return None
    new_seq: list[int] = []
    events: list[int] = []
    for j, rec in enumerate(stages, start=1):
        for k in sorted(rec) + [j - 1]:
            new_seq.append(k)
            events.append(sp.event(k, j))
    return _intervals_of_sequence(m, new_seq, events)


def _repair(m: _Model, seq: list[int], cap: int) -> list[int] | None:
    """Fit a compute sequence from elsewhere (``--hint``, `greedy`) into the search space.

    Not from the paper: another solver may compute a node more than C_v times, which makes its
    schedule useless as a hint. Dropping a recomputation of v (never the first computation)
    keeps the sequence valid — v's readers use the previous copy, retained longer — at the price
    of memory. The excess copies are dropped one at a time, each time the one whose removal
    gives the lowest peak (eq. (4)); then recomputations that the budget does not need are
    dropped too, costliest first, while the peak stays within `cap` (or does not rise, when it
    was over). None when the first computations do not follow the input order (staged domain).
    """
    ivs = _map_sequence(m, seq)
    if ivs is None:
        return None
    seq = list(seq)
    peak = _folded_peak(m, ivs)

    def recomputations(v: int | None = None) -> list[int]:
        seen: set[int] = set()
        out = []
        for p, k in enumerate(seq):
            if k in seen and (v is None or k == v):
                out.append(p)
            seen.add(k)
        return out

    def peak_without(p: int) -> int | None:
        trial = _map_sequence(m, seq[:p] + seq[p + 1 :])
        return None if trial is None else _folded_peak(m, trial)

    counts: dict[int, int] = {}
    for k in seq:
        counts[k] = counts.get(k, 0) + 1
    for v, c in sorted(counts.items()):
        for _ in range(c - m.space.copies[v]):
            options = [(pk, p) for p in recomputations(v) if (pk := peak_without(p)) is not None]
            if not options:
                return None
            peak, p = min(options)
            del seq[p]
    order = sorted(recomputations(), key=lambda p: (-m.w[seq[p]], p))
    for idx, p in enumerate(order):
        pk = peak_without(p)
        if pk is not None and pk <= max(cap, peak):
            peak = pk
            del seq[p]
            order[idx + 1 :] = [q - (q > p) for q in order[idx + 1 :]]
    return seq


def _peak_excess(m: _Model, ivs: list[list[Interval]], cap: int) -> tuple[int, int, int]:
    """(peak, total excess over `cap` summed over the compute events, event of the peak)."""
    changes: dict[int, int] = {}
    events: set[int] = set()
    for k, lst in enumerate(ivs):
        for st, en in lst:
            changes[st] = changes.get(st, 0) + m.mem[k] + m.ws[k]
            changes[st + 1] = changes.get(st + 1, 0) - m.ws[k]
            changes[en] = changes.get(en, 0) - m.mem[k]
            events.add(st)
    level = peak = excess = 0
    at = -1
    for t in sorted(changes):
        level += changes[t]
        if t in events:
            excess += max(0, level - cap)
            if level > peak:
                peak, at = level, t
    return peak, excess, at


def _lower_peak(
    m: _Model, seq: list[int], cap: int, deadline: float | None, max_steps: int = 10**9
) -> list[int] | None:
    """Bring a start a little over the budget within it by splitting retention intervals.

    Not from the paper; a fast stand-in for phase 1 (§2.4) on near-feasible starts, which keeps
    their cost low where phase 1, blind to the duration, adds many recomputations. At the event
    of highest memory (eq. (4)), every output retained across it but not read there, with a copy
    left, is a candidate: recomputing it right before its next reader ends its interval earlier
    (its inputs are retained longer instead). The candidate lowering the memory over the budget
    (summed over the events) the most per unit of duration is applied, until the peak fits `cap`;
    None when stuck or out of time.
    """
    ivs = _map_sequence(m, seq)
    if ivs is None or not _fits(m, ivs):
        return None
    seq = _sequence_of(ivs)
    peak, excess, t_peak = _peak_excess(m, ivs, cap)
    for _ in range(max_steps):
        if peak <= cap:
            return seq
        if deadline is not None and time.monotonic() > deadline:
            return None
        starts = sorted(st for lst in ivs for st, _ in lst)
        pos = bisect.bisect_left(starts, t_peak)
        node = seq[pos]
        best: tuple[float, list[list[Interval]], tuple[int, int, int]] | None = None
        for k, lst in enumerate(ivs):
            if k == node or k in m.preds[node] or len(lst) >= m.space.copies[k]:
                continue
            if not any(st < t_peak < en for st, en in lst):
                continue
            q = next((i for i in range(pos + 1, len(seq)) if k in m.preds[seq[i]]), None)
            if q is None:
                continue
            t_ivs = _map_sequence(m, seq[:q] + [k] + seq[q:])
            if t_ivs is None or not _fits(m, t_ivs):
                continue
            res = _peak_excess(m, t_ivs, cap)
            gain = (excess - res[1]) / (m.w[k] + 1)
            if res[1] < excess and (best is None or gain > best[0]):
                best = (gain, t_ivs, res)
        if best is None:
            return None
        _, ivs, (peak, excess, t_peak) = best
        seq = _sequence_of(ivs)
    return seq if peak <= cap else None


def _staged_eviction(m: _Model, cap: int, score: int, max_chain: int) -> list[int] | None:
    """A memory-feasible starting point inside the staged space (not from the paper).

    Phase 1 (§2.4) exists because no easy feasible solution is known, and on tight budgets
    CP-SAT spends most of its time there. This walks the stages in order; when an event would
    exceed `cap` it drops a retained output not needed in the rest of the stage (its interval
    then ends right after its last use so far). Candidates are outputs whose recomputation
    needs at most `max_chain` other outputs that are not retained; the one dropped maximises
    m·d/(w + w_chain + 1) (score 0), m·d/(w_chain + 1) (1) or m/(w_chain + 1) (2), with d the
    distance to its next reader and w_chain the cost of that chain. A dropped output that is
    read later is *pending*: it is recomputed (with its chain) in the stage of its next reader,
    in node order, so at most C_v computations are ever needed. When nothing can be dropped the
    event goes over `cap`, and the result can only start phase 1. CP-SAT gets it as a hint.
    """
    n = m.space.n
    consumers: list[list[int]] = [[] for _ in range(n)]
    for v in range(n):
        for u in m.preds[v]:
            consumers[u].append(v)
    for c in consumers:
        c.sort()
    live: set[int] = set()
    pending: set[int] = set()
    level = 0
    count = [0] * n
    seq: list[int] = []

    def next_use(x: int, j: int, memo: dict[int, int]) -> int:
        """The stage of x's next reader (through pending outputs); -1 when none, n+1 if kept."""
        if x in memo:
            return memo[x]
        best = n + 1 if m.keep[x] else -1
        for c in consumers[x]:
            if c > j:
                best = c if best < 0 else min(best, c)
                break
        for c in consumers[x]:
            if c in pending:
                t = next_use(c, j, memo)
                if t >= 0:
                    best = t if best < 0 else min(best, t)
        memo[x] = best
        return best

    for j in range(n):
        need: set[int] = set()
        stack = [j]
        while stack:
            for p in m.preds[stack.pop()]:
                if p not in live and p not in need:
                    need.add(p)
                    stack.append(p)
        stage = sorted(need) + [j]
        for pos, r in enumerate(stage):
            if count[r] >= m.space.copies[r]:
                return None
            pinned = {p for q in stage[pos:] for p in m.preds[q]}
            memo: dict[int, int] = {}
            while level + m.mem[r] + m.ws[r] > cap:
                best, best_key, best_revive = -1, -1.0, set()
                for x in live:
                    if x in pinned or m.keep[x] or count[x] >= m.space.copies[x]:
                        continue
                    # Inputs of x that are not retained must be recomputed with it (those freed
                    # for good are revived as pending); long chains can pile up into one stage.
                    chain: set[int] = set()
                    stack = [x]
                    while stack and len(chain) <= max_chain:
                        for p in m.preds[stack.pop()]:
                            if p not in live and p not in chain:
                                chain.add(p)
                                stack.append(p)
                    if len(chain) > max_chain or any(count[p] >= m.space.copies[p] for p in chain):
                        continue
                    revive = {p for p in chain if p not in pending}
                    dist = next_use(x, j, memo) - j
                    extra = sum(m.w[p] for p in chain)
                    if score == 0:
                        key = m.mem[x] * dist / (m.w[x] + extra + 1)
                    elif score == 1:
                        key = m.mem[x] * dist / (extra + 1)
                    else:
                        key = m.mem[x] / (extra + 1)
                    if key > best_key or (key == best_key and x < best):
                        best, best_key, best_revive = x, key, revive
                if best < 0:
                    break  # stuck: go over `cap` here; the result can still start phase 1
                pending |= best_revive
                live.discard(best)
                pending.add(best)
                level -= m.mem[best]
                memo.clear()
            seq.append(r)
            count[r] += 1
            pending.discard(r)
            live.add(r)
            level += m.mem[r]
            # outputs nobody reads any more (in this stage, later, or through a pending output)
            # are freed right after this event
            still = {p for q in stage[pos + 1 :] for p in m.preds[q]}
            memo = {}
            for x in [x for x in live if x not in still and next_use(x, j, memo) < 0]:
                live.discard(x)
                level -= m.mem[x]
    return seq


def _fits(m: _Model, ivs: list[list[Interval]]) -> bool:
    return all(len(x) <= m.space.copies[k] for k, x in enumerate(ivs))


def _folded_peak(m: _Model, ivs: list[list[Interval]]) -> int:
    """Peak of eq. (4) for these intervals (in gcd units), i.e. what the cumulative sees."""
    changes: dict[int, int] = {}
    for k, lst in enumerate(ivs):
        for st, en in lst:
            changes[st] = changes.get(st, 0) + m.mem[k] + m.ws[k]
            changes[st + 1] = changes.get(st + 1, 0) - m.ws[k]
            changes[en] = changes.get(en, 0) - m.mem[k]
    level = peak = 0
    for t in sorted(changes):
        level += changes[t]
        peak = max(peak, level)
    return peak


def _sequence_of(ivs: list[list[Interval]]) -> list[int]:
    return [k for _, k in sorted((st, k) for k, lst in enumerate(ivs) for st, _ in lst)]


def _hint(m: _Model, ivs: list[list[Interval]], peak: int) -> None:
    """Give CP-SAT a complete hint (every variable), so it starts from this solution."""
    m.model.clear_hints()
    n = m.space.n
    for k in range(len(m.nodes)):
        for i in range(m.space.copies[k]):
            if i < len(ivs[k]):
                (st, en), on = ivs[k][i], 1
            else:
                st, on = m.absent[k][i], 0
                en = st + 1
            if m.stage[k][i] is not None:
                m.model.add_hint(m.stage[k][i], st // n)
            elif not isinstance(m.s[k][i], int):
                m.model.add_hint(m.s[k][i], st)
            if not isinstance(m.a[k][i], int):
                m.model.add_hint(m.a[k][i], on)
            m.model.add_hint(m.e[k][i], en)
            m.model.add_hint(m.size[k][i], en - st)
    for u, j, v, i, c in m.cover:
        on = j < len(ivs[u]) and i < len(ivs[v]) and ivs[u][j][0] < ivs[v][i][0] < ivs[u][j][1]
        m.model.add_hint(c, int(on))
    m.model.add_hint(m.m_var, max(peak, m.m_var.proto.domain[0]))  # M_var ≥ M, eq. (12)


class _Incumbents(cp_model.CpSolverSolutionCallback):
    """Reports each CP-SAT solution (eq. (1) value, bound, decoded steps) to the CLI."""

    def __init__(self, m: _Model, graph: Graph, options: SolveOptions, phase: int, cap: int, unit: float):
        super().__init__()
        self.m, self.graph, self.options = m, graph, options
        self.phase, self.cap, self.unit = phase, cap, unit

    def intervals(self) -> list[list[Interval]]:
        return _read(self.m, self.value)

    def on_solution_callback(self) -> None:
        ivs = self.intervals()
        if self.phase == 1:
            peak = self.value(self.m.m_var)
            self.options.progress(phase=1, peak=peak, elapsed=self.wall_time)
            if peak > self.cap:
                return
        steps = _decode(self.m, self.graph, ivs)
        self.options.incumbent(steps)
        if self.phase == 1:
            self.stop_search()  # phase 1 ends at the first memory-feasible solution (§2.4)
            return
        if self.phase == 2:
            obj, bound = self.objective_value, self.best_objective_bound
            self.options.progress(
                phase=2,
                elapsed=self.wall_time,
                incumbent=obj * self.unit,
                bound=bound * self.unit,
                gap=(obj - bound) / obj if obj else 0.0,
            )


def _read(m: _Model, value: Callable[[Expr], int]) -> list[list[Interval]]:
    """Present intervals per node from a solution (`CpSolver.value` or a callback's `value`)."""
    out: list[list[Interval]] = []
    for k in range(len(m.nodes)):
        lst = []
        for i in range(m.space.copies[k]):
            if isinstance(m.a[k][i], int) or value(m.a[k][i]):
                st = m.s[k][i] if isinstance(m.s[k][i], int) else value(m.s[k][i])
                lst.append((int(st), int(value(m.e[k][i]))))
        out.append(lst)
    return out


def _decode(m: _Model, graph: Graph, ivs: list[list[Interval]]) -> list[Step]:
    ids = graph.node_view.ids
    return steps_from_sequence(graph, [ids[m.nodes[k]] for k in _sequence_of(ivs)])


def _local_sequence(m: _Model, graph: Graph, steps: list[Step]) -> list[int]:
    local = {graph.node_view.ids[v]: k for k, v in enumerate(m.nodes)}
    return [local[s.node] for s in steps if s.op == "compute" and s.node in local]


# ---------------------------------------------------------------- the solver


def _split_outputs(graph: Graph) -> bool:
    """Whether a needed node has two outputs of nonzero size (which a schedule may free apart)."""
    vm = graph.value_map
    return any(sum(1 for v in graph.node_map[n].outputs if vm[v].size > 0) > 1 for n in graph.needed_nodes)


class Moccasin(Solver):
    name = "moccasin"
    method = "retention-interval constraint program (CP-SAT), two phases"
    paper = "Bartan et al., MOCCASIN, ICML 2023, §2"
    #: `optimal` means CP-SAT closed the gap on eqs. (1)–(11): a proof of optimality within the
    #: search space (staged by default, at most C_v computations of a node, one memory block per
    #: node). With C_v ≥ n the staged space is Checkmate's fixed-order stage space, checked
    #: against brute force in tests/test_moccasin.py.
    exact = True
    params = (
        Param("max_copies", int, 2, "C_v: at most this many computations of a node (§2)"),
        Param("free_order", bool, False, "free operator order (§2.1, domain ΣC_v) instead of the staged one"),
        Param(
            "precedence",
            str,
            "literals",
            "eq. (5) as reservoirs (§2.2, eq. 10) or as one cover literal per predecessor copy",
            choices=("reservoir", "literals"),
        ),
    )

    def notes(self) -> str:
        return (
            "Default is the fixed-input-order staged variant (§2.3) as in the paper's tables; "
            "'optimal' is a proof within that space with at most --max-copies computations per node. "
            "Starts from --hint, the greedy solver when installed, the baseline and a staged eviction "
            "heuristic, cut to --max-copies and brought within the budget when a little over; phase 1 "
            "runs only when none of them fits the budget."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        params = self.defaults() | options.params
        c_v = max(1, int(params["max_copies"]))
        staged = not bool(params["free_order"])
        view = graph.node_view
        unit_mem = reduce(math.gcd, [x for x in view.mem + view.workspace if x > 0], 0) or 1
        cap = (budget - view.resident) // unit_mem if budget >= view.resident else -1
        used = {"max_copies": c_v, "free_order": not staged, "precedence": str(params["precedence"])}
        if cap < 0:
            return SolverResult(
                steps=None,
                status="infeasible",
                backend="ortools-cp-sat",
                params=used,
                message="the budget is below the resident inputs and parameters",
                best_peak=view.resident,
            )
        needed = [i for i in range(len(view)) if view.needed[i]]
        if not needed:  # the outputs are inputs or parameters: nothing to run
            return SolverResult(steps=[], status="optimal", backend="none", objective=0.0, params=used)
        w, unit = _integer_costs([view.cost[i] for i in needed] or [0.0])
        m = _build(view, cap, unit_mem, w, c_v, staged, str(params["precedence"]))

        # Starting points (module docstring): --hint, the greedy solver, the baseline, the
        # eviction heuristic, each repaired (§2.4: phase 2 starts from a memory-feasible solution;
        # phase 1 from the lowest-peak one when none fits).
        sequences: list[tuple[str, list[int]]] = []

        def add(cname: str, steps: list[Step]) -> bool:
            """Add a start and its repair; whether one of them fits the budget."""
            seq = _local_sequence(m, graph, steps)
            sequences.append((cname, seq))
            fixed = _repair(m, seq, cap)
            if fixed is not None and fixed != seq:
                sequences.append((f"{cname} (repaired)", fixed))
            ok = False
            for x in (seq, fixed):
                ivs = None if x is None else _map_sequence(m, x)
                ok = ok or (ivs is not None and _fits(m, ivs) and _folded_peak(m, ivs) <= cap)
            ivs = None if fixed is None else _map_sequence(m, fixed)
            if not ok and ivs is not None and _folded_peak(m, ivs) <= cap * (1 + NEAR_OVER):
                assert fixed is not None
                # bounded by the clock, or with one worker (reproducible runs) by a count
                left = options.remaining()
                if options.workers <= 1 or left is None:
                    lowered = _lower_peak(m, fixed, cap, None, LOWER_STEPS)
                else:
                    lowered = _lower_peak(m, fixed, cap, time.monotonic() + 0.1 * left)
                if lowered is not None:
                    sequences.append((f"{cname} (lowered)", _repair(m, lowered, cap) or lowered))
            return ok  # a lowered start does not end the search for a better one

        if options.hint:
            add("hint", options.hint)
        # greedy's schedule may compute a node more than C_v times; the repair then raises its
        # peak, so greedy runs again at a slightly lower budget until a repaired one fits (with
        # one worker a count bounds it, as greedy then ignores the clock).
        # Below the budget its peak-reduction strategies run one by one: greedy keeps only the
        # cheapest schedule, and after the repair another one may be cheaper.
        t_greedy = time.monotonic()
        calls = 0
        for frac in GREEDY_TARGETS:
            fits = False
            for strategy in ("auto",) if frac == 1 else GREEDY_STRATEGIES:
                spent = time.monotonic() - t_greedy
                if options.workers <= 1:  # reproducible runs: a count, not the clock
                    if calls >= GREEDY_CALLS_ONE_WORKER:
                        break
                elif options.time_limit is not None and spent > GREEDY_SHARE * options.time_limit:
                    break
                calls += 1
                steps = self._greedy(graph, int(budget * frac), options, strategy)
                if steps and frac == 1 and simulate(graph, steps).peak_memory <= budget:
                    options.incumbent(steps)  # the model may outlast the time limit (issue 20)
                label = "greedy" if frac == 1 else f"greedy {strategy}@{frac:.1%}"
                fits = bool(steps and add(label, steps)) or fits
            if fits:
                break
        add("baseline", baseline_steps(graph))
        # The eviction start at the budget; failing that, at looser targets, whose result can
        # still have a lower peak than anything else to start phase 1 from. Bounded by a tenth of
        # the time limit, since it is Python and only a hint.
        t_heur = time.monotonic()
        heur_budget = None if options.time_limit is None else 0.1 * options.time_limit
        # with one worker (reproducible runs) a count bounds it instead of the clock
        runs, max_runs = 0, 12 if options.workers <= 1 else 10**9
        if options.workers <= 1:
            heur_budget = None
        peak_ub = sum(m.mem) + max(m.ws, default=0)
        targets = sorted({min(peak_ub, int(cap * (1 + x / 40))) for x in range(7)})
        for target in targets:
            found = False
            for score, max_chain in itertools.product(range(3), (1, len(m.nodes))):
                if runs >= max_runs or (heur_budget is not None and time.monotonic() - t_heur > heur_budget):
                    break
                runs += 1
                seq = _staged_eviction(m, target, score, max_chain)
                if seq is None:
                    continue
                ivs = _map_sequence(m, seq)
                if ivs is not None and _folded_peak(m, ivs) <= target:
                    found = True
                    name = f"eviction-{score}/{max_chain}@{target * unit_mem + view.resident}"
                    sequences.append((name, seq))
                    fixed = _repair(m, seq, cap)
                    if fixed is not None and fixed != seq:
                        sequences.append((f"{name} (repaired)", fixed))
            if found:
                break
        starts: list[tuple[int, int, str, list[list[Interval]]]] = []  # (peak, cost, name, ivs)
        for cname, seq in sequences:
            ivs = _map_sequence(m, seq)
            if ivs is None or not _fits(m, ivs):
                continue
            cost = sum(m.w[k] * len(x) for k, x in enumerate(ivs))
            starts.append((_folded_peak(m, ivs), cost, cname, ivs))
        feasible = sorted((c, p, nm, ivs) for p, c, nm, ivs in starts if p <= cap)

        # With one worker the run must repeat exactly for a seed: CP-SAT stops on deterministic
        # time, split between the phases by what phase 1 actually used (also deterministic).
        deterministic = options.workers <= 1
        det_left = None if options.time_limit is None else options.time_limit * DETERMINISTIC_FRACTION

        def new_solver(remaining: float | None) -> cp_model.CpSolver:
            solver = cp_model.CpSolver()
            prm = solver.parameters
            prm.num_workers = max(1, options.workers)
            prm.random_seed = options.seed
            # Probing dominates presolve on these models (seconds at n = 250, repeated in every
            # LNS neighbourhood) and finds little: the intervals' domains are already tight.
            prm.cp_model_probing_level = 0
            if remaining is not None:
                prm.max_time_in_seconds = max(0.01, remaining)
            if deterministic and det_left is not None:
                prm.max_deterministic_time = max(0.01, det_left)
            return solver

        notes: list[str] = []
        start_ivs: list[list[Interval]] | None = None
        if feasible:
            c, _, src, start_ivs = feasible[0]
            notes.append(f"phase 1 skipped: the {src} schedule fits (duration {c * unit:.6g})")
        if not feasible:
            # Phase 1, eqs. (12)-(13): minimise max(M_var, M) (M_var's domain starts at M); it
            # stops at the first memory-feasible solution. (Breaking ties by the duration (1)
            # was measured to make it several times slower: RL n250 at 80%, 44 s vs 7 s.)
            m.model.minimize(m.m_var)
            if starts:
                p, _, src, ivs = min(starts, key=lambda x: (x[0], x[1]))
                _hint(m, ivs, p)
                notes.append(f"phase 1 from the {src} schedule (peak {p * unit_mem + view.resident})")
            solver = new_solver(options.remaining())
            cb = _Incumbents(m, graph, options, 1, cap, unit)
            status = solver.solve(m.model, cb)
            if det_left is not None:
                det_left -= solver.deterministic_time
            solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
            peak = solver.value(m.m_var) if solved else None
            if solved and peak is not None and peak <= cap:
                ivs1 = _read(m, solver.value)
                # phase 1 ignores the duration: drop the recomputations the budget does not need
                pruned = _repair(m, _sequence_of(ivs1), cap)
                ivs2 = None if pruned is None else _map_sequence(m, pruned)
                if ivs2 is not None and _fits(m, ivs2) and _folded_peak(m, ivs2) <= cap:
                    ivs1 = ivs2
                cost1 = sum(m.w[k] * len(x) for k, x in enumerate(ivs1))
                notes.append(
                    f"phase 1: memory-feasible in {solver.wall_time:.1f}s at duration {cost1 * unit:.6g}"
                )
                start_ivs = ivs1
            elif not solved:
                return SolverResult(
                    steps=None,
                    status="infeasible" if status == cp_model.INFEASIBLE else "unknown",
                    backend="ortools-cp-sat",
                    params=used,
                    message=f"phase 1: {solver.status_name(status)}",
                )
            else:
                assert peak is not None
                proved = status == cp_model.OPTIMAL
                best = peak * unit_mem + view.resident
                lb = int(solver.best_objective_bound) * unit_mem + view.resident
                return SolverResult(
                    steps=None,
                    status="infeasible" if proved else "unknown",
                    backend="ortools-cp-sat",
                    params=used,
                    message=(
                        f"phase 1: lowest peak {best} > budget"
                        + (" (proved within the search space)" if proved else f", bound {lb}")
                    ),
                    best_peak=best,
                )
        assert start_ivs is not None

        # Phase 2, eq. (1) subject to (2)-(11), from the feasible solution as a hint.
        fallback = _decode(m, graph, start_ivs)
        options.incumbent(fallback)
        fallback_cost = sum(m.w[k] * len(x) for k, x in enumerate(start_ivs))
        m.model.clear_objective()
        m.model.add(m.m_var <= cap)
        m.model.minimize(m.duration)
        _hint(m, start_ivs, cap)
        remaining = options.remaining()
        if remaining is not None and remaining <= 0.05:
            return self._result(
                fallback, "feasible", fallback_cost, None, unit, used, notes + ["no time left"]
            )
        # With a clock limit and several workers, the full portfolio (whose tree search proves
        # the small rows optimal) gets a first share; if it has not finished, LNS-only workers
        # take the rest from its incumbent (see LNS_AFTER).
        split = not deterministic and options.workers >= 2 and remaining is not None
        first = min(LNS_AFTER_CAP, LNS_AFTER * remaining) if split and remaining is not None else remaining
        solver = new_solver(first)
        cb = _Incumbents(m, graph, options, 2, cap, unit)
        t0 = time.monotonic()
        status = solver.solve(m.model, cb)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            notes.append(f"phase 2: {solver.status_name(status)} after {time.monotonic() - t0:.1f}s")
            return self._result(fallback, "feasible", fallback_cost, None, unit, used, notes)
        ivs = _read(m, solver.value)
        obj = int(round(solver.objective_value))
        bound = int(math.ceil(solver.best_objective_bound - 1e-6))
        remaining = options.remaining()
        if split and status != cp_model.OPTIMAL and bound < obj and remaining is not None and remaining > 0.5:
            m.model.clear_hints()
            _hint(m, ivs, cap)
            lns = new_solver(remaining)
            lns.parameters.use_lns_only = True
            status2 = lns.solve(m.model, cb)
            if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE) and lns.objective_value < obj - 0.5:
                ivs, obj = _read(m, lns.value), int(round(lns.objective_value))
            notes.append(f"LNS-only after {first:.0f}s of the full portfolio")
        if obj > fallback_cost:  # never return worse than the start
            ivs, obj = start_ivs, fallback_cost
        optimal = status == cp_model.OPTIMAL or bound >= obj
        gap = (obj - bound) / obj if obj else 0.0
        notes.append(f"phase 2: {solver.status_name(status).lower()}, gap {gap:.2%}")
        if _split_outputs(graph):
            # The model keeps a node's outputs together (one block): where they could be freed
            # apart, its optimum and bound are those of a restricted space, not the graph's
            # (found by the fuzzer against brute force, issue 20)
            optimal, bound = False, None
            notes.append("outputs of multi-output nodes kept together: no optimality claim")
        return self._result(
            _decode(m, graph, ivs), "optimal" if optimal else "feasible", obj, bound, unit, used, notes
        )

    @staticmethod
    def _result(
        steps: list[Step],
        status: str,
        obj: int,
        bound: int | None,
        unit: float,
        used: dict[str, object],
        notes: list[str],
    ) -> SolverResult:
        return SolverResult(
            steps=steps,
            status=status,  # type: ignore[arg-type]
            backend="ortools-cp-sat",
            objective=obj * unit,
            lower_bound=None if bound is None else bound * unit,
            params=used,
            message="; ".join(notes),
        )

    @staticmethod
    def _greedy(
        graph: Graph, budget: int, options: SolveOptions, strategy: str = "auto"
    ) -> list[Step] | None:
        """The `greedy` solver's schedule, when that solver is installed (a CP-SAT hint only)."""
        from remat_cli.solvers import registry

        try:
            greedy = registry.get("greedy")
        except registry.UnknownSolver:
            return None
        remaining = options.remaining()
        sub = SolveOptions(
            time_limit=None if remaining is None else max(0.1, 0.1 * remaining),
            seed=options.seed,
            workers=1,
            params=greedy.defaults() | {"strategy": strategy},
        )
        try:
            return greedy.solve(graph, budget, sub).steps
        except Exception:  # a hint is optional: a failing helper solver must not stop moccasin
            return None
