"""Rounds in sequence: a time limit that holds several iteration budgets of the paper's two
stages runs them one after another, every other one hinted with the cheapest schedule so far.

Imanishi et al. (NeurIPS'23, App. D.4) run 20M + 2M iterations once. Before rounds, a time limit
only ever scaled that budget down (``--rate``): from 73 s on, more time bought nothing. Round k
(k ≥ 1) runs the whole solve again with seed + ``SEED_STEP``·k, an even one with the cheapest
schedule so far as its hint: its own first stage explores afresh, and its second stage starts
from the hint when that is cheaper than the first stage's best (the solver's warm start), so it
never ends above the rounds before it; the cheapest round's schedule is the result. The plan
(:func:`round_plan`) depends on the work limit alone (the user's limit at the assumed rate): the
same command and seed do the same rounds on any machine fast enough for the rate (the wall
clock only cuts a slower one short).

Only the first round is whole: at a tight budget a short first stage may find nothing at all
(resnet18_b32 at 50%, two half rounds at 60 s, seed 0: no schedule). The rounds after it are
hinted, so their second stage starts from the best schedule so far, and their first stage only
has to lead it into another basin: on a small graph a short one does, and the same work then
buys several draws instead of one. The odd rounds (1, 3, ...) are not hinted (the caller's hint
only): a hinted round's second stage starts from the incumbent whenever that is cheaper than its
own first stage's best, which it nearly always is, so hinted rounds stay in the first round's
basin. resnet18_b32 at 70%, 60 s, seed 0 recomputes its first convolution (0.60%) in every
hinted round; with every other round fresh, a fresh round finds 0.08% (seeds 1 and 2 and 15
other cells of the shipped graphs and resnet18_b32 at 50/70%, seeds 0/1: the same or within
0.01 point). How short grows with the graph (``short_round``): the share of a whole round is
the operators over ``WHOLE_AT``, at least ``SHORT`` and at most 1.
Measured at 120 s, one core, 50%, seeds 0/1, a whole round and 14M iterations (before) against
a whole round and quarter ones: torch_transformer_train (371 operators) 9.64/8.62% ->
8.62/8.62%, torch_mlp_train (129) 43.2/38.9% -> 38.9/38.9%, torch_unet_train (116) 7.88/8.27% ->
8.29/8.27%; but resnet18_b32 (951) 13.2/17.4% -> 19.0/17.4%, where the second round's 14M
iterations had found the 13.2%: there the rounds after the first stay long.

The plan is made at --rate, the speed of the slowest kernel (the tight part's soft peak, counted
``SOFT_WORK``); the exact peak's kernel runs 5-9 times faster on one core, so a round ended in a
fifth to a half of its share of the limit (torch_transformer_train at 50%, 60 s: one round of 18M
iterations, 12.8 s). A round's result says what its iterations are worth in seconds at the
kernels' assumed speeds (``work_seconds``: the exact kernel at ``EXACT_SPEED`` times --rate), and
what it leaves of its work limit is planned as more short rounds (:func:`later_rounds`). Counted
from iterations, not timed, so that the rounds stay the same on every run; a round the clock cut
leaves nothing. At 60 s, 50%, seed 0, one core: torch_transformer_train 10.62% -> 8.62% (7 rounds,
35 s), torch_resnet_train -> 9.85%, torch_mlp_train 43.2% -> 38.9%.
"""

from __future__ import annotations

import time
from dataclasses import replace

from remat_cli.graph import Graph
from remat_cli.schedule import Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.solvers.fastsa.chains import Chain, cheapest
from remat_cli.solvers.fastsa.pins import unpinned
from remat_cli.solvers.fastsa.repair import repair as peak_repair

#: seed offset between rounds, clear of the side-by-side chains' seed + 1 .. seed + 63
SEED_STEP = 1000
#: most rounds a time limit gives (``--rounds`` may ask for more): a limit of hours, or a few
#: --iterations under a long limit, would otherwise give hundreds of rounds of seconds each;
#: beyond it the rounds after the first grow to share the limit, up to a whole round each
MAX_ROUNDS = 16
#: the rounds after the first: at least this share of a whole round ...
SHORT = 0.25
#: ... and the graph's operators over this many (up to a whole round): 15,000 of the paper's 22M
#: iterations per operator
WHOLE_AT = 1_500
#: the least share of a short round that the rest of a time limit runs as one more round
MIN_PARTIAL = 0.25
#: the fresh rounds from 3 on run a pinned graph where there is one (pins.py), each candidate
#: in two rounds: a pinned round ends in the pinned basin about 3 times in 4 (torch_unet_train
#: at 50%, 10 single rounds of 5 and 18 s, 8 at 3.71%), and rounds 3 and 5 are the first two
#: after the first whole round and its hinted one
PIN_FROM, PIN_TRIES = 3, 2
#: share of the time left that the peak repair of a round above the budget may take when rounds
#: follow it (after the last one: all of it)
REPAIR_SHARE = 0.25


def short_round(per_round: int, nodes: int) -> int:
    """Iterations of each round after the first for a graph of `nodes` operators (docstring)."""
    return int(per_round * min(1.0, max(SHORT, nodes / WHOLE_AT)))


def round_plan(
    work_limit: float | None, rate: float, per_round: int, asked: int, short: int | None = None
) -> list[float | None]:
    """Each round's work limit (seconds at ``rate``; None: no limit). ``asked`` > 0: that many
    equal rounds. Else one whole round of ``per_round`` iterations, then rounds of `short`
    iterations (default ``SHORT`` of a whole one) while the work limit holds them (see
    :func:`later_rounds`). A limit below a whole round and ``MIN_PARTIAL`` of a short one is one
    round, scaled down as before rounds; :func:`run_rounds` may add rounds after it."""
    if asked > 0:
        return [None if work_limit is None else work_limit / asked] * asked
    if work_limit is None or per_round <= 0:
        return [work_limit]
    whole = per_round / rate
    each = (SHORT * per_round if short is None else short) / rate
    rest = work_limit - whole
    if rest < MIN_PARTIAL * each:
        return [work_limit]
    return [whole, *later_rounds(rest, each, whole, MAX_ROUNDS - 1)]


def later_rounds(rest: float, each: float, whole: float, slots: int) -> list[float]:
    """The rounds `rest` seconds of work hold after the first: rounds of `each` seconds, and
    what is left over as one more when it is at least ``MIN_PARTIAL`` of one (120 s at the
    default rate, a graph of 371 operators or fewer: a whole round, two quarter ones and 3M
    iterations); at most `slots`, then lengthened to share the rest, up to `whole` each (the
    work of a longer limit is not used)."""
    if slots <= 0 or each <= 0 or rest < MIN_PARTIAL * each:
        return []
    k = int(rest // each)
    if k >= slots:
        return [min(whole, rest / slots)] * slots
    left = rest - k * each
    return [each] * k + ([left] if left >= MIN_PARTIAL * each else [])


def run_rounds(
    chain: Chain,
    graph: Graph,
    budget: int,
    options: SolveOptions,
    plan: list[float | None],
    each: float = 0.0,
    whole: float = 0.0,
    pins: list[tuple[str, Chain]] | None = None,
    repair: bool = True,
) -> SolverResult:
    """`chain` run once per round of `plan` in sequence, each with a share of the time left in
    proportion to its work, the even ones (0, 2, ...) with the cheapest schedule within budget so
    far as their hint, the odd ones afresh (the caller's hint only); the cheapest result is
    kept. A round whose iterations took less than its work limit at the kernels' assumed speeds
    (its result's ``work_seconds``: the exact peak's kernel is faster than --rate, and a
    converged second stage ends early) leaves the difference to the rounds after it, re-planned
    as rounds of `each` seconds (up to `whole`): deterministic, since it counts iterations, not
    the clock. `pins`: (node, chain on the graph with that node pinned last) for the pinned
    rounds (the odd ones from ``PIN_FROM``, each pin ``PIN_TRIES`` times; fresh: the hint is not
    a schedule of the pinned graph), whose schedules are the graph's without the pin
    (:mod:`.pins`). `repair`: the first round that ends above the budget while nothing so far
    fits it is repaired at its peak (:func:`repaired`), and the hinted rounds after it start
    from that schedule."""
    best: list[float] = [float("inf")]

    def report(steps: list[Step]) -> None:
        # a round's incumbents above the best of the rounds before it are not the solve's
        steps = unpinned(steps)
        sim = simulate(graph, steps)
        if sim.peak_memory <= budget and sim.cost < best[0]:
            best[0] = sim.cost
            options.incumbent(steps)

    results: list[SolverResult | None] = []
    plan = list(plan)
    hint = options.hint
    hint_sim = None if hint is None else simulate(graph, hint)
    hint_cost = hint_sim.cost if hint_sim is not None and hint_sim.peak_memory <= budget else float("inf")
    tried, fixed = False, None  # one repair per solve (deterministic); the round it fixed
    k = 0
    while k < len(plan):
        work = plan[k]
        left = options.remaining()
        if k and left is not None and left <= 0.0:  # the first runs whatever is left, as alone
            break
        window = None
        if left is not None:
            ahead = sum(w or 0.0 for w in plan[k:])
            window = left * (work or 0.0) / ahead if ahead > 0 else left / (len(plan) - k)
        j = (k - PIN_FROM) // 2 // PIN_TRIES
        pin = pins[j] if pins and k % 2 and k >= PIN_FROM and j < len(pins) else None
        opts = replace(
            options,
            seed=options.seed + SEED_STEP * k,
            hint=None if pin else options.hint if k % 2 else hint,  # odd rounds explore (module docstring)
            time_limit=window,
            nominal_limit=work,
            started=time.monotonic(),
            on_incumbent=report,
        )
        res = (pin[1] if pin else chain)(opts)
        if pin and res.steps:
            res.steps = unpinned(res.steps)
            res.message += f"; {pin[0]} pinned last"
        if repair and hint_cost == float("inf") and res.steps and not tried:
            tried = True
            share = REPAIR_SHARE if k + 1 < len(plan) else 1.0  # the last round leaves it the rest
            # its incumbent goes through `report`, like the rounds', so a later worse one is not reported
            fixed = k if repaired(res, graph, budget, replace(options, on_incumbent=report), share) else None
        results.append(res)
        sim = simulate(graph, res.steps) if res.steps else None
        if sim is not None and sim.peak_memory <= budget and sim.cost < hint_cost:
            hint, hint_cost = res.steps, sim.cost
        used = res.params.get("work_seconds")
        cut = res.params.get("wall_stopped", False)  # its time was the clock's, not its work's
        if each > 0 and work is not None and used is not None and used < work and not cut:
            rest = sum(w or 0.0 for w in plan[k + 1 :]) + work - used
            plan[k + 1 :] = later_rounds(rest, each, whole, MAX_ROUNDS - k - 1)
        k += 1
    if len(results) == 1 and results[0] is not None:
        return results[0]
    best = cheapest(graph, budget, options, results, "rounds in sequence", SEED_STEP)
    if fixed is not None and best is not results[fixed]:
        best.message = (
            f"{best.message}; round {fixed} was repaired at its peak and hinted the rounds after it"
        )
    return best


def repaired(res: SolverResult, graph: Graph, budget: int, options: SolveOptions, share: float = 1.0) -> bool:
    """Whether the peak repair (:mod:`.repair`) brought `res`, a schedule above the budget,
    within it; `res` then holds the repaired schedule (the hinted rounds after it polish it).
    The repair may take `share` of the time left."""
    if not res.steps or simulate(graph, res.steps).peak_memory <= budget:
        return False
    left = options.remaining()
    fixed = peak_repair(graph, res.steps, budget, None if left is None else time.monotonic() + share * left)
    if fixed is not None:
        res.steps, res.status, res.best_peak = fixed, "feasible", None
        res.objective = simulate(graph, fixed).cost
        res.message = (
            f"{res.message}; above the budget, repaired at its peak (values made again, outputs deferred)"
        )
        options.incumbent(fixed)
    return fixed is not None
