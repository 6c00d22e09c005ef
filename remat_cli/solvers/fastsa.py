"""FastSA: simulated annealing over a node sequence with an add-max segment tree and node grouping.

Imanishi, Xu, Takagi, Wang, Castillo, "A fast heuristic to optimize time-space tradeoff for large
models", NeurIPS 2023 (``papers/fastsa.txt``): §2 (problem, SA, segment tree, grouping), App. B
(node-intermediate memory, memory-minimising ordering), App. C (node grouping, logaddexp tree)
and App. D.4 (initialisation and temperature schedule).

The graph is folded to one memory block per node (``NodeView``). A state is a fixed-length
sequence of nodes and ``nop`` slots (§2.2, App. D.4); mutations add a node at a nop slot, remove
one, or rotate one to another slot, subject to the validity conditions of §2.2; the peak M(S) is
maintained incrementally in a range-add / range-max segment tree (§2.1.1, §2.2.1) by the compiled
kernel in :mod:`remat_cli.solvers.fastsa_kernel`. The objective is eq. (1)
``max(budget, M)·C`` or, by default, the budget-respecting variant of footnote 2 of §3.1.

Two stages (§2.2.2, App. C.1, App. D.4): with ``--grouping`` a first SA on grouped nodes
(Algorithm 1 with the ``do_fuse`` rule) that stops as soon as the budget is met, then a second,
colder SA on the decomposed nodes that removes redundant computations. Without grouping (the
default) the first stage anneals the original nodes over its whole schedule and the second
continues colder. Grouping is off by default because on the Table-1 graphs the grouped pipeline
was worse under the same time (bench/fastsa.py: e.g. RL n500 at 80% 3.2% vs 1.2% cost increase,
CM2 at 80% 0.43% vs 0.36%): their model inputs are tiny or absent, so do_fuse holds from the
sources onwards and Algorithm 1 alone folds each whole graph into one group (``max_group`` caps
that). The best schedules found (least feasible cost, least peak, per stage, and the last state)
are each polished (a deviation: :func:`remat_cli.solvers.fastsa_kernel.polish` greedily removes
the computations that are not needed to stay within the budget, e.g. the zero-cost copies the
cold stage has no reason to drop: CM1 at 80% keeps its 0.136% with 3 instead of ~30
recomputations), go through ``steps_from_sequence`` (free after last use) and the project
simulator, and the best is returned; each better one is reported through ``options.incumbent``.

Deviations, all switchable: the initial temperature is 0.3% of f(S0) instead of App. D.4's
0.1% (on the Table-1 graphs, whose single moves change f by around 1%, 0.1% is close to greedy:
RL n100 at 80% ended at 1.6% cost increase, at 0.3% at 0.0%); the mutation mix
(``rotate_share``; the paper gives none); ``local`` proposals (times drawn inside the
window where a mutation can be valid, see :func:`remat_cli.solvers.fastsa_kernel.sa_chunk`; 75%
of the proposals by default: on random_layered_n1000 about 75% of local proposals pass the §2.2
conditions against about 25% of uniform ones, so each iteration does far more; with 11M
iterations RL n500 at 70% ends at 4.8% (uniform, 22M: 5.6%) and RL n250 at 70% near 1.1-1.4%
(uniform: 3.5%), while all-local proposals made the small RL n100 worse (70%: over budget),
which the uniform quarter avoids, bench/fastsa.py); ``over_budget_weight`` (off: 1) steepens the footnote-2
objective above the budget; a dynamic sequence length (T is re-chosen and the sequence re-spread evenly between
chunks, so that a few thousand slots suffice instead of 2^20); and a per-node copy limit per
chunk (a node may gain 4 copies before the next re-spread). ``--no-recompute`` runs rotations
only, on f(S) = M(S) (App. B.2).

Determinism: the kernel draws from its own xorshift generator seeded by ``options.seed`` and runs
in fixed-size chunks; every stopping decision depends on iteration counts only. A time limit is
turned into an iteration budget with a fixed assumed rate (``rate`` iterations per second), so
the same seed gives the same schedule whatever the machine's speed; only when the machine is
slower than that rate does the wall-clock safety net stop earlier, and the message then says so.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from remat_cli.graph import Graph, NodeView
from remat_cli.schedule import Step, simulate, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers import fastsa_kernel as K

#: iterations per kernel call; stopping is only decided between chunks
CHUNK = 1 << 16
#: nop slots per node when (re)spreading a sequence (T is the next power of two)
SPACING = 8
#: extra copies a node may gain over its initial count (more is rejected as an invalid add)
COPIES = 4


@dataclass
class Problem:
    """The SA's node set: original nodes (one per needed node) or groups (App. C.1).

    ``members[i]`` lists the NodeView indices node i runs, in topological order; ``mem`` is the
    block it outputs, ``ws`` its node-intermediate memory (App. B.1).
    """

    members: list[list[int]]
    preds: list[list[int]]
    mem: np.ndarray
    ws: np.ndarray
    cost: np.ndarray
    keep: np.ndarray
    addrem: np.ndarray  # may be added / removed (recomputable); rotation is always allowed

    def __post_init__(self) -> None:
        n = self.size
        self.pred_ptr = np.zeros(n + 1, dtype=np.int64)
        self.pred_ptr[1:] = np.cumsum([len(ps) for ps in self.preds])
        self.pred_idx = np.array([q for ps in self.preds for q in ps], dtype=np.int64)
        self.edge_consumer = np.repeat(np.arange(n, dtype=np.int64), np.diff(self.pred_ptr))
        biggest = float(max(1, int(self.mem.max(initial=0)), int(self.ws.max(initial=0))))
        self.lscale = 10.0 / biggest  # App. C.2: the largest value becomes 10

    @property
    def size(self) -> int:
        return len(self.members)

    def layout(self, copies: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
        """NI (static columns), NX and the size of PU for nodes that now run ``copies`` times.

        A node may gain COPIES more copies before the next re-layout (more adds are rejected as
        invalid); one spare production slot lets a rotation add before it removes.
        """
        n = self.size
        pcap = np.where(self.addrem, copies + COPIES, np.maximum(copies, 1)).astype(np.int64) + 1
        ucap = np.bincount(self.pred_idx, weights=pcap[self.edge_consumer], minlength=n).astype(np.int64)
        region = pcap + ucap
        pbase = np.zeros(n, dtype=np.int64)
        pbase[1:] = np.cumsum(region)[:-1]
        NI = np.zeros((n, 8), dtype=np.int64)
        NI[:, K.PB] = pbase
        NI[:, K.UB] = pbase + pcap
        NI[:, K.MEM] = self.mem
        NI[:, K.PS] = self.pred_ptr[:-1]
        NI[:, K.PE] = self.pred_ptr[1:]
        NI[:, K.FL] = self.keep.astype(np.int64) * K.KEEP + self.addrem.astype(np.int64) * K.ADDREM
        NX = np.stack([self.ws.astype(np.int64), pcap], axis=1)
        return NI, np.ascontiguousarray(NX), int(region.sum())


def original_problem(nv: NodeView) -> Problem:
    """The needed nodes of the NodeView, one SA node each; unneeded nodes never run."""
    ids = [i for i in range(len(nv)) if nv.needed[i]]
    local = {v: k for k, v in enumerate(ids)}
    return Problem(
        members=[[i] for i in ids],
        preds=[[local[q] for q in nv.preds[i]] for i in ids],
        mem=np.array([nv.mem[i] for i in ids], dtype=np.int64),
        ws=np.array([nv.workspace[i] for i in ids], dtype=np.int64),
        cost=np.array([nv.cost[i] for i in ids], dtype=np.float64),
        keep=np.array([nv.keep[i] for i in ids], dtype=bool),
        addrem=np.array([nv.recomputable[i] for i in ids], dtype=bool),
    )


def group_nodes(nv: NodeView, max_group: int = 0) -> Problem:
    """Node grouping, Algorithm 1 of App. C.1 over the needed nodes in topological order.

    ``do_fuse(n_i)``: fuse n_i into every later node that consumes its output when its inputs take
    no more memory than its output, ``sum s(input(n_i)) <= sum s(output(n_i))``; n_i becomes nop.
    The grouped node of n_i and n_j follows §2.2.2: c(g) = c(n_i) + c(n_j), input(g) =
    input(n_i) ∪ (input(n_j) \\ output(n_i)), output(g) = output(n_j) (the block of n_i is consumed
    inside). Constituents shared by both are run once (the groups are sets of original nodes).
    Resident inputs (model inputs, parameters) are always in memory, so they count as 0 in
    do_fuse. Graph outputs are never fused (their block must stay), nor are ``recomputable:
    false`` nodes, which fusing into several consumers would duplicate (§2.3).
    ``max_group`` (0: no limit) keeps groups at most that many members: on graphs whose model
    inputs are small or absent (all the Moccasin graphs) do_fuse holds transitively from the
    sources and Algorithm 1 alone folds the whole graph into one group.
    The node-intermediate memory of a group is estimated from the values produced and used
    within it (App. B.1): the most its internal blocks (plus a member's workspace) take at any
    member's compute instant, an upper bound on what running the members in order needs beyond
    the group's inputs and output.
    """
    ids = [i for i in range(len(nv)) if nv.needed[i]]
    inputs: dict[int, set[int]] = {i: set(nv.preds[i]) for i in ids}
    consumers: dict[int, set[int]] = {i: {c for c in nv.succs[i] if nv.needed[c]} for i in ids}
    members: dict[int, set[int]] = {i: {i} for i in ids}
    alive = dict.fromkeys(ids, True)
    for i in ids:
        if nv.keep[i] or not nv.recomputable[i] or not consumers[i]:
            continue
        if sum(nv.mem[q] for q in inputs[i]) > nv.mem[i]:  # do_fuse
            continue
        if max_group and any(len(members[j] | members[i]) > max_group for j in consumers[i]):
            continue
        for j in consumers[i]:
            members[j] |= members[i]
            inputs[j] = (inputs[j] | inputs[i]) - {i}
        for q in inputs[i]:
            consumers[q].discard(i)
            consumers[q] |= consumers[i]
        alive[i] = False
    heads = [i for i in ids if alive[i]]
    local = {h: k for k, h in enumerate(heads)}
    mlists = [sorted(members[h]) for h in heads]
    return Problem(
        members=mlists,
        preds=[sorted(local[q] for q in inputs[h]) for h in heads],
        mem=np.array([nv.mem[h] for h in heads], dtype=np.int64),
        ws=np.array([_group_workspace(nv, ms) for ms in mlists], dtype=np.int64),
        cost=np.array([sum(nv.cost[m] for m in ms) for ms in mlists], dtype=np.float64),
        keep=np.array([nv.keep[h] for h in heads], dtype=bool),
        addrem=np.array([all(nv.recomputable[m] for m in ms) for ms in mlists], dtype=bool),
    )


def _group_workspace(nv: NodeView, ms: list[int]) -> int:
    """App. B.1 estimate for a group run as ``ms`` (topological; the head, last, is its output)."""
    head = ms[-1]
    inside = set(ms)
    last_use = {m: k for k, m in enumerate(ms)}
    for k, m in enumerate(ms):
        for q in nv.preds[m]:
            if q in inside:
                last_use[q] = k
    live = 0
    worst = 0
    for k, m in enumerate(ms):
        out = nv.mem[m] if m != head else 0
        worst = max(worst, live + out + nv.workspace[m])
        live += out
        for q in nv.preds[m]:
            if q in inside and q != head and last_use[q] == k:
                live -= nv.mem[q]
    return worst


@dataclass
class Best:
    order: np.ndarray | None = None  # compact sequence of SA node indices
    cost: float = math.inf
    peak: float = math.inf


class State:
    """The mutable half of the kernel state for a problem and T slots."""

    def __init__(self, prob: Problem, order: np.ndarray, seed: int, log_cap: int, lse: bool = False):
        self.prob = prob
        mixed = ((seed + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
        self.rng = np.array([mixed | 1], dtype=np.uint64)
        self.fstate = np.zeros(K.F_LEN, dtype=np.float64)
        self.istate = np.zeros(K.I_LEN, dtype=np.int64)
        self.log_t = np.zeros(log_cap, dtype=np.int32)
        self.log_n = np.zeros(log_cap, dtype=np.int32)
        self.T = 0
        self.lse = lse
        self.respread(np.asarray(order, dtype=np.int64))

    def respread(self, order: np.ndarray) -> None:
        """Lay ``order`` out evenly (App. D.4) in T >= SPACING·len slots and rebuild everything."""
        T = 64
        while T < SPACING * (len(order) + 1):
            T *= 2
        if T != self.T:
            self.T = T
            self.occ = np.zeros(T, dtype=np.int32)
            self.occpos = np.zeros(T, dtype=np.int32)
            self.tz = np.zeros(4 * T, dtype=np.int64)
            self.lz = np.zeros(4 * T if self.lse else 0, dtype=np.float64)
        copies = np.bincount(order, minlength=self.prob.size).astype(np.int64)
        self.NI, NX, pu = self.prob.layout(copies)
        self.PU = np.zeros(max(pu, 1), dtype=np.int32)
        p = self.prob
        add_list = np.flatnonzero(p.addrem).astype(np.int64)
        self.kt = (T, T, p.lscale, NX, p.cost.astype(np.float64), p.pred_idx, add_list)
        self.seq = K.spread(order.astype(np.int32), T)
        K.rebuild(self.kt, self.st)

    @property
    def st(self) -> tuple:
        return (
            self.seq,
            self.occ,
            self.occpos,
            self.NI,
            self.PU,
            self.tz,
            self.lz,
            self.fstate,
            self.istate,
            self.rng,
            self.log_t,
            self.log_n,
        )

    def order(self) -> np.ndarray:
        return self.seq[self.seq >= 0].astype(np.int64)

    @property
    def peak(self) -> int:
        """M(S) without the resident bytes: the root of the max tree."""
        return int(self.tz[2])

    @property
    def cost(self) -> float:
        return float(self.fstate[K.F_COST])


def expand(prob: Problem, order: np.ndarray) -> list[int]:
    """Decompose grouped nodes into their members (§2.2.2): NodeView indices in sequence."""
    out: list[int] = []
    for g in order:
        out.extend(prob.members[int(g)])
    return out


class FastSA(Solver):
    name = "fastsa"
    method = "simulated annealing over a node sequence (segment tree, node grouping)"
    paper = "Imanishi et al., A fast heuristic to optimize time-space tradeoff for large models (NeurIPS'23)"
    exact = False
    params = (
        Param("iterations", int, 20_000_000, "first-stage SA iterations (App. D.4: 20M)"),
        Param("iterations2", int, 2_000_000, "second-stage SA iterations on decomposed nodes (App. D.4: 2M)"),
        Param(
            "grouping", bool, False, "first stage on grouped nodes (App. C.1, Algorithm 1); off: on all nodes"
        ),
        Param("max_group", int, 8, "most original nodes in one group (0: no limit, as Algorithm 1)"),
        Param("no_recompute", bool, False, "only reorder, never recompute (App. B.2)"),
        Param("logaddexp", bool, False, "range-add/range-logaddexp tree for the objective (App. C.2)"),
        Param(
            "objective",
            str,
            "elu",
            "elu: footnote 2 of §3.1 (budget-respecting); max: eq. (1) max(budget, M)·C",
            choices=("elu", "max"),
        ),
        Param(
            "elu_sharpness", float, 100.0, "L(-x) = 0 in footnote 2 (the paper: 100); larger hugs the budget"
        ),
        Param(
            "over_budget_weight",
            float,
            1.0,
            "slope of the footnote-2 objective above the budget (the paper: 1; larger keeps M <= budget)",
        ),
        Param("initial_temperature", float, 3e-3, "initial temperature / initial objective (App. D.4: 0.1%)"),
        Param(
            "final_temperature", float, 1e-4, "final / initial temperature in each stage (App. D.4: 0.01%)"
        ),
        Param("rotate_share", float, 1.0 / 3.0, "share of rotations among the mutations (rest: add/remove)"),
        Param(
            "local",
            float,
            0.75,
            "share of add/rotate times drawn inside their valid window (rest: uniform, §2.2)",
        ),
        Param("stop_at_budget", bool, True, "end the grouped first stage once the budget is met (§3.1)"),
        Param(
            "patience",
            int,
            2_000_000,
            "converged: end stage 2 after this many iterations without a better feasible cost (0: never)",
        ),
        # 3e5/s: RL n500 at 90% needs ~16M iterations to reach the published 0.03% (11M at 2e5/s
        # ends at 0.11%); one loaded core still runs 16.5M local-mix iterations in ~35 s of 55.
        Param("rate", float, 3.0e5, "assumed iterations/s that turns --time-limit into an iteration budget"),
    )

    def notes(self) -> str:
        return (
            "Heuristic (no optimality proof). Deterministic for a seed: a time limit becomes an "
            "iteration budget at the assumed --rate."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        p = self.defaults() | options.params
        nv = graph.node_view
        resident = float(nv.resident)
        base_prob = original_problem(nv)
        if base_prob.size == 0:
            return SolverResult(steps=[], status="feasible", backend="numba", objective=0.0)
        no_rec = bool(p["no_recompute"])
        if no_rec:
            base_prob.addrem[:] = False
        grouped = group_nodes(nv, int(p["max_group"])) if (p["grouping"] and not no_rec) else None
        if grouped is not None and grouped.size * 2 < base_prob.size // 4:
            grouped = None  # degenerate: too few groups left to anneal (see group_nodes)
        n1 = max(0, int(p["iterations"]))
        n2 = max(0, int(p["iterations2"]))
        capped = ""
        if options.time_limit is not None:
            allowed = int(max(0.0, options.time_limit) * float(p["rate"]))
            if n1 + n2 > allowed:
                scale = allowed / (n1 + n2)
                n1, n2 = int(n1 * scale), int(n2 * scale)
                capped = f" (iterations scaled to {n1}+{n2} for the time limit at {p['rate']:.0f}/s)"
        mode = {"elu": K.OBJ_ELU, "max": K.OBJ_MAX}[p["objective"]]
        if no_rec:
            mode = K.OBJ_MEMORY  # App. B.2: the cost is fixed, minimise the peak
        run = _Run(
            graph, nv, float(budget), resident, mode, bool(p["logaddexp"]), options, int(p["patience"])
        )
        run.local = min(1.0, max(0.0, float(p["local"])))
        run.sharp = max(1.0, float(p["elu_sharpness"]))
        run.over = max(1.0, float(p["over_budget_weight"]))
        run.p_rotate = min(1.0, max(0.0, float(p["rotate_share"])))

        # first stage: grouped nodes, until the budget is met (App. D.4)
        prob1 = grouped if grouped is not None else base_prob
        order1 = np.arange(prob1.size, dtype=np.int64)  # topological `order` with groups in it
        state1 = State(prob1, order1, options.seed, 2 * CHUNK + 4, run.lse)
        f0 = run.objective(state1)
        h0 = float(p["initial_temperature"]) * f0
        hf = h0 * float(p["final_temperature"])
        best1 = run.stage(1, state1, n1, h0, hf, bool(p["stop_at_budget"]) and grouped is not None, no_rec)

        # second stage: decomposed nodes, colder (App. D.4)
        order2 = np.array(
            [base_index for base_index in _to_base(base_prob, expand(prob1, state1.order()))], dtype=np.int64
        )
        state2 = State(base_prob, order2, options.seed + 1, 2 * CHUNK + 4, run.lse)
        best2 = run.stage(2, state2, n2, hf, hf * float(p["final_temperature"]), False, no_rec)

        candidates = [
            expand(prob1, best1.feas.order) if best1.feas.order is not None else None,
            expand(prob1, best1.low.order) if best1.low.order is not None else None,
            expand(base_prob, best2.feas.order) if best2.feas.order is not None else None,
            expand(base_prob, best2.low.order) if best2.low.order is not None else None,
            expand(base_prob, state2.order()),
        ]
        polished = [run.polish(base_prob, c) for c in candidates if c is not None]
        chosen = run.choose(polished)
        steps, peak, cost = chosen
        msg = f"{run.iterations} iterations{capped}"
        if run.wall_stopped:
            msg += "; stopped by the wall clock before the iteration budget (not deterministic)"
        feasible = peak <= budget
        return SolverResult(
            steps=steps,
            status="feasible" if feasible else "infeasible",
            backend="numba",
            objective=cost,
            message=msg,
            best_peak=None if feasible else peak,
            params={"iterations_run": run.iterations},
        )


def _to_base(base_prob: Problem, nv_indices: list[int]) -> list[int]:
    local = {m[0]: k for k, m in enumerate(base_prob.members)}
    return [local[i] for i in nv_indices]


@dataclass
class StageBest:
    feas: Best
    low: Best


class _Run:
    """Chunked driver of one solve: stages, stopping, incumbents and progress."""

    def __init__(self, graph: Graph, nv: NodeView, budget: float, resident: float, mode: int, lse: bool,
                 options: SolveOptions, patience: int):  # fmt: skip
        self.graph = graph
        self.nv = nv
        self.budget = max(budget, 1.0)
        self.resident = resident
        self.mode = mode
        self.lse = lse
        self.options = options
        self.patience = patience
        self.local = 0.0
        self.p_rotate = 1.0 / 3.0
        self.sharp = 100.0
        self.over = 1.0
        self.iterations = 0
        self.wall_stopped = False
        base_cost = sum(nv.cost[i] for i in range(len(nv)) if nv.needed[i])
        # keeps f(S) informative when every cost is 0
        self.c_floor = 1e-9 * base_cost if base_cost > 0 else 1.0
        self.best_cost = math.inf
        self.last_report = time.monotonic()
        self.unreported: tuple[Problem, np.ndarray] | None = None

    def objective(self, s: State) -> float:
        m = float(s.peak) + self.resident
        return K.objective(m, s.cost + self.c_floor, self.budget, self.mode, self.sharp, self.over)

    def stage(self, stage: int, s: State, n_iter: int, h0: float, hf: float, stop_at_budget: bool,
              no_rec: bool) -> StageBest:  # fmt: skip
        feas, low = Best(), Best()
        m0 = float(s.peak) + self.resident
        if m0 <= self.budget:
            feas = Best(s.order(), s.cost, m0)
        low = Best(s.order(), s.cost, m0)
        if stop_at_budget and m0 <= self.budget:
            return StageBest(feas, low)
        p_add = p_rem = 0.0 if no_rec else (1.0 - self.p_rotate) / 2.0
        ratio = (hf / h0) ** (1.0 / n_iter) if n_iter > 0 and h0 > 0 else 1.0
        it = 0
        since_better = 0
        while it < n_iter:
            n = min(CHUNK, n_iter - it)
            h = h0 * (hf / h0) ** (it / n_iter) if h0 > 0 else 0.0
            base = s.seq.copy()
            fs, ist = s.fstate, s.istate
            fs[K.F_BEST_FEAS_COST] = feas.cost
            fs[K.F_BEST_FEAS_PEAK] = feas.peak
            fs[K.F_BEST_PEAK] = low.peak
            fs[K.F_BEST_PEAK_COST] = low.cost
            ist[K.I_LOG_LEN] = 0
            ist[K.I_MARK_FEAS] = -1
            ist[K.I_MARK_PEAK] = -1
            ist[K.I_MET] = 0
            done = K.sa_chunk(s.kt, s.st, n, self.budget, self.resident, self.c_floor, self.mode, h, ratio,
                              p_add, p_rem, stop_at_budget, self.local, self.sharp,
                              self.over)  # fmt: skip
            it += done
            self.iterations += done
            improved = False
            if ist[K.I_MARK_FEAS] >= 0:
                snap = base.copy()
                K.apply_log(snap, s.log_t, s.log_n, int(ist[K.I_MARK_FEAS]))
                feas = Best(
                    snap[snap >= 0].copy(), float(fs[K.F_BEST_FEAS_COST]), float(fs[K.F_BEST_FEAS_PEAK])
                )
                improved = True
            if ist[K.I_MARK_PEAK] >= 0:
                snap = base.copy()
                K.apply_log(snap, s.log_t, s.log_n, int(ist[K.I_MARK_PEAK]))
                low = Best(snap[snap >= 0].copy(), float(fs[K.F_BEST_PEAK_COST]), float(fs[K.F_BEST_PEAK]))
            since_better = 0 if improved else since_better + done
            self._report(stage, it, s, feas, low, h, improved)
            if ist[K.I_MET]:
                break
            # converged: only in the cold second stage, so that the first keeps its whole schedule
            if stage == 2 and self.patience and feas.order is not None and since_better >= self.patience:
                break
            remaining = self.options.remaining()
            if remaining is not None and remaining <= 0.0:
                self.wall_stopped = True
                break
            # re-spread so that every gap has nops again, which also recomputes C and the trees
            # exactly (no drift from millions of incremental updates)
            s.respread(s.order())
        return StageBest(feas, low)

    def _report(self, stage: int, it: int, s: State, feas: Best, low: Best, h: float, improved: bool) -> None:
        now = time.monotonic()
        if improved and feas.order is not None and feas.cost < self.best_cost:
            self.best_cost = feas.cost
            self.unreported = (s.prob, feas.order)
        if now - self.last_report < 1.0:
            return
        self.last_report = now
        if self.unreported is not None:  # decoding costs milliseconds: at most once a second
            prob, order = self.unreported
            self.unreported = None
            ids = self.nv.ids
            self.options.incumbent(steps_from_sequence(self.graph, [ids[i] for i in expand(prob, order)]))
        self.options.progress(
            stage=stage,
            iteration=it,
            elapsed=now - self.options.started,
            incumbent=None if feas.order is None else feas.cost,
            peak=low.peak,
            temperature=h,
            current_peak=float(s.peak) + self.resident,
            current_cost=s.cost,
        )

    def polish(self, base_prob: Problem, cand: list[int]) -> list[int]:
        """``cand`` (NodeView indices) without its redundant computations (kernel ``polish``):
        the peak may rise up to the budget, or not at all when the candidate is already above it."""
        s = State(base_prob, np.array(_to_base(base_prob, cand), dtype=np.int64), 0, 4, False)
        limit = max(self.budget, float(s.peak) + self.resident) - self.resident
        K.polish(s.kt, s.st, limit)
        return expand(base_prob, s.order())

    def choose(self, candidates: list[list[int]]) -> tuple[list[Step], int, float]:
        """The candidate the simulator finds within budget at least cost, else the lowest peak."""
        best: tuple[tuple[int, float, float], list[Step], int, float] | None = None
        ids = self.nv.ids
        for cand in candidates:
            steps = steps_from_sequence(self.graph, [ids[i] for i in cand])
            sim = simulate(self.graph, steps)
            over = sim.peak_memory > self.budget
            key = (int(over), float(sim.peak_memory) if over else sim.cost, float(sim.peak_memory))
            if best is None or key < best[0]:
                best = (key, steps, sim.peak_memory, sim.cost)
        assert best is not None
        self.options.incumbent(best[1])
        return best[1], best[2], best[3]


def _warm_up() -> None:
    """Compile (or load from numba's on-disk cache) every kernel specialisation the solver uses,
    at import time, so that no solve pays the first-call compilation inside its time limit."""
    prob = Problem(
        members=[[0], [1]],
        preds=[[], [0]],
        mem=np.array([1, 1], dtype=np.int64),
        ws=np.array([0, 1], dtype=np.int64),
        cost=np.array([1.0, 1.0]),
        keep=np.array([False, True]),
        addrem=np.array([True, True]),
    )
    s = State(prob, np.arange(2, dtype=np.int64), seed=0, log_cap=64)
    K.sa_chunk(s.kt, s.st, 16, 10.0, 0.0, 1e-9, K.OBJ_ELU, 1.0, 1.0, 1 / 3, 1 / 3, False, 0.5, 100.0, 1.0)
    K.apply_log(s.seq.copy(), s.log_t, s.log_n, 0)
    K.polish(s.kt, s.st, 10.0)
    K.objective(1.0, 1.0, 1.0, K.OBJ_ELU, 100.0, 1.0)


_warm_up()
