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
   When no recomputation lowers the peak, one computation near it is moved across it (delayed
   past it when nothing reads its outputs before, or brought forward when its inputs exist):
   the order is a lever of its own (MODeL's, Steiner et al. 2023), and RL n500 at 70% needs it.

Each compute sequence is decoded with `steps_from_sequence` (frees at last use) and simulated.
Deterministic: no randomness, ties go to the lowest index.

Speed (it is `auto`'s warm start): on small programs split-shallow runs first, on large ones the
DTR runs do; the cheapest cost so far bounds the later runs, which are abandoned once their
sequence costs more (branch and bound: the cheapest result is the same up to ties);
the e* walk and the split planner's excess sum are numba kernels (cached on disk). When no
strategy fits in the graph's order, they run again in a low-memory topological order
(`arrays.low_memory_order`), which fits RL n250 at 70%.

Modules: `arrays` (the flat arrays, the low-memory order), `dtr` (family 1), `split` (family 2).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from remat_cli.graph import Graph
from remat_cli.schedule import (
    SimResult,
    Step,
    baseline_steps,
    peak_lower_bound,
    simulate,
    steps_from_sequence,
)
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.greedy.arrays import Abandon, Arrays, build_arrays, low_memory_order
from remat_cli.solvers.greedy.dtr import run_dtr
from remat_cli.solvers.greedy.split import SPLIT_DEPTH, run_split

#: "auto" leaves the split strategies out above this many computes: each split round decodes
#: the whole sequence again, so the pass is quadratic (2,000 nodes: a minute; 100,000: days)
SPLIT_MAX_PROGRAM = 5_000
#: up to this many computes, "auto" runs the split strategies before the DTR ones: a split run
#: then costs less than a DTR run, and the cheapest split schedule abandons the DTR runs early
SPLIT_FIRST_MAX_PROGRAM = 1_500

__all__ = ["STRATEGIES", "TARGETS", "Greedy", "evict_in_order", "low_memory_order"]

STRATEGIES = ("split-shallow", "split", "belady-estar-lazy", "belady-estar", "dtr-estar")
#: fractions of the budget each strategy aims at, in turn, until its schedule fits
TARGETS = (1.0, 0.98, 0.95, 0.9)


def _aim(
    graph: Graph,
    a: Arrays,
    budget: int,
    strategy: str,
    go: Callable[[], bool],
    stop: Callable[[], bool] | None,
    bound: float,
) -> Iterator[tuple[float, list[Step], SimResult]]:
    """`strategy` aimed at each of TARGETS in turn while `go()` allows another run: yields
    (target, steps, simulation) per run. A target a little under the budget absorbs what the
    estimates miss, so the sweep ends at the first run that fits; also when a run is abandoned
    (it costs more than `bound`, the cheapest schedule so far) or ends far above the budget,
    which aiming lower leaves stuck (transformer_b32 at 45%: split ends at 1.86x the budget at
    every target, 8 of greedy's 1.5 s before the DTR runs that fit), or when aiming lower did not
    lower the peak (a 12-layer decoder at 50%: split and split-shallow end at the same peak, 8%
    over the budget, at every target, 14 s of the 14.3 s greedy spends there)."""
    rounds = 8 * len(a.program)
    previous = float("inf")  # the peak the run at the previous target reached
    for target in TARGETS:
        if not go():
            return
        try:
            if strategy == "split":
                seq = run_split(a, budget * target, rounds, SPLIT_DEPTH, stop, bound)
            elif strategy == "split-shallow":
                seq = run_split(a, budget * target, rounds, 0, stop, bound)
            else:
                seq, _ = run_dtr(a, budget * target, strategy, stop, bound)
        except Abandon:
            return
        steps = steps_from_sequence(graph, [graph.nodes[n].id for n in seq])
        sim = simulate(graph, steps)
        yield target, steps, sim
        if sim.peak_memory <= budget or sim.peak_memory * TARGETS[-1] > budget or sim.peak_memory >= previous:
            return
        previous = sim.peak_memory


def evict_in_order(graph: Graph, budget: int, order: list[str]) -> list[Step] | None:
    """The cheapest schedule within `budget` the DTR strategies (family 1) give when the needed
    nodes are first computed in `order` (a topological order), or None. fastsa's last rescue runs
    it in the order of the least peak it annealed: on mobilenet_v2_b1 at 50% that order fits
    with belady-estar-lazy where neither the graph's order nor the low-memory one does."""
    a = build_arrays(graph, order)
    best: tuple[float, list[Step]] | None = None
    for strategy in ("belady-estar-lazy", "belady-estar"):
        bound = best[0] if best is not None else float("inf")
        for _, steps, sim in _aim(graph, a, budget, strategy, lambda: True, None, bound):
            if sim.peak_memory <= budget and (best is None or sim.cost < best[0]):
                best = (sim.cost, steps)
    return None if best is None else best[1]


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

    def prepare(self) -> None:
        """Its numba kernels (the e* walk, the split planner) loaded from numba's disk cache before
        the clock starts: one solve of an 8-node chain at its peak lower bound (0.3 s; a first
        call pays it otherwise, which moccasin's greedy start inside an H-ILP's 0.8 s share of an
        8 s limit could not afford, so its schedule depended on which run came first)."""
        from remat_cli.importers.generators import linear

        g = linear(8, seed=0)
        self.solve(g, peak_lower_bound(g), SolveOptions(time_limit=5.0, workers=1, params=self.defaults()))

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
        choice = options.params["strategy"]
        # dtr-estar (online staleness) never won on the benchmarks and thrashes: asked for only.
        # Whichever family is cheaper to run goes first, so that its cost bounds (and cuts short)
        # the other's runs: on small programs the split pass, on large ones the DTR runs (linear),
        # which bound the quadratic split pass (on a 12-layer decoder at 50% it spent 14 s to end
        # over the budget).
        split_first = len(graph.needed_nodes) <= SPLIT_FIRST_MAX_PROGRAM
        ordered = STRATEGIES[:4] if split_first else (*STRATEGIES[2:4], *STRATEGIES[:2])
        strategies = ordered if choice == "auto" else (choice,)
        if choice == "auto" and len(graph.needed_nodes) > SPLIT_MAX_PROGRAM:
            strategies = tuple(x for x in strategies if not x.startswith("split"))

        def out_of_time() -> bool:
            # a binding time limit would make the result depend on the clock; with one worker (the
            # deterministic mode) every strategy runs to its own end
            return options.workers != 1 and options.remaining() == 0.0

        best: tuple[float, list[Step], str] | None = None
        lowest: tuple[int, float, list[Step], str] = (base_sim.peak_memory, base_sim.cost, base, "baseline")
        ran = 0

        def go() -> bool:
            nonlocal ran
            if ran and out_of_time():
                return False
            ran += 1
            return True

        # the graph's order first; a low-memory order (fewer bytes live before any recomputation)
        # only when nothing fits in it
        for order_name in ("", "low-memory order"):
            if best is not None or (ran and out_of_time()):
                break
            a = build_arrays(graph, low_memory_order(graph) if order_name else None)
            for strategy in strategies:
                bound = best[0] if best is not None else float("inf")
                for target, steps, sim in _aim(graph, a, budget, strategy, go, out_of_time, bound):
                    how = strategy if target == 1.0 else f"{strategy} aiming at {target:.0%} of the budget"
                    how += f" in the {order_name}" if order_name else ""
                    if sim.peak_memory <= budget:
                        if best is None or sim.cost < best[0]:
                            best = (sim.cost, steps, how)
                            options.incumbent(steps)
                            options.progress(incumbent=sim.cost, strategy=how)
                    elif (sim.peak_memory, sim.cost) < lowest[:2]:
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
