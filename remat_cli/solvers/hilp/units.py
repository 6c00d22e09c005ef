"""hilp units and their options: measurement (eq. 10, App. B.1.2-B.3), refinement, option
selection (§3.2.2) and identical subgraphs (App. C.1.1).

Gusak et al., *HiREmate*.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from remat_cli.graph import Graph, Node, Value
from remat_cli.solvers.hilp.context import LOSS, TOKEN, Ctx

# ------------------------------------------------------------------------------------------------
# Units and options


@dataclass(frozen=True)
class Opt:
    """One option: a schedule of a unit's forward (or only) part and of its backward part."""

    fwd: tuple[str, ...]
    bwd: tuple[str, ...]
    time_f: float
    time_b: float
    m_f: int  # overhead of eq. (10) while running fwd: peak minus what stays after
    m_b: int
    phantom: int  # p_{j,o}: bytes kept from fwd to bwd (App. B.1.1)
    deps_f: frozenset[str]
    deps_b: frozenset[str]
    peak: int
    #: App. B.3 correction terms: (m^i_{k,o}, inputs no longer used at sub-step i), per part
    corr_f: tuple[tuple[int, frozenset[str]], ...] = ()
    corr_b: tuple[tuple[int, frozenset[str]], ...] = ()

    @property
    def time(self) -> float:
        return self.time_f + self.time_b


@dataclass
class Unit:
    fwd: tuple[str, ...]  # forward operators (or all operators of a plain unit), topological
    bwd: tuple[str, ...]  # backward operators of a layer, topological
    layer: bool
    children: list[Unit] | None = None
    options: list[Opt] = field(default_factory=list)

    @property
    def owned(self) -> frozenset[str]:
        return frozenset(self.fwd) | frozenset(self.bwd)

    @property
    def ops(self) -> int:
        return len(self.fwd) + len(self.bwd)


def measure(ctx: Ctx, owned: frozenset[str], fwd: Sequence[str], bwd: Sequence[str]) -> Opt:
    """Replay an option on the operators (values freed after their last use, as
    `steps_from_sequence` does) and read off time, m_{k,o}, p_{j,o} and the dependencies.

    Memory counts only values the option produces; values that cross the unit's boundary stay
    (they are data nodes of the level above); inputs from outside are counted one level up."""
    seq = list(fwd) + list(bwd)
    split = len(fwd)
    nodes = ctx.nodes
    cross: set[str] = set()
    end_of: dict[tuple[str, int], int] = {}  # (value, production position) -> last use
    current: dict[str, int] = {}
    deps_f: set[str] = set()
    deps_b: set[str] = set()
    last_read: dict[str, int] = {}  # dependency -> last position reading it, within its part
    produced_f: set[str] = set()
    produced_b: set[str] = set()
    for k, n_id in enumerate(seq):
        n = nodes[n_id]
        part_produced = produced_f if k < split else produced_b
        for v in n.inputs:
            if v in ctx.resident:
                continue
            if v in current:
                end_of[(v, current[v])] = k
            if v not in part_produced:
                (deps_f if k < split else deps_b).add(v)
                last_read[v] = k
        for v in n.outputs:
            current[v] = k
            end_of[(v, k)] = k
            part_produced.add(v)
            if ctx.crossing(v, owned):
                cross.add(v)
    fwd_nodes = set(fwd)
    cross_f_vals = {v for v in cross if ctx.producer[v] in fwd_nodes}
    free_at: dict[int, list[str]] = defaultdict(list)
    for (v, k), e in end_of.items():
        # crossing values stay (the level above tracks them), except a forward output the
        # backward part recomputes for itself: that copy is the backward's own
        if v not in cross or (k >= split and v in cross_f_vals):
            free_at[e].append(v)
    live: dict[str, int] = {}
    mem = 0
    peak_f = 0
    peak_b = 0
    mem_split = 0
    cross_f = 0
    phantom_vals: set[str] = set()
    step_at: list[int] = []

    def at_split() -> None:
        nonlocal mem, mem_split, cross_f, phantom_vals
        mem_split = mem
        for v in [v for v in live if v in cross_f_vals]:
            cross_f += live[v]
            mem -= live.pop(v)  # data nodes one level up from here on
        phantom_vals = set(live)

    for k, n_id in enumerate(seq):
        if k == split:
            at_split()
        n = nodes[n_id]
        new = 0
        for v in n.outputs:
            if v not in live:
                new += ctx.size(v)
        at = mem + new + n.workspace
        step_at.append(at)
        if k < split:
            peak_f = max(peak_f, at)
        else:
            peak_b = max(peak_b, at)
        for v in n.outputs:
            if v not in live:
                live[v] = ctx.size(v)
                mem += live[v]
        for v in free_at.get(k, ()):
            if v in live:
                mem -= live.pop(v)
    if split == len(seq):
        at_split()
    phantom = mem_split - cross_f
    end_b = mem
    deps_b -= phantom_vals

    def corrections(lo: int, hi: int, deps: set[str], end: int) -> tuple[tuple[int, frozenset[str]], ...]:
        best: dict[frozenset[str], int] = {}
        for i in range(lo, hi):
            done = frozenset(v for v in deps if last_read.get(v, lo - 1) < i)
            best[done] = max(best.get(done, -(1 << 62)), step_at[i] - end)
        return tuple(sorted(((m, d) for d, m in best.items()), key=lambda e: (e[0], sorted(e[1]))))

    return Opt(
        fwd=tuple(fwd),
        bwd=tuple(bwd),
        time_f=float(sum(nodes[n].cost for n in fwd)),
        time_b=float(sum(nodes[n].cost for n in bwd)),
        m_f=max(0, peak_f - mem_split),
        m_b=max(0, peak_b - end_b) if bwd else 0,
        phantom=phantom if bwd else 0,
        deps_f=frozenset(deps_f),
        deps_b=frozenset(deps_b),
        peak=max(peak_f, peak_b),
        corr_f=corrections(0, split, deps_f, mem_split),
        corr_b=corrections(split, len(seq), deps_b, end_b),
    )


def flat_option(ctx: Ctx, unit: Unit, seq: Sequence[str]) -> Opt | None:
    """The option a whole-graph schedule (its compute sequence `seq`, e.g. greedy's) gives a
    layer unit (a flat schedule translated into the top H-ILP's start): its forward
    operators once, in order, then every computation of its operators from the end of its
    forward pass to its last backward operator -- the recomputations the flat schedule makes
    for this layer's backward. None for plain units or when `seq` misses an operator."""
    if not unit.layer or not unit.bwd:
        return None
    owned = unit.owned
    fwd = set(unit.fwd)
    bwd = set(unit.bwd)
    first: dict[str, int] = {}
    last_b = -1
    for i, n in enumerate(seq):
        if n in fwd:
            first.setdefault(n, i)
        elif n in bwd:
            last_b = i
    if len(first) < len(fwd) or last_b < 0:
        return None
    end_f = max(first.values())
    # backward operators the schedule ran before the forward pass ended (a weight's transpose
    # needs nothing of it) open the backward part: the later ones read them (resnet50_b32 at
    # 70%: without them a convolution read permute_29 before its recomputation further on)
    early = dict.fromkeys(n for n in seq[:end_f] if n in owned and n not in fwd)
    b = (*early, *(n for n in seq[end_f + 1 : last_b + 1] if n in owned))
    if not bwd <= set(b) or not reads_after_writes(ctx, owned, (*unit.fwd, *b)):
        return None
    return measure(ctx, owned, unit.fwd, b)


def reads_after_writes(ctx: Ctx, owned: frozenset[str], seq: Sequence[str]) -> bool:
    """Whether every value of the unit's own operators that `seq` reads was produced earlier
    in it (a valid option; values from outside the unit are the level above's)."""
    produced: set[str] = set()
    for n_id in seq:
        n = ctx.nodes[n_id]
        if any(v not in produced and ctx.producer.get(v) in owned for v in n.inputs):
            return False
        produced.update(n.outputs)
    return True


def atomic(ctx: Ctx, n: str) -> Unit:
    u = Unit(fwd=(n,), bwd=(), layer=False)
    u.options = [measure(ctx, u.owned, (n,), ())]
    return u


# ------------------------------------------------------------------------------------------------
# Refining the top where the memory is


def pieces(ctx: Ctx, unit: Unit, order: dict[str, int] | None = None) -> list[Unit]:
    """One level down from `unit`: its children; for a unit whose children are single operators
    (a level-0 layer: one forward operator and the backward block paired with it), the
    operators of its forward part and the *runs* of its backward block, maximal stretches with
    no foreign operator between them in the graph's order. A run is convex (every path between
    two of its operators passes only operators the order puts between them), and splitting at
    the runs lets the top interleave blocks as the graph's own order does, instead of holding a
    whole block's outputs together. ``order`` (operator -> position) replaces the graph's
    order: a whole-graph schedule's, whose runs the top can then follow phase by phase."""
    assert unit.children is not None
    if any(c.ops > 1 for c in unit.children) or not unit.bwd:
        return unit.children
    pos = ctx.pos if order is None else order
    topo = ctx.graph.topo_order if order is None else sorted(order, key=order.__getitem__)
    out = [c for c in unit.children if c.fwd[0] in unit.fwd]
    at = sorted(pos[n] for n in unit.bwd)
    runs: list[list[str]] = []
    for a, b in zip([None, *at], at, strict=False):
        if a is None or b != a + 1:
            runs.append([])
        runs[-1].append(topo[b])
    for r in runs:
        u = Unit(fwd=tuple(r), bwd=(), layer=False)
        u.options = [measure(ctx, u.owned, u.fwd, ())]
        out.append(u)
    return out


def refine(ctx: Ctx, units: list[Unit], cap: int) -> list[Unit] | None:
    """The top units with the unit needing the most memory (its smallest-peak option) replaced
    by its :func:`pieces`, again and again while the instance stays within `cap` compute
    nodes; None when nothing could be refined."""

    cur = list(units)
    changed = False
    while True:
        cands = [(min(o.peak for o in u.options), -i) for i, u in enumerate(cur) if u.children and u.options]
        new = None
        for _, neg in sorted(cands, reverse=True):
            i = -neg
            trial = cur[:i] + pieces(ctx, cur[i]) + cur[i + 1 :]
            if compute_nodes(trial) <= cap:
                new = trial
                break
        if new is None:
            return cur if changed else None
        cur, changed = new, True


def follow(ctx: Ctx, units: list[Unit], seq: Sequence[str], cap: int) -> list[Unit]:
    """Top units from which a whole-graph schedule (its compute sequence `seq`, e.g. fastsa's)
    reads phase by phase (the flat schedule as the top H-ILP's start,
    :func:`remat_cli.solvers.hilp.warmstart.flat_hint`). A compute node runs its operators
    together, and a phase runs its recomputations before its compute node, so

    1. a unit whose forward or backward part `seq` runs in separate stretches, or in whose
       stretch `seq` recomputes anything, is replaced by its :func:`pieces` (cut along `seq`),
       until none is left;
    2. a piece is cut around each operator `seq` recomputes and where `seq` recomputes
       something between two of its operators;
    3. while there are more than `cap` compute nodes, the two neighbouring single-option pieces
       (one after the other in `seq`, nothing recomputed in or between them) with the fewest
       operators merge: a stretch of a topological order is convex, and what `seq` runs once
       in one stretch needs no finer grain.
    """
    order = first_ranks(seq)
    topo = sorted(order, key=order.__getitem__)
    again: set[str] = set()  # operators `seq` recomputes
    cut: set[str] = set()  # operators after whose first computation `seq` recomputes something
    done = 0  # how many operators `seq` has run so far
    for n in seq:
        if order[n] < done:
            again.add(n)
            cut.add(topo[done - 1])
        else:
            done += 1
    stops = again | cut

    def broken(u: Unit) -> bool:
        if _runs(u.fwd, order) > 1 or _runs(u.bwd, order) > 1:
            return True
        return any(n in stops for part in (u.fwd, u.bwd) for n in sorted(part, key=order.__getitem__)[:-1])

    cur = list(units)
    while True:
        at = next((i for i, u in enumerate(cur) if u.children and (broken(u) or again & u.owned)), None)
        if at is None:
            break
        cur[at : at + 1] = pieces(ctx, cur[at], order)
    out: list[Unit] = []
    for u in cur:
        if u.layer or len(u.fwd) == 1 or not broken(u) and not again & u.owned:
            out.append(u)
            continue
        part: list[str] = []
        for n in sorted(u.fwd, key=order.__getitem__):
            if part and (n in again or part[-1] in stops):
                out.append(_plain(ctx, part))
                part = []
            part.append(n)
        out.append(_plain(ctx, part))

    def mergeable(u: Unit) -> bool:
        return not u.layer and len(u.options) == 1 and not again & u.owned

    out.sort(key=lambda u: min(order[n] for n in u.owned))
    # each merge rescans the pairs: the per-unit facts are kept, not recomputed per pair
    # (resnet50_b32 at 50%: 4 s in `owned` and `ops` for a 144-node cut)
    ok = [mergeable(u) for u in out]
    ops = [u.ops for u in out]
    n_compute = compute_nodes(out)
    while n_compute > cap:
        best: tuple[int, int] | None = None
        for i in range(len(out) - 1):
            a, b = out[i], out[i + 1]
            if ok[i] and ok[i + 1] and order[b.fwd[0]] == order[a.fwd[-1]] + 1 and a.fwd[-1] not in cut:
                if best is None or ops[i] + ops[i + 1] < best[0]:
                    best = (ops[i] + ops[i + 1], i)
        if best is None:
            break
        _, i = best
        merged = _plain(ctx, list(out[i].fwd + out[i + 1].fwd))
        out[i : i + 2] = [merged]
        ok[i : i + 2] = [mergeable(merged)]
        ops[i : i + 2] = [merged.ops]
        n_compute -= 1
    return out


def compute_nodes(units: Sequence[Unit]) -> int:
    """How many compute nodes an H-ILP over `units` has: F_j and B_j per layer, one per plain unit."""
    return sum(2 if u.layer else 1 for u in units)


def first_ranks(seq: Sequence[str]) -> dict[str, int]:
    """Operator -> rank of its first computation in the compute sequence `seq`."""
    order: dict[str, int] = {}
    for n in seq:
        order.setdefault(n, len(order))
    return order


def _plain(ctx: Ctx, ops: Sequence[str]) -> Unit:
    u = Unit(fwd=tuple(ops), bwd=(), layer=False)
    u.options = [measure(ctx, u.owned, u.fwd, ())]
    return u


def _runs(ops: Sequence[str], order: dict[str, int]) -> int:
    """How many separate stretches of `order` the operators `ops` make."""
    at = sorted(order[n] for n in ops if n in order)
    return sum(1 for a, b in zip([None, *at], at, strict=False) if a is None or b != a + 1)


# ------------------------------------------------------------------------------------------------
# Sub-graphs: a unit as a Graph of its own (budgets, and the "framework of solvers")


def unit_graph(ctx: Ctx, unit: Unit) -> Graph:
    """The unit's operators as a Graph: inputs from outside are resident; for a layer a virtual
    loss node reads the forward outputs and produces the incoming gradients (and a 0-byte
    token every backward operator reads, so none runs before it)."""
    owned = unit.owned
    values: dict[str, Value] = {}
    nodes: list[Node] = []
    outputs: list[str] = []
    incoming: list[str] = []
    loss_in: list[str] = []
    seen_in: set[str] = set()
    for n_id in unit.fwd + unit.bwd:
        n = ctx.nodes[n_id]
        for v in n.inputs:
            if ctx.producer.get(v) in owned or v in seen_in:
                continue
            seen_in.add(v)
            if unit.layer and v not in ctx.resident and ctx.producer.get(v) not in ctx.forward:
                incoming.append(v)
                values[v] = Value(id=v, size=ctx.size(v))
            else:
                values[v] = Value(id=v, size=ctx.size(v), role="input")
        for v in n.outputs:
            values[v] = Value(id=v, size=ctx.size(v))
            if ctx.crossing(v, owned):
                if unit.layer and n_id in ctx.forward and v not in ctx.outputs:
                    loss_in.append(v)
                else:
                    outputs.append(v)
    for n_id in unit.fwd:
        nodes.append(ctx.nodes[n_id])
    if unit.layer:
        values[TOKEN] = Value(id=TOKEN, size=0)
        nodes.append(Node(id=LOSS, inputs=loss_in, outputs=[*incoming, TOKEN], cost=0.0, recomputable=False))
        for n_id in unit.bwd:
            n = ctx.nodes[n_id]
            nodes.append(n.model_copy(update={"inputs": [*n.inputs, TOKEN]}))
    order = [n.id for n in nodes]
    return Graph(
        name="hilp-unit", values=list(values.values()), nodes=nodes, outputs=outputs or [TOKEN], order=order
    )


# ------------------------------------------------------------------------------------------------
# Option selection (§3.2.2)


def pareto(opts: list[Opt]) -> list[Opt]:
    uniq: dict[tuple[tuple[str, ...], tuple[str, ...]], Opt] = {}
    for o in opts:
        uniq.setdefault((o.fwd, o.bwd), o)
    cand = sorted(uniq.values(), key=lambda o: (o.time, o.peak, o.phantom, o.fwd, o.bwd))
    out: list[Opt] = []
    for o in cand:
        # an option needing more of the level above (a kept forward value read by the
        # backward part, say) never dominates one that recomputes it instead
        if any(
            q.time <= o.time
            and q.peak <= o.peak
            and q.phantom <= o.phantom
            and q.deps_f <= o.deps_f
            and q.deps_b <= o.deps_b
            for q in out
        ):
            continue
        out.append(o)
    return out


def spread(opts: list[Opt], count: int) -> list[Opt]:
    """§3.2.2: the highest peak, then the lowest, then the one closest to the middle, and so on
    (greedy farthest-point selection on the peaks). For layers the option keeping the least
    between forward and backward is always taken too: the level above trades exactly that
    memory (App. B.1.1), and a spread of peaks alone can drop it."""
    if len(opts) <= count:
        return opts
    by = sorted(opts, key=lambda o: (-o.peak, o.time))
    chosen = [by[0]]
    least_kept = min(opts, key=lambda o: (o.phantom, o.time, o.peak))
    if least_kept is not by[0]:
        chosen.append(least_kept)
    rest = [o for o in by[1:] if o is not least_kept]
    while len(chosen) < count and rest:
        best = max(range(len(rest)), key=lambda i: (min(abs(rest[i].peak - c.peak) for c in chosen), -i))
        chosen.append(rest.pop(best))
    return sorted(chosen, key=lambda o: (o.time, o.peak))


# ------------------------------------------------------------------------------------------------
# Identical subgraphs (App. C.1.1)


def canonical(ctx: Ctx, unit: Unit) -> tuple[tuple[Any, ...], list[str]]:
    """The canonical representation of a unit: its operators in order, each by its
    equivalence class (op, sizes, phase; a cost bucket when there is no op) and the in-unit
    indices of its inputs' producers. Translated schedules are re-measured with each member's
    own costs, so a coarse class only costs quality, never validity."""
    order = list(unit.fwd) + list(unit.bwd)
    idx = {n: i for i, n in enumerate(order)}
    rep: list[Any] = [unit.layer, len(unit.fwd)]
    for n_id in order:
        n = ctx.nodes[n_id]
        ins = []
        for v in n.inputs:
            p = ctx.producer.get(v)
            if p in idx:
                ins.append(("i", idx[p], ctx.nodes[p].outputs.index(v)))
            else:
                ins.append(("x", ctx.size(v), v in ctx.resident))
        outs = tuple((ctx.size(v), ctx.crossing(v, unit.owned)) for v in n.outputs)
        # the op names the code (App. C.1.1); without one, costs within ~20% are one class
        cost = 0 if n.op else (round(math.log(n.cost) / math.log(1.5)) if n.cost > 0 else None)
        rep.append((n.op, cost, n.workspace, n.phase, n.recomputable, outs, tuple(ins)))
    return tuple(rep), order
