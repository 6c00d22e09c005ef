"""FastSA's driver: two annealing stages, stopping, polishing and choosing the schedule
(Imanishi et al., NeurIPS'23, §2.2.2, §3.1 and App. D.4).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph, NodeView
from remat_cli.schedule import Step, simulate, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.fastsa import kernel as K
from remat_cli.solvers.fastsa.chains import can_fork, run_chains
from remat_cli.solvers.fastsa.config import KICK_HEAT, RESCUE_OVER, RunConfig
from remat_cli.solvers.fastsa.kicks import iterate
from remat_cli.solvers.fastsa.pins import candidates, pinned
from remat_cli.solvers.fastsa.problem import (
    Problem,
    State,
    expand,
    group_nodes,
    original_problem,
    to_base,
)
from remat_cli.solvers.fastsa.rounds import repaired, round_plan, run_rounds, short_round
from remat_cli.solvers.fastsa.run import Run, StageBest
from remat_cli.solvers.greedy import evict_in_order

#: most chains --chains 0 runs (one per worker): each holds its own copy of the state
AUTO_CHAINS = 8


class FastSA(Solver):
    name = "fastsa"
    method = "simulated annealing over a node sequence (segment tree, node grouping)"
    paper = "Imanishi et al., A fast heuristic to optimize time-space tradeoff for large models (NeurIPS'23)"
    exact = False
    warm_starts = True
    params = (
        Param("iterations", int, 20_000_000, "first-stage SA iterations (App. D.4: 20M)", low=0, high=10**12),
        Param(
            "iterations2",
            int,
            2_000_000,
            "second-stage SA iterations on decomposed nodes (App. D.4: 2M)",
            low=0,
            high=10**12,
        ),
        Param(
            "grouping", bool, False, "first stage on grouped nodes (App. C.1, Algorithm 1); off: on all nodes"
        ),
        Param(
            "max_group",
            int,
            8,
            "most original nodes in one group (0: no limit, as Algorithm 1)",
            low=0,
            high=1000000,
        ),
        Param("no_recompute", bool, False, "only reorder, never recompute (App. B.2)"),
        Param("logaddexp", bool, False, "range-add/range-logaddexp tree for the objective (App. C.2)"),
        Param(
            "tight_after",
            float,
            1.0 / 3.0,
            "share of the first stage after which, when it has found no schedule within the budget, the "
            "rest of it is re-heated from its least peak with recomputation chains (--chain) and the "
            "logaddexp soft peak of App. C.2 until the budget is met (0: from the start; 1: never)",
            low=0,
            high=1,
        ),
        Param(
            "objective",
            str,
            "elu",
            "elu: footnote 2 of §3.1 (budget-respecting); max: eq. (1) max(budget, M)·C",
            choices=("elu", "max"),
        ),
        Param(
            "elu_sharpness",
            float,
            100.0,
            "L(-x) = 0 in footnote 2 (the paper: 100); larger hugs the budget",
            low=0.001,
            high=1000000.0,
        ),
        Param(
            "over_budget_weight",
            float,
            1.0,
            "slope of the footnote-2 objective above the budget (the paper: 1; larger keeps M <= budget)",
            low=0,
            high=1000000.0,
        ),
        Param(
            "initial_temperature",
            float,
            3e-3,
            "initial temperature / initial objective (App. D.4: 0.1%)",
            low=1e-12,
            high=1000000.0,
        ),
        Param(
            "final_temperature",
            float,
            1e-4,
            "final / initial temperature in each stage (App. D.4: 0.01%)",
            low=1e-12,
            high=1,
        ),
        Param(
            "rotate_share",
            float,
            1.0 / 3.0,
            "share of rotations among the mutations (rest: add/remove)",
            low=0,
            high=1,
        ),
        Param(
            "local",
            float,
            0.75,
            "share of add/rotate times drawn inside their valid window (rest: uniform, §2.2)",
            low=0,
            high=1,
        ),
        Param(
            "chain",
            int,
            12,
            "at tight budgets (see --tight-after) and in the second stage an add also recomputes up to "
            "this many of the inputs it would keep alive, recursively, as one mutation, and a remove the "
            "computations it leaves unused (0: the single-node mutations of §2.2)",
            low=0,
            high=64,
        ),
        Param(
            "rescue",
            bool,
            True,
            "when the first stage ends above the budget, anneal the (logaddexp) peak alone until it is met",
        ),
        Param(
            "greedy_start",
            bool,
            True,
            "start the second stage from greedy's schedule when it is cheaper than the first stage's best "
            "and the rescue from it when "
            "there is no hint (off: greedy's solve never runs inside fastsa; the last rescue, greedy's "
            "eviction in the order of the least peak annealed, still does)",
        ),
        Param(
            "kicks",
            float,
            0.15,
            "share of the iteration budget that a first stage meeting the budget before its tight "
            "part (--tight-after) gives to kicks after the second: the most expensive recomputation "
            "removed and the schedule annealed again, kept when cheaper within the budget (see "
            "kicks.py; 0: the paper's two stages only)",
            low=0,
            high=0.9,
        ),
        Param("stop_at_budget", bool, True, "end the grouped first stage once the budget is met (§3.1)"),
        Param(
            "chains",
            int,
            0,
            "independent chains side by side, chain k with seed + k and the whole iteration budget; "
            f"the cheapest schedule is kept (0: one per worker, at most {AUTO_CHAINS})",
            low=0,
            high=64,
        ),
        Param(
            "rounds",
            int,
            0,
            "rounds of both stages in sequence, round k with seed + 1000k, an even one with the "
            "cheapest schedule so far as its hint (0: one whole round of --iterations + "
            "--iterations2, then shorter ones while the time limit holds them at --rate and what "
            "the rounds' iterations leave of it at the kernels' speeds (the operators / 1,500 of a "
            "round, at least a quarter), at most 16 rounds in all; one without a limit)",
            low=0,
            high=1000,
        ),
        Param(
            "pins",
            int,
            2,
            "terminal nodes to pin: rounds 3 and 5 anneal the graph with the largest terminal node "
            "(a weight gradient) pinned after the last gradient, rounds 7 and 9 with the "
            "second (0: none)",
            low=0,
            high=2,
        ),
        Param(
            "repair",
            bool,
            True,
            "when a round ends above the budget and nothing fits it yet, repair its schedule at the "
            "peak (values made again just before their next use, output operators deferred; "
            "repair.py) and start the hinted rounds from it (not with --no-recompute)",
        ),
        Param(
            "patience",
            int,
            2_000_000,
            "converged: end stage 2 after this many iterations without a better feasible cost (0: never)",
            low=0,
            high=10**12,
        ),
        # the rate is below the kernels' speed on one core, so that a time limit's iterations
        # fit in it with room for greedy's start and polish
        Param(
            "rate",
            float,
            3.0e5,
            "assumed iterations/s that turns --time-limit into an iteration budget",
            low=1,
            high=1e12,
        ),
    )

    def notes(self) -> str:
        return (
            "Heuristic (no optimality proof). Deterministic for a seed: a time limit becomes an "
            "iteration budget at the assumed --rate."
        )

    def prepare(self) -> None:
        _warm_up()

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        _warm_up()
        k = int((self.defaults() | options.params)["chains"]) or min(options.workers, AUTO_CHAINS)
        if k > 1 and can_fork():
            return run_chains(functools.partial(self._rounds, graph, budget), graph, budget, options, k)
        return self._rounds(graph, budget, options)

    def _rounds(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """One chain, in as many rounds as its work limit holds (see rounds.py)."""
        p = self.defaults() | options.params
        per_round = int(p["iterations"]) + int(p["iterations2"])
        short = short_round(per_round, len(graph.needed_nodes))
        rate = float(p["rate"])
        plan = round_plan(options.work_limit(), rate, per_round, int(p["rounds"]), short)
        fix = bool(p["repair"]) and not p["no_recompute"]  # the repair makes values again
        if plan == [None] or int(p["rounds"]) == 1:
            res = self._chain(graph, budget, options)
            if fix:
                repaired(res, graph, budget, options)
            return res
        chain = functools.partial(self._chain, graph, budget, greedy={})
        pins = [
            (node, functools.partial(self._chain, pinned(graph, node), budget, greedy={}))
            for node in candidates(graph, budget)[: int(p["pins"])]
        ]
        if int(p["rounds"]) > 0:  # as many as asked, no more
            return run_rounds(chain, graph, budget, options, plan, pins=pins, repair=fix)
        return run_rounds(chain, graph, budget, options, plan, short / rate, per_round / rate, pins, fix)

    def _chain(
        self, graph: Graph, budget: int, options: SolveOptions, greedy: dict[str, Any] | None = None
    ) -> SolverResult:
        """One annealing chain: the two stages of App. D.4 with their rescue and polish; `greedy`
        keeps greedy's schedule for the rounds after it (see _greedy_start)."""
        p = self.defaults() | options.params
        nv = graph.node_view
        base_prob = original_problem(nv)
        if base_prob.size == 0:
            return SolverResult(steps=[], status="feasible", backend="numba", objective=0.0)
        cfg = RunConfig.build(p, nv, budget, options)
        no_rec = cfg.no_recompute
        if no_rec:
            base_prob.addrem[:] = False
        grouped = group_nodes(nv, int(p["max_group"])) if (p["grouping"] and not no_rec) else None
        if grouped is not None and grouped.size * 2 < base_prob.size // 4:
            grouped = None  # degenerate: too few groups left to anneal (see group_nodes)
        run = Run(graph, nv, cfg, options, greedy)
        c = _Chain(graph, nv, base_prob, grouped if grouped is not None else base_prob, budget, options, run)
        # the caller's schedule within budget as base-problem indices (no_recompute keeps none)
        c.hint_order = None if no_rec else as_start(graph, nv, base_prob, budget, options.hint)
        if cfg.greedy_start and not no_rec and cfg.n2 > 0 and cfg.rescue and options.time_limit is not None:
            # a first stage that needs its tight part may end above the budget, and the rescue
            # after it would then run greedy with what little the clock leaves: greedy's schedule
            # is taken when the tight part begins instead, while the time is there
            def take_fallback() -> None:
                run.fallback = _greedy_start(
                    graph, nv, base_prob, budget, options, run, 0.75 * (options.remaining() or 0.0)
                )

            run.on_tight = take_fallback
        best1, state1 = _first_stage(c, grouped is not None)
        # what stage 1 gave back is the kicks' share of the wall clock
        share2 = 1.0 - run.given / max(1, cfg.n_total)
        order2_base, rescued, n2 = _second_start(c, best1, state1)
        if rescued and order2_base is not None:
            # stage 2's start (the rescue's, or greedy's when cheaper than stage 1's best) as an
            # incumbent at once: stage 2 reports only what improves on it, and a watchdog
            # stopping the solve at a short limit keeps the last incumbent
            options.incumbent(_base_steps(graph, nv, base_prob, order2_base))
        # second stage: decomposed nodes, colder (App. D.4)
        if order2_base is None:
            order2_base = to_base(base_prob, expand(c.prob1, state1.order()))
        state2 = State(
            base_prob, np.array(order2_base, dtype=np.int64), options.seed + 1, run.log_cap, cfg.lse
        )
        # The second stage always has the chain mutations, also where the first met the budget
        # without its tight part: a schedule's recomputations sit in basins that single adds do
        # not leave (a MatMul recomputed where its cheaper Where/Softmax chain would do)
        run.chain = cfg.chain_max
        best2 = run.stage(2, state2, n2, c.hf, c.hf * cfg.final_temperature, False, no_rec, share=share2)
        candidates = [
            expand(c.prob1, best1.feas.order) if best1.feas.order is not None else None,
            expand(c.prob1, best1.low.order) if best1.low.order is not None else None,
            expand(base_prob, best2.feas.order) if best2.feas.order is not None else None,
            expand(base_prob, best2.low.order) if best2.low.order is not None else None,
            expand(base_prob, state2.order()),
        ]
        polished = [run.polish(base_prob, x) for x in candidates if x is not None]
        if c.hint_order is not None:
            # the hint itself, unpolished: a hinted run never ends above it (``warm_starts``)
            polished.append(expand(base_prob, np.array(c.hint_order, dtype=np.int64)))
        if rescued and order2_base is not c.hint_order:
            # the stage-2 start itself, unpolished (greedy's or the hint's schedule, within the
            # budget to the simulator): the kernel folds a node's outputs into one block and may
            # see it above the budget, so neither stage 2 nor polish (which may then raise the
            # simulated peak up to the kernel's) keeps it
            polished.append(expand(base_prob, np.array(order2_base, dtype=np.int64)))
        steps, peak, cost = run.choose(polished)
        steps, peak, cost, kicks = _kicks(c, steps, peak, cost)
        return _result(run, budget, steps, peak, cost, rescued + kicks)


@dataclass
class _Chain:
    """What the parts of one chain share: the graph, its base problem and the first stage's
    (grouped or not), the run, the hint as base-problem indices and the temperatures."""

    graph: Graph
    nv: NodeView
    base_prob: Problem
    prob1: Problem
    budget: int
    options: SolveOptions
    run: Run
    hint_order: list[int] | None = None
    hf: float = 0.0  # the first stage's final temperature, the second's initial one
    share1: float = 1.0  # the share of the wall clock the first stage may use


def _first_stage(c: _Chain, grouped: bool) -> tuple[StageBest, State]:
    """The first stage (App. D.4): grouped nodes when `grouped`, until the budget is met."""
    cfg, run = c.run.cfg, c.run
    order1 = np.arange(c.prob1.size, dtype=np.int64)  # topological `order` with groups in it
    state1 = State(c.prob1, order1, c.options.seed, run.log_cap, cfg.lse)
    f0 = run.objective(state1)
    h0 = cfg.initial_temperature * f0
    c.hf = h0 * cfg.final_temperature
    # the first stage leaves the second stage's share of the wall clock to it (and to a rescue)
    c.share1 = cfg.n1 / max(1, cfg.n_total) if cfg.n2 > 0 else 1.0
    best1 = run.stage(1, state1, cfg.n1, h0, c.hf, cfg.stop_at_budget and grouped, cfg.no_recompute,
                      share=c.share1, give=cfg.n_kick)  # fmt: skip
    return best1, state1


def _second_start(c: _Chain, best1: StageBest, state1: State) -> tuple[list[int] | None, str, int]:
    """Where the second stage starts (base-problem indices; None: stage 1's last state), what
    gave it, and the second stage's iterations. When stage 1 ended above the budget, the rescue's
    start (see _rescue); else the hint's or greedy's schedule when cheaper than stage 1's best (a
    first stage cut short when the cores are shared can end above greedy; a hinted run re-anneals the
    hint instead of ending above it)."""
    cfg, run, n2 = c.run.cfg, c.run, c.run.cfg.n2
    graph, nv, base_prob = c.graph, c.nv, c.base_prob
    if cfg.no_recompute or n2 <= 0:
        return None, "", n2
    if best1.feas.order is None and cfg.rescue:
        # the peak-alone annealing takes half of the second stage's iterations, not as many
        # again: at a time limit the iteration budget n1 + n2 is all the time there is
        n3, before = n2 // 2, run.iterations
        order2_base, rescued = _rescue(c, best1, state1, n3, 1.0 - 0.5 * (1.0 - c.share1))
        n2 -= run.iterations - before
        if order2_base is not None:
            run.over = max(run.over, RESCUE_OVER)
            st0 = State(base_prob, np.array(order2_base, dtype=np.int64), 0, 4, cfg.lse)
            c.hf = cfg.initial_temperature * run.objective(st0) * cfg.final_temperature
        return order2_base, rescued, n2
    if best1.feas.order is None:
        return None, "", n2
    order2_base, rescued = None, ""
    starts = [("the given hint", c.hint_order)]
    if cfg.greedy_start:
        starts.append(
            ("greedy's schedule", _greedy_start(graph, nv, base_prob, c.budget, c.options, run, cfg.reserve))
        )
    f_order = to_base(base_prob, expand(c.prob1, best1.feas.order))
    cheapest = _base_cost(graph, nv, base_prob, f_order)
    for src, order in starts:
        if order is not None and (cost := _base_cost(graph, nv, base_prob, order)) < cheapest:
            order2_base, cheapest = order, cost
            rescued = f"; stage 2 started from {src} (cheaper than stage 1's)"
    return order2_base, rescued, n2


def _kicks(c: _Chain, steps: list[Step], peak: int, cost: float) -> tuple[list[Step], int, float, str]:
    """The kicks after the second stage (see kicks.py) with the iterations the stages left, when
    the chosen schedule is within the budget: the schedule, its peak and cost, and the message."""
    cfg, run = c.run.cfg, c.run
    left = cfg.n_total - run.iterations
    if cfg.n_kick <= 0 or left < cfg.each_kick // 2:
        return steps, peak, cost, ""
    start = as_start(c.graph, c.nv, c.base_prob, c.budget, steps)
    if start is None:
        return steps, peak, cost, ""
    h = KICK_HEAT * c.hf
    order, kick_cost, k = iterate(run, c.base_prob, start, cost, left, cfg.each_kick, h,
                                  h * cfg.final_temperature, RESCUE_OVER, c.options.seed)  # fmt: skip
    kicks = f"; {k} kicks after stage 2"
    if kick_cost < cost:
        kicks += f" (cost {kick_cost:.6g}, stage 2's {cost:.6g})"
        steps = _base_steps(c.graph, c.nv, c.base_prob, order)
        sim = simulate(c.graph, steps)
        peak, cost = sim.peak_memory, sim.cost
        c.options.incumbent(steps)
    return steps, peak, cost, kicks


def _result(run: Run, budget: int, steps: list[Step], peak: int, cost: float, how: str) -> SolverResult:
    """The chain's result and its message: the iterations run and how the stages went."""
    msg = f"{run.iterations} iterations{run.cfg.capped}{how}"
    if run.tight_from is not None:
        msg += (
            f"; no schedule within budget after {run.tight_from} iterations: the rest of stage 1 "
            "re-heated with recomputation chains and the soft peak"
        )
    if run.wall_stopped:
        msg += "; shortened or stopped by the wall clock before the iteration budget (not deterministic)"
    feasible = peak <= budget
    return SolverResult(
        steps=steps,
        status="feasible" if feasible else "infeasible",
        backend="numba",
        objective=cost,
        message=msg,
        best_peak=None if feasible else peak,
        params={
            "iterations_run": run.iterations,
            "work_seconds": run.work_seconds(run.cfg.rate),
            "wall_stopped": run.wall_stopped,
        },
    )


def _base_steps(graph: Graph, nv: NodeView, base_prob: Problem, order: list[int]) -> list[Step]:
    """The steps of a compute sequence in base-problem indices (one node per member)."""
    return steps_from_sequence(graph, [nv.ids[base_prob.members[i][0]] for i in order])


def _base_cost(graph: Graph, nv: NodeView, base_prob: Problem, order: list[int]) -> float:
    return simulate(graph, _base_steps(graph, nv, base_prob, order)).cost


def _greedy_start(
    graph: Graph,
    nv: NodeView,
    base_prob: Problem,
    budget: int,
    options: SolveOptions,
    run: Run,
    reserve: float,
) -> list[int] | None:
    """Greedy's schedule within budget as base-problem indices, or None. Greedy gets the time
    left but `reserve` seconds, what the stages after it need at the assumed rate (a fifth of
    the time left at least), and is held to it: with one worker (the deterministic mode) it
    would run every strategy to its end whatever the limit. A run the clock cut is marked as such
    (`wall_stopped`). Greedy ignores the seed, so a schedule it found uncut is kept in
    `run.greedy` for the rounds after this one."""
    from remat_cli import registry

    if "steps" in run.greedy:
        return as_start(graph, nv, base_prob, budget, run.greedy["steps"])
    if "greedy" not in registry.names():
        return None
    greedy = registry.get("greedy")
    left = options.remaining()
    limit = None if left is None else max(1.0, 0.2 * left, left - reserve)
    opts = SolveOptions(time_limit=limit, seed=options.seed, workers=1 if limit is None else 2)
    opts.params = greedy.defaults()
    steps = greedy.solve(graph, budget, opts).steps
    if limit is not None and opts.remaining() == 0.0:
        run.wall_stopped = True
    else:
        run.greedy["steps"] = steps
    return as_start(graph, nv, base_prob, budget, steps)


def as_start(
    graph: Graph, nv: NodeView, base_prob: Problem, budget: int, steps: list[Step] | None
) -> list[int] | None:
    """A schedule's compute sequence as base-problem indices when it is within budget, else None."""
    if not steps or simulate(graph, steps).peak_memory > budget:
        return None
    local = {m[0]: k for k, m in enumerate(base_prob.members)}
    seq = [nv.index[s.node] for s in steps if s.op == "compute" and s.node is not None]
    return [local[i] for i in seq if i in local]


def _rescue(
    c: _Chain, best1: StageBest, state1: State, n3: int, share: float
) -> tuple[list[int] | None, str]:
    """A start within budget for the second stage (base-problem indices) and what gave it: the
    hint's (``c.hint_order``), else greedy's, else the peak-alone annealing's,
    which runs `n3` iterations and stops when `share` of the time limit has passed."""
    graph, nv, base_prob, prob1, budget, options, run = (
        c.graph,
        c.nv,
        c.base_prob,
        c.prob1,
        c.budget,
        c.options,
        c.run,
    )
    hint_order, final_t = c.hint_order, run.cfg.final_temperature
    if hint_order is not None:
        return hint_order, "; stage 2 started from the given hint (stage 1 ended above the budget)"
    if options.params.get("greedy_start", True):
        # the peak-alone annealing after it runs the soft peak, up to 3 times slower
        found = run.fallback
        if found is None and (run.on_tight is None or run.tight_from is None):  # not taken before
            found = _greedy_start(graph, nv, base_prob, budget, options, run, 2 * run.cfg.reserve)
        if found is not None:
            return found, "; stage 2 started from greedy's schedule (stage 1 ended above the budget)"
    low = best1.low.order if best1.low.order is not None else state1.order()
    state_r = State(prob1, low, options.seed + 2, run.log_cap, True)
    h0 = 3e-3 * (float(state_r.peak) + run.cfg.resident)
    best_r = run.stage(3, state_r, n3, h0, h0 * final_t, True, False, mode=K.OBJ_MEMORY,
                       share=share)  # fmt: skip
    if best_r.feas.order is not None:
        return to_base(base_prob, expand(prob1, best_r.feas.order)), (
            "; the budget was met by annealing the peak alone (stage 1 ended above it)"
        )
    # last: greedy's eviction with the first computations in the order of the least peak
    # annealed (also with greedy_start off, as `auto` runs fastsa after greedy failed: it takes
    # a fraction of a second). That order holds few bytes live; eviction then fits what the
    # annealing left just above the budget (where greedy's own orders end far above it), at a high cost stage 2 then lowers
    low_r = best_r.low.order if best_r.low.order is not None else low
    order = [nv.ids[i] for i in dict.fromkeys(expand(prob1, low_r))]  # first computations
    found = as_start(graph, nv, base_prob, budget, evict_in_order(graph, budget, order))
    if found is None:
        return None, ""
    return found, (
        "; stage 2 started from greedy's eviction in the order of the least peak annealed (stage 1 "
        "and the peak-alone annealing ended above the budget)"
    )


@functools.cache
def _warm_up() -> None:
    """Compile (or load from numba's on-disk cache, ``cache=True``) every kernel specialisation
    the solver uses, once, on the first solve and before its clock starts, so that importing the
    solver (e.g. ``remat solvers``) costs nothing and no stage pays compilation mid-run."""
    prob = Problem(
        members=[[0], [1]],
        preds=[[], [0]],
        mem=np.array([1, 1], dtype=np.int64),
        ws=np.array([0, 1], dtype=np.int64),
        cost=np.array([1.0, 1.0]),
        keep=np.array([False, True]),
        addrem=np.array([True, True]),
    )
    s = State(prob, np.arange(2, dtype=np.int64), seed=0, log_cap=64 * 3)
    K.sa_chunk(s.kt, s.st, 16, 10.0, 0.0, 1e-9, K.OBJ_ELU, 1.0, 1.0, 1 / 3, 1 / 3, False, 0.5, 100.0, 1.0, 1)
    K.apply_log(s.seq.copy(), s.log_t, s.log_n, 0)
    K.polish(s.kt, s.st, 10.0)
    K.objective(1.0, 1.0, 1.0, K.OBJ_ELU, 100.0, 1.0)
