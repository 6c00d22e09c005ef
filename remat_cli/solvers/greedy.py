"""greedy: fast rematerialization heuristics for any DAG and any budget; the cheapest schedule
within the budget wins (or the lowest peak when none fits). Everyone's fallback and the warm start
of the exact solvers. Two families, both keeping the graph's `order` for first computations:

1. DTR-style eviction — Kirisame et al., "Dynamic Tensor Rematerialization", ICLR'21, §2 (evict
   when an allocation would exceed the budget, rematerialize evicted tensors on demand) and §3
   (h_DTR(t) = c(t) / (m(t) · s(t)): compute cost c, memory m, staleness s; the e* variant
   charges c with the evicted neighbourhood: evicted ancestors that recomputing t also needs,
   evicted descendants whose recomputation reads t). The order (needed nodes) runs as DTR runs a
   program: before each compute, while live bytes + outputs + workspace exceed the budget, the
   live value with the smallest h is evicted; graph outputs, inputs of the node about to run
   (locked), outputs of non-recomputable nodes and empty values never are. A missing input is
   recomputed through its producer, recursively (which may evict more). Since the order is known,
   `belady-*` replaces staleness by the distance to the value's next read (Belady's rule; an
   evicted descendant read earlier makes that read earlier). Dead values are freed at once
   (DTR's banishing) or, in `*-lazy`, kept cached until memory is short.
   Multi-output nodes: outputs are evicted one by one; recomputing the node first frees its
   still-live outputs (the simulator forbids computing a node whose outputs are live).

2. Peak reduction (`split`, `split-shallow`): the offline counterpart, measured to be much
   better on the Moccasin graphs (bench/baselines.py). At the highest instant over the budget,
   insert the recomputation — right before its next read — of the value live across that instant
   that removes the most excess bytes·instants per unit of cost; inputs dead by then are kept
   alive longer (their added excess is charged) or recomputed too, up to SPLIT_DEPTH levels.

Each compute sequence is decoded with `steps_from_sequence` (frees at last use) and simulated.
Deterministic: no randomness, ties go to the lowest index.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph
from remat_cli.schedule import Step, baseline_steps, simulate, steps_from_sequence
from remat_cli.solvers.base import Param, SolveOptions, Solver, SolverResult

#: the e* cost is evaluated on at most this many of the best candidates by the local h
ESTAR_TOP = 64
#: a variant that computes more than this many times the needed nodes is abandoned (thrashing)
MAX_BLOWUP = 4
#: how many levels of dead inputs the peak-reduction pass recomputes rather than keeps
SPLIT_DEPTH = 4
#: the pass stops after this many rounds without lowering the peak or the total excess
STALL_ROUNDS = 8


@dataclass
class _Arrays:
    """The graph as flat integer arrays (values and nodes indexed densely)."""

    size: np.ndarray  # float64 bytes per value
    evictable: np.ndarray  # bool per value
    producer: list[int]  # node index per value (-1 for inputs/parameters)
    resident: np.ndarray  # bool per value
    ins: list[list[int]]  # intermediate inputs per node (deduplicated)
    outs: list[list[int]]  # outputs per node
    out_size: list[int]
    workspace: list[int]
    cost: np.ndarray  # float64 per node
    program: list[int]  # needed nodes in order
    free_after: list[list[int]]  # values dead after program position i
    uses: list[list[int]]  # program positions reading each value, ascending
    consumers: list[list[int]]  # program nodes reading each value
    born: list[int]  # program position of each value's producer (-1: input or never produced)
    resident_bytes: int
    is_output: np.ndarray


def _arrays(graph: Graph) -> _Arrays:
    vids = [v.id for v in graph.values]
    vidx = {v: i for i, v in enumerate(vids)}
    nids = [n.id for n in graph.nodes]
    nidx = {n: i for i, n in enumerate(nids)}
    vm = graph.value_map
    size = np.array([v.size for v in graph.values], dtype=np.float64)
    resident = np.array([v.resident for v in graph.values], dtype=bool)
    is_output = np.zeros(len(vids), dtype=bool)
    for v in graph.outputs:
        is_output[vidx[v]] = True
    producer = [-1] * len(vids)
    ins: list[list[int]] = []
    outs: list[list[int]] = []
    for k, n in enumerate(graph.nodes):
        ins.append([vidx[v] for v in dict.fromkeys(n.inputs) if not vm[v].resident])
        outs.append([vidx[v] for v in n.outputs])
        for v in outs[-1]:
            producer[v] = k
    recomputable = [n.recomputable for n in graph.nodes]
    needed = graph.needed_nodes
    program = [nidx[n] for n in graph.topo_order if n in needed]
    pos = {n: i for i, n in enumerate(program)}
    uses: list[list[int]] = [[] for _ in vids]
    for i, n in enumerate(program):
        for v in ins[n]:
            uses[v].append(i)
    # A non-recomputable node's outputs can never be rebuilt, so they stay live while any value
    # whose recomputation could need them (a descendant through recomputable nodes) is still used:
    # reach[v] = max(last use of v, reach of the outputs of v's recomputable consumers).
    last = [uses[v][-1] if uses[v] else pos.get(producer[v], -1) for v in range(len(vids))]
    reach = list(last)
    consumers: list[list[int]] = [[] for _ in vids]
    for n in program:
        for v in ins[n]:
            consumers[v].append(n)
    for n in reversed(program):
        for v in outs[n]:
            for c in consumers[v]:
                if recomputable[c]:
                    reach[v] = max(reach[v], max(reach[o] for o in outs[c]))
    fixed = [producer[v] >= 0 and not recomputable[producer[v]] for v in range(len(vids))]
    retain = [reach[v] if fixed[v] else last[v] for v in range(len(vids))]
    free_after: list[list[int]] = [[] for _ in program]
    for v in range(len(vids)):
        if resident[v] or is_output[v] or producer[v] not in pos:
            continue
        free_after[retain[v]].append(v)
    evictable = ~resident & ~is_output & (size > 0) & ~np.array(fixed, dtype=bool)
    return _Arrays(
        size=size,
        evictable=evictable,
        producer=producer,
        resident=resident,
        ins=ins,
        outs=outs,
        out_size=[int(sum(vm[v].size for v in n.outputs)) for n in graph.nodes],
        workspace=[n.workspace for n in graph.nodes],
        cost=np.array([n.cost for n in graph.nodes], dtype=np.float64),
        program=program,
        free_after=free_after,
        uses=uses,
        consumers=consumers,
        born=[pos.get(p, -1) for p in producer],
        resident_bytes=graph.resident_bytes,
        is_output=is_output,
    )


class _Abandon(Exception):
    pass


def _run(
    a: _Arrays, threshold: float, variant: str, stop: Callable[[], bool] | None = None
) -> tuple[list[int], int]:
    """One DTR pass with eviction threshold `threshold`; returns (compute sequence of node
    indices, peak of this simulation, which bounds the decoded schedule's peak from above)."""
    nv = len(a.size)
    live = a.resident.copy()
    locked = np.zeros(nv, dtype=np.int32)
    last_access = np.zeros(nv, dtype=np.float64)
    inf = float("inf")
    next_use = np.full(nv, inf)
    use_ptr = [0] * nv
    for v in range(nv):
        if a.uses[v]:
            next_use[v] = a.uses[v][0]
    # c(t): the producer's cost, per value
    c0 = np.array([a.cost[p] if p >= 0 else 0.0 for p in a.producer], dtype=np.float64)
    # when each value would be freed as dead; the e* of the Belady variants counts an input that
    # is live now but dead before the evicted value's next use as one to recompute
    free_at = np.full(nv, inf)
    for i, vs in enumerate(a.free_after):
        free_at[vs] = i
    belady = variant.startswith("belady")
    estar = "estar" in variant
    lazy = "lazy" in variant
    size = a.size
    evictable = a.evictable
    seq: list[int] = []
    zombies: list[int] = []
    mem = float(a.resident_bytes)
    peak = mem
    clock = 1.0
    position = 0
    cap = MAX_BLOWUP * max(1, len(a.program))

    def projected_cost(v: int, due: float, limit: float) -> tuple[float, float]:
        """e*: (cost, kept bytes) of recomputing v at time `due`: its producer plus, recursively,
        the producers of inputs that will not be live then; stops once the cost exceeds `limit`.
        Lazy variants keep a live input that dies before `due` cached instead (its bytes are
        returned: they no longer count as freed by the eviction)."""
        total, kept = c0[v], 0.0
        seen = {v}
        stack = [v]
        while stack:
            u = stack.pop()
            for w in a.ins[a.producer[u]]:
                if w in seen:
                    continue
                seen.add(w)
                if live[w]:
                    if free_at[w] >= due:
                        continue
                    if lazy:
                        kept += size[w]
                        continue
                total += c0[w]
                if total > limit:
                    return total, kept
                stack.append(w)
        return total, kept

    def relying_children(v: int) -> tuple[float, float]:
        """(earliest next use, total producer cost) of the evicted values whose recomputation
        reads v: evicting v makes each of them more expensive (DTR's evicted descendants)."""
        due, cost = inf, 0.0
        for c in a.consumers[v]:
            for o in a.outs[c]:
                if not live[o] and a.born[o] < position and next_use[o] < inf:
                    due = min(due, next_use[o])
                    cost += c0[o]
        return due, cost

    def pick() -> int:
        cand = np.flatnonzero(live & evictable & (locked == 0))
        if len(cand) == 0:
            return -1
        if belady:
            age = next_use[cand] - position  # inf when never used again
        else:
            age = clock - last_access[cand]
        denom = size[cand] * age
        with np.errstate(divide="ignore", invalid="ignore"):
            h0 = c0[cand] / denom  # h with the producer's cost alone: a lower bound of e*'s h
        if not estar:
            return int(cand[np.argmin(h0)])
        order = _smallest(h0, ESTAR_TOP)
        best, best_h = int(cand[order[0]]), inf
        for j in order[:ESTAR_TOP]:
            if h0[j] >= best_h:
                break  # every later candidate is at least as bad
            v = int(cand[j])
            child_due, child_cost = relying_children(v)
            if belady:
                # an evicted child rematerialized first needs v then: v's real next use
                due = min(next_use[v], child_due)
                if due == inf:
                    return v  # dead and nothing evicted reads it: free
                gap = due - position
                if gap <= 0:
                    continue
                cost, kept = projected_cost(v, due, best_h * size[v] * gap)
                if kept >= size[v]:
                    continue
                h = cost / ((size[v] - kept) * gap)
            else:
                d = denom[j]
                h = (child_cost + projected_cost(v, inf, best_h * d - child_cost)[0]) / d
            if h < best_h:
                best, best_h = v, h
        return best

    def compute(n: int) -> None:
        nonlocal mem, peak, clock
        for o in a.outs[n]:
            if live[o]:  # a sibling of the value being rematerialized: rebuilt by this compute
                live[o] = False
                mem -= size[o]
        need = a.out_size[n] + a.workspace[n]
        while mem + need > threshold:
            v = pick()
            if v < 0:
                break
            live[v] = False
            mem -= size[v]
        peak = max(peak, mem + need)
        mem += a.out_size[n]
        for o in a.outs[n]:
            live[o] = True
            last_access[o] = clock
            if next_use[o] == inf and evictable[o]:
                zombies.append(o)
        for v in a.ins[n]:
            last_access[v] = clock
        clock += 1.0
        seq.append(n)
        if len(seq) > cap or (stop is not None and len(seq) % 64 == 0 and stop()):
            raise _Abandon

    def open_frame(n: int) -> list:
        # lock the inputs that are live now, so making the others live cannot evict them
        held = [v for v in a.ins[n] if live[v]]
        for v in held:
            locked[v] += 1
        return [n, 0, held]

    def materialize(target: int) -> None:
        stack = [open_frame(target)]
        while stack:
            frame = stack[-1]
            n, k, held = frame
            ins = a.ins[n]
            while k < len(ins):
                v = ins[k]
                if v in held:
                    k += 1
                elif live[v]:
                    locked[v] += 1
                    held.append(v)
                    k += 1
                else:
                    break
            frame[1] = k
            if k < len(ins):
                stack.append(open_frame(a.producer[ins[k]]))
                continue
            compute(n)
            for v in held:
                locked[v] -= 1
            stack.pop()

    for position, n in enumerate(a.program):  # noqa: B007 (read by pick through the closure)
        materialize(n)
        for v in a.ins[n]:
            p = use_ptr[v] + 1
            use_ptr[v] = p
            next_use[v] = a.uses[v][p] if p < len(a.uses[v]) else inf
        for v in a.free_after[position]:
            # lazy: a dead value stays cached until memory is short (it is then the cheapest
            # to evict unless an evicted value's recomputation will read it)
            if live[v] and not (lazy and evictable[v]):
                live[v] = False
                mem -= size[v]
        if not lazy:
            # values rebuilt for a rematerialization after their last use are dead again now
            for v in zombies:
                if live[v] and next_use[v] == inf:
                    live[v] = False
                    mem -= size[v]
        zombies.clear()
    return seq, int(round(peak))


def _decode(a: _Arrays, seq: list[int]) -> tuple[np.ndarray, list[list[tuple[int, int, list[int]]]]]:
    """The memory at each compute instant of `seq` as `steps_from_sequence` frees it, and each
    value's live intervals (start, end, positions reading it), inclusive."""
    nv = len(a.size)
    opened: dict[int, tuple[int, list[int]]] = {}
    intervals: list[list[tuple[int, int, list[int]]]] = [[] for _ in range(nv)]
    for k, n in enumerate(seq):
        for x in a.ins[n]:
            opened[x][1].append(k)
        for o in a.outs[n]:
            if o in opened:
                s, uses = opened.pop(o)
                intervals[o].append((s, uses[-1] if uses else s, uses))
            opened[o] = (k, [])
    last = len(seq) - 1
    for o, (s, uses) in opened.items():
        intervals[o].append((s, last if a.is_output[o] else (uses[-1] if uses else s), uses))
    diff = np.zeros(len(seq) + 1)
    for v, ivs in enumerate(intervals):
        for s, e, _ in ivs:
            diff[s] += a.size[v]
            diff[e + 1] -= a.size[v]
    ws = np.array([a.workspace[n] for n in seq], dtype=np.float64)
    return np.cumsum(diff[:-1]) + a.resident_bytes + ws, intervals


def _split(
    a: _Arrays,
    budget: float,
    max_rounds: int,
    depth: int = SPLIT_DEPTH,
    stop: Callable[[], bool] | None = None,
) -> list[int]:
    """Peak reduction on the compute sequence (the offline counterpart of the eviction loop): at
    the highest instant t over the budget, pick the value live across t (not read there) whose
    recomputation right before its next read after t removes the most excess (bytes over budget,
    summed over instants) per unit of cost, insert that recomputation, and repeat.

    The recomputed producer needs its inputs live at that point: an input that is dead by then is
    either kept alive longer (the excess this adds is charged to the score) or recomputed too,
    recursively up to `depth` levels, whichever scores better."""
    seq = list(a.program)
    progress, stalled = (np.inf, np.inf), 0
    for _ in range(max_rounds):
        if stop is not None and stop():
            break
        prof, intervals = _decode(a, seq)
        t = int(np.argmax(prof))
        if prof[t] <= budget:
            break
        total = float(np.maximum(prof - budget, 0.0).sum())
        if total < progress[0] or prof[t] < progress[1]:
            progress, stalled = (total, prof[t]), 0
        else:
            stalled += 1
            if stalled > STALL_ROUNDS:
                break  # the estimates stopped matching the exact profile
        best = _best_split(a, seq, prof, intervals, t, budget, depth)
        if best is None:
            break
        b, nodes = best
        seq[b:b] = list(dict.fromkeys(nodes))  # an ancestor shared by two inputs runs once
    return seq


def _best_split(
    a: _Arrays,
    seq: list[int],
    prof: np.ndarray,
    intervals: list[list[tuple[int, int, list[int]]]],
    t: int,
    budget: float,
    depth: int,
) -> tuple[int, list[int]] | None:
    """The best (position, nodes to insert there) lowering the excess at instant t, if any."""
    excess = np.maximum(prof - budget, 0.0)
    # sparse table: the max of prof over [i, j) in O(1), for the common "stays under" test
    table = [prof]
    while 2 ** len(table) <= len(prof):
        h = 2 ** (len(table) - 1)
        table.append(np.maximum(table[-1][:-h], table[-1][h:]))

    def range_max(i: int, j: int) -> float:
        k = (j - i).bit_length() - 1
        return float(max(table[k][i], table[k][j - (1 << k)]))

    loss_memo: dict[tuple[int, int], float] = {}
    plan_memo: dict[tuple[int, int, int], tuple[float, float, list[int]]] = {}

    def extend_loss(x: int, b: int) -> float:
        key = (x, b)
        if key not in loss_memo:
            loss_memo[key] = _extend_loss(x, b)
        return loss_memo[key]

    def _extend_loss(x: int, b: int) -> float:
        # excess added by keeping x alive from its last read before b up to b
        ivx = [iv for iv in intervals[x] if iv[0] < b]
        if not ivx:
            return np.inf
        ex = ivx[-1][1]
        if ex >= b:
            return 0.0
        if b <= ex + 1 or range_max(ex + 1, b) + a.size[x] <= budget:
            return 0.0
        seg = prof[ex + 1 : b]
        return float((np.maximum(seg + a.size[x] - budget, 0.0) - excess[ex + 1 : b]).sum())

    def plan(p: int, b: int, d: int) -> tuple[float, float, list[int]]:
        key = (p, b, d)
        if key not in plan_memo:
            plan_memo[key] = _plan(p, b, d)
        return plan_memo[key]

    def _plan(p: int, b: int, d: int) -> tuple[float, float, list[int]]:
        """(cost, excess added, nodes to insert before position b) to recompute node p there."""
        cost, loss, nodes = float(a.cost[p]), 0.0, []
        for x in a.ins[p]:
            keep = extend_loss(x, b)
            if keep > 0 and d > 0 and a.evictable[x]:
                c2, l2, n2 = plan(a.producer[x], b, d - 1)
                # recompute x instead when that costs less excess per unit of extra cost
                if l2 < keep and (c2 == 0 or (keep - l2) / c2 > keep / max(cost, 1e-9)):
                    cost, loss, nodes = cost + c2, loss + l2, nodes + n2
                    continue
            loss += keep
        return cost, loss, nodes + [p]

    n_t = seq[t]
    touched = set(a.ins[n_t]) | set(a.outs[n_t])
    cands: list[tuple[float, int, int]] = []  # (gain per producer cost: a score bound, gain, b)
    for v in np.flatnonzero(a.evictable):
        v = int(v)
        if v in touched:
            continue
        for s, e, uses in intervals[v]:
            if not s < t < e:
                continue
            before = [u for u in uses if u < t]
            lo = before[-1] if before else s
            b = next(u for u in uses if u > t)
            gain = float(np.sum(np.minimum(excess[lo + 1 : b], a.size[v])))
            cands.append((gain / max(float(a.cost[a.producer[v]]), 1e-9), v, b))
            break
    cands.sort(key=lambda c: (-c[0], c[1]))
    best: tuple[int, list[int]] | None = None
    best_score = 0.0
    for bound, v, b in cands:
        if bound <= best_score:
            break  # the loss is >= 0 and the cost >= the producer's: no later one wins
        cost, loss, nodes = plan(a.producer[v], b, depth)
        # the inserted instant itself: what is live before position b, with the producer's
        # outputs (about v's bytes) and the other inserted nodes' outputs (inputs of the producer)
        at_b = seq[b]
        inserted = prof[b] - a.out_size[at_b] - a.workspace[at_b] + a.workspace[nodes[-1]]
        inserted += sum(a.out_size[m] for m in dict.fromkeys(nodes[:-1]))
        loss += max(0.0, inserted - budget)
        score = (bound * max(float(a.cost[a.producer[v]]), 1e-9) - loss) / max(cost, 1e-9)
        if score > best_score:
            best, best_score = (b, nodes), score
    return best


STRATEGIES = ("split", "split-shallow", "belady-estar-lazy", "belady-estar", "dtr-estar")
#: "auto" leaves the split strategies out above this many computes: each split round decodes
#: the whole sequence again, so the pass is quadratic (2,000 nodes: a minute; 100,000: days)
SPLIT_MAX_PROGRAM = 5_000
#: fractions of the budget each strategy aims at, in turn, until its schedule fits
TARGETS = (1.0, 0.98, 0.95, 0.9)


def _smallest(h: np.ndarray, k: int) -> np.ndarray:
    """``np.argsort(h, kind="stable")[:k]`` in O(len(h)) rather than O(len(h) log len(h)): the
    eviction scan calls this once per eviction (issue 20, scale)."""
    if k >= len(h):
        return np.argsort(h, kind="stable")
    threshold = np.partition(h, k - 1)[k - 1]
    if np.isnan(threshold):
        return np.argsort(h, kind="stable")[:k]
    idx = np.flatnonzero(h <= threshold)  # ascending: ties stay in index order, as in a stable sort
    return idx[np.argsort(h[idx], kind="stable")][:k]


class Greedy(Solver):
    name = "greedy"
    method = "greedy rematerialization: peak-reduction splits and DTR-style eviction, best kept"
    paper = "Kirisame et al., Dynamic Tensor Rematerialization, ICLR 2021 (h_DTR and its e* variant)"
    params = (
        Param(
            "strategy",
            str,
            "auto",
            "split (peak reduction, dead inputs recomputed up to 4 levels), split-shallow (dead inputs "
            "kept alive), belady-estar / belady-estar-lazy / dtr-estar (DTR eviction with the distance "
            "to the next use or the staleness), auto (all but dtr-estar, keep the cheapest)",
            choices=("auto", *STRATEGIES),
        ),
    )

    def notes(self) -> str:
        return (
            "heuristic for any DAG (no optimality claim); warm start of the exact solvers; with more "
            "than one worker a binding time limit cuts the list of strategies short"
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        base = baseline_steps(graph)
        base_sim = simulate(graph, base)
        if base_sim.peak_memory <= budget:  # nothing to evict: the baseline is the cheapest schedule
            options.incumbent(base)
            return SolverResult(
                steps=base, status="feasible", objective=base_sim.cost, message="baseline fits"
            )
        a = _arrays(graph)
        choice = str(options.params.get("strategy", "auto"))
        # dtr-estar (online staleness) never won on the benchmarks and thrashes: asked for only
        strategies = STRATEGIES[:-1] if choice == "auto" else (choice,)
        if choice == "auto" and len(a.program) > SPLIT_MAX_PROGRAM:
            strategies = tuple(x for x in strategies if not x.startswith("split"))

        def out_of_time() -> bool:
            # a binding time limit would make the result depend on the clock; with one worker (the
            # deterministic mode) every strategy runs to its own end
            return options.workers != 1 and options.remaining() == 0.0

        best: tuple[float, list[Step], str] | None = None
        lowest: tuple[int, float, list[Step], str] = (base_sim.peak_memory, base_sim.cost, base, "baseline")
        ran = 0
        for strategy in strategies:
            # a target a little under the budget absorbs what the estimates miss; the first
            # target that fits ends the sweep for this strategy
            for target in TARGETS:
                if ran and out_of_time():
                    break
                ran += 1
                rounds = 8 * len(a.program)
                try:
                    if strategy == "split":
                        seq = _split(a, budget * target, rounds, SPLIT_DEPTH, out_of_time)
                    elif strategy == "split-shallow":
                        seq = _split(a, budget * target, rounds, 0, out_of_time)
                    else:
                        seq, _ = _run(a, budget * target, strategy, out_of_time)
                except _Abandon:
                    break
                steps = steps_from_sequence(graph, [graph.nodes[n].id for n in seq])
                sim = simulate(graph, steps)
                how = strategy if target == 1.0 else f"{strategy} aiming at {target:.0%} of the budget"
                if sim.peak_memory <= budget:
                    if best is None or sim.cost < best[0]:
                        best = (sim.cost, steps, how)
                        options.incumbent(steps)
                        options.progress(incumbent=sim.cost, strategy=how)
                    break
                if (sim.peak_memory, sim.cost) < lowest[:2]:
                    lowest = (sim.peak_memory, sim.cost, steps, how)
        if best is not None:
            return SolverResult(
                steps=best[1],
                status="feasible",
                objective=best[0],
                message=f"cheapest of {ran} runs: {best[2]}",
            )
        return SolverResult(
            steps=lowest[2],
            status="infeasible",
            objective=lowest[1],
            best_peak=lowest[0],
            message=f"no strategy fit the budget; lowest peak {lowest[0]} ({lowest[3]})",
        )
