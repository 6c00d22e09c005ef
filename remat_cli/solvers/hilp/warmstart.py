"""Warm starts of an H-ILP: the sequential schedule over its compute nodes and a greedy
recomputing one (Gusak et al., *HiREmate*, App. B.2; our addition for HiGHS incumbents).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import numpy as np

from remat_cli.milp import LinearModel
from remat_cli.solvers.hilp.model import Instance, OutOfTime, complete


def sequential_x(inst: Instance, model: LinearModel, choice: Sequence[int]) -> np.ndarray:
    """The H-ILP variables of the *sequential* schedule: phase t computes compute node t only,
    with option ``choice[t]``; a data node stays from its producer to its last reader (under the
    chosen options; to the end when final) and is deleted right after that reader, as the
    linearised deletion rule of App. B.3 demands; a phantom node lives from F_j to B_j. Every
    constraint but the memory rows holds by construction, so whether this vector is feasible
    is whether the sequential schedule fits the H-ILP's memory model."""
    R, P, Sp, C, D = model.var_maps  # type: ignore[attr-defined]
    T = len(inst.items)
    x = np.zeros(model.num_vars)
    for t in range(T):
        x[R[(t, t, choice[t])]] = 1.0
    for d, p in enumerate(inst.producer):
        readers = [k for k, o in inst.users[d] if o == choice[k]]
        last = T if inst.final[d] else max(readers, default=p)
        for t in range(p + 1, last + 1):
            x[P[(t, d)]] = 1.0
        x[C[(p, d)]] = 1.0
        if last < T:
            x[D[(last, last, d)]] = 1.0
    for j, (f, b) in inst.layer_of.items():
        for t in range(f + 1, b + 1):
            x[Sp[(t, j, choice[f])]] = 1.0
    return complete(model, x)


#: most feasibility checks one sequential-hint search may make (a work limit, not a clock)
HINT_CHECKS = 4000


def sequential_hint(
    inst: Instance, model: LinearModel, prefer: Sequence[int | None] | None = None
) -> np.ndarray | None:
    """A feasible starting solution for the H-ILP: the sequential schedule (every compute node
    once, in order) with one option per unit, chosen greedily. It starts from the options
    keeping the least between forward and backward (the phantom minimum of App. B.1.1) or
    with the smallest peak, and repeatedly switches the unit whose faster option saves the most
    time while the H-ILP's own memory rows still hold. The engine starts from it (HiGHS:
    setSolution), so a top H-ILP cut short by its limits still returns a schedule built from
    the options -- and improves it by recomputing (dropping and recomputing data nodes)
    where that pays. None when no sequential choice fits.

    ``prefer`` (per unit, an option index or None) is tried as a start of its own: the options
    a whole-graph schedule gives the units (:func:`remat_cli.solvers.hilp.units.flat_option`),
    the other units at their phantom minimum; the start with the lower objective is returned."""
    A = model.matrix()
    lo = model.row_lb - 1e-6
    hi = model.row_ub + 1e-6
    checks = 0

    def per_item(cu: list[int]) -> list[int]:
        return [0 if it.kind == "loss" else cu[it.unit] for it in inst.items]

    def fits(cu: list[int]) -> np.ndarray | None:
        nonlocal checks
        checks += 1
        x = sequential_x(inst, model, per_item(cu))
        ax = A @ x
        return x if bool(np.all(ax <= hi) and np.all(ax >= lo)) else None

    units = inst.units
    keys = (
        lambda o: (o.phantom, o.peak, o.time),  # the phantom minimum
        lambda o: (o.peak, o.phantom, o.time),
    )
    starts: list[list[int]] = [
        [min(range(len(u.options)), key=lambda i, u=u: key(u.options[i])) for u in units] for key in keys
    ]
    if prefer is not None:
        starts.insert(0, [o if o is not None else starts[0][ui] for ui, o in enumerate(prefer)])
    best: np.ndarray | None = None
    for cu in starts:
        x = fits(cu)
        if x is None:
            continue
        x = _improve(inst, model, cu, x, fits, lambda: checks)
        if best is None or model.objective(x) < model.objective(best) - 1e-9:
            best = x
        if prefer is None or cu is not starts[0]:
            break  # the phantom-minimum or smallest-peak start: the first that fits
    return best


def _improve(
    inst: Instance,
    model: LinearModel,
    cur: list[int],
    x: np.ndarray,
    fits: Callable[[list[int]], np.ndarray | None],
    checks: Callable[[], int],
) -> np.ndarray:
    """Switch, again and again, the unit whose faster option saves the most time while the
    H-ILP's memory rows still hold (see :func:`sequential_hint`)."""
    units = inst.units
    while checks() < HINT_CHECKS:
        moves = sorted(
            (
                (units[ui].options[cur[ui]].time - o.time, ui, oi)
                for ui, u in enumerate(units)
                for oi, o in enumerate(u.options)
                if o.time < units[ui].options[cur[ui]].time - 1e-12
            ),
            key=lambda e: (-e[0], e[1], e[2]),
        )
        for _, ui, oi in moves:
            if checks() >= HINT_CHECKS:
                break
            cand = cur.copy()
            cand[ui] = oi
            xc = fits(cand)
            if xc is not None:
                cur, x = cand, xc
                break
        else:
            break
    return x


#: fractions of the H-ILP's budget the recomputing start aims at, in turn, until one fits
RECOMPUTE_AIMS = (1.0, 0.9, 0.8, 0.7, 0.6, 0.5)


def recompute_hint(
    inst: Instance, model: LinearModel, budget: int, deadline: float | None = None
) -> np.ndarray | None:
    """A starting solution that recomputes, for H-ILPs whose sequential schedule fits nowhere
    (tight budgets; Checkmate's own solver starts from a greedy schedule the same way). Phase t
    computes item t after recomputing the plain items producing inputs no longer in memory;
    after each phase, data nodes no later item reads are freed, and while the next phase would
    not fit, the recomputable data node read farthest ahead is evicted (Belady), at the last
    phase that related to it (the deletion rule of App. B.3 deletes only after a related
    computation). Plain items and F_j before its B_j (rows (8a)/(8b)) are recomputed; B_j runs
    once. The schedule is aimed under a shrinking
    share of `budget` until its H-ILP vector (derived as in :func:`sequential_x`) satisfies
    every row; None when none does. OutOfTime once the wall clock passes `deadline` (epoch s)."""
    choice_u = [
        min(
            range(len(u.options)),
            key=lambda i, u=u: (u.options[i].phantom, u.options[i].peak, u.options[i].time),
        )
        for u in inst.units
    ]
    choice = [0 if it.kind == "loss" else choice_u[it.unit] for it in inst.items]
    readers = _readers(inst, choice)
    rec = _Recompute(inst, choice, readers, deadline)
    A = model.matrix()
    lo = model.row_lb - 1e-6
    hi = model.row_ub + 1e-6
    for frac in RECOMPUTE_AIMS:
        sched = rec.phases_for(frac * budget)
        if sched is None:
            return None
        x = phase_vector(inst, model, choice, readers, *sched)
        if x is not None:
            ax = A @ x
            if bool(np.all(ax <= hi) and np.all(ax >= lo)):
                return x
    return None


class _Recompute:
    """The recomputing schedule of :func:`recompute_hint` under one aim, phase by phase."""

    def __init__(
        self, inst: Instance, choice: list[int], readers: list[list[int]], deadline: float | None
    ) -> None:
        self.inst = inst
        self.items = inst.items
        self.choice = choice
        self.readers = readers
        self.deadline = deadline
        self.reads: list[list[int]] = [[] for _ in range(len(inst.items))]
        for d, ks in enumerate(readers):
            for k in ks:
                self.reads[k].append(d)
        self.last_reader = [max(r, default=-1) for r in readers]

    def rerunnable(self, k: int, t: int) -> bool:
        """Plain items and F_j before its B_j may run again in phase t."""
        it = self.items[k]
        return it.kind == "plain" or (it.kind == "F" and self.inst.layer_of[it.unit][1] > t)

    def plan(self, t: int, alive: set[int]) -> list[int] | None:
        """Items phase t runs: t after the plain producers of inputs not in memory."""
        comp: set[int] = set()
        inst, reads = self.inst, self.reads

        def run(k: int) -> bool:
            for d in reads[k]:
                p = inst.producer[d]
                if d not in alive and p not in comp and (not self.rerunnable(p, t) or not run(p)):
                    return False
            comp.add(k)
            return True

        return sorted(comp) if run(t) else None

    def peak(self, t: int, comp: list[int], alive: set[int], kept: int) -> tuple[int, set[int]]:
        """Memory at the phase's fullest item, and the data it reads."""
        inst, items, sizes, reads, readers = self.inst, self.items, self.inst.sizes, self.reads, self.readers
        live = set(alive)
        mem = sum(sizes[d] for d in live) + kept
        top = 0
        used = set()
        for k in comp:
            new = [d for d in items[k].outs if d not in live]
            top = max(top, mem + sum(sizes[d] for d in new) + items[k].m[self.choice[k]])
            live.update(new)
            mem += sum(sizes[d] for d in new)
            used.update(reads[k])
            done = [d for d in reads[k] if max((r for r in readers[d] if r in comp), default=-1) <= k]
            for d in done:
                if d in live and self.last_reader[d] <= t and not inst.final[d]:
                    live.discard(d)
                    mem -= sizes[d]
        return top, used

    def phases_for(self, aim: float) -> tuple[list[list[int]], list[set[int]]] | None:
        """The phases' items and the data alive at each phase's end, evicting (Belady) while a
        phase's peak is above `aim`; None where a phase cannot run."""
        inst, items, sizes, readers, choice = (
            self.inst,
            self.items,
            self.inst.sizes,
            self.readers,
            self.choice,
        )
        alive: set[int] = set()
        ends: list[set[int]] = []
        phases: list[list[int]] = []
        last_rel: dict[int, int] = {}
        kept = 0  # phantoms between F_j and B_j
        for t in range(len(items)):
            if self.deadline is not None and time.time() > self.deadline:
                raise OutOfTime
            comp = self.plan(t, alive)
            if comp is None:
                return None
            top, used = self.peak(t, comp, alive, kept)
            while top > aim:
                cands = [
                    (nxt, sizes[d], d)
                    for d in alive
                    if d not in used
                    and not inst.final[d]
                    and self.rerunnable(inst.producer[d], nxt := min(k for k in readers[d] if k > t))
                ]
                if not cands:
                    break
                *_, d = max(cands)
                alive.discard(d)
                for e in ends[last_rel[d] :]:
                    e.discard(d)
                top, used = self.peak(t, comp, alive, kept)
            for k in comp:
                alive.update(items[k].outs)
                for d in (*self.reads[k], *items[k].outs):
                    last_rel[d] = t
            it = items[t]
            if it.kind == "F":
                kept += it.phantom[choice[t]]
            elif it.kind == "B":
                kept -= it.phantom[choice[t]]
            alive -= {d for d in alive if self.last_reader[d] <= t and not inst.final[d]}
            ends.append(set(alive))
            phases.append(comp)
        return phases, ends


def _readers(inst: Instance, choice: Sequence[int]) -> list[list[int]]:
    """readers[d]: the items other than its producer that read data node d under ``choice``."""
    readers: list[list[int]] = [[] for _ in inst.sizes]
    for d, us in enumerate(inst.users):
        for k, o in us:
            if o == choice[k] and k != inst.producer[d]:
                readers[d].append(k)
    return readers


def phase_vector(
    inst: Instance,
    model: LinearModel,
    choice: Sequence[int],
    readers: Sequence[Sequence[int]],
    phases: Sequence[Sequence[int]],
    ends: Sequence[set[int]],
) -> np.ndarray | None:
    """The H-ILP variables of a schedule given phase by phase: ``phases[t]`` the items phase t
    computes (ascending, ending with t, each with option ``choice[k]``), ``ends[t]`` the data
    nodes in memory after it; ``readers[d]`` the items reading d under ``choice``. Each data node
    leaving memory is deleted after the last item of its phase related to it (App. B.3's
    deletion rule); None when there is none."""
    R, P, Sp, C, D = model.var_maps  # type: ignore[attr-defined]
    T = len(inst.items)
    x = np.zeros(model.num_vars)
    for t, comp in enumerate(phases):
        for k in comp:
            x[R[(t, k, choice[k])]] = 1.0
    for d, p in enumerate(inst.producer):
        for t in range(p, T):
            present = t > p and d in ends[t - 1]
            made = p in phases[t] and not present
            if made:
                x[C[(t, d)]] = 1.0
            stays = d in ends[t]
            x[P[(t + 1, d)]] = float(stays)
            if (present or made) and not stays:
                rel = [k for k in phases[t] if k == p or k in readers[d]]
                if not rel:
                    return None
                x[D[(t, rel[-1], d)]] = 1.0
    for j, (f, b) in inst.layer_of.items():
        for t in range(f + 1, b + 1):
            x[Sp[(t, j, choice[f])]] = 1.0
    return complete(model, x)


def flat_hint(
    inst: Instance, model: LinearModel, seq: Sequence[str], prefer: Sequence[int | None] | None = None
) -> tuple[np.ndarray | None, int | None]:
    """:func:`flat_vector` when it satisfies every row of the H-ILP, else None; and, when only
    memory rows fail, the budget (bytes) under which they would hold."""
    x = flat_vector(inst, model, seq, prefer)
    if x is None:
        return None, None
    ax = model.matrix() @ x
    over = ax > model.row_ub + 1e-6
    if not over.any() and bool(np.all(ax >= model.row_lb - 1e-6)):
        return x, None
    budget = model.mem_budget  # type: ignore[attr-defined]
    if np.any(ax < model.row_lb - 1e-6) or np.any(model.row_ub[over] != budget):
        return None, None
    return None, int(ax[over].max() * model.mem_scale)  # type: ignore[attr-defined]


def flat_vector(
    inst: Instance, model: LinearModel, seq: Sequence[str], prefer: Sequence[int | None] | None = None
) -> np.ndarray | None:
    """A whole-graph schedule (its compute sequence `seq`, e.g. fastsa's) as a start of the
    H-ILP (a flat schedule translated into the top H-ILP's MIP start). Phase t
    computes item t (the instance's order, :func:`remat_cli.solvers.hilp.units.follow`); a
    computation in `seq` of an item already run in full is a recomputation in the phase of the
    first item `seq` has not yet run in full (the whole item: the H-ILP has no finer grain),
    except a layer's forward operators between its F_j and its B_j, which its B_j's option
    (``prefer``, from :func:`remat_cli.solvers.hilp.units.flat_option`) recomputes. A data node
    stays in memory from a computation to its next reader, unless its producer runs again
    before that reader. None when a deletion has no related item in its phase; the vector may
    break rows (the H-ILP's memory model is not the simulator's)."""
    items = inst.items
    T = len(items)
    choice_u = [
        prefer[ui]
        if prefer is not None and prefer[ui] is not None
        else min(range(len(u.options)), key=lambda i, u=u: (u.options[i].phantom, u.options[i].peak))
        for ui, u in enumerate(inst.units)
    ]
    choice = [0 if it.kind == "loss" else choice_u[it.unit] for it in items]
    owner: dict[str, int] = {}
    for k, it in enumerate(items):
        if it.kind == "loss":
            continue
        u = inst.units[it.unit]
        for n in u.bwd if it.kind == "B" else u.fwd:
            owner[n] = k
    left = [len(set(inst.units[it.unit].bwd if it.kind == "B" else inst.units[it.unit].fwd)) for it in items]
    seen: set[str] = set()
    phases: list[set[int]] = [{t} for t in range(T)]
    t = 0  # the first item `seq` has not run in full yet: the phase in progress
    for n in seq:
        k = owner.get(n)
        if k is None:
            continue
        if n not in seen:
            seen.add(n)
            left[k] -= 1
            while t < T and left[t] == 0:
                t += 1
            continue
        it = items[k]
        if k >= t or t >= T or it.kind == "B":
            continue  # within item k's first run (or a backward item: run once)
        if it.kind == "F" and inst.layer_of[it.unit][1] <= t:
            continue  # recomputed inside its B_j's option
        phases[t].add(k)
    readers = _readers(inst, choice)
    ends: list[set[int]] = [set() for _ in range(T)]
    for d, p in enumerate(inst.producer):
        made = [t for t in range(T) if p in phases[t]]
        read = sorted({t for t in range(T) if any(k in phases[t] for k in readers[d])})
        for t in range(made[0] if made else T, T):
            if inst.final[d]:
                ends[t].add(d)
                continue
            nxt = next((r for r in read if r > t), None)
            if nxt is not None and not any(t < m <= nxt for m in made):
                ends[t].add(d)
    return phase_vector(inst, model, choice, readers, [sorted(c) for c in phases], ends)
