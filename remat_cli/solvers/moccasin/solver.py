"""The `moccasin` solver: starting points (:mod:`.starts`), phase 1 and phase 2 of MOCCASIN §2.4
on the model of :mod:`.model`, decoding (:mod:`.decode`)."""

from __future__ import annotations

import itertools
import math
import time
from functools import reduce

from ortools.sat.python import cp_model

from remat_cli.graph import Graph
from remat_cli.schedule import Step, baseline_steps, relative_gap, simulate
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.moccasin.decode import Incumbents, decode_schedule, local_sequence, read_solution
from remat_cli.solvers.moccasin.model import Interval, Model, build_model, integer_costs
from remat_cli.solvers.moccasin.starts import (
    folded_peak,
    lower_peak,
    map_sequence,
    repair_sequence,
    sequence_of,
    set_hint,
    staged_eviction,
    within_copies,
)

#: with one worker the search is stopped on CP-SAT's deterministic time (so a seed gives the same
#: schedule twice); this fraction of the wall-clock budget is the deterministic limit, leaving
#: headroom where other processes share the cores and deterministic time runs slower than the wall clock.
DETERMINISTIC_FRACTION = 0.5

#: phase 2 with a time limit and several workers: the full CP-SAT portfolio runs for this share
#: of the time left (at most LNS_AFTER_CAP seconds), then only LNS workers. On two cores the
#: portfolio is one tree-search worker plus one thread cycling through a dozen LNS
#: neighbourhoods; the tree search proves small graphs optimal quickly but on larger ones may
#: never improve the incumbent, where LNS-only workers do.
LNS_AFTER = 0.25
LNS_AFTER_CAP = 30.0


#: a start at most this fraction over the budget is brought within it by `lower_peak`
NEAR_OVER = 0.05
#: with one worker `lower_peak` stops after this many recomputations instead of on the clock
LOWER_STEPS = 64
#: greedy runs at these fractions of the budget until one (repaired) fits, within GREEDY_SHARE
#: of the time limit
GREEDY_TARGETS = (1.0, 0.985, 0.97, 0.95)
GREEDY_SHARE = 0.25
GREEDY_STRATEGIES = ("split", "split-shallow")
#: with one worker greedy ignores the clock, so its runs are counted instead
GREEDY_CALLS_ONE_WORKER = 3


class Moccasin(Solver):
    """Phase 1 (memory) then phase 2 (duration) of MOCCASIN §2.4 on CP-SAT, from the best start."""

    name = "moccasin"
    method = "retention-interval constraint program (CP-SAT), two phases"
    paper = "Bartan et al., MOCCASIN, ICML 2023, §2"
    #: `optimal` means CP-SAT closed the gap on eqs. (1)–(11): a proof of optimality within the
    #: search space (staged by default, at most C_v computations of a node, one memory block per
    #: node). With C_v ≥ n the staged space is Checkmate's fixed-order stage space, checked
    #: against brute force in tests/test_moccasin.py.
    exact = True
    exact_params = {"max_copies": 8}  # C_v ≥ T on the tiny graphs: the whole stage space
    warm_starts = True
    params = (
        Param("max_copies", int, 2, "C_v: at most this many computations of a node (§2)", low=1, high=64),
        Param("free_order", bool, False, "free operator order (§2.1, domain ΣC_v) instead of the staged one"),
        Param(
            "precedence",
            str,
            "literals",
            "eq. (5) as reservoirs (§2.2, eq. 10) or as one cover literal per predecessor copy",
            choices=("reservoir", "literals"),
        ),
    )

    def prepare(self) -> None:
        """Greedy's schedule is one of its starts: greedy's kernels loaded before the clock."""
        from remat_cli import registry

        if "greedy" in registry.names():
            registry.get("greedy").prepare()

    def notes(self) -> str:
        return (
            "Default is the fixed-input-order staged variant (§2.3) as in the paper's tables; "
            "'optimal' is a proof within that space with at most --max-copies computations per node. "
            "Starts from --hint, the greedy solver when installed, the baseline and a staged eviction "
            "heuristic, cut to --max-copies and brought within the budget when a little over; phase 1 "
            "runs only when none of them fits the budget."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        """ "optimal" when CP-SAT closes the gap on eqs. (1)–(11) (optimal within the staged space
        with at most C_v computations per node), "feasible" with the bound reached otherwise;
        "infeasible" when the budget is below the resident bytes or phase 1 finds nothing
        memory-feasible (`best_peak` then the lowest peak of its starting points)."""
        params = options.params
        c_v = max(1, int(params["max_copies"]))
        staged = not bool(params["free_order"])
        view = graph.node_view
        unit_mem = reduce(math.gcd, [x for x in view.mem + view.workspace if x > 0], 0) or 1
        cap = (budget - view.resident) // unit_mem if budget >= view.resident else -1
        used = {"max_copies": c_v, "free_order": not staged, "precedence": str(params["precedence"])}
        if cap < 0:
            return SolverResult(
                steps=None,
                status="infeasible",
                backend="ortools-cp-sat",
                params=used,
                message="the budget is below the resident inputs and parameters",
                best_peak=view.resident,
            )
        needed = view.needed_index
        if not needed:  # the outputs are inputs or parameters: nothing to run
            return SolverResult(steps=[], status="optimal", backend="none", objective=0.0, params=used)
        w, unit = integer_costs([view.cost[i] for i in needed] or [0.0])
        m = build_model(view, cap, unit_mem, w, c_v, staged, str(params["precedence"]))
        # Starting points (module docstring): --hint, the greedy solver, the baseline, the
        # eviction heuristic, each repaired (§2.4: phase 2 starts from a memory-feasible solution;
        # phase 1 from the lowest-peak one when none fits).
        sequences: list[tuple[str, list[int]]] = []
        helper_notes: list[str] = []  # failures of the greedy helper, reported in the message
        if options.hint:
            _add_start(m, graph, cap, options, sequences, "hint", options.hint)
        self._greedy_starts(m, graph, budget, cap, options, sequences, helper_notes)
        _add_start(m, graph, cap, options, sequences, "baseline", baseline_steps(graph))
        _eviction_starts(m, cap, unit_mem, view.resident, options, sequences)
        starts: list[tuple[int, int, str, list[list[Interval]]]] = []  # (peak, cost, name, ivs)
        for cname, seq in sequences:
            ivs = map_sequence(m, seq)
            if ivs is None or not within_copies(m, ivs):
                continue
            cost = sum(m.w[k] * len(x) for k, x in enumerate(ivs))
            starts.append((folded_peak(m, ivs), cost, cname, ivs))
        feasible = sorted((c, p, nm, ivs) for p, c, nm, ivs in starts if p <= cap)
        cp = _CpRuns(options, used)
        notes: list[str] = list(helper_notes)
        start_ivs: list[list[Interval]] | None = None
        if feasible:
            c, _, src, start_ivs = feasible[0]
            notes.append(f"phase 1 skipped: the {src} schedule fits (duration {c * unit:.6g})")
        else:
            got = _phase1(m, graph, cap, unit, unit_mem, view.resident, options, starts, cp, notes)
            if isinstance(got, SolverResult):
                return got
            start_ivs = got
        return self._phase2(m, graph, cap, unit, options, start_ivs, cp, notes)

    def _greedy_starts(
        self,
        m: Model,
        graph: Graph,
        budget: int,
        cap: int,
        options: SolveOptions,
        sequences: list[tuple[str, list[int]]],
        helper_notes: list[str],
    ) -> None:
        """Greedy's schedules as starts. Greedy's schedule may compute a node more than C_v
        times; the repair then raises its peak, so greedy runs again at a slightly lower budget
        until a repaired one fits (with one worker a count bounds it, as greedy then ignores the
        clock). Below the budget its peak-reduction strategies run one by one: greedy keeps only
        the cheapest schedule, and after the repair another one may be cheaper."""
        t_greedy = time.monotonic()
        calls = 0
        for frac in GREEDY_TARGETS:
            fits = False
            for strategy in ("auto",) if frac == 1 else GREEDY_STRATEGIES:
                spent = time.monotonic() - t_greedy
                if options.workers <= 1:  # reproducible runs: a count, not the clock
                    if calls >= GREEDY_CALLS_ONE_WORKER:
                        break
                elif options.time_limit is not None and spent > GREEDY_SHARE * options.time_limit:
                    break
                calls += 1
                steps = self._greedy(graph, int(budget * frac), options, strategy, helper_notes)
                if steps and frac == 1 and simulate(graph, steps).peak_memory <= budget:
                    options.incumbent(steps)  # the model may outlast the time limit
                label = "greedy" if frac == 1 else f"greedy {strategy}@{frac:.1%}"
                fits = bool(steps and _add_start(m, graph, cap, options, sequences, label, steps)) or fits
            if fits:
                break

    def _phase2(
        self,
        m: Model,
        graph: Graph,
        cap: int,
        unit: float,
        options: SolveOptions,
        start_ivs: list[list[Interval]],
        cp: _CpRuns,
        notes: list[str],
    ) -> SolverResult:
        """Phase 2, eq. (1) subject to (2)-(11), from the feasible solution as a hint."""
        used = cp.used
        fallback = decode_schedule(m, graph, start_ivs)
        options.incumbent(fallback)
        fallback_cost = sum(m.w[k] * len(x) for k, x in enumerate(start_ivs))
        m.model.clear_objective()
        m.model.add(m.m_var <= cap)
        m.model.minimize(m.duration)
        set_hint(m, start_ivs, cap)
        remaining = options.remaining()
        if remaining is not None and remaining <= 0.05:
            if cp.deterministic:
                used["clock_stopped"] = True
            return self._result(
                fallback, "feasible", fallback_cost, None, unit, used, notes + ["no time left"]
            )
        # With a clock limit and several workers, the full portfolio (whose tree search proves
        # the small rows optimal) gets a first share; if it has not finished, LNS-only workers
        # take the rest from its incumbent (see LNS_AFTER).
        split = not cp.deterministic and options.workers >= 2 and remaining is not None
        first = min(LNS_AFTER_CAP, LNS_AFTER * remaining) if split and remaining is not None else remaining
        solver = cp.new_solver(first)
        cb = Incumbents(m, graph, options, 2, cap, unit)
        t0 = time.monotonic()
        status = solver.solve(m.model, cb)
        cp.clock_cut(solver, status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            notes.append(f"phase 2: {solver.status_name(status)} after {time.monotonic() - t0:.1f}s")
            return self._result(fallback, "feasible", fallback_cost, None, unit, used, notes)
        ivs = read_solution(m, solver.value)
        obj = int(round(solver.objective_value))
        bound = int(math.ceil(solver.best_objective_bound - 1e-6))
        remaining = options.remaining()
        if split and status != cp_model.OPTIMAL and bound < obj and remaining is not None and remaining > 0.5:
            m.model.clear_hints()
            set_hint(m, ivs, cap)
            lns = cp.new_solver(remaining)
            lns.parameters.use_lns_only = True
            status2 = lns.solve(m.model, cb)
            if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE) and lns.objective_value < obj - 0.5:
                ivs, obj = read_solution(m, lns.value), int(round(lns.objective_value))
            notes.append(f"LNS-only after {first:.0f}s of the full portfolio")
        if obj > fallback_cost:  # never return worse than the start
            ivs, obj = start_ivs, fallback_cost
        optimal = status == cp_model.OPTIMAL or bound >= obj
        gap = relative_gap(obj, bound) or 0.0
        notes.append(f"phase 2: {solver.status_name(status).lower()}, gap {gap:.2%}")
        if _split_outputs(graph):
            # The model keeps a node's outputs together (one block): where they could be freed
            # apart, its optimum and bound are those of a restricted space, not the graph's
            # (found by the fuzzer against brute force)
            optimal, bound = False, None
            notes.append("outputs of multi-output nodes kept together: no optimality claim")
        return self._result(
            decode_schedule(m, graph, ivs),
            "optimal" if optimal else "feasible",
            obj,
            bound,
            unit,
            used,
            notes,
        )

    @staticmethod
    def _result(
        steps: list[Step],
        status: str,
        obj: int,
        bound: int | None,
        unit: float,
        used: dict[str, object],
        notes: list[str],
    ) -> SolverResult:
        return SolverResult(
            steps=steps,
            status=status,  # type: ignore[arg-type]
            backend="ortools-cp-sat",
            objective=obj * unit,
            lower_bound=None if bound is None else bound * unit,
            params=used,
            message="; ".join(notes),
        )

    @staticmethod
    def _greedy(
        graph: Graph, budget: int, options: SolveOptions, strategy: str, notes: list[str]
    ) -> list[Step] | None:
        """The `greedy` solver's schedule, when that solver is installed (a CP-SAT hint only)."""
        from remat_cli import registry

        remaining = options.remaining()
        sub = SolveOptions(
            time_limit=None if remaining is None else max(0.1, 0.1 * remaining),
            seed=options.seed,
            workers=1,
            params={"strategy": strategy},
        )
        res = registry.call_solver("greedy", graph, budget, sub, notes)
        return None if res is None else res.steps


def _split_outputs(graph: Graph) -> bool:
    """Whether a needed node has two outputs of nonzero size (which a schedule may free apart)."""
    vm = graph.value_map
    return any(sum(1 for v in graph.node_map[n].outputs if vm[v].size > 0) > 1 for n in graph.needed_nodes)


def _add_start(
    m: Model,
    graph: Graph,
    cap: int,
    options: SolveOptions,
    sequences: list[tuple[str, list[int]]],
    cname: str,
    steps: list[Step],
) -> bool:
    """Add a start and its repair to `sequences`; whether one of them fits the budget. A start a
    little over it (NEAR_OVER) is lowered as well."""
    seq = local_sequence(m, graph, steps)
    sequences.append((cname, seq))
    fixed = repair_sequence(m, seq, cap)
    if fixed is not None and fixed != seq:
        sequences.append((f"{cname} (repaired)", fixed))
    ok = False
    for x in (seq, fixed):
        ivs = None if x is None else map_sequence(m, x)
        ok = ok or (ivs is not None and within_copies(m, ivs) and folded_peak(m, ivs) <= cap)
    ivs = None if fixed is None else map_sequence(m, fixed)
    if not ok and ivs is not None and folded_peak(m, ivs) <= cap * (1 + NEAR_OVER):
        assert fixed is not None
        # bounded by the clock, or with one worker (reproducible runs) by a count
        left = options.remaining()
        if options.workers <= 1 or left is None:
            lowered = lower_peak(m, fixed, cap, None, LOWER_STEPS)
        else:
            lowered = lower_peak(m, fixed, cap, time.monotonic() + 0.1 * left)
        if lowered is not None:
            sequences.append((f"{cname} (lowered)", repair_sequence(m, lowered, cap) or lowered))
    return ok  # a lowered start does not end the search for a better one


def _eviction_starts(
    m: Model,
    cap: int,
    unit_mem: int,
    resident: int,
    options: SolveOptions,
    sequences: list[tuple[str, list[int]]],
) -> None:
    """The eviction start at the budget; failing that, at looser targets, whose result can still
    have a lower peak than anything else to start phase 1 from. Bounded by a tenth of the time
    limit, since it is Python and only a hint; with one worker (reproducible runs) by a count."""
    t_heur = time.monotonic()
    heur_budget = None if options.time_limit is None else 0.1 * options.time_limit
    runs, max_runs = 0, 12 if options.workers <= 1 else 10**9
    if options.workers <= 1:
        heur_budget = None
    peak_ub = sum(m.mem) + max(m.ws, default=0)
    targets = sorted({min(peak_ub, int(cap * (1 + x / 40))) for x in range(7)})
    for target in targets:
        found = False
        for score, max_chain in itertools.product(range(3), (1, len(m.nodes))):
            if runs >= max_runs or (heur_budget is not None and time.monotonic() - t_heur > heur_budget):
                break
            runs += 1
            seq = staged_eviction(m, target, score, max_chain)
            if seq is None:
                continue
            ivs = map_sequence(m, seq)
            if ivs is not None and folded_peak(m, ivs) <= target:
                found = True
                name = f"eviction-{score}/{max_chain}@{target * unit_mem + resident}"
                sequences.append((name, seq))
                fixed = repair_sequence(m, seq, cap)
                if fixed is not None and fixed != seq:
                    sequences.append((f"{name} (repaired)", fixed))
        if found:
            break


class _CpRuns:
    """CP-SAT runs of one solve. With one worker the run must repeat exactly for a seed: CP-SAT
    stops on deterministic time, split between the phases by what phase 1 actually used (also
    deterministic)."""

    def __init__(self, options: SolveOptions, used: dict[str, object]) -> None:
        self.options = options
        self.used = used
        self.deterministic = options.workers <= 1
        self.det_left = None if options.time_limit is None else options.time_limit * DETERMINISTIC_FRACTION

    def new_solver(self, remaining: float | None) -> cp_model.CpSolver:
        solver = cp_model.CpSolver()
        prm = solver.parameters
        prm.num_workers = max(1, self.options.workers)
        prm.random_seed = self.options.seed
        # Probing dominates presolve on these models (seconds at n = 250, repeated in every
        # LNS neighbourhood) and finds little: the intervals' domains are already tight.
        prm.cp_model_probing_level = 0
        if remaining is not None:
            prm.max_time_in_seconds = max(0.01, remaining)
        if self.deterministic and self.det_left is not None:
            prm.max_deterministic_time = max(0.01, self.det_left)
        return solver

    def clock_cut(self, solver: cp_model.CpSolver, status: object) -> None:
        """With one worker a seed repeats only where CP-SAT stopped on its deterministic budget
        or finished: where the wall clock stopped it first (its deterministic time can run well
        below the wall clock's when other processes share the cores), ``clock_stopped`` says so, for a caller that
        must drop a result the clock chose (the H-ILP's flat start)."""
        finished = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
        cut = solver.deterministic_time < solver.parameters.max_deterministic_time
        if self.deterministic and self.det_left is not None and not finished and cut:
            self.used["clock_stopped"] = True


def _phase1(
    m: Model,
    graph: Graph,
    cap: int,
    unit: float,
    unit_mem: int,
    resident: int,
    options: SolveOptions,
    starts: list[tuple[int, int, str, list[list[Interval]]]],
    cp: _CpRuns,
    notes: list[str],
) -> list[list[Interval]] | SolverResult:
    """Phase 1, eqs. (12)-(13): minimise max(M_var, M) (M_var's domain starts at M); it stops at
    the first memory-feasible solution, which it returns, or the result saying none was found.
    (Breaking ties by the duration (1) makes it several times slower.)"""
    used = cp.used
    m.model.minimize(m.m_var)
    if starts:
        p, _, src, ivs = min(starts, key=lambda x: (x[0], x[1]))
        set_hint(m, ivs, p)
        notes.append(f"phase 1 from the {src} schedule (peak {p * unit_mem + resident})")
    solver = cp.new_solver(options.remaining())
    cb = Incumbents(m, graph, options, 1, cap, unit)
    status = solver.solve(m.model, cb)
    if cp.det_left is not None:
        cp.det_left -= solver.deterministic_time
    solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
    peak = solver.value(m.m_var) if solved else None
    fits = solved and peak is not None and peak <= cap
    if not fits:
        cp.clock_cut(solver, status)  # at a memory-feasible solution its callback stopped it
    if fits:
        ivs1 = read_solution(m, solver.value)
        # phase 1 ignores the duration: drop the recomputations the budget does not need
        pruned = repair_sequence(m, sequence_of(ivs1), cap)
        ivs2 = None if pruned is None else map_sequence(m, pruned)
        if ivs2 is not None and within_copies(m, ivs2) and folded_peak(m, ivs2) <= cap:
            ivs1 = ivs2
        cost1 = sum(m.w[k] * len(x) for k, x in enumerate(ivs1))
        notes.append(f"phase 1: memory-feasible in {solver.wall_time:.1f}s at duration {cost1 * unit:.6g}")
        return ivs1
    if not solved:
        return SolverResult(
            steps=None,
            status="infeasible" if status == cp_model.INFEASIBLE else "unknown",
            backend="ortools-cp-sat",
            params=used,
            message=f"phase 1: {solver.status_name(status)}",
        )
    assert peak is not None
    proved = status == cp_model.OPTIMAL
    best = peak * unit_mem + resident
    lb = int(solver.best_objective_bound) * unit_mem + resident
    return SolverResult(
        steps=None,
        status="infeasible" if proved else "unknown",
        backend="ortools-cp-sat",
        params=used,
        message=(
            f"phase 1: lowest peak {best} > budget"
            + (" (proved within the search space)" if proved else f", bound {lb}")
        ),
        best_peak=best,
    )
