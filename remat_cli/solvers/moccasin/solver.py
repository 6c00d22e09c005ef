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
from remat_cli.solvers.moccasin.decode import _decode, _Incumbents, _local_sequence, _read
from remat_cli.solvers.moccasin.model import Interval, _build, _integer_costs
from remat_cli.solvers.moccasin.starts import (
    _fits,
    _folded_peak,
    _hint,
    _lower_peak,
    _map_sequence,
    _repair,
    _sequence_of,
    _staged_eviction,
)

#: with one worker the search is stopped on CP-SAT's deterministic time (so a seed gives the same
#: schedule twice); this fraction of the wall-clock budget is the deterministic limit, leaving
#: headroom on a loaded machine, where deterministic time runs slower than the wall clock.
DETERMINISTIC_FRACTION = 0.5

#: phase 2 with a time limit and several workers: the full CP-SAT portfolio runs for this share
#: of the time left (at most LNS_AFTER_CAP seconds), then only LNS workers. On two cores the
#: portfolio is one tree-search worker plus one thread cycling through a dozen LNS
#: neighbourhoods; the tree search proves RL n100 optimal in a second but on RL n250 at 80%
#: never improves the incumbent, and LNS-only workers reach 4.92% in 60 s where the portfolio
#: stays at 5.03% for 120 s (measured alone on the 2-core machine).
LNS_AFTER = 0.25
LNS_AFTER_CAP = 30.0


#: a start at most this fraction over the budget is brought within it by `_lower_peak`
NEAR_OVER = 0.05
#: with one worker `_lower_peak` stops after this many recomputations instead of on the clock
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
        w, unit = _integer_costs([view.cost[i] for i in needed] or [0.0])
        m = _build(view, cap, unit_mem, w, c_v, staged, str(params["precedence"]))

        # Starting points (module docstring): --hint, the greedy solver, the baseline, the
        # eviction heuristic, each repaired (§2.4: phase 2 starts from a memory-feasible solution;
        # phase 1 from the lowest-peak one when none fits).
        sequences: list[tuple[str, list[int]]] = []
        helper_notes: list[str] = []  # failures of the greedy helper, reported in the message

        def add(cname: str, steps: list[Step]) -> bool:
            """Add a start and its repair; whether one of them fits the budget."""
            seq = _local_sequence(m, graph, steps)
            sequences.append((cname, seq))
            fixed = _repair(m, seq, cap)
            if fixed is not None and fixed != seq:
                sequences.append((f"{cname} (repaired)", fixed))
            ok = False
            for x in (seq, fixed):
                ivs = None if x is None else _map_sequence(m, x)
                ok = ok or (ivs is not None and _fits(m, ivs) and _folded_peak(m, ivs) <= cap)
            ivs = None if fixed is None else _map_sequence(m, fixed)
            if not ok and ivs is not None and _folded_peak(m, ivs) <= cap * (1 + NEAR_OVER):
                assert fixed is not None
                # bounded by the clock, or with one worker (reproducible runs) by a count
                left = options.remaining()
                if options.workers <= 1 or left is None:
                    lowered = _lower_peak(m, fixed, cap, None, LOWER_STEPS)
                else:
                    lowered = _lower_peak(m, fixed, cap, time.monotonic() + 0.1 * left)
                if lowered is not None:
                    sequences.append((f"{cname} (lowered)", _repair(m, lowered, cap) or lowered))
            return ok  # a lowered start does not end the search for a better one

        if options.hint:
            add("hint", options.hint)
        # greedy's schedule may compute a node more than C_v times; the repair then raises its
        # peak, so greedy runs again at a slightly lower budget until a repaired one fits (with
        # one worker a count bounds it, as greedy then ignores the clock).
        # Below the budget its peak-reduction strategies run one by one: greedy keeps only the
        # cheapest schedule, and after the repair another one may be cheaper.
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
                    options.incumbent(steps)  # the model may outlast the time limit (issue 20)
                label = "greedy" if frac == 1 else f"greedy {strategy}@{frac:.1%}"
                fits = bool(steps and add(label, steps)) or fits
            if fits:
                break
        add("baseline", baseline_steps(graph))
        # The eviction start at the budget; failing that, at looser targets, whose result can
        # still have a lower peak than anything else to start phase 1 from. Bounded by a tenth of
        # the time limit, since it is Python and only a hint.
        t_heur = time.monotonic()
        heur_budget = None if options.time_limit is None else 0.1 * options.time_limit
        # with one worker (reproducible runs) a count bounds it instead of the clock
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
                seq = _staged_eviction(m, target, score, max_chain)
                if seq is None:
                    continue
                ivs = _map_sequence(m, seq)
                if ivs is not None and _folded_peak(m, ivs) <= target:
                    found = True
                    name = f"eviction-{score}/{max_chain}@{target * unit_mem + view.resident}"
                    sequences.append((name, seq))
                    fixed = _repair(m, seq, cap)
                    if fixed is not None and fixed != seq:
                        sequences.append((f"{name} (repaired)", fixed))
            if found:
                break
        starts: list[tuple[int, int, str, list[list[Interval]]]] = []  # (peak, cost, name, ivs)
        for cname, seq in sequences:
            ivs = _map_sequence(m, seq)
            if ivs is None or not _fits(m, ivs):
                continue
            cost = sum(m.w[k] * len(x) for k, x in enumerate(ivs))
            starts.append((_folded_peak(m, ivs), cost, cname, ivs))
        feasible = sorted((c, p, nm, ivs) for p, c, nm, ivs in starts if p <= cap)

        # With one worker the run must repeat exactly for a seed: CP-SAT stops on deterministic
        # time, split between the phases by what phase 1 actually used (also deterministic).
        deterministic = options.workers <= 1
        det_left = None if options.time_limit is None else options.time_limit * DETERMINISTIC_FRACTION

        def new_solver(remaining: float | None) -> cp_model.CpSolver:
            solver = cp_model.CpSolver()
            prm = solver.parameters
            prm.num_workers = max(1, options.workers)
            prm.random_seed = options.seed
            # Probing dominates presolve on these models (seconds at n = 250, repeated in every
            # LNS neighbourhood) and finds little: the intervals' domains are already tight.
            prm.cp_model_probing_level = 0
            if remaining is not None:
                prm.max_time_in_seconds = max(0.01, remaining)
            if deterministic and det_left is not None:
                prm.max_deterministic_time = max(0.01, det_left)
            return solver

        def clock_cut(solver: cp_model.CpSolver, status: object) -> None:
            """With one worker a seed repeats only where CP-SAT stopped on its deterministic budget
            or finished: where the wall clock stopped it first (its deterministic time runs at
            0.12-0.2 s a second on the 2-core machine), ``clock_stopped`` says so, for a caller
            that must drop a result the clock chose (the H-ILP's flat start)."""
            finished = status in (cp_model.OPTIMAL, cp_model.INFEASIBLE)
            cut = solver.deterministic_time < solver.parameters.max_deterministic_time
            if deterministic and det_left is not None and not finished and cut:
                used["clock_stopped"] = True

        notes: list[str] = list(helper_notes)
        start_ivs: list[list[Interval]] | None = None
        if feasible:
            c, _, src, start_ivs = feasible[0]
            notes.append(f"phase 1 skipped: the {src} schedule fits (duration {c * unit:.6g})")
        if not feasible:
            # Phase 1, eqs. (12)-(13): minimise max(M_var, M) (M_var's domain starts at M); it
            # stops at the first memory-feasible solution. (Breaking ties by the duration (1)
            # was measured to make it several times slower: RL n250 at 80%, 44 s vs 7 s.)
            m.model.minimize(m.m_var)
            if starts:
                p, _, src, ivs = min(starts, key=lambda x: (x[0], x[1]))
                _hint(m, ivs, p)
                notes.append(f"phase 1 from the {src} schedule (peak {p * unit_mem + view.resident})")
            solver = new_solver(options.remaining())
            cb = _Incumbents(m, graph, options, 1, cap, unit)
            status = solver.solve(m.model, cb)
            if det_left is not None:
                det_left -= solver.deterministic_time
            solved = status in (cp_model.OPTIMAL, cp_model.FEASIBLE)
            peak = solver.value(m.m_var) if solved else None
            fits = solved and peak is not None and peak <= cap
            if not fits:
                clock_cut(solver, status)  # at a memory-feasible solution its callback stopped it
            if fits:
                ivs1 = _read(m, solver.value)
                # phase 1 ignores the duration: drop the recomputations the budget does not need
                pruned = _repair(m, _sequence_of(ivs1), cap)
                ivs2 = None if pruned is None else _map_sequence(m, pruned)
                if ivs2 is not None and _fits(m, ivs2) and _folded_peak(m, ivs2) <= cap:
                    ivs1 = ivs2
                cost1 = sum(m.w[k] * len(x) for k, x in enumerate(ivs1))
                notes.append(
                    f"phase 1: memory-feasible in {solver.wall_time:.1f}s at duration {cost1 * unit:.6g}"
                )
                start_ivs = ivs1
            elif not solved:
                return SolverResult(
                    steps=None,
                    status="infeasible" if status == cp_model.INFEASIBLE else "unknown",
                    backend="ortools-cp-sat",
                    params=used,
                    message=f"phase 1: {solver.status_name(status)}",
                )
            else:
                assert peak is not None
                proved = status == cp_model.OPTIMAL
                best = peak * unit_mem + view.resident
                lb = int(solver.best_objective_bound) * unit_mem + view.resident
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
        assert start_ivs is not None

        # Phase 2, eq. (1) subject to (2)-(11), from the feasible solution as a hint.
        fallback = _decode(m, graph, start_ivs)
        options.incumbent(fallback)
        fallback_cost = sum(m.w[k] * len(x) for k, x in enumerate(start_ivs))
        m.model.clear_objective()
        m.model.add(m.m_var <= cap)
        m.model.minimize(m.duration)
        _hint(m, start_ivs, cap)
        remaining = options.remaining()
        if remaining is not None and remaining <= 0.05:
            if deterministic:
                used["clock_stopped"] = True
            return self._result(
                fallback, "feasible", fallback_cost, None, unit, used, notes + ["no time left"]
            )
        # With a clock limit and several workers, the full portfolio (whose tree search proves
        # the small rows optimal) gets a first share; if it has not finished, LNS-only workers
        # take the rest from its incumbent (see LNS_AFTER).
        split = not deterministic and options.workers >= 2 and remaining is not None
        first = min(LNS_AFTER_CAP, LNS_AFTER * remaining) if split and remaining is not None else remaining
        solver = new_solver(first)
        cb = _Incumbents(m, graph, options, 2, cap, unit)
        t0 = time.monotonic()
        status = solver.solve(m.model, cb)
        clock_cut(solver, status)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            notes.append(f"phase 2: {solver.status_name(status)} after {time.monotonic() - t0:.1f}s")
            return self._result(fallback, "feasible", fallback_cost, None, unit, used, notes)
        ivs = _read(m, solver.value)
        obj = int(round(solver.objective_value))
        bound = int(math.ceil(solver.best_objective_bound - 1e-6))
        remaining = options.remaining()
        if split and status != cp_model.OPTIMAL and bound < obj and remaining is not None and remaining > 0.5:
            m.model.clear_hints()
            _hint(m, ivs, cap)
            lns = new_solver(remaining)
            lns.parameters.use_lns_only = True
            status2 = lns.solve(m.model, cb)
            if status2 in (cp_model.OPTIMAL, cp_model.FEASIBLE) and lns.objective_value < obj - 0.5:
                ivs, obj = _read(m, lns.value), int(round(lns.objective_value))
            notes.append(f"LNS-only after {first:.0f}s of the full portfolio")
        if obj > fallback_cost:  # never return worse than the start
            ivs, obj = start_ivs, fallback_cost
        optimal = status == cp_model.OPTIMAL or bound >= obj
        gap = relative_gap(obj, bound) or 0.0
        notes.append(f"phase 2: {solver.status_name(status).lower()}, gap {gap:.2%}")
        if _split_outputs(graph):
            # The model keeps a node's outputs together (one block): where they could be freed
            # apart, its optimum and bound are those of a restricted space, not the graph's
            # (found by the fuzzer against brute force, issue 20)
            optimal, bound = False, None
            notes.append("outputs of multi-output nodes kept together: no optimality claim")
        return self._result(
            _decode(m, graph, ivs), "optimal" if optimal else "feasible", obj, bound, unit, used, notes
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
