"""Rounds in sequence: a time limit that holds several iteration budgets of the paper's two
stages runs them one after another, each hinted with the cheapest schedule so far.

Imanishi et al. (NeurIPS'23, App. D.4) run 20M + 2M iterations once. Before rounds, a time limit
only ever scaled that budget down (``--rate``): from 73 s on, more time bought nothing. Round k
(k ≥ 1) runs the whole solve again with seed + ``SEED_STEP``·k and the cheapest schedule so far
as its hint: its own first stage explores afresh, and its second stage starts from the hint when
that is cheaper than the first stage's best (the solver's warm start), so a round never ends
above the rounds before it. The number of rounds is the work limit (the user's limit at the
assumed rate) over one round's iterations, rounded down: the same command and seed do the same
rounds on any machine fast enough for the rate (the wall clock only cuts a slower one short).
Measured, one core, a 9 s round hinted with a 60 s run's schedule at 50%: torch_transformer_train
10.62% -> 8.62%, torch_mlp_train 43.2% -> 38.9%; torch_unet_train, torch_resnet_train,
resnet18_b32 and mobilenet_v2_b1 unchanged.
"""

from __future__ import annotations

import time
from dataclasses import replace

from remat_cli.graph import Graph
from remat_cli.schedule import Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.solvers.fastsa.chains import Chain, cheapest

#: seed offset between rounds, clear of the side-by-side chains' seed + 1 .. seed + 63
SEED_STEP = 1000
#: most rounds a time limit gives (``--rounds`` may ask for more): a limit of hours, or a few
#: --iterations under a long limit, would otherwise give hundreds of rounds of seconds each
MAX_ROUNDS = 8
#: the least share of a whole round that the rest of a time limit runs as one more round
MIN_PARTIAL = 0.25


def round_plan(work_limit: float | None, rate: float, per_round: int, asked: int) -> list[float | None]:
    """Each round's work limit (seconds at ``rate``; None: no limit). ``asked`` > 0: that many
    equal rounds. Else as many whole rounds of ``per_round`` iterations as the work limit holds,
    at most MAX_ROUNDS, and what is left over as one shorter round when it is at least
    ``MIN_PARTIAL`` of a whole one (120 s at the default rate: a whole round and 14M iterations);
    a limit below one whole round is one round, scaled down as before rounds."""
    if asked > 0:
        return [None if work_limit is None else work_limit / asked] * asked
    if work_limit is None or per_round <= 0:
        return [work_limit]
    whole = per_round / rate
    k = min(MAX_ROUNDS, int(work_limit // whole))
    if k == 0:
        return [work_limit]
    rest = work_limit - k * whole
    return [whole] * k + ([rest] if k < MAX_ROUNDS and rest >= MIN_PARTIAL * whole else [])


def run_rounds(
    chain: Chain, graph: Graph, budget: int, options: SolveOptions, plan: list[float | None]
) -> SolverResult:
    """`chain` run once per round of `plan` in sequence, each with the cheapest schedule within
    budget so far as its hint and a share of the time left in proportion to its work; the
    cheapest result is kept."""
    best: list[float] = [float("inf")]

    def report(steps: list[Step]) -> None:
        # a round's incumbents above the best of the rounds before it are not the solve's
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget and sim.cost < best[0]:
            best[0] = sim.cost
            options.incumbent(steps)

    results: list[SolverResult | None] = []
    hint = options.hint
    hint_sim = None if hint is None else simulate(graph, hint)
    hint_cost = hint_sim.cost if hint_sim is not None and hint_sim.peak_memory <= budget else float("inf")
    for k, work in enumerate(plan):
        left = options.remaining()
        if left is not None and left <= 0.0:
            break
        window = None
        if left is not None:
            ahead = sum(w or 0.0 for w in plan[k:])
            window = left * (work or 0.0) / ahead if ahead > 0 else left / (len(plan) - k)
        opts = replace(
            options,
            seed=options.seed + SEED_STEP * k,
            hint=hint,
            time_limit=window,
            nominal_limit=work,
            started=time.monotonic(),
            on_incumbent=report,
        )
        res = chain(opts)
        results.append(res)
        sim = simulate(graph, res.steps) if res.steps else None
        if sim is not None and sim.peak_memory <= budget and sim.cost < hint_cost:
            hint, hint_cost = res.steps, sim.cost
    return cheapest(graph, budget, options, results, "rounds in sequence", SEED_STEP)
