"""hilp: HiREmate's hierarchical solver — H-Partition, per-subgraph options, the H-ILP.

Gusak et al., *HiREmate: Hierarchical Approach for Efficient Re-materialization of Large Neural
Networks*: §3 (H-Partition §3.1, H-Solver §3.2, option selection §3.2.2), Appendix A
(Algorithm 2, in :mod:`remat_cli.solvers.hpartition`), Appendix B.2-B.3 (the H-ILP,
eqs. 2 and 5-10) and Appendix C.1.1 (identical subgraphs).

How the pieces fit:

- **Units.** A unit is a piece of the graph solved as one compute node one level up. An atomic
  unit is one operator. On training graphs (nodes carry ``phase`` and ``grad_of``) a
  subgraph of forward operators and the backward operators that differentiate them form a
  *layer* (App. B.1.1): compute nodes F_j and B_j sharing their options, with a *phantom node*
  holding what option o keeps between F_j and B_j. Where ``grad_of`` is missing (ONNX training
  graphs carry ``phase`` only) the pairing comes from the dataflow (:func:`structural_pairs`),
  and a forward operator with several backward operators is a level-0 layer solved for its
  own options. Elsewhere (inference graphs, networkx data without phases) a subgraph is one
  plain compute node with options (§3.2.2).
- **Bottom-up solving (§3.2.1).** H-Partition groups the (forward) graph level by level. For each
  subgraph, an H-ILP instance is built over its children units (plus a virtual *loss* node for
  layers, App. B.2: it stands for "the rest of the graph" between forward and backward), and
  solved under several budgets (``levels``); each schedule, flattened to operator sequences,
  becomes an *option* of the subgraph: (forward sequence, backward sequence, time, peak, phantom
  size). Leaves are H-ILPs over atomic units, i.e. RK-Checkmate; other registered solvers
  that apply (``leaf_solvers``, e.g. ``checkmate``) add their schedules of the same subgraph as
  more options — HiREmate's "framework of solvers".
- **Option metrics** are measured by replaying each option's sequences on the operators (never
  taken from an ILP): time, the overhead m_{k,o} of eq. (10) (peak above what stays after), the
  phantom size p_{j,o} and the option-specific dependencies d →o k (App. B.1.2).
- **Top level.** The H-ILP over the top units under the user's budget (minus the resident
  inputs and parameters); its schedule is flattened into one operator sequence, decoded by
  :func:`remat_cli.schedule.steps_from_sequence` and simulated. When the simulated peak exceeds
  the budget (the ILP's memory model is an approximation, App. B.3), the ILP budget is lowered
  and the top solved again.
- **Warm start.** Every H-ILP (units and top) starts from the *sequential* schedule over its
  compute nodes (each once, in order) with one option per unit, chosen greedily from the
  phantom minimum towards faster options while the H-ILP's own memory rows hold
  (:func:`sequential_hint`). HiGHS alone often found no incumbent at all in its limits on a
  25-unit top (the 2000-node transformer at 50%: "unknown"); started, it proves optimality
  over the options there, and a cut-short run still returns a schedule made of options.
  Where no sequential choice fits, a greedy schedule that recomputes plain compute nodes
  (evicting the data node read farthest ahead) is the start (:func:`recompute_hint`).
- **Refined top.** A unit holds all its outputs together, so a fixed grouping can rule out
  every schedule within a tight budget (on ONNX training graphs the backward block paired with
  one forward operator holds gradients that other blocks consume much later). A second top
  instance goes one level down where the memory is (:func:`refine`: the units with the
  largest smallest-peak option replaced by their :func:`pieces`, up to ``FINER_TOP`` x M^t
  compute nodes) is solved after the top, with half the top's nominal time (the overall
  deadline still holds), and the cheaper schedule counts.
- **When the hierarchy finds nothing (or little).** Whole-graph solvers run in a fixed order
  (``FALLBACK``: greedy, then fastsa with the 15% of the time limit kept for them) and the
  cheapest schedule within budget is used: "infeasible" is only reported when none of them
  finds one; the message says which produced the result.
- **Determinism.** With one worker every H-ILP stops on work (HiGHS node limits, CP-SAT
  deterministic time), never on the clock; a HiGHS run the overall deadline cuts short is
  dropped, so the deterministic fallbacks stand in for it (:func:`solve_instance`).
"""

from __future__ import annotations

import heapq
import math
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from remat_cli.graph import Graph, GraphError, Node, Value
from remat_cli.milp import EngineSettings, LinearModel
from remat_cli.milp import solve as milp_solve
from remat_cli.schedule import Step, baseline, peak_lower_bound, simulate, steps_from_sequence
from remat_cli.solvers.base import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.hpartition import LevelGraph, h_partition

LOSS = "__hilp_loss__"
#: whole-graph solvers tried, in this order, when the H-ILP finds nothing within budget
FALLBACK = ("greedy", "fastsa")
#: the refined top (units replaced by their pieces where the memory is) has at most this many
#: times M^t compute nodes
FINER_TOP = 3
TOKEN = "__hilp_token__"
#: options kept per top-level unit at least (§3.2.2's N_o split gives the rest)
TOP_OPTIONS = 6


# ------------------------------------------------------------------------------------------------
# Context: the graph's lookups restricted to the nodes some output needs


class Ctx:
    def __init__(self, graph: Graph, training: bool):
        self.graph = graph
        self.needed = graph.needed_nodes
        self.pos = {n: i for i, n in enumerate(graph.topo_order)}
        self.nodes = graph.node_map
        self.values = graph.value_map
        self.producer = graph.producer
        self.consumers = {v: [c for c in cs if c in self.needed] for v, cs in graph.consumers.items()}
        self.resident = {v.id for v in graph.values if v.resident}
        self.outputs = set(graph.outputs)
        self.forward: set[str] = set()
        self.grads: dict[str, list[str]] = defaultdict(list)
        if training:
            for n in graph.nodes:
                if n.id in self.needed and n.phase == "forward":
                    self.forward.add(n.id)
            pairs = grad_pairs(graph)
            for n in graph.nodes:
                f = pairs.get(n.id)
                if n.id in self.needed and f in self.forward:
                    self.grads[f].append(n.id)

    def size(self, v: str) -> int:
        return self.values[v].size

    def crossing(self, v: str, owned: set[str] | frozenset[str]) -> bool:
        """Value v leaves the unit owning `owned`: a graph output or read outside it."""
        return v in self.outputs or any(c not in owned for c in self.consumers[v])


def grad_pairs(graph: Graph) -> dict[str, str]:
    """Backward node -> the forward node it differentiates: ``grad_of`` where the graph says it;
    otherwise (Checkmate/Moccasin networkx data carry ``phase`` only) the forward node whose op
    is the backward op without its ``_backward`` suffix, when that op is unique; otherwise (ONNX
    training graphs: ``phase`` but neither) :func:`structural_pairs`."""
    out = {n.id: n.grad_of for n in graph.nodes if n.grad_of is not None and n.phase != "forward"}
    if out:
        return out
    by_op: dict[str, list[str]] = defaultdict(list)
    for n in graph.nodes:
        if n.phase == "forward" and n.op:
            by_op[n.op].append(n.id)
    for n in graph.nodes:
        if n.phase == "backward" and n.op and n.op.endswith("_backward"):
            fw = by_op.get(n.op.removesuffix("_backward"), [])
            if len(fw) == 1:
                out[n.id] = fw[0]
    if out:
        return out
    return structural_pairs(graph)


def structural_pairs(graph: Graph) -> dict[str, str]:
    """Pair backward nodes with forward nodes from the dataflow alone (no names needed).

    A backward chain starts where it reads layer j's activations (App. B.1.1: what a layer keeps
    from F_j to B_j): such a node, with no paired backward predecessor, is paired with the
    deepest forward node whose output it reads. Every other backward node continues gradients
    and is paired with the shallowest of its backward predecessors' partners: gradients flow
    from deep layers to shallow ones, so along every backward edge the pairing never gets
    deeper (this keeps the F_j -> loss -> B_j quotient acyclic for chains of layers). Backward
    nodes reading neither (e.g. a transposed weight) take the pairing of their backward
    successors, the deepest one (so the edge to it stays monotone)."""
    order = graph.topo_order
    pos = {n: i for i, n in enumerate(order)}
    nodes = graph.node_map
    producer = graph.producer
    forward = {n.id for n in graph.nodes if n.phase == "forward"}
    backward = [n for n in order if nodes[n].phase not in ("forward", "loss")]
    if not forward or not backward:
        return {}
    bset = set(backward)
    depth: dict[str, float] = {}
    for b in backward:
        # the gradient it continues (its paired backward predecessors) decides first: a weight
        # gradient reads layer j's *input* activation but belongs to layer j, whose output
        # gradient it reads
        d = min((depth[p] for v in nodes[b].inputs if (p := producer.get(v)) in bset), default=math.inf)
        if math.isinf(d):
            reads = [pos[p] for v in nodes[b].inputs if (p := producer.get(v)) in forward]
            d = float(max(reads)) if reads else math.inf
        depth[b] = d
    succs: dict[str, list[str]] = defaultdict(list)
    for b in backward:
        for v in nodes[b].inputs:
            p = producer.get(v)
            if p in bset:
                succs[p].append(b)
    for b in reversed(backward):
        if math.isinf(depth[b]):
            ds = [depth[s] for s in succs[b] if not math.isinf(depth[s])]
            if ds:
                depth[b] = max(ds)
    return {b: order[int(d)] for b, d in depth.items() if not math.isinf(d)}


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


def atomic(ctx: Ctx, n: str) -> Unit:
    u = Unit(fwd=(n,), bwd=(), layer=False)
    u.options = [measure(ctx, u.owned, (n,), ())]
    return u


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


def build_instance(ctx: Ctx, units: list[Unit], with_loss: bool) -> Instance:
    """Compute nodes (F_j/B_j per layer, one per plain unit, the virtual loss when the instance
    is a layer being solved for its options) and data nodes (values crossing between them)."""
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
        pos = [ctx.pos[n] for n in it.seqs[0]]
        at = (max(pos) if it.side == 2 else min(pos)) if pos else 0
        return (it.side, at, k)

    ready = [key(k) for k in range(n_items) if indeg[k] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        *_, k = heapq.heappop(ready)
        order.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, key(s))
    if len(order) != n_items:
        raise AssertionError("H-ILP instance has a cyclic dependency between compute nodes")
    new_index = {k: i for i, k in enumerate(order)}
    items = [raw[k] for k in order]
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


def hilp_model(
    inst: Instance, budget: int, corrections: bool = False, kept_budget: int | None = None
) -> tuple[LinearModel, dict[tuple[int, int, int], int]]:
    """The H-ILP of App. B.2-B.3 for `inst` under `budget` (bytes, scaled by their gcd).

    One deliberate departure: eq. (8) is split in two rows (see there) so that F_j may run again
    before B_j with its phantom in memory, to recompute its outputs; every schedule the paper's
    rows allow is still allowed.

    Variables (all binary): R^t_{k,o}, P^t_d, Sp^t_{j,o}, C^t_d, D^t_{k,d}. Every data node here
    has one producer, so S^t_{k,d} coincides with P^t_d (with a single contribution, "d holds
    k's contribution" and "d is in memory" are the same event) and is not duplicated.
    Returns the model and the column of each R^t_{k,o} keyed (t, k, o)."""
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
        for k in range(t + 1):
            for o, tm in enumerate(items[k].times):
                R[(t, k, o)] = var(tm)  # objective, eq. (2)
    P: dict[tuple[int, int], int] = {}
    for d in range(nd):
        for t in range(inst.producer[d] + 1, T + 1):
            P[(t, d)] = var()
    layers = sorted(inst.layer_of.items())
    Sp: dict[tuple[int, int, int], int] = {}
    for j, (f, _b) in layers:
        for t in range(f + 1, T + 1):
            for o in range(len(items[f].seqs)):
                Sp[(t, j, o)] = var()
    C: dict[tuple[int, int], int] = {}
    for d in range(nd):
        for t in range(inst.producer[d], T):
            C[(t, d)] = var()
    # related compute nodes of each data node: its producer and the items of its users
    related: list[list[int]] = []
    use_opts: list[dict[int, list[int]]] = []
    for d in range(nd):
        uo: dict[int, list[int]] = defaultdict(list)
        for k, o in inst.users[d]:
            uo[k].append(o)
        use_opts.append(uo)
        related.append(sorted({inst.producer[d], *uo}))
    D: dict[tuple[int, int, int], int] = {}
    for d in range(nd):
        for t in range(inst.producer[d], T):
            for k in related[d]:
                if k <= t:
                    D[(t, k, d)] = var()
    m = LinearModel("hilp")
    m.add_vars(len(cost), lb=0.0, ub=1.0, integer=True, cost=np.array(cost))
    rows = _Rows()
    inf = math.inf

    def CR(t: int, k: int) -> list[tuple[int | None, float]]:
        return [(R[(t, k, o)], 1.0) for o in range(len(items[k].times))] if k <= t else []

    def Rsum(t: int, k: int, opts: list[int]) -> list[tuple[int | None, float]]:
        return [(R[(t, k, o)], 1.0) for o in opts] if k <= t else []

    # (5) at most one option per computation; validity: node t is computed in phase t
    for t in range(T):
        for k in range(t + 1):
            rows.add(CR(t, k), 1.0 if k == t else 0.0, 1.0)
    # the loss node runs exactly once
    if inst.loss is not None:
        rows.add([term for t in range(inst.loss, T) for term in CR(t, inst.loss)], 1.0, 1.0)
    # phantom nodes, (6)-(9)
    for j, (f, b) in layers:
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
        if inst.final[d]:
            rows.add([(P[(T, d)], 1.0)], 1.0, 1.0)
    # data dependencies (incl. option-specific ones): R^t_{k',o} <= CR^t_k + P^t_d
    for d in range(nd):
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
    # memory, U^t_k and eq. (10)
    mem_rows: list[tuple[int, int, int]] = []
    for t in range(T):
        base: list[tuple[int | None, float]] = [(P.get((t, d)), float(s_d[d])) for d in range(nd) if s_d[d]]
        for j, (f, _b) in layers:
            for o in range(len(items[f].seqs)):
                pj = sc(items[f].phantom[o])
                if pj:
                    base.append((Sp.get((t, j, o)), float(pj)))
        acc = list(base)
        for k in range(t + 1):
            it = items[k]
            for d in it.outs:
                if s_d[d]:
                    acc.append((C[(t, d)], float(s_d[d])))
            del_d = [d for d in range(nd) if (t, k, d) in D and s_d[d]]
            dels = [(D[(t, k, d)], float(s_d[d])) for d in del_d]
            acc.extend((c, -v) for c, v in dels)
            if it.kind == "F":
                for o in range(len(it.seqs)):
                    pj = sc(it.phantom[o])
                    if pj:
                        acc.append((R[(t, k, o)], float(pj)))
            elif it.kind == "B":
                j = it.unit
                f = inst.layer_of[j][0]
                for o in range(len(it.seqs)):
                    pj = sc(it.phantom[o])
                    if pj:
                        acc.extend([(R[(t, f, o)], -pj), (Sp.get((t, j, o)), -pj), (Sp[(t + 1, j, o)], pj)])
            over = [(R[(t, k, o)], float(sc(it.m[o]))) for o in range(len(it.seqs)) if it.m[o]]
            mem_rows.append((len(rows.lb), t, k))
            if kept_budget is not None and k == inst.loss and t == inst.loss:
                # what the forward part leaves for the backward part (the layer's phantom)
                rows.add([*acc], -inf, float(kept_budget // g))
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
    first = m.num_constraints
    rows.flush(m)
    m.mem_rows = [(first + r, t, k) for r, t, k in mem_rows]  # type: ignore[attr-defined]
    m.mem_scale = g  # type: ignore[attr-defined]
    m.var_maps = (R, P, Sp, C, D)  # type: ignore[attr-defined]
    return m, R


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
    return x


#: most feasibility checks one sequential-hint search may make (a work limit, not a clock)
HINT_CHECKS = 4000


def sequential_hint(inst: Instance, model: LinearModel) -> np.ndarray | None:
    """A feasible starting solution for the H-ILP: the sequential schedule (every compute node
    once, in order) with one option per unit, chosen greedily. It starts from the options
    keeping the least between forward and backward (the phantom minimum of App. B.1.1) or
    with the smallest peak, and repeatedly switches the unit whose faster option saves the most
    time while the H-ILP's own memory rows still hold. The engine starts from it (HiGHS:
    setSolution), so a top H-ILP cut short by its limits still returns a schedule built from
    the options -- and improves it by recomputing (dropping and recomputing data nodes)
    where that pays. None when no sequential choice fits."""
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
    cur: list[int] | None = None
    x: np.ndarray | None = None
    for key in keys:
        cu = [min(range(len(u.options)), key=lambda i, u=u: key(u.options[i])) for u in units]
        x = fits(cu)
        if x is not None:
            cur = cu
            break
    if cur is None:
        return None
    while checks < HINT_CHECKS:
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
            if checks >= HINT_CHECKS:
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


def recompute_hint(inst: Instance, model: LinearModel, budget: int) -> np.ndarray | None:
    """A starting solution that recomputes, for H-ILPs whose sequential schedule fits nowhere
    (tight budgets; Checkmate's own solver starts from a greedy schedule the same way). Phase t
    computes item t after recomputing the plain items producing inputs no longer in memory;
    after each phase, data nodes no later item reads are freed, and while the next phase would
    not fit, the recomputable data node read farthest ahead is evicted (Belady), at the last
    phase that related to it (the deletion rule of App. B.3 deletes only after a related
    computation). Plain items and F_j before its B_j (rows (8a)/(8b)) are recomputed; B_j runs
    once. The schedule is aimed under a shrinking
    share of `budget` until its H-ILP vector (derived as in :func:`sequential_x`) satisfies
    every row; None when none does."""
    R, P, Sp, C, D = model.var_maps  # type: ignore[attr-defined]
    items = inst.items
    T = len(items)
    nd = len(inst.sizes)
    choice_u = [
        min(
            range(len(u.options)),
            key=lambda i, u=u: (u.options[i].phantom, u.options[i].peak, u.options[i].time),
        )
        for u in inst.units
    ]
    choice = [0 if it.kind == "loss" else choice_u[it.unit] for it in items]
    reads: list[list[int]] = [[] for _ in range(T)]
    readers: list[list[int]] = [[] for _ in range(nd)]
    for d, us in enumerate(inst.users):
        for k, o in us:
            if o == choice[k] and k != inst.producer[d]:
                reads[k].append(d)
                readers[d].append(k)
    last_reader = [max(r, default=-1) for r in readers]
    sizes = inst.sizes
    A = model.matrix()
    lo = model.row_lb - 1e-6
    hi = model.row_ub + 1e-6

    def phases_for(aim: float) -> tuple[list[list[int]], list[set[int]]] | None:
        alive: set[int] = set()
        ends: list[set[int]] = []
        phases: list[list[int]] = []
        last_rel: dict[int, int] = {}
        kept = 0  # phantoms between F_j and B_j

        def rerunnable(k: int, t: int) -> bool:
            it = items[k]
            return it.kind == "plain" or (it.kind == "F" and inst.layer_of[it.unit][1] > t)

        def plan(t: int) -> list[int] | None:
            """Items phase t runs: t after the plain producers of inputs not in memory."""
            comp: set[int] = set()

            def run(k: int) -> bool:
                for d in reads[k]:
                    p = inst.producer[d]
                    if d not in alive and p not in comp and (not rerunnable(p, t) or not run(p)):
                        return False
                comp.add(k)
                return True

            return sorted(comp) if run(t) else None

        def peak(t: int, comp: list[int]) -> tuple[int, set[int]]:
            """Memory at the phase's fullest item, and the data it reads."""
            live = set(alive)
            mem = sum(sizes[d] for d in live) + kept
            top = 0
            used = set()
            for k in comp:
                new = [d for d in items[k].outs if d not in live]
                top = max(top, mem + sum(sizes[d] for d in new) + items[k].m[choice[k]])
                live.update(new)
                mem += sum(sizes[d] for d in new)
                used.update(reads[k])
                done = [d for d in reads[k] if max((r for r in readers[d] if r in comp), default=-1) <= k]
                for d in done:
                    if d in live and last_reader[d] <= t and not inst.final[d]:
                        live.discard(d)
                        mem -= sizes[d]
            return top, used

        for t in range(T):
            comp = plan(t)
            if comp is None:
                return None
            top, used = peak(t, comp)
            while top > aim:
                cands = [
                    (nxt, sizes[d], d)
                    for d in alive
                    if d not in used
                    and not inst.final[d]
                    and rerunnable(inst.producer[d], nxt := min(k for k in readers[d] if k > t))
                ]
                if not cands:
                    break
                *_, d = max(cands)
                alive.discard(d)
                for e in ends[last_rel[d] :]:
                    e.discard(d)
                top, used = peak(t, comp)
            for k in comp:
                alive.update(items[k].outs)
                for d in (*reads[k], *items[k].outs):
                    last_rel[d] = t
            it = items[t]
            if it.kind == "F":
                kept += it.phantom[choice[t]]
            elif it.kind == "B":
                kept -= it.phantom[choice[t]]
            alive -= {d for d in alive if last_reader[d] <= t and not inst.final[d]}
            ends.append(set(alive))
            phases.append(comp)
        return phases, ends

    def vector(phases: list[list[int]], ends: list[set[int]]) -> np.ndarray | None:
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
        return x

    for frac in RECOMPUTE_AIMS:
        sched = phases_for(frac * budget)
        if sched is None:
            return None
        x = vector(*sched)
        if x is not None:
            ax = A @ x
            if bool(np.all(ax <= hi) and np.all(ax >= lo)):
                return x
    return None


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


# ------------------------------------------------------------------------------------------------
# Refining the top where the memory is


def pieces(ctx: Ctx, unit: Unit) -> list[Unit]:
    """One level down from `unit`: its children; for a unit whose children are single operators
    (a level-0 layer: one forward operator and the backward block paired with it), the
    operators of its forward part and the *runs* of its backward block, maximal stretches with
    no foreign operator between them in the graph's order. A run is convex (every path between
    two of its operators passes only operators the order puts between them), and splitting at
    the runs lets the top interleave blocks as the graph's own order does, instead of holding a
    whole block's outputs together."""
    assert unit.children is not None
    if any(c.ops > 1 for c in unit.children) or not unit.bwd:
        return unit.children
    out = [c for c in unit.children if c.fwd[0] in unit.fwd]
    at = sorted(ctx.pos[n] for n in unit.bwd)
    runs: list[list[str]] = []
    for a, b in zip([None, *at], at, strict=False):
        if a is None or b != a + 1:
            runs.append([])
        runs[-1].append(ctx.graph.topo_order[b])
    for r in runs:
        u = Unit(fwd=tuple(r), bwd=(), layer=False)
        u.options = [measure(ctx, u.owned, u.fwd, ())]
        out.append(u)
    return out


def refine(ctx: Ctx, units: list[Unit], cap: int) -> list[Unit] | None:
    """The top units with the unit needing the most memory (its smallest-peak option) replaced
    by its :func:`pieces`, again and again while the instance stays within `cap` compute
    nodes; None when nothing could be refined."""

    def items(us: list[Unit]) -> int:
        return sum(2 if u.layer else 1 for u in us)

    cur = list(units)
    changed = False
    while True:
        cands = [(min(o.peak for o in u.options), -i) for i, u in enumerate(cur) if u.children and u.options]
        new = None
        for _, neg in sorted(cands, reverse=True):
            i = -neg
            trial = cur[:i] + pieces(ctx, cur[i]) + cur[i + 1 :]
            if items(trial) <= cap:
                new = trial
                break
        if new is None:
            return cur if changed else None
        cur, changed = new, True


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
# Solving one unit for its options


@dataclass
class Job:
    unit: Unit
    fractions: tuple[float, ...]
    time_limit: float | None
    backend: str
    seed: int
    deterministic: bool
    leaf_solvers: tuple[str, ...]
    deadline: float | None = None  # epoch seconds (worker processes share the clock)


_CTX: Ctx | None = None  # set before forking the worker processes


#: deterministic mode: HiGHS branch-and-bound nodes per second of an ILP's share, per unit of
#: model size (variables + rows) -- a work limit in place of the wall clock
NODE_RATE = 2e6


def solve_instance(
    inst: Instance,
    budget: int,
    time_limit: float | None,
    backend: str,
    seed: int,
    deterministic: bool,
    corrections: bool = False,
    kept_budget: int | None = None,
    gap: float = 1e-4,
    deadline: float | None = None,
) -> tuple[list[tuple[int, int]] | None, str]:
    """Solve one H-ILP. With ``deterministic`` (one worker and a seed) the engine stops on work
    done, not on the wall clock, so a seeded run repeats exactly: CP-SAT on its deterministic
    time, HiGHS on a node limit sized from ``time_limit`` and the model. The wall clock
    (``deadline``, epoch seconds: the end of the ILP work) still stops a HiGHS run that would
    overrun the user's time limit -- HiGHS has no work limit on its root node -- and what such
    a run found is dropped (the status says so), so that only work-limited results count."""
    model, R = hilp_model(inst, budget, corrections, kept_budget)
    hint = sequential_hint(inst, model)
    if hint is None:
        hint = recompute_hint(inst, model, budget)
    engine_options: dict[str, dict[str, Any]] = {}
    wall = time_limit
    if deterministic and time_limit is not None:
        size = model.num_vars + model.num_constraints
        nodes = max(10, int(time_limit * NODE_RATE / max(1, size)))
        engine_options["highs"] = {"mip_max_nodes": nodes}
        if backend == "highs":
            wall = None if deadline is None else max(0.05, deadline - time.time())
    settings = EngineSettings(
        backend=backend,
        time_limit=wall,
        threads=1,
        seed=seed,
        deterministic=deterministic,
        rel_gap=gap,
        engine_options=engine_options,
        hint=hint,
    )
    res = milp_solve(model, settings)
    status = res.status
    if deterministic and wall is not None and deadline is not None and time.time() >= deadline - 0.05:
        # a solution the clock picked is not reproducible: drop it; the sequential start (a
        # deterministic function of the options) and the fallbacks stand in
        res.x = None
        status += " (stopped by the clock: dropped for determinism)"
    if res.x is None or (hint is not None and model.objective(res.x) > model.objective(hint) + 1e-9):
        if hint is None:
            return None, status
        return decode(inst, hint, R), status + " (its sequential start)"
    return decode(inst, res.x, R), status


def unit_options(ctx: Ctx, job: Job) -> list[Opt]:
    """Schedules of the unit under several budgets (its options), plus the two trivial ones."""
    unit = job.unit
    assert unit.children is not None
    inst = build_instance(ctx, unit.children, with_loss=unit.layer)
    owned = unit.owned
    found: list[Opt] = []
    for pick in ("time", "peak"):
        f, b = flatten(inst, trivial(inst, pick))
        found.append(measure(ctx, owned, f, b))
        if unit.layer:
            # keep nothing between forward and backward: the backward pass recomputes the forward
            found.append(measure(ctx, owned, f, f + b))
    sub = unit_graph(ctx, unit)
    hi = baseline(sub).peak_memory
    lo = peak_lower_bound(sub)
    res = sub.resident_bytes
    runs: list[tuple[int, int | None]] = [(int(lo + frac * (hi - lo)) - res, None) for frac in job.fractions]
    if unit.layer and inst.loss is not None:
        # options that bound what is kept from forward to backward (the phantom) rather than
        # the peak: the top level trades exactly that against backward time
        fixed = sum(s for d, s in enumerate(inst.sizes) if inst.producer[d] == inst.loss)
        fixed += sum(s for d, s in enumerate(inst.sizes) if any(k == inst.loss for k, _ in inst.users[d]))
        p0 = found[0].phantom
        runs += [(hi - res, fixed + int(frac * p0)) for frac in job.fractions[1:]]
    per = None if job.time_limit is None else job.time_limit / max(1, len(runs))
    for budget, kept in runs:
        # options need not be proven optimal: a 1% gap saves most of the search
        sched, _ = solve_instance(
            inst, budget, per, job.backend, job.seed, job.deterministic, True, kept, 0.01, job.deadline
        )
        if sched is not None:
            f, b = flatten(inst, sched)
            found.append(measure(ctx, owned, f, b))
    for name in job.leaf_solvers:
        found.extend(_leaf_solver_options(ctx, unit, sub, name, lo, hi, job))
    return pareto(found)


def _leaf_solver_options(
    ctx: Ctx, unit: Unit, sub: Graph, name: str, lo: int, hi: int, job: Job
) -> list[Opt]:
    """Options from another registered solver run on the unit's own Graph (the "framework of
    solvers", §3.2.1): its compute sequence, split at the virtual loss."""
    from remat_cli.solvers import registry

    try:
        solver = registry.get(name)
    except KeyError:
        return []
    if solver.availability()[0] != "available" or solver.supports(sub) is not None:
        return []
    out = []
    per = None if job.time_limit is None else job.time_limit / max(1, len(job.fractions))
    for frac in job.fractions:
        budget = int(lo + frac * (hi - lo))
        opts = SolveOptions(time_limit=per, seed=job.seed, workers=1)
        opts.params = solver.defaults()
        try:
            r = solver.solve(sub, budget, opts)
        except Exception:  # a failing helper solver only costs its options
            continue
        if r.steps is None:
            continue
        seq = [s.node for s in r.steps if s.op == "compute" and s.node is not None]
        if seq.count(LOSS) > 1:
            continue  # the rest of the graph runs once
        if LOSS in seq:
            i = seq.index(LOSS)
            fwd, bwd = seq[:i], seq[i + 1 :]
        else:
            fwd, bwd = seq, []
        if any(n in unit.bwd for n in fwd) or not set(unit.fwd) <= set(fwd) or not set(unit.bwd) <= set(bwd):
            continue  # not a forward/backward schedule of the whole unit
        out.append(measure(ctx, unit.owned, fwd, bwd))
    return out


def _run_job(job: Job) -> list[Opt]:
    assert _CTX is not None
    return unit_options(_CTX, job)


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


# ------------------------------------------------------------------------------------------------
# The solver


class HILP(Solver):
    name = "hilp"
    method = "hierarchical ILP over H-Partition subgraphs with per-subgraph options (H-ILP)"
    paper = "HiREmate (Gusak et al.), §3 and Appendices A-C"
    exact = False
    params = (
        Param("max_subgraph", int, 8, "M^l: most nodes in a lower-level subgraph (H-Partition)"),
        Param("max_top", int, 24, "M^t: most nodes in the top-level graph (H-Partition)"),
        Param("alpha", float, 0.5, "α of the H-Partition score s_α, eq. (1)"),
        Param("options", int, 48, "N_o: most options over all compute nodes of one H-ILP (§3.2.2)"),
        Param(
            "levels",
            int,
            4,
            "peak budgets each subgraph is solved under to make its options (layers also get "
            "levels-1 budgets on the memory kept from forward to backward)",
        ),
        Param("jobs", int, 1, "parallel processes for the independent subgraphs of one level"),
        Param(
            "backend",
            str,
            "auto",
            "MILP engine for the H-ILPs (auto: HiGHS)",
            ("auto", "highs", "scip", "cpsat", "gurobi"),
        ),
        Param(
            "leaf_solvers",
            str,
            "",
            "other registered solvers adding options on leaf subgraphs, comma-separated (e.g. checkmate)",
        ),
    )

    def notes(self) -> str:
        return (
            "Training graphs with phase/grad_of pair each subgraph's forward and backward into a "
            "layer with phantom nodes; other graphs use plain subgraph nodes. Schedules are "
            "feasible, not proven optimal. With --time-limit, about half goes to the subgraph "
            "levels and the rest to the top H-ILP; on time-out the best schedule found is returned "
            "(every unit run once with its fastest, smallest or least-kept option is always tried, "
            "and every H-ILP starts from the best such sequential schedule that fits its memory rows). "
            "A second top, refined one level down where the memory is, follows with half the top's "
            "time; greedy "
            "and fastsa then run on the whole graph with the last 15% of the time and the cheapest "
            "schedule is used (the message says which)."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        p = self.defaults() | options.params
        return _Solve(graph, budget, options, p).run()


class _Solve:
    def __init__(self, graph: Graph, budget: int, options: SolveOptions, params: dict[str, Any]):
        self.g = graph
        self.budget = budget
        self.opt = options
        self.p = params
        self.deterministic = options.workers == 1
        backend = str(params["backend"])
        if backend == "auto":
            backend = "highs"
        self.backend = backend
        self.limit = options.time_limit
        self.started = time.monotonic()
        #: the end of the ILP work (epoch seconds), leaving 15% of the limit to the fallback
        self.deadline = None if self.limit is None else time.time() + 0.85 * self.limit

    def training(self) -> bool:
        """Layers apply when backward nodes name their forward node and the quotient
        F → loss → B structure exists; else plain subgraphs."""
        fw = {n.id for n in self.g.nodes if n.id in self.g.needed_nodes and n.phase == "forward"}
        return bool(fw) and any(f in fw for f in grad_pairs(self.g).values())

    def run(self) -> SolverResult:
        g = self.g
        self.early_incumbent()
        try:
            ctx = Ctx(g, self.training())
            top_units = self.hierarchy(ctx)
            inst = build_instance(ctx, top_units, with_loss=False)
        except (AssertionError, GraphError):
            # layers whose quotient has a cycle (a pairing that does not follow the gradient
            # flow): plain subgraphs instead
            ctx = Ctx(g, False)
            top_units = self.hierarchy(ctx)
            inst = build_instance(ctx, top_units, with_loss=False)
        base = baseline(g)
        best: tuple[float, list[Step], int] | None = None
        if base.peak_memory <= self.budget:
            best = (base.cost, _baseline_steps(g), base.peak_memory)
            self.opt.incumbent(best[1])
        lowest = base.peak_memory
        resident = g.resident_bytes
        target = self.budget - resident
        # incumbents before the top ILP: every unit once with its fastest or smallest option
        for pick in ("time", "peak", "kept"):
            steps = steps_from_sequence(g, flatten(inst, trivial(inst, pick))[0])
            sim = simulate(g, steps)
            lowest = min(lowest, sim.peak_memory)
            if sim.peak_memory <= self.budget and (best is None or sim.cost < best[0]):
                best = (sim.cost, steps, sim.peak_memory)
                self.opt.incumbent(steps)
        # one level down where the memory is: the units needing the most memory replaced by
        # their pieces (less is held together) while the instance stays of a solvable size,
        # solved after the top with half its nominal time (the overall deadline still holds);
        # the cheaper schedule counts
        finer = refine(ctx, top_units, FINER_TOP * int(self.p["max_top"]))
        found, statuses, low = self.solve_top(inst, target)
        lowest = min(lowest, low)
        msg = (
            f"{len(top_units)} top-level units, {len(inst.items)} compute nodes; top H-ILP "
            f"{'/'.join(statuses) or 'not run'} on {self.backend}"
        )
        if found is not None:
            msg += f" (overhead {found[0] / base.cost - 1:.4f})"
        if finer is not None:
            self.select(finer, TOP_OPTIONS)
            inst2 = build_instance(ctx, finer, with_loss=False)
            found2, statuses, low = self.solve_top(inst2, target, 0.5 if self.deterministic else 1.0)
            lowest = min(lowest, low)
            msg += f"; refined ({len(inst2.items)} compute nodes): {'/'.join(statuses)}"
            if found2 is not None:
                msg += f" (overhead {found2[0] / base.cost - 1:.4f})"
                if found is None or found2[0] < found[0]:
                    found = found2
        if found is not None and (best is None or found[0] < best[0]):
            best = found
            self.opt.incumbent(best[1])
        # the hierarchy's fixed grouping can rule out every schedule a finer one has (a unit
        # keeps all its outputs together), and a top H-ILP cut short by the clock can be poor:
        # leaf solvers on the whole graph, the framework of solvers (§3.2.1) applied at the
        # top, compete with it, and nothing is called infeasible before they have run
        fb = self.fallback()
        if fb is not None and (best is None or fb[0] < best[0]):
            best = fb[:3]
            msg += (
                f"; used: {fb[3]} on the whole graph (overhead {fb[0] / base.cost - 1:.4f}: cheaper "
                "than the H-ILP's schedule or none)"
            )
            self.opt.incumbent(best[1])
        elif fb is None and best is None:
            msg += "; whole-graph greedy and fastsa found none either"
        else:
            msg += "; used: H-ILP"
        if best is None:
            return SolverResult(
                steps=None,
                status="infeasible" if self.limit is None else "unknown",
                backend=self.backend,
                message=msg,
                best_peak=lowest,
            )
        return SolverResult(
            steps=best[1],
            status="feasible",
            backend=self.backend,
            objective=best[0],
            message=msg,
            params={"max_subgraph": self.p["max_subgraph"]},
        )

    def solve_top(
        self, inst: Instance, target: int, share: float = 1.0
    ) -> tuple[tuple[float, list[Step], int] | None, list[str], int]:
        """The top H-ILP under the user's budget, with `share` of the top's time; when the
        simulated peak exceeds it (the ILP's memory model is an approximation, App. B.3) the ILP
        budget is lowered and it is solved again. Returns the schedule within budget (cost,
        steps, peak), the statuses and the lowest simulated peak."""
        g = self.g
        tries = 0
        statuses: list[str] = []
        lowest = 1 << 62
        while tries < 4:
            tries += 1
            top_time = None
            if self.limit is not None:
                # 15% of the limit stays for the whole-graph fallback; deterministic runs size
                # their work limit from the nominal split, never from the clock
                if self.deterministic:
                    left = 0.35 * self.limit * share
                else:
                    left = (0.85 * self.limit - self.elapsed()) * (share if tries == 1 else 1.0)
                top_time = max(0.2, left) * (0.8 if tries == 1 else 0.5)
            sched, top_status = solve_instance(
                inst,
                target,
                top_time,
                self.backend,
                self.opt.seed,
                self.deterministic,
                corrections=True,
                deadline=self.deadline,
            )
            statuses.append(top_status)
            if sched is None:
                break
            f, _ = flatten(inst, sched)
            steps = steps_from_sequence(g, f)
            sim = simulate(g, steps)
            lowest = min(lowest, sim.peak_memory)
            self.opt.progress(stage="top", attempt=tries, peak=sim.peak_memory, cost=sim.cost)
            if sim.peak_memory <= self.budget:
                return (sim.cost, steps, sim.peak_memory), statuses, lowest
            # the ILP's memory model was optimistic: ask it for proportionally less
            over = sim.peak_memory - self.budget
            target -= max(over, int(0.02 * max(target, 1)))
            if target <= 0:
                break
        return None, statuses, lowest

    def fallback(self) -> tuple[float, list[Step], int, str] | None:
        """The cheapest schedule within budget of greedy and fastsa (in this fixed order, fastsa
        with the time left), or None."""
        from remat_cli.solvers import registry

        out: tuple[float, list[Step], int, str] | None = None
        for name in FALLBACK:
            if name not in registry.names():
                continue
            solver = registry.get(name)
            if solver.availability()[0] != "available" or solver.supports(self.g) is not None:
                continue
            left = None
            if self.limit is not None:
                # the 15% kept for this step; deterministic runs take the nominal share (fastsa
                # sizes its iteration budget from it), others whatever the clock has left
                left = 0.15 * self.limit if self.deterministic else self.limit - self.elapsed() - 0.5
                # greedy is cheap and needs its few strategies to finish: never less than 5 s
                left = max(5.0 if name == "greedy" else 0.5, left)
            opts = SolveOptions(time_limit=left, seed=self.opt.seed, workers=self.opt.workers)
            opts.params = solver.defaults()
            r = solver.solve(self.g, self.budget, opts)
            if r.steps is None:
                continue
            sim = simulate(self.g, r.steps)
            if sim.peak_memory <= self.budget and (out is None or sim.cost < out[0]):
                out = (sim.cost, r.steps, sim.peak_memory, name)
        return out

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def early_incumbent(self) -> None:
        """Greedy's schedule as an incumbent at once: the hierarchy's leaf ILPs may use up the
        whole time limit, and a watchdog then returns the last incumbent (issue 20)."""
        from remat_cli.solvers import registry

        if self.opt.on_incumbent is None or "greedy" not in registry.names():
            return
        greedy = registry.get("greedy")
        left = min(5.0, self.limit) if self.limit is not None else 5.0
        r = greedy.solve(self.g, self.budget, SolveOptions(time_limit=left, seed=self.opt.seed, workers=1))
        if r.steps is not None and simulate(self.g, r.steps).peak_memory <= self.budget:
            self.opt.incumbent(r.steps)

    # ---- hierarchy: partition, then solve units bottom-up ----
    def hierarchy(self, ctx: Ctx) -> list[Unit]:
        g = self.g
        needed = [n for n in g.topo_order if n in ctx.needed]
        training = bool(ctx.forward)
        base_nodes = [n for n in needed if n in ctx.forward] if training else needed
        idx = {n: i for i, n in enumerate(base_nodes)}
        preds = [
            sorted({idx[ctx.producer[v]] for v in ctx.nodes[n].inputs if ctx.producer.get(v) in idx})
            for n in base_nodes
        ]
        values = []
        for n in base_nodes:
            for v in ctx.nodes[n].outputs:
                cons = tuple(sorted({idx[c] for c in ctx.consumers[v] if c in idx}))
                values.append((ctx.size(v), idx[n], cons, v in ctx.outputs))
        lg = LevelGraph(preds, values, [1] * len(base_nodes))
        levels = h_partition(lg, int(self.p["max_subgraph"]), int(self.p["max_top"]), float(self.p["alpha"]))
        # level-0 units
        if training:
            units: list[Unit] = []
            for n in base_nodes:
                if ctx.grads.get(n):
                    units.append(
                        Unit(fwd=(n,), bwd=tuple(sorted(ctx.grads[n], key=ctx.pos.__getitem__)), layer=True)
                    )
                else:
                    units.append(Unit(fwd=(n,), bwd=(), layer=False))
        else:
            units = [Unit(fwd=(n,), bwd=(), layer=False) for n in base_nodes]
        atoms: dict[str, Unit] = {}

        def atom(n: str) -> Unit:
            if n not in atoms:
                atoms[n] = atomic(ctx, n)
            return atoms[n]

        # level 0: a layer of one forward operator and several backward ones (ONNX training
        # graphs, paired by structural_pairs) is a subgraph of its own, solved for its options;
        # split into atoms it would leave its backward operators one by one to the top H-ILP
        solve0 = [ui for ui, u in enumerate(units) if u.layer and len(u.bwd) > 1]
        for ui in solve0:
            units[ui].children = [atom(n) for n in units[ui].fwd + units[ui].bwd]
        n_levels = len(levels) + (1 if solve0 else 0)
        if solve0:
            self.solve_level(ctx, units, 0, n_levels, leaf=True)
            self.opt.progress(stage="level 0", subgraphs=len(solve0))
        for li, groups in enumerate(levels):
            new_units: list[Unit] = []
            for grp in groups:
                members = [units[i] for i in grp]
                if len(grp) == 1:
                    new_units.append(members[0])
                    continue
                fwd = tuple(sorted((n for u in members for n in u.fwd), key=ctx.pos.__getitem__))
                bwd = tuple(sorted((n for u in members for n in u.bwd), key=ctx.pos.__getitem__))
                u = Unit(fwd=fwd, bwd=bwd, layer=bool(bwd))
                u.children = [c for m in members for c in self.expand(m, atom)]
                self.select(u.children)
                new_units.append(u)
            li_all = li + (1 if solve0 else 0)
            solved = self.solve_level(ctx, new_units, li_all, n_levels, leaf=li == 0)
            units = new_units
            self.opt.progress(stage=f"level {li + 1}", subgraphs=len(groups), solved=solved)
        # top units: solved subgraphs keep their options; the others stand for their operators
        top = [c for u in units for c in self.expand(u, atom)]
        done = {n for u in top for n in u.owned}
        top += [atom(n) for n in needed if n not in done]
        self.select(top, TOP_OPTIONS)
        return top

    def solve_level(self, ctx: Ctx, new_units: list[Unit], li: int, n_levels: int, leaf: bool) -> int:
        """Options of every unit of one level that has children and none yet (one
        representative per class of identical subgraphs, App. C.1.1); returns how many were
        solved."""
        owners: list[int] = []
        jobs: list[Job] = []
        classes: dict[tuple[Any, ...], int] = {}
        translate: list[tuple[int, int, list[str]]] = []
        reps: dict[int, list[str]] = {}
        for ui, u in enumerate(new_units):
            if u.children is None or u.options:
                continue
            key, order = canonical(ctx, u)
            if key in classes:
                translate.append((ui, classes[key], order))
                continue
            classes[key] = ui
            reps[ui] = order
            owners.append(ui)
        share = None
        if self.limit is not None:
            left = max(0.1, self.limit * 0.5 - (0 if self.deterministic else self.elapsed()))
            if self.deterministic:
                left = self.limit * 0.5 / max(1, n_levels)
            else:
                left = left / max(1, n_levels - li)
            # building and measuring take time too: the ILPs get 70% of the share
            share = 0.7 * left / max(1, len(owners) / max(1, int(self.p["jobs"])))
        fr = _fractions(int(self.p["levels"]))
        names = tuple(s for s in str(self.p["leaf_solvers"]).split(",") if s) if leaf else ()
        for ui in owners:
            jobs.append(
                Job(
                    new_units[ui],
                    fr,
                    share,
                    self.backend,
                    self.opt.seed,
                    self.deterministic,
                    names,
                    self.deadline,
                )
            )
        results = self.run_jobs(ctx, jobs)
        for ui, opts in zip(owners, results, strict=True):
            new_units[ui].options = opts
        for ui, rep, order in translate:
            mapping = dict(zip(reps[rep], order, strict=True))
            u = new_units[ui]
            u.options = pareto(
                [
                    measure(ctx, u.owned, tuple(mapping[n] for n in o.fwd), tuple(mapping[n] for n in o.bwd))
                    for o in new_units[rep].options
                ]
            )
        return len(owners)

    @staticmethod
    def expand(u: Unit, atom: Any) -> list[Unit]:
        """A unit without options (never grouped) stands for its atomic operators."""
        if u.options:
            return [u]
        return [atom(n) for n in u.fwd + u.bwd]

    def select(self, units: list[Unit], floor: int = 3) -> None:
        """§3.2.2: split N_o over the compute nodes in proportion to their basic operations,
        each keeping at least `floor` (the top level, solved once and warm-started, affords
        more: with 3 options a 25-unit top has only "keep all", "keep some", "keep nothing")."""
        n_o = int(self.p["options"])
        total = sum(u.ops for u in units if len(u.options) > 1) or 1
        for u in units:
            if len(u.options) > 1:
                u.options = spread(u.options, max(floor, round(n_o * u.ops / total)))

    def run_jobs(self, ctx: Ctx, jobs: list[Job]) -> list[list[Opt]]:
        n = int(self.p["jobs"])
        if n <= 1 or len(jobs) <= 1:
            return [unit_options(ctx, j) for j in jobs]
        global _CTX
        _CTX = ctx
        import multiprocessing as mp

        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("fork")) as ex:
            return list(ex.map(_run_job, jobs))


def _fractions(levels: int) -> tuple[float, ...]:
    if levels <= 1:
        return (1.0,)
    return tuple(1.0 - i / (levels - 1) for i in range(levels))


def _baseline_steps(g: Graph) -> list[Step]:
    from remat_cli.schedule import baseline_steps

    return baseline_steps(g)
