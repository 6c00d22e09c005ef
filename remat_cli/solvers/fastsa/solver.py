"""FastSA's driver: two annealing stages, stopping, polishing and choosing the schedule
(Imanishi et al., NeurIPS'23, §2.2.2, §3.1 and App. D.4).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph, NodeView
from remat_cli.schedule import Step, simulate, steps_from_sequence
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.fastsa import kernel as K
from remat_cli.solvers.fastsa.chains import can_fork, run_chains
from remat_cli.solvers.fastsa.kicks import iterate
from remat_cli.solvers.fastsa.pins import candidates, pinned
from remat_cli.solvers.fastsa.problem import (
    CHUNK,
    Best,
    Problem,
    State,
    _to_base,
    expand,
    group_nodes,
    original_problem,
)
from remat_cli.solvers.fastsa.rounds import repaired, round_plan, run_rounds, short_round
from remat_cli.solvers.greedy import evict_in_order

#: slope above the budget of the footnote-2 objective in the stage after a rescue (see solve)
RESCUE_OVER = 20.0
#: work of one iteration of the tight part's soft peak (kernel with logaddexp), in iterations at
#: --rate, which sizes the iteration budget: on one core that kernel ran at 230-290k/s, below
#: the assumed 300k/s (the exact one at 0.7-1.2M/s), before its logaddexp became a table lookup.
#: Counted as one, the tight part outran its share of the limit, and the clock shortened it by a
#: different amount in each run. At 1.15, ONNX exports at 50%, 60 s, seeds 0-2 (one core each,
#: the same cells side by side): mean overhead resnet18_b32 16.2% -> 14.4%,
#: torch_transformer_train 10.6% -> 9.3%, mobilenet_v2_b1 9.9% -> 9.6%, torch_resnet_train
#: 11.2% -> 12.0%; the slow cells end 4-7 s earlier
SOFT_WORK = 1.15
#: the exact peak's kernel runs at this multiple of --rate, the soft peak's at SOFT_SPEED: one core
#: of this machine, ONNX exports of 116-951 operators at 50/70%, 30 s: 1.57-2.69M and 631-746k
#: iterations/s against the assumed 3e5. A round's iterations at these speeds are its work in
#: seconds (``work_seconds``), from which the rounds after it are planned (see rounds.py); the
#: margin below the measured speeds is for a slower machine and what the kernels' time leaves out
#: (greedy's start, polish: 6 s of mobilenet_v2_b1's 15.6 at 50%). At 3.3 and 1.5 the rounds' wall
#: time was 0.53-0.62 of their work and a 60 s limit ended after 25-38 s (mixer_b16 at 50%: 28 s,
#: 4.24%, where 120 s gives 3.48%); at 4.6 and 2.0 after 34-50 s. Eight ONNX exports with a
#: schedule at 50% (seeds 0, 1) and 60% (seed 0), one core: 10 of 24 cells cheaper (densenet_b16
#: at 50% 2.84% -> 1.52%, mixer_b16 4.24% -> 3.48%), 12 the same, 2 dearer (torch_unet_train at
#: 50%, seed 0: 7.87% -> 8.27%; convnext_b16 at 50%, seed 1: 4.84% -> 5.60%)
#: (bench/results/fastsa_speeds*.json)
EXACT_SPEED = 4.6
SOFT_SPEED = 2.0
#: a kick anneals from this multiple of the second stage's initial temperature (see kicks.py):
#: mobilenet_v2_b1 at 70%, 60 s, seed 0, kicks of n2 iterations: from 1x the kick of
#: node_convolution_4 ended at 3.3% and was dropped; from 3x it ended at 0.89% (stage 2: 3.06%)
KICK_HEAT = 3.0
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
            "(torch_transformer_train at 70%, 60 s: 2.3% instead of 4.2%), and the rescue from it when "
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
            "second (0: none; issue 18: torch_unet_train at 50%, 60 s, 8.27% -> 3.71%)",
            low=0,
            high=2,
        ),
        Param(
            "repair",
            bool,
            True,
            "when a round ends above the budget and nothing fits it yet, repair its schedule at the "
            "peak (values made again just before their next use, output operators deferred; "
            "repair.py) and start the hinted rounds from it (issue 18: bert_b8 at 60%, 60 s: none -> 23.9%; not with --no-recompute)",
        ),
        Param(
            "patience",
            int,
            2_000_000,
            "converged: end stage 2 after this many iterations without a better feasible cost (0: never)",
            low=0,
            high=10**12,
        ),
        # 3e5/s: RL n500 at 90% needs ~16M iterations to reach the published 0.03% (11M at 2e5/s
        # ends at 0.11%); one loaded core still runs 16.5M local-mix iterations in ~35 s of 55.
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
        work_limit = options.work_limit()
        if work_limit is not None:
            allowed = int(max(0.0, work_limit) * float(p["rate"]))
            if n1 + n2 > allowed:
                scale = allowed / (n1 + n2)
                n1, n2 = int(n1 * scale), int(n2 * scale)
                capped = f" (iterations scaled to {n1}+{n2} for the time limit at {p['rate']:.0f}/s)"
        n_kick = 0 if no_rec else int(float(p["kicks"]) * (n1 + n2))
        n_total = n1 + n2
        each_kick = max(1_000, n2)  # iterations per kick: the second stage's
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
        run.chain_max = 0 if no_rec else int(p["chain"])
        run.tight_after = min(1.0, max(0.0, float(p["tight_after"])))
        if greedy is not None:
            run.greedy = greedy
        # the seconds the second stage needs at the assumed rate, with a margin for polish and a
        # machine slower than the rate: what greedy's start leaves of the time
        run.reserve = 1.5 * n2 / float(p["rate"])

        # the caller's schedule within budget as base-problem indices (no_recompute keeps none)
        hint_order = None if no_rec else _as_start(graph, nv, base_prob, budget, options.hint)
        if p["greedy_start"] and not no_rec and n2 > 0 and p["rescue"] and options.time_limit is not None:
            # a first stage that needs its tight part may end above the budget, and the rescue
            # after it then runs greedy with what the clock leaves: on a slow kernel little
            # (a 2-layer GRU training step, 1,674 nodes, at 80%, 20 s: greedy needs 4.6 s, got
            # 1 s, and fastsa ended with nothing where greedy alone fits). Greedy's schedule is
            # taken when the tight part begins instead, while the time is there, for the rescue
            def take_fallback() -> None:
                run.fallback = _greedy_start(
                    graph, nv, base_prob, budget, options, run, 0.75 * (options.remaining() or 0.0)
                )

            run.on_tight = take_fallback

        # first stage: grouped nodes, until the budget is met (App. D.4)
        prob1 = grouped if grouped is not None else base_prob
        order1 = np.arange(prob1.size, dtype=np.int64)  # topological `order` with groups in it
        state1 = State(prob1, order1, options.seed, run.log_cap, run.lse)
        f0 = run.objective(state1)
        h0 = float(p["initial_temperature"]) * f0
        hf = h0 * float(p["final_temperature"])
        # the first stage leaves the second stage's share of the wall clock to it (and to a rescue)
        share1 = n1 / max(1, n_total) if n2 > 0 else 1.0
        best1 = run.stage(1, state1, n1, h0, hf, bool(p["stop_at_budget"]) and grouped is not None, no_rec,
                          share=share1, give=n_kick)  # fmt: skip
        # what stage 1 gave back is the kicks' share of the wall clock
        share2 = 1.0 - run.given / max(1, n_total)
        rescued = ""
        order2_base: list[int] | None = None
        if best1.feas.order is None and not no_rec and n2 > 0 and p["rescue"]:
            # tight budgets (issue 18): on f(S) = max(B, M)·C a state far above the budget sits
            # on a plateau (many time steps at the peak, one mutation lowers none of them), and
            # the feasible schedules of ONNX training graphs are long recomputation chains no
            # single mutation builds, so the first stage can end above the budget. The second
            # stage then starts from a schedule within budget: the caller's hint, else greedy's
            # (a deviation from App. D.4, which starts from the topological order), else the
            # peak annealed alone on the soft logaddexp peak of App. C.2 (every time step near
            # the max counts); it is colder and steep above the budget, so it stays within it
            # the peak-alone annealing takes half of the second stage's iterations, not as many
            # again: at a time limit the iteration budget n1 + n2 is all the time there is
            # (resnet18_b32 at 50%, 60 s: stage 1 ended above the budget at 49 s, and the rescue
            # and stage 2 at n2 each outran the limit with nothing; with 120 s it met the budget)
            n3, before = n2 // 2, run.iterations
            order2_base, rescued = _rescue(graph, nv, base_prob, prob1, best1, state1, budget, options, run,
                                           hint_order, n3, 1.0 - 0.5 * (1.0 - share1),
                                           float(p["final_temperature"]))  # fmt: skip
            n2 -= run.iterations - before
            if order2_base is not None:
                run.over = max(run.over, RESCUE_OVER)
                st0 = State(base_prob, np.array(order2_base, dtype=np.int64), 0, 4, run.lse)
                hf = float(p["initial_temperature"]) * run.objective(st0) * float(p["final_temperature"])

        elif best1.feas.order is not None and not no_rec and n2 > 0:
            # the hint's or greedy's schedule, when cheaper than the first stage's best, is where
            # the second stage starts (a first stage cut short on a loaded machine can end above
            # greedy; a hinted run re-anneals the hint instead of ending above it: the H-ILP's
            # fallback hinted with fastsa's schedule of torch_transformer_train at 50%, 9 s,
            # took it from 10.62% to 8.62%)
            starts = [("the given hint", hint_order)]
            if p["greedy_start"]:
                g_order = _greedy_start(graph, nv, base_prob, budget, options, run, run.reserve)
                starts.append(("greedy's schedule", g_order))
            f_order = _to_base(base_prob, expand(prob1, best1.feas.order))
            cheapest = _base_cost(graph, nv, base_prob, f_order)
            for src, order in starts:
                if order is not None and (cost := _base_cost(graph, nv, base_prob, order)) < cheapest:
                    order2_base, cheapest = order, cost
                    rescued = f"; stage 2 started from {src} (cheaper than stage 1's)"

        if rescued and order2_base is not None:
            # stage 2's start (the rescue's, or greedy's when cheaper than stage 1's best) as an
            # incumbent at once: stage 2 reports only what improves on it, and a watchdog
            # stopping the solve at a short limit keeps the last incumbent (the H-ILP's flat
            # fastsa on densenet_b8 at 50%, 5 s: none, where greedy's schedule fitted)
            options.incumbent(_base_steps(graph, nv, base_prob, order2_base))

        # second stage: decomposed nodes, colder (App. D.4)
        if order2_base is None:
            order2_base = _to_base(base_prob, expand(prob1, state1.order()))
        order2 = np.array(order2_base, dtype=np.int64)
        state2 = State(base_prob, order2, options.seed + 1, run.log_cap, run.lse)
        # The second stage always has the chain mutations, also where the first met the budget
        # without its tight part. A schedule's recomputations sit in basins that single adds do
        # not leave: torch_transformer_train at 70% recomputes two attention MatMuls (2.29%) in
        # 8 of 8 seeds' single rounds, where one MatMul with its Where/Softmax chain costs 1.27%;
        # with chains in stage 2, 2 of 4 seeds' single rounds and both seeds at 60 s found it
        # (seed 1: 2.25% -> 1.27%), resnet18_b32 at 70% seeds 1/2 went 0.60/0.17% -> 0.18/0.06%,
        # and the 50% cells and the other shipped graphs' did not move (within 0.01 point).
        run.chain = run.chain_max
        best2 = run.stage(2, state2, n2, hf, hf * float(p["final_temperature"]), False, no_rec, share=share2)

        candidates = [
            expand(prob1, best1.feas.order) if best1.feas.order is not None else None,
            expand(prob1, best1.low.order) if best1.low.order is not None else None,
            expand(base_prob, best2.feas.order) if best2.feas.order is not None else None,
            expand(base_prob, best2.low.order) if best2.low.order is not None else None,
            expand(base_prob, state2.order()),
        ]
        polished = [run.polish(base_prob, c) for c in candidates if c is not None]
        if hint_order is not None:
            # the hint itself, unpolished: a hinted run never ends above it (``warm_starts``)
            polished.append(expand(base_prob, np.array(hint_order, dtype=np.int64)))
        if rescued and order2_base is not hint_order:
            # the stage-2 start itself, unpolished (greedy's or the hint's schedule, within the
            # budget to the simulator): the kernel folds a node's outputs into one block and may
            # see it above the budget, so neither stage 2 nor polish (which may then raise the
            # simulated peak up to the kernel's) keeps it
            polished.append(expand(base_prob, np.array(order2_base, dtype=np.int64)))
        steps, peak, cost = run.choose(polished)
        kicks = ""
        left = n_total - run.iterations
        start = (
            _as_start(graph, nv, base_prob, budget, steps) if n_kick > 0 and left >= each_kick // 2 else None
        )
        if start is not None:
            h = KICK_HEAT * hf
            order, kick_cost, k = iterate(run, base_prob, start, cost, left, each_kick, h,
                                          h * float(p["final_temperature"]), RESCUE_OVER, options.seed)  # fmt: skip
            kicks = f"; {k} kicks after stage 2"
            if kick_cost < cost:
                kicks += f" (cost {kick_cost:.6g}, stage 2's {cost:.6g})"
                steps = _base_steps(graph, nv, base_prob, order)
                sim = simulate(graph, steps)
                peak, cost = sim.peak_memory, sim.cost
                options.incumbent(steps)
        msg = f"{run.iterations} iterations{capped}{rescued}{kicks}"
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
                "work_seconds": run.work_seconds(float(p["rate"])),
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
    run: _Run,
    reserve: float,
) -> list[int] | None:
    """Greedy's schedule within budget as base-problem indices, or None. Greedy gets the time
    left but `reserve` seconds, what the stages after it need at the assumed rate (a fifth of
    the time left at least), and is held to it: with one worker (the deterministic mode) it
    would run every strategy to its end, 10 s and more on resnet18_b32 at 50% whatever the
    limit. A run the clock cut is marked as such (`wall_stopped`). Held to a fifth of the time
    left, it was cut there at 60 s although fastsa ended after 40 s: its schedule, and so
    fastsa's, depended on the clock. Greedy ignores the seed, so a schedule it found uncut is
    kept in `run.greedy` for the rounds after this one (mobilenet_v2_b1 at 50%: 9 s a round)."""
    from remat_cli import registry

    if "steps" in run.greedy:
        return _as_start(graph, nv, base_prob, budget, run.greedy["steps"])
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
    return _as_start(graph, nv, base_prob, budget, steps)


def _as_start(
    graph: Graph, nv: NodeView, base_prob: Problem, budget: int, steps: list[Step] | None
) -> list[int] | None:
    """A schedule's compute sequence as base-problem indices when it is within budget, else None."""
    if not steps or simulate(graph, steps).peak_memory > budget:
        return None
    local = {m[0]: k for k, m in enumerate(base_prob.members)}
    seq = [nv.index[s.node] for s in steps if s.op == "compute" and s.node is not None]
    return [local[i] for i in seq if i in local]


def _rescue(graph: Graph, nv: NodeView, base_prob: Problem, prob1: Problem, best1: StageBest, state1: State,
            budget: int, options: SolveOptions, run: _Run, hint_order: list[int] | None, n3: int,
            share: float, final_t: float) -> tuple[list[int] | None, str]:  # fmt: skip
    """A start within budget for the second stage (base-problem indices) and what gave it: the
    hint's (`hint_order`, decoded by the caller), else greedy's, else the peak-alone annealing's,
    which runs `n3` iterations."""
    if hint_order is not None:
        return hint_order, "; stage 2 started from the given hint (stage 1 ended above the budget)"
    if options.params.get("greedy_start", True):
        # the peak-alone annealing after it runs the soft peak, up to 3 times slower
        found = run.fallback
        if found is None and (run.on_tight is None or run.tight_from is None):  # not taken before
            found = _greedy_start(graph, nv, base_prob, budget, options, run, 2 * run.reserve)
        if found is not None:
            return found, "; stage 2 started from greedy's schedule (stage 1 ended above the budget)"
    low = best1.low.order if best1.low.order is not None else state1.order()
    state_r = State(prob1, low, options.seed + 2, run.log_cap, True)
    h0 = 3e-3 * (float(state_r.peak) + run.resident)
    best_r = run.stage(3, state_r, n3, h0, h0 * final_t, True, False, mode=K.OBJ_MEMORY,
                       share=share)  # fmt: skip
    if best_r.feas.order is not None:
        return _to_base(base_prob, expand(prob1, best_r.feas.order)), (
            "; the budget was met by annealing the peak alone (stage 1 ended above it)"
        )
    # last: greedy's eviction with the first computations in the order of the least peak
    # annealed (also with greedy_start off, as `auto` runs fastsa after greedy failed: it takes
    # a fraction of a second). That order holds few bytes live; eviction then fits what the annealing left just
    # above the budget (mobilenet_v2_b1 at 50%, 30 s, seeds 0 and 1: 6% and 1.4% above, where
    # greedy's own orders end 25% above), at a high cost stage 2 then lowers
    low_r = best_r.low.order if best_r.low.order is not None else low
    order = [nv.ids[i] for i in dict.fromkeys(expand(prob1, low_r))]  # first computations
    found = _as_start(graph, nv, base_prob, budget, evict_in_order(graph, budget, order))
    if found is None:
        return None, ""
    return found, (
        "; stage 2 started from greedy's eviction in the order of the least peak annealed (stage 1 "
        "and the peak-alone annealing ended above the budget)"
    )


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
        self.over_base = 1.0  # the slope above the budget when the tight part of stage 1 began
        self.chain = 0  # the chain length the kernel runs with now (see stage)
        self.chain_max = 0
        self.tight_after = 1.0
        self.reserve = 0.0  # seconds greedy's start leaves to the second stage (see _greedy_start)
        self.tight_from: int | None = None  # run iterations when the tight part of stage 1 began
        self.given = 0  # iterations stage 1 gave back to the kicks (see stage)
        self.on_tight: Callable[[], None] | None = None  # called when stage 1's tight part begins
        self.fallback: list[int] | None = None  # greedy's schedule taken then (see _chain)
        self.greedy: dict[str, Any] = {}  # greedy's uncut schedule, shared by a solve's rounds
        self.iterations = 0
        self.soft_iterations = 0  # of them, on the soft peak's kernel
        self.wall_stopped = False
        base_cost = sum(nv.cost[i] for i in range(len(nv)) if nv.needed[i])
        # keeps f(S) informative when every cost is 0
        self.c_floor = 1e-9 * base_cost if base_cost > 0 else 1.0
        self.best_cost = math.inf
        self.last_report = time.monotonic()
        self.unreported: tuple[Problem, np.ndarray] | None = None

    def work_seconds(self, rate: float) -> float:
        """The iterations run so far in seconds of the assumed kernel speeds (deterministic)."""
        exact = self.iterations - self.soft_iterations
        return (exact / EXACT_SPEED + self.soft_iterations / SOFT_SPEED) / rate

    @property
    def log_cap(self) -> int:
        """Journal entries a chunk may write: a rotation writes 2, a mutation with its chain chain + 1."""
        return (self.chain_max + 2) * CHUNK + 4

    def objective(self, s: State) -> float:
        m = float(s.peak) + self.resident
        return K.objective(m, s.cost + self.c_floor, self.budget, self.mode, self.sharp, self.over)

    def stage(self, stage: int, s: State, n_iter: int, h0: float, hf: float, stop_at_budget: bool,
              no_rec: bool, mode: int | None = None, share: float = 1.0, give: int = 0) -> StageBest:  # fmt: skip
        """One annealing stage; with a time limit it stops by the wall clock when `share` of the
        limit has passed (the safety net when the machine is slower than the assumed rate). A
        first stage that meets the budget before its tight part would begin (--tight-after)
        ends `give` iterations early (``given``), for the kicks after the second stage."""
        mode = self.mode if mode is None else mode
        feas, low = Best(), Best()
        m0 = float(s.peak) + self.resident
        if m0 <= self.budget:
            feas = Best(s.order(), s.cost, m0)
        low = Best(s.order(), s.cost, m0)
        if stop_at_budget and m0 <= self.budget:
            return StageBest(feas, low)
        p_add = p_rem = 0.0 if no_rec else (1.0 - self.p_rotate) / 2.0
        # `n_iter` is work: an iteration of the tight part's soft peak counts SOFT_WORK, every
        # other one 1; the temperature and the slope above the budget follow the work done
        it = 0
        work = 0.0
        weight = 1.0
        since_better = 0
        w_rate, t_rate = 0.0, time.monotonic()
        w0 = 0.0  # where the temperature schedule (re)started

        def cooling() -> float:
            # the kernel's factor per iteration: from h0 at w0 to hf when the work reaches n_iter
            return (hf / h0) ** (weight / (n_iter - w0)) if h0 > 0 and n_iter > w0 else 1.0

        ratio = cooling()
        tight_at = int(self.tight_after * n_iter) if stage == 1 and self.chain_max > 0 else n_iter + 1
        give_at = int(self.tight_after * n_iter) if stage == 1 else n_iter + 1
        while work < n_iter:
            if work >= tight_at and feas.order is None and not self.chain and n_iter - work >= 2 * CHUNK:
                # issue 18: a third of the first stage has passed and no state was within the
                # budget. On ONNX training graphs at tight budgets the SA of §2.2 sits on a plateau
                # far above it: every time step near the peak has to lose a block at once (the max
                # of M(S) sees none of them alone), and each block leaves only through a whole
                # recomputation chain of small ops, which single adds only build through states
                # of equal memory and higher cost (torch_mlp_train at 50%: stuck at 63% of the
                # baseline peak at any temperature). The rest of the stage anneals afresh from
                # the least peak found, with the chain mutations (kernel ``_plan_chain``) and the
                # logaddexp soft peak of App. C.2, which counts every time step near the max,
                # until the budget is met (then the exact peak, see below). Graphs that meet
                # their budget earlier run the paper's mutations only, unchanged.
                self.chain = self.chain_max
                self.tight_from = self.iterations
                self.over_base = self.over
                if self.on_tight is not None:
                    self.on_tight()
                s.set_lse(True)
                s.respread(low.order if low.order is not None else s.order())
                weight = SOFT_WORK
                w0, w_rate, t_rate = work, work, time.monotonic()
                ratio = cooling()
            if self.tight_from is not None and stage == 1 and feas.order is None:
                # an adaptive penalty: from the middle of the tight part on, the slope above the
                # budget grows from --over-budget-weight to RESCUE_OVER at its end, and stays where
                # it is once a schedule fits. A budget the mild slope meets in the first half keeps
                # its cheap schedules (torch_resnet_train, torch_transformer_train at 50%: the same
                # schedules); one it does not is met by a steeper slope (resnet18_b32 at 50%, 60 s,
                # seeds 0 and 1: 13.2% and 14.4% overhead, where both ended above the budget).
                # Growing from the start of the tight part cost the first kind up to 6 points.
                frac = min(1.0, max(0.0, 2.0 * (work - w0) / max(1.0, n_iter - w0) - 1.0))
                self.over = self.over_base * (max(self.over_base, RESCUE_OVER) / self.over_base) ** frac
            if give and work >= give_at and feas.order is not None and not self.chain:
                # met early: the rest of the stage anneals on a shorter schedule (as a wall-clock
                # shortening does) and the kicks get what it leaves (see kicks.py)
                shorter = int(max(work + CHUNK, n_iter - give))
                self.given, n_iter, give = n_iter - shorter, shorter, 0
                ratio = cooling()
            n = max(1, min(CHUNK, math.ceil((n_iter - work) / weight)))
            h = h0 * (hf / h0) ** ((work - w0) / (n_iter - w0)) if h0 > 0 else 0.0
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
            done = K.sa_chunk(s.kt, s.st, n, self.budget, self.resident, self.c_floor, mode, h, ratio,
                              p_add, p_rem, stop_at_budget, self.local, self.sharp,
                              self.over, self.chain)  # fmt: skip
            it += done
            work += done * weight
            self.soft_iterations += done if s.lse else 0
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
            if remaining is not None:
                left = remaining - (1.0 - share) * (self.options.time_limit or 0.0)
                if left <= 0.0:
                    self.wall_stopped = True
                    break
                # slower than the assumed rate (a loaded machine): shorten the stage to what the
                # measured rate reaches by its end, so that it still cools down to hf instead of
                # being cut off hot (issue 18: torch_resnet_train at 70% ended at 4.9% when cut
                # off, 1.1% cooled); never triggered where the rate holds, so seeded runs repeat.
                # The rate is measured from the last switch of kernel: the soft peak's, while a
                # first stage anneals it until the budget is met, is about 3 times slower than
                # the exact one that follows, so a stage shortened then may end early; cut off
                # instead, its slope above the budget never grows and it may end with nothing
                # (resnet18_b32 at 50% as the H-ILP's flat start, stopped at 3/4 of 60 s)
                rate = (work - w_rate) / max(1e-9, time.monotonic() - t_rate)
                reach = work + 0.9 * rate * left
                if reach < n_iter and work - w_rate >= 2 * CHUNK * weight:
                    n_iter = int(max(work + CHUNK * weight, reach))
                    ratio = cooling()
                    self.wall_stopped = True
            # the soft peak of a first stage that anneals it only until the budget is met (see
            # above) gives way to the exact peak once a schedule fits
            if stage == 1 and s.lse and not self.lse and feas.order is not None:
                s.set_lse(False)
                weight = 1.0
                ratio = cooling()
                w_rate, t_rate = work, time.monotonic()
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
