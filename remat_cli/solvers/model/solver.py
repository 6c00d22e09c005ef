"""MODeL (Steiner, Elhoushi, Kahn, Hegarty, "MODeL: Memory Optimizations for Deep Learning",
ICML 2023): the solver entry, §4.4-4.5 and §5.4-5.5.

Joint mode (default) minimises the arena over operator orders and tensor offsets, without
recomputation, in three stages sharing the time limit:

0. Warm start (not in the paper): the better of the program order and a memory-aware list
   schedule, improved by hill climbing (`ordering.improve_order`; on torch_unet_train it alone
   takes the fragmentation-free peak from 47.7 to 34.6 MB, which CP-SAT's order model did not
   find from the program order in 12 s), then the cut descent (`ordering.cut_descent`) towards
   the minimum-cut bound (`bound.py`); reaching it proves the order optimal before CP-SAT runs
   (all four shipped ONNX training graphs, in at most 2.7 s), then chain moves
   (`ordering.chain_descent`: a weight's transpose-view-flip chain moved next to the backward
   convolution that reads it; MobileNet-v2 b32) and the walk across the peak
   (`ordering.peak_walk`; MobileNet-v2 b1: to the bound in 0.2 s). Where a pair of operators set
   the bound, a second descent starts from the order that pair points at, and pair moves from the
   peak follow it (`ordering.pair_move`, `ordering.pair_descent`: the exported ResNet-18 step,
   batch 32); with --order-only the lower peak goes on, the joint mode adds it to its orders for
   addresses.
1. §5.5 reordering alone (`ordering.py`): CP-SAT minimises the fragmentation-free peak from the
   warm start, then, where that is above the bound, the walk across the peak again; its proven
   bound (or the minimum-cut bound of `bound.py`, a strengthening of eq. 12's forced
   preservation, when larger; with --order-only taken again from the order found) is a lower
   bound for every arena.
2. §4.3 addresses (`addresses.py`): greedy best fit for each candidate order (the order
   stage's, the program's, the start), then the placement heuristics (perturbed best fit, the
   squeaky wheel, the big buffers placed exactly first) on each whose peak is below the best
   arena; where the arena then reaches its order's own peak, the bound again; when the arena is
   above the bound, ruin and recreate on the best one (`addresses.repack`), a walk over orders
   of that peak towards a tighter greedy placement (`plateau.py`, not in the paper; when the
   arena is still more than 0.5% above the bound after it, the joint walk over orders
   and offsets from that placement, `plateau.joint_walk`), then once,
   on the best order, ruin and recreate again and the exact engine (CP-SAT
   ``AddNoOverlap2D``). Each step is skipped once the arena is within --gap of the bound, and
   the heuristics and the walk stop on counts of fruitless tries, not on shares of the time
   limit, which makes them faster and keeps a seeded run repeatable.
3. §4.4 program (9) (`joint.py`): only when the arena is still above the bound, CP-SAT over
   order and addresses together, warm-started from stage 2.

Why CP-SAT and not the paper's big-M MILP (both are here; ``--address-engine milp`` runs eqs.
(6)-(8) on HiGHS through `remat_cli.milp`): the MILP needs O(n x steps) C/P binaries for the
order plus a pair of binaries per pair of tensors that may be live together, and its big-M rows
give an LP bound near 0, so the bound comes only from branching; CP-SAT's interval variables
need one position per operator and one box per tensor, and the cumulative relaxation proves
the fragmentation-free peak at once (bench/model.py compares the two engines).

Every CP-SAT model stops on a stall (`cpsat.run`: rounds of deterministic time, so a seed
repeats, while each finds a smaller objective), not only on the time limit: on ResNet-18 b32
the order model had spent 22 of 30 s without passing its warm start, leaving the placement
1.3 s; with the stall it stops after 8 s and the arena drops from 1.09% to 0.78% above the
order's peak.

Status "optimal" means the arena equals a proven lower bound (`bound.py`'s cuts, the order-only
CP-SAT bound, or the joint model's own); `--gap` (default 1e-4) ends the search earlier, with
status "feasible" and the gap in the message. `--fixed-order` keeps the program order (addresses only; the bound is
that order's peak); `--order-only` returns the best order with its ideal, fragmentation-free
peak as the objective and no plan. Resident values (inputs, parameters) are outside the arena;
the objective and bound are resident bytes + arena, comparable with the budget.
"""

from __future__ import annotations

import time
from typing import ClassVar

from remat_cli.graph import Graph
from remat_cli.planning.addresses import ENGINES, place, repack
from remat_cli.planning.memory_plan import (
    Buffer,
    align,
    arena_of,
    arena_peak,
    buffers_of,
    greedy_offsets,
    make_plan,
)
from remat_cli.schedule import Step, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.model.bound import CutNetwork, cut_bound
from remat_cli.solvers.model.joint import solve_joint
from remat_cli.solvers.model.lifetimes import Problem
from remat_cli.solvers.model.ordering import (
    OrderResult,
    chain_descent,
    cut_descent,
    greedy_order,
    improve_order,
    pair_descent,
    pair_move,
    peak_walk,
    solve_order,
)
from remat_cli.solvers.model.plateau import joint_walk, plateau_walk

DEFAULT_TIME_LIMIT = 60.0
#: program (9) is built only up to this many tensors: above, CP-SAT's presolve of the joint model
#: alone can run far past the time limit
JOINT_MAX_TENSORS = 400
#: seeded single-worker solves of graphs up to this many operators stop on counts, not the clock
CLOCK_FREE_OPS = 100
#: CP-SAT's stall rounds (`cpsat.run`) in units of deterministic time per second of the solve's
#: time limit (the limit, not the time left, so that a seed repeats): with a 30 s limit 1.0 for the
#: order model, 0.6 for the address model and 3.0 for program (9), whose presolve and warm start
#: take about 2 of them
ORDER_STALL, ADDRESS_STALL, JOINT_STALL = 1 / 30, 1 / 60, 1 / 10
#: above this gap (arena over the order bound) after the plateau walk, the joint walk
#: (`plateau.joint_walk`) runs: half the issue's bar (1% measured), since the walk still gains
#: there (MobileNet-v2 b1, 300 s, one core: 0.82% after the squeaky wheel without it, 0.12% with
#: it). The bound, not the order's own peak: the plateau walk may take an order of a higher peak,
#: which then hid ResNet-50 b1's 0.57% gap (0.49% above that order's peak; the joint walk
#: took it to 0.32%)
JOINT_WALK_GAP = 0.005
#: share of the time left that the plateau walk gets: the joint walk after it gains more on the
#: large graphs (300 s, one core: ResNet-50 b1 0.32% -> 0.08% above the bound, with 0.5)
PLATEAU_SHARE = 0.2


class Model(Solver):
    name = "model"
    method = "operator order + tensor addresses, no recomputation (one arena)"
    paper = "Steiner et al., ICML 2023 (MODeL)"
    exact = True
    minimises = "memory"
    params: ClassVar[tuple[Param, ...]] = (
        Param("fixed_order", bool, False, "keep the program order; optimise the addresses only"),
        Param("order_only", bool, False, "order alone: the ideal, fragmentation-free peak (§5.5), no plan"),
        Param("alignment", int, 1, "every offset and size a multiple of this many bytes", low=1, high=2**30),
        Param("address_engine", str, "cp-sat", "engine for the address stage", ENGINES),
        Param(
            "gap",
            float,
            1e-4,
            "stop once the arena is within this fraction above the lower bound (Gurobi's default "
            "MIPGap, the paper's setting); 0: search until proven optimal or out of time",
            low=0.0,
            high=1.0,
        ),
    )

    def notes(self) -> str:
        return "never recomputes: the budget must hold the whole graph's best order; writes a memory_plan"

    def prepare(self) -> None:
        from remat_cli.planning.best_fit import warm_up

        warm_up()

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        # compiling the best-fit kernel (first solve after an install) is not solving: the time
        # it takes is given back, so that seeded runs stop their stages at the same work
        t0 = time.monotonic()
        self.prepare()
        compiled = time.monotonic() - t0
        prm = self.defaults() | options.params
        alignment = int(prm["alignment"])
        if alignment < 1:
            raise ValueError("--alignment must be at least 1")
        if prm["fixed_order"] and prm["order_only"]:
            raise ValueError("--fixed-order and --order-only exclude each other")
        limit = options.remaining()
        deadline = time.monotonic() + (DEFAULT_TIME_LIMIT if limit is None else limit + compiled)
        p = Problem(graph, alignment)
        if options.workers == 1 and len(p) <= CLOCK_FREE_OPS:
            # every stage also stops on a count (patience, stall rounds of deterministic time),
            # and on graphs this small those end in well under a second; the clock, shared with
            # whatever else runs, cut a stage short in one of three seeded runs on a loaded
            # machine and the runs returned different orders
            deadline = max(deadline, time.monotonic() + DEFAULT_TIME_LIMIT)
        run = _Run(self, p, budget, options, prm, deadline)
        if prm["order_only"]:
            return run.order_only()
        if prm["fixed_order"]:
            return run.fixed_order()
        return run.joint()

    @staticmethod
    def _steps(p: Problem, order: list[int]) -> list[Step]:
        return steps_from_sequence(p.graph, [p.ops[i] for i in order])

    @classmethod
    def _order_start(
        cls, p: Problem, options: SolveOptions, floor: int, deadline: float, net: CutNetwork
    ) -> tuple[list[int], int, list[int] | None]:
        """Stage 0: the start order, hill-climbed, then the minimum-cut bound, the cut descent
        towards it, the chain moves and the walk across the peak, each with a share of the time
        left; returns (order, bound, paired). Where a pair of operators set the bound, `paired` is
        the descent from the order that pair points at, followed by the pair descent (else None):
        with --order-only the lower of the two peaks starts the order search; the joint mode keeps
        the cut descent's order as its start, adds `paired` to its candidates for addresses (and
        holds the bound against it where its peak is the lower), since orders of the same peak
        place differently (MobileNet-v2 b1, 300 s: arena 1.67% above its order's peak from the
        paired start, 0.45% from the cut descent's; ResNet-18 b32: 0.01% from the paired order,
        0.62% from the other). `net`: the problem's CutNetwork, shared by all four."""

        def until(share: float) -> float:
            now = time.monotonic()
            return now + max(0.0, deadline - now) * share

        start = improve_order(p, cls._start(p, options), until(0.15))
        # a schedule at once: stopped at its limit, the solve still has one to give
        options.incumbent(cls._steps(p, start))
        pair: list[int] = []
        # a share, not the whole limit: on a 3,276-operator LSTM step the cuts take 9 s, and
        # with --time-limit 10 the solve was stopped before it had any schedule
        floor = max(floor, cut_bound(p, start, until(0.3), pair, net))
        order = cut_descent(p, start, floor, until(0.25), net=net)
        order = chain_descent(p, order, floor, until(0.1))
        # before CP-SAT's order model, which on MobileNet-v2 b1 spent 76 s without passing the
        # descents' 5,288,384 B, where the walk reached the bound (5,180,736 B) in 0.2 s
        order = peak_walk(p, order, floor, until(0.1), options.seed)
        if not pair or p.peak(order) <= floor:
            return order, floor, None
        moved = pair_move(p, start, pair[0], pair[1], until(0.1), net)
        moved = cut_descent(p, moved, floor, until(0.25), net=net)
        return order, floor, pair_descent(p, moved, pair, floor, until(0.1), net)

    @staticmethod
    def _walk(p: Problem, r: OrderResult, deadline: float, seed: int) -> OrderResult:
        """The order search's result walked across its peak (`ordering.peak_walk`) where it is
        above the bound."""
        if r.optimal or r.peak <= r.bound:
            return r
        order = peak_walk(p, r.order, r.bound, deadline, seed)
        peak = p.peak(order)
        return OrderResult(order, peak, r.bound, peak <= r.bound) if peak < r.peak else r

    @staticmethod
    def _rebound(p: Problem, r: OrderResult, deadline: float, net: CutNetwork) -> OrderResult:
        """The bound again from the order found, where a gap is left: the pair bound's candidates
        are its operators of the largest live bytes (ResNet-50 b32: 831.7 MB from the start
        order, 833.8 MB from the order found, 10 KB below its peak). The plain cuts are `net`'s
        from the first bound."""
        if r.optimal or r.peak <= r.bound:
            return r
        bound = max(r.bound, cut_bound(p, r.order, deadline, net=net))
        return OrderResult(r.order, r.peak, bound, r.peak <= bound)

    @staticmethod
    def _start(p: Problem, options: SolveOptions) -> list[int]:
        """The hint's compute order when it runs each needed operator once, else the better of the
        program order and the greedy list schedule."""
        if options.hint:
            seq = [s.node for s in options.hint if s.op == "compute"]
            if len(seq) == len(p) and set(seq) == set(p.ops):
                order = [p.index[n] for n in seq if n is not None]
                pos = {i: k for k, i in enumerate(order)}
                if all(pos[q] < pos[i] for i in order for q in p.preds[i]):
                    return order
        return min((list(range(len(p))), greedy_order(p)), key=p.peak)


def _floor(p: Problem, alignment: int) -> int:
    """Bytes every order needs at some step: an operator's inputs, outputs and workspace together,
    and all graph outputs at the end."""
    vm = p.graph.value_map
    nm = p.graph.node_map
    best = 0
    for n_id in p.ops:
        n = nm[n_id]
        vals = {v for v in n.inputs if not vm[v].resident} | set(n.outputs)
        best = max(best, sum(align(vm[v].size, alignment) for v in vals) + align(n.workspace, alignment))
    outs = sum(align(vm[v].size, alignment) for v in set(p.graph.outputs) if not vm[v].resident)
    return max(best, outs)


class _Run:
    """One joint-mode solve (module docstring): its settings, the time left, the best placement
    so far and the bound, stage by stage."""

    def __init__(
        self,
        sv: Model,
        p: Problem,
        budget: int,
        options: SolveOptions,
        prm: dict[str, object],
        deadline: float,
    ) -> None:
        self.sv = sv
        self.p = p
        self.graph = p.graph
        self.budget = budget
        self.options = options
        self.deadline = deadline
        self.alignment = int(prm["alignment"])  # type: ignore[call-overload]
        self.resident = p.graph.resident_bytes
        self.program = list(range(len(p)))
        self.floor = _floor(p, self.alignment)
        self.workers, self.seed, self.gap = options.workers, options.seed, float(prm["gap"])  # type: ignore[arg-type]
        self.per_second = DEFAULT_TIME_LIMIT if options.time_limit is None else options.time_limit
        self.order_stall, self.address_stall = ORDER_STALL * self.per_second, ADDRESS_STALL * self.per_second
        self.engine = str(prm["address_engine"])
        self.backend = "cp-sat" if self.engine == "cp-sat" else "highs"
        self.best: tuple[int, list[int], list[Buffer], list[int]] | None = None
        self.bound = 0
        self.rebound = True

    def open_gap(self, objective: int, bound: int) -> bool:
        return objective > bound * (1 + self.gap) and self.left() > 0

    def left(self, share: float = 1.0) -> float:
        return max(0.0, self.deadline - time.monotonic()) * share

    def result(
        self, steps: list[Step], objective: int, bound: int, optimal: bool, **kw: object
    ) -> SolverResult:
        status = "optimal" if optimal else "feasible"
        if self.resident + objective > self.budget:
            status = "infeasible"
        return SolverResult(
            steps=steps,
            status=status,  # type: ignore[arg-type]
            backend=kw.pop("backend", "cp-sat"),  # type: ignore[arg-type]
            objective=float(self.resident + objective),
            lower_bound=float(self.resident + bound),
            message=str(kw.pop("message", "")) or None,
            memory_plan=kw.pop("plan", None),  # type: ignore[arg-type]
            best_peak=self.resident + objective,
        )

    def order_only(self) -> SolverResult:
        """--order-only: the best order (§5.5) and its fragmentation-free peak, no plan."""
        p, sv = self.p, self.sv
        net = CutNetwork(p)
        start, floor, paired = sv._order_start(p, self.options, self.floor, self.deadline, net)
        if paired is not None and p.peak(paired) < p.peak(start):
            start = paired
        r = solve_order(p, start, self.left(0.9), self.workers, self.seed, floor, self.gap, self.order_stall)
        r = sv._rebound(p, sv._walk(p, r, time.monotonic() + self.left(0.5), self.seed), self.deadline, net)
        steps = sv._steps(p, r.order)
        return self.result(
            steps,
            r.peak,
            r.bound,
            r.optimal,
            message=f"order only: fragmentation-free peak {r.peak:,} B of intermediates "
            f"({'proven optimal' if r.optimal else f'bound {r.bound:,} B'}; program order "
            f"{p.peak(self.program):,} B); no memory plan",
        )

    def fixed_order(self) -> SolverResult:
        """--fixed-order: addresses (§4.3) for the program order alone."""
        steps = self.sv._steps(self.p, self.program)
        bufs = buffers_of(self.graph, steps)
        offsets, arena, bound, optimal = place(
            bufs,
            self.alignment,
            self.left(),
            self.workers,
            self.seed,
            self.engine,
            self.gap,
            stall=self.address_stall,
        )
        return self.result(
            steps,
            arena,
            bound,
            optimal,
            plan=make_plan(bufs, offsets, self.alignment),
            backend=self.backend,
            message=f"fixed order: arena {arena:,} B, that order's peak {arena_peak(bufs, self.alignment):,} B",
        )

    def keep(self, order: list[int], bufs: list[Buffer], offs: list[int]) -> None:
        """The placement as the best when its arena is smaller."""
        arena = arena_of(bufs, offs, self.alignment)
        if self.best is None or arena < self.best[0]:
            self.best = (arena, order, bufs, offs)

    def joint(self) -> SolverResult:
        """The joint mode's stages (module docstring): order, addresses, walks, the exact engine
        and program (9)."""
        p = self.p
        # 1. reordering alone (§5.5): the best fragmentation-free order and a bound for any arena
        net = CutNetwork(p)
        start, self.floor, paired = self.sv._order_start(p, self.options, self.floor, self.deadline, net)
        # without stage 3 (too large) the order search gets most of the time
        joint = self.engine == "cp-sat" and len(p.tensors) <= JOINT_MAX_TENSORS
        r = solve_order(
            p,
            start,
            self.left(0.4 if joint else 0.8),
            self.workers,
            self.seed,
            self.floor,
            self.gap,
            self.order_stall,
        )
        r = self.sv._walk(p, r, time.monotonic() + self.left(0.1), self.seed)
        searched = r.order
        if paired is not None and (paired_peak := p.peak(paired)) < r.peak:
            # the pair descent's order is the lower one, so the one the bound is held against
            # (the search from the cut descent's order may stop above it); the searched order
            # stays a candidate
            r = OrderResult(paired, paired_peak, r.bound, paired_peak <= r.bound)
        r = self.sv._rebound(p, r, time.monotonic() + self.left(0.1), net)
        self.bound = r.bound
        orders = (
            tuple(r.order),
            tuple(searched),
            tuple(self.program),
            tuple(start),
            *([tuple(paired)] if paired else []),
        )
        r = self.addresses(r, orders, net)
        return self.exact_and_program(r, joint)

    def addresses(self, r: OrderResult, orders: tuple[tuple[int, ...], ...], net: CutNetwork) -> OrderResult:
        """2. Addresses (§4.3) for the candidate orders, the smallest arena going on; the
        heuristics, the repack, the plateau walk and the joint walk while a gap is open. Returns
        the order result, whose bound may have been raised."""
        p, alignment, seed, gap = self.p, self.alignment, self.seed, self.gap
        candidates = []
        for order in map(list, dict.fromkeys(orders)):
            bufs = buffers_of(self.graph, self.sv._steps(p, order))
            offs = greedy_offsets(bufs, alignment)
            candidates.append((arena_of(bufs, offs, alignment), order, bufs))
            self.keep(order, bufs, offs)
        assert self.best is not None
        # The heuristics (perturbed best fit, the big buffers first; no full engine) on every
        # candidate whose peak leaves room below the best arena, best greedy arena first: greedy
        # alone ranks them wrongly (an order whose greedy arena is higher may place within --gap
        # of its peak with the big buffers first)
        for _, order, bufs in sorted(candidates, key=lambda c: c[0]):
            if self.open_gap(self.best[0], self.bound) and arena_peak(bufs, alignment) < self.best[0]:
                placed, _, _, _ = place(
                    bufs, alignment, self.left(0.1), self.workers, seed, self.engine, gap, exact=False
                )
                self.keep(order, bufs, placed)
        r = self.at_its_peak(r, net)
        if self.open_gap(self.best[0], self.bound):
            # ruin and recreate on the best order before the walk, which starts from a plain
            # best fit that may be further above the peak than the incumbent
            _, order, bufs, offs = self.best
            deadline_repack = time.monotonic() + self.left(0.4)
            self.keep(order, bufs, repack(bufs, alignment, offs, seed, deadline_repack, gap))
            r = self.at_its_peak(r, net)
        self.options.incumbent(self.sv._steps(p, self.best[1]))
        self.options.progress(arena=self.resident + self.best[0], bound=self.resident + self.bound)
        if self.open_gap(self.best[0], self.bound):  # orders of that peak whose placement is tighter
            walked, walked_offsets = plateau_walk(
                p,
                self.best[1],
                self.bound,
                time.monotonic() + self.left(PLATEAU_SHARE),
                seed,
                incumbent=self.best[0],
                near=int(self.bound * (1 + gap)),
            )
            bufs = buffers_of(self.graph, self.sv._steps(p, walked))
            self.keep(walked, bufs, p.by_buffer(walked_offsets, bufs))
        if self.open_gap(self.best[0], self.bound) and self.best[0] > self.bound * (1 + JOINT_WALK_GAP):
            # the placement itself is still the gap: move operators and offsets together from
            # it, with most of the time left (the plateau walk re-places every tensor by a plain
            # best fit). After the plateau walk, not instead of it: that walk may reach the peak
            # where the joint walk alone stops above it
            _, order, bufs, offs = self.best
            walked, walked_offsets = joint_walk(
                p, order, p.by_tensor(offs, bufs), self.bound, time.monotonic() + self.left(0.8), seed
            )
            bufs = buffers_of(self.graph, self.sv._steps(p, walked))
            self.keep(walked, bufs, p.by_buffer(walked_offsets, bufs))
        return r

    def at_its_peak(self, r: OrderResult, net: CutNetwork) -> OrderResult:
        """The arena is its order's own peak: no placement closes the gap, only a higher bound or
        a lower order, and the bound had a tenth of the time; the bound again (once), with most
        of the time left."""
        assert self.best is not None
        if (
            self.rebound
            and self.open_gap(self.best[0], self.bound)
            and self.best[0] <= arena_peak(self.best[2], self.alignment) * (1 + self.gap)
        ):
            r, self.rebound = self.sv._rebound(self.p, r, time.monotonic() + self.left(0.8), net), False
            self.bound = r.bound
        return r

    def exact_and_program(self, r: OrderResult, joint: bool) -> SolverResult:
        """The exact engine (perturbed best fit, the big buffers first, then CP-SAT or the MILP)
        once, on the best order after the walks (before them it spends its time without passing
        the greedy start); 3. program (9) when a gap remains; the result."""
        p, alignment, gap = self.p, self.alignment, self.gap
        assert self.best is not None
        arena, order, bufs, offs = self.best
        self.options.incumbent(self.sv._steps(p, order))
        self.options.progress(arena=self.resident + arena, bound=self.resident + self.bound)
        if self.open_gap(arena, self.bound):
            placed, placed_arena, _, _ = place(
                bufs, alignment, self.left(0.5), self.workers, self.seed, self.engine, gap,
                stall=self.address_stall, start=offs,
            )  # fmt: skip
            if placed_arena < arena:
                self.best = (placed_arena, order, bufs, placed)
        arena, order, bufs, offs = self.best
        bound = self.bound
        stage = "order, then addresses"
        if self.open_gap(arena, bound) and self.left() > 0.5 and joint:
            start_offsets = p.by_tensor(offs, bufs)
            j = solve_joint(
                p, alignment, order, start_offsets, arena, bound, self.left(), self.workers, self.seed, gap,
                JOINT_STALL * self.per_second,
            )  # fmt: skip
            if j is not None:
                bound = max(bound, j.bound)
                if j.arena < arena:
                    order, arena, stage = j.order, j.arena, "joint model (9)"
                    bufs = buffers_of(self.graph, self.sv._steps(p, order))
                    offs = p.by_buffer(j.offsets, bufs)
                if j.optimal:
                    bound = max(bound, arena)
        bound = min(bound, arena)
        steps = self.sv._steps(p, order)
        return self.result(
            steps,
            arena,
            bound,
            arena <= bound,
            plan=make_plan(bufs, offs, alignment),
            backend=self.backend,
            message=f"{stage}: arena {arena:,} B, bound {bound:,} B"
            + (f" (within --gap {gap:g})" if bound < arena <= bound * (1 + gap) else "")
            + f", program order's peak {p.peak(self.program):,} B, best order's ideal peak {r.peak:,} B "
            + ("(proven optimal)" if r.optimal else f"(order bound {r.bound:,} B)"),
        )
