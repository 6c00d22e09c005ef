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


def round_count(work_limit: float | None, rate: float, per_round: int, asked: int) -> int:
    """How many rounds run: ``asked`` when positive, else as many whole rounds of ``per_round``
    iterations as the work limit holds at ``rate``, at most MAX_ROUNDS (one without a limit)."""
    if asked > 0:
        return asked
    if work_limit is None or per_round <= 0:
        return 1
    return max(1, min(MAX_ROUNDS, int(work_limit * rate) // per_round))


def run_rounds(chain: Chain, graph: Graph, budget: int, options: SolveOptions, rounds: int) -> SolverResult:
    """`chain` run `rounds` times in sequence, each with an equal share of the time left and the
    cheapest schedule within budget so far as its hint; the cheapest result is kept."""
    best: list[float] = [float("inf")]

    def report(steps: list[Step]) -> None:
        # a round's incumbents above the best of the rounds before it are not the solve's
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget and sim.cost < best[0]:
            best[0] = sim.cost
            options.incumbent(steps)

    results: list[SolverResult | None] = []
    hint = options.hint
    work = options.work_limit()
    for k in range(rounds):
        left = options.remaining()
        if left is not None and left <= 0.0:
            break
        window = None if left is None else left / (rounds - k)
        opts = replace(
            options,
            seed=options.seed + SEED_STEP * k,
            hint=hint,
            time_limit=window,
            nominal_limit=None if work is None else work / rounds,
            started=time.monotonic(),
            on_incumbent=report,
        )
        res = chain(opts)
        results.append(res)
        if res.steps and simulate(graph, res.steps).peak_memory <= budget:
            if hint is None or simulate(graph, res.steps).cost < simulate(graph, hint).cost:
                hint = res.steps
    return cheapest(graph, budget, options, results, "rounds in sequence", SEED_STEP)
