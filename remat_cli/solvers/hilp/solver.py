"""The H-ILP solver, top level: hierarchy, top H-ILP and refined top (Gusak et al.,
*HiREmate*, §3.2.1); the whole-graph flat start and fallbacks are in :mod:`.flatstart`.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from remat_cli.graph import Graph, GraphError
from remat_cli.schedule import (
    ScheduleError,
    SimResult,
    Step,
    baseline,
    overhead,
    simulate,
    steps_from_sequence,
)
from remat_cli.solver import OptionError, Param, SolveOptions, Solver, SolverResult
from remat_cli.solvers.hilp.context import Ctx, grad_pairs
from remat_cli.solvers.hilp.flatstart import solver_names
from remat_cli.solvers.hilp.instance import Instance, build_instance
from remat_cli.solvers.hilp.levels import TOP_OPTIONS, Levels
from remat_cli.solvers.hilp.model import flatten, trivial
from remat_cli.solvers.hilp.portfolio import Portfolio
from remat_cli.solvers.hilp.subgraphs import solve_instance
from remat_cli.solvers.hilp.units import (
    Unit,
    compute_nodes,
    first_ranks,
    follow,
    refine,
)
from remat_cli.solvers.hilp.windows import Windows, sweep

#: the refined top (units replaced by their pieces where the memory is) has at most this many
#: times M^t compute nodes
FINER_TOP = 3
#: share of the time after the flat start for the windows over it (:mod:`.windows`); the
#: hierarchy and the tops have the rest
WINDOW_SHARE = 0.5

# ------------------------------------------------------------------------------------------------
# The solver


#: seconds, where the caller gives no --time-limit (as auto's)
DEFAULT_TIME_LIMIT = 60.0


class HILP(Solver):
    name = "hilp"
    method = "hierarchical ILP over H-Partition subgraphs with per-subgraph options (H-ILP)"
    paper = "HiREmate (Gusak et al.), §3 and Appendices A-C"
    exact = False
    warm_starts = True  # the hint is one more flat start (WholeGraph.flat_schedule)
    params = (
        Param(
            "max_subgraph",
            int,
            8,
            "M^l: most nodes in a lower-level subgraph (H-Partition)",
            low=2,
            high=10000,
        ),
        Param("max_top", int, 24, "M^t: most nodes in the top-level graph (H-Partition)", low=2, high=10000),
        Param("alpha", float, 0.5, "α of the H-Partition score s_α, eq. (1)", low=0, high=1),
        Param(
            "options",
            int,
            48,
            "N_o: most options over all compute nodes of one H-ILP (§3.2.2)",
            low=1,
            high=100000,
        ),
        Param(
            "levels",
            int,
            4,
            "peak budgets each subgraph is solved under to make its options (layers also get "
            "levels-1 budgets on the memory kept from forward to backward)",
            low=1,
            high=64,
        ),
        Param(
            "jobs", int, 1, "parallel processes for the independent subgraphs of one level", low=1, high=64
        ),
        Param(
            "backend",
            str,
            "auto",
            "MILP engine for the H-ILPs (auto: HiGHS)",
            ("auto", "highs", "scip", "cpsat", "gurobi"),
        ),
        Param(
            "leaf_solvers",
            str,
            "",
            "other registered solvers adding options on leaf subgraphs, comma-separated (e.g. checkmate)",
        ),
        Param(
            "flat_start",
            str,
            "fastsa,moccasin",
            "whole-graph solvers run first, comma-separated (fastsa as it runs alone in the whole "
            "limit, about a fifth of it; each other one 10% of the limit); the "
            "cheapest schedule within budget is the one the refined top is cut along and starts "
            "from, and gives every top-level layer one more option (empty: none)",
        ),
        Param(
            "windows",
            int,
            40,
            "stages per window of Checkmate's model in the flat start's order, re-solved with the "
            "rest of that schedule fixed, half the time after it (0: off)",
            low=0,
            high=100000,
        ),
        Param(
            "fallback",
            str,
            "auto",
            "auto: greedy and fastsa also run on the whole graph and the cheapest schedule is returned "
            "(the message says which); none: only the H-ILP's own schedule (no time kept for them)",
            ("auto", "none"),
        ),
    )

    def notes(self) -> str:
        return (
            "Training graphs with phase/grad_of pair each subgraph's forward and backward into a "
            "layer with phantom nodes; other graphs use plain subgraph nodes. Schedules are "
            "feasible, not proven optimal. With --time-limit, fastsa (as it runs alone) and "
            "moccasin (10%) go first on the whole graph (--flat-start; a --hint within budget is "
            "one more flat start), about half of the rest to the subgraph levels and the rest to "
            "the top H-ILPs; on time-out the best schedule found is returned (every unit run once "
            "with its fastest, smallest or least-kept option is always tried, and every H-ILP "
            "starts from the best such sequential schedule that fits its memory rows). A second "
            "top, cut along fastsa's schedule and started from it (without a flat start: refined "
            "one level down where the memory is), is solved too. Greedy "
            "and fastsa run on the whole graph too (beside the H-ILPs over the whole limit with two "
            "workers or more, else with the last 15% of it) and the cheapest schedule is used (the "
            "message says which); --fallback none returns the H-ILP's own schedule. The flat start is the "
            "refined top's start, so where no H-ILP schedule is cheaper the H-ILP's own schedule is "
            "the flat start's, and the message and the result's produced_by say so. Default time "
            f"limit {DEFAULT_TIME_LIMIT:g} s (without one every H-ILP would run to optimality)."
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        p = self.defaults() | options.params
        _check_solver_names(p)
        if options.time_limit is None:
            # without one every H-ILP runs to optimality: `remat solve torch_resnet_train.onnx
            # --budget 50% --solver hilp`, the pitch's command, ran past 20 minutes and had 13.0%
            # there, where the 60 s default returned 9.91% (two workers)
            options = replace(options, time_limit=DEFAULT_TIME_LIMIT)
        return HilpRun(graph, budget, options, p).run()


def _check_solver_names(p: dict[str, Any]) -> None:
    """--flat-start and --leaf-solvers name registered solvers other than this one (which would
    call itself); OptionError (exit 2) otherwise, not a silently skipped helper."""
    from remat_cli import registry

    known = [n for n in registry.names() if n not in ("hilp", "auto")]
    named = [("--flat-start", n) for n in solver_names(p, "flat_start")]
    named += [("--leaf-solvers", n) for n in solver_names(p, "leaf_solvers")]
    for flag, name in named:
        if name not in known:
            raise OptionError(f"{flag}: {name!r} is not a solver it can call (known: {', '.join(known)})")


class HilpRun(Levels):
    """One solve of the H-ILP solver: flat start, hierarchy, tops and fallbacks."""

    def __init__(self, graph: Graph, budget: int, options: SolveOptions, params: dict[str, Any]):
        self.g = graph
        self.budget = budget
        self.opt = options
        self.p = params
        self.deterministic = options.workers == 1
        backend = str(params["backend"])
        if backend == "auto":
            backend = "highs"
        self.backend = backend
        self.limit = options.time_limit
        #: failures of helper solvers (registry.call_solver), reported in the message
        self.helper_notes: list[str] = []
        #: failures of leaf solvers on subgraphs, as (solver, note), from the job processes
        self.leaf_failures: list[tuple[str, str]] = []
        self.started = time.monotonic()
        fallback = params.get("fallback") != "none"
        #: with two workers or more the whole-graph fallbacks run beside the H-ILPs in a process
        #: of their own over the whole time limit (with a share of the limit after them fastsa
        #: ends well above its own schedule at the full limit); with one worker (deterministic)
        #: they follow the H-ILPs
        self.parallel = fallback and options.workers >= 2 and self.limit is not None
        #: share of the time limit for the H-ILPs: 15% stays for sequential fallbacks
        self.ilp_share = 0.85 if fallback and not self.parallel else 1.0
        self.portfolio: Portfolio | None = None
        self.prefer: list[int | None] | None = None
        self.flat_seq: list[str] | None = None
        #: the flat start's schedule (cost, steps, peak): the start of a refined top that follows
        #: it, and so that top's schedule when its model cannot be built or solved in time; with
        #: fallbacks on, also a candidate for the returned result (:meth:`fallback`)
        self.flat_start: tuple[float, list[Step], int] | None = None
        #: the solver whose schedule the flat start is (flat_start's, or greedy's when it found none)
        self.flat_name = ""
        #: the end of the ILP work (epoch seconds), 5% short of its share: decoding and simulating
        #: the top's schedule follow it, and the runner's watchdog stops at the limit itself
        self.deadline = None if self.limit is None else time.time() + 0.95 * self.ilp_share * self.limit

    def training(self) -> bool:
        """Layers apply when backward nodes name their forward node and the quotient
        F → loss → B structure exists; else plain subgraphs."""
        fw = {n.id for n in self.g.nodes if n.id in self.g.needed_nodes and n.phase == "forward"}
        return bool(fw) and any(f in fw for f in grad_pairs(self.g).values())

    def run(self) -> SolverResult:
        self.early_incumbent()
        if self.parallel:
            assert self.limit is not None
            self.portfolio = Portfolio(self.g, self.budget, self.limit, self.opt.seed)
        try:
            return self._run()
        finally:
            if self.portfolio is not None:
                self.portfolio.stop()

    def _run(self) -> SolverResult:
        g = self.g
        self.flat_schedule()
        windowed = self.windows()
        ctx, top_units, inst = self.top_instance()
        base = baseline(g)
        best, lowest = self.trivial_incumbents(inst, base)
        tops, order, parts = self.tops(ctx, top_units, inst, base)
        found, low = self.solve_tops(tops, top_units, order, self.budget - g.resident_bytes, base, parts)
        lowest = min(lowest, low)
        if windowed is not None:
            head, w = windowed
            if w.steps is None:
                parts.append(f"{head}: {w.note}")
            else:
                parts.append(f"{head}: {w.note} (overhead {overhead(w.cost, base.cost):.4f})")
                if found is None or w.cost < found[0]:
                    found = (w.cost, w.steps, w.peak)
        if self.flat_start is not None and (found is None or self.flat_start[0] < found[0]):
            # the flat start is the H-ILP's own schedule where no top improves on it, also where
            # no refined top could follow it (``follow`` found no cut): the top alone was
            # returned then, though costlier (test_a_flat_start_no_top_improves_is_named_as_such)
            found = self.flat_start
        msg = f"{len(top_units)} top-level units, {len(inst.items)} compute nodes; " + "; ".join(parts)
        if found is not None and (best is None or found[0] < best[0]):
            best = found
            self.opt.incumbent(best[1])
        return self.result(best, msg, base, lowest)

    def top_instance(self) -> tuple[Ctx, list[Unit], Instance]:
        """The hierarchy's top-level units and their instance: with layers where the graph has
        them; plain subgraphs where the layers' quotient has a cycle (a pairing that does not
        follow the gradient flow)."""
        g = self.g
        try:
            ctx = Ctx(g, self.training())
            top_units = self.hierarchy(ctx)
            self.prefer = self.flat_options(ctx, top_units)
            inst = build_instance(ctx, top_units, with_loss=False)
        except (AssertionError, GraphError):
            ctx = Ctx(g, False)
            top_units = self.hierarchy(ctx)
            self.prefer = self.flat_options(ctx, top_units)
            inst = build_instance(ctx, top_units, with_loss=False)
        return ctx, top_units, inst

    def trivial_incumbents(
        self, inst: Instance, base: SimResult
    ) -> tuple[tuple[float, list[Step], int] | None, int]:
        """Incumbents before the top ILP: the baseline when it fits, then every unit once with
        its fastest or smallest option; the cheapest within budget and the lowest peak seen."""
        g = self.g
        best: tuple[float, list[Step], int] | None = None
        if base.peak_memory <= self.budget:
            best = (base.cost, _baseline_steps(g), base.peak_memory)
            self.opt.incumbent(best[1])
        lowest = base.peak_memory
        for pick in ("time", "peak", "kept"):
            steps = steps_from_sequence(g, flatten(inst, trivial(inst, pick))[0])
            sim = self.simulated(steps)
            if sim is None:
                continue
            lowest = min(lowest, sim.peak_memory)
            if sim.peak_memory <= self.budget and (best is None or sim.cost < best[0]):
                best = (sim.cost, steps, sim.peak_memory)
                self.opt.incumbent(steps)
        return best, lowest

    def tops(
        self, ctx: Ctx, top_units: list[Unit], inst: Instance, base: SimResult
    ) -> tuple[list[tuple[list[Unit], Instance, list[int | None] | None]], dict[str, int] | None, list[str]]:
        """The top H-ILPs to solve, in order, the whole-graph order a refined top follows (None:
        none does), and the message's parts so far. One level down where the memory is: the
        units needing the most memory replaced by their pieces (less is held together) while
        the instance stays of a solvable size, solved after the top with half its nominal time
        (the overall deadline still holds); the cheaper schedule counts. With a whole-graph
        schedule (flat_start) the pieces are cut along it instead (`follow`), so that it is the
        refined top's start."""
        order = self.flat_order()
        cap = FINER_TOP * int(self.p["max_top"])
        finer = follow(ctx, top_units, self.flat_seq, cap) if self.flat_seq else None
        parts = []
        if finer is not None and compute_nodes(finer) > 2 * cap:
            # the schedule recomputes in too many places to be followed by an instance of a
            # solvable size: that instance's start, the schedule itself, is all it would give
            # in time (as a top whose model cannot be built, see solve_top); the refined top
            # of old, without it, is solved instead (the schedule itself is a candidate below,
            # as every flat start is)
            if self.flat_start is not None:
                parts.append(
                    f"refined ({compute_nodes(finer)} compute nodes, from {self.flat_name}'s schedule): "
                    f"not solved: more than {2 * cap} compute nodes (its start, the whole-graph schedule "
                    f"it follows) (overhead {overhead(self.flat_start[0], base.cost):.4f})"
                )
            finer, order = None, None
        if order is None:
            finer = refine(ctx, top_units, cap)
        elif self.flat_start is not None:
            # the start of the refined top that follows it, an H-ILP schedule (with fallbacks on
            # it was reported already): the watchdog returns it when an engine overruns the limit
            self.opt.incumbent(self.flat_start[1])
        tops: list[tuple[list[Unit], Instance, list[int | None] | None]] = [(top_units, inst, self.prefer)]
        if finer is not None:
            self.select(finer, TOP_OPTIONS)
            prefer2 = self.flat_options(ctx, finer)
            inst2 = build_instance(ctx, finer, with_loss=False, order=order)
            refined = (finer, inst2, prefer2)
            # a refined top that follows the whole-graph schedule starts from it: it goes first,
            # with the top's share, where its start is worth the most time
            tops = [refined, *tops] if order is not None else [*tops, refined]
        return tops, order, parts

    def solve_tops(
        self,
        tops: list[tuple[list[Unit], Instance, list[int | None] | None]],
        top_units: list[Unit],
        order: dict[str, int] | None,
        target: int,
        base: SimResult,
        parts: list[str],
    ) -> tuple[tuple[float, list[Step], int] | None, int]:
        """Each top H-ILP in turn under `target` (the budget less the resident bytes): the
        cheapest schedule found and the lowest peak; a part of the message for each."""
        found = None
        lowest = base.peak_memory
        for i, (units, ins, pref) in enumerate(tops):
            share = 1.0 if i == 0 or not self.deterministic else 0.5
            follows = order is not None and units is not top_units
            got, statuses, low = self.solve_top(ins, target, share, prefer=pref, follows=follows)
            lowest = min(lowest, low)
            text = f"{'/'.join(statuses) or 'not run'}"
            if units is top_units:
                part = f"top H-ILP {text} on {self.backend}"
            else:
                source = f", from {self.flat_name}'s schedule" if order else ""
                part = f"refined ({len(ins.items)} compute nodes{source}): {text}"
            if got is not None:
                # at once: the next top's engine may overrun the limit in native code, and the
                # watchdog then returns the last incumbent
                self.opt.incumbent(got[1])
                part += f" (overhead {overhead(got[0], base.cost):.4f})"
                if found is None or got[0] < found[0]:
                    found = got
            parts.append(part)
        return found, lowest

    def result(
        self, best: tuple[float, list[Step], int] | None, msg: str, base: SimResult, lowest: int
    ) -> SolverResult:
        """The result after the fallbacks: the hierarchy's fixed grouping can rule out every
        schedule a finer one has (a unit keeps all its outputs together), and a top H-ILP cut
        short by the clock can be poor: leaf solvers on the whole graph, the framework of
        solvers (§3.2.1) applied at the top, compete with it, and nothing is called infeasible
        before they have run."""
        own, by = self.own_source(best)
        if self.portfolio is not None:
            fb = self.portfolio.collect(
                self.limit - self.elapsed() if self.limit is not None else 0.0, self.helper_notes
            )
        elif self.p.get("fallback") != "none":
            fb = self.fallback(None if best is None else best[:2])
        else:
            fb = None
        if self.p.get("fallback") == "none":
            msg += f"; used: {own} (fallbacks off)" if best is not None else "; fallbacks off"
        elif fb is not None and (best is None or fb[0] < best[0]):
            best = fb[:3]
            by = fb[3]
            msg += (
                f"; used: {fb[3]} on the whole graph (overhead {overhead(fb[0], base.cost):.4f}: cheaper "
                "than the H-ILP's schedule or none)"
            )
            self.opt.incumbent(best[1])
        elif fb is None and best is None:
            msg += "; whole-graph greedy and fastsa found none either"
        else:
            msg += f"; used: {own}"
        notes = _leaf_failure_notes(self.leaf_failures) + self.helper_notes
        if notes:
            msg += "; " + "; ".join(notes)
        if best is None:
            return SolverResult(
                steps=None,
                status="infeasible" if self.limit is None else "unknown",
                backend=self.backend,
                message=msg,
                best_peak=lowest,
            )
        return SolverResult(
            steps=best[1],
            status="feasible",
            backend=self.backend,
            objective=best[0],
            message=msg,
            params={"max_subgraph": self.p["max_subgraph"], "produced_by": by, "time_limit": self.limit},
        )

    def windows(self) -> tuple[str, Windows] | None:
        """The flat start improved window by window (:func:`sweep`), with ``WINDOW_SHARE`` of
        the time after it: the message's head and what the sweep gave; None where there is no
        flat start or windows are off."""
        size = int(self.p.get("windows", 0))
        if not size or self.flat_start is None or self.limit is None or self.deadline is None:
            return None
        share = WINDOW_SHARE * max(0.0, self.deadline - time.time())
        head = f"windows of {size} stages over {self.flat_name}'s schedule"
        if share < 1.0:
            cost, _, peak = self.flat_start
            return head, Windows(None, cost, peak, 0, 0, "not tried, no time left")
        w = sweep(
            self.g,
            self.budget,
            self.flat_start[1],
            size,
            share,
            self.opt.seed,
            self.deterministic,
            self.deadline,
        )
        if w.steps is not None:
            self.opt.incumbent(w.steps)
        return head, w

    def own_source(self, best: tuple[float, list[Step], int] | None) -> tuple[str, str]:
        """Which method made the H-ILP's own schedule, for the message and for the result's
        ``produced_by``. The flat start is the refined top's start, so a top that improves on
        nothing returns it unchanged: then it is that solver's schedule, not the H-ILP's (issue
        18: torch_resnet_train at 50%, 300 s, one core: the refined top solved to optimality
        returned fastsa's own 9.11%, and the message said "used: H-ILP")."""
        if best is not None and self.flat_start is not None and best[0] >= self.flat_start[0]:
            return (
                f"{self.flat_name}'s schedule, the flat start (no H-ILP schedule was cheaper)",
                f"{self.flat_name} (flat start)",
            )
        return "H-ILP", "hilp"

    def solve_top(
        self,
        inst: Instance,
        target: int,
        share: float = 1.0,
        prefer: list[int | None] | None = None,
        follows: bool = False,
    ) -> tuple[tuple[float, list[Step], int] | None, list[str], int]:
        """The top H-ILP under the user's budget, with `share` of the top's time; when the
        simulated peak exceeds it (the ILP's memory model is an approximation, App. B.3) the ILP
        budget is lowered and it is solved again. ``follows``: the instance follows the whole-graph
        schedule (:func:`follow`), which is its start. Returns the schedule within budget (cost,
        steps, peak), the statuses and the lowest simulated peak."""
        g = self.g
        tries = 0
        statuses: list[str] = []
        lowest = 1 << 62
        kept: tuple[float, list[Step], int] | None = None
        while tries < 4:
            tries += 1
            top_time = None
            if self.limit is not None:
                # 15% of the limit stays for the whole-graph fallback; deterministic runs size
                # their work limit from the nominal split, never from the clock
                if self.deterministic:
                    left = (self.ilp_share - 0.5) * self.span() * share
                else:
                    left = (self.ilp_share * self.limit - self.elapsed()) * (share if tries == 1 else 1.0)
                top_time = max(0.2, left) * (0.8 if tries == 1 else 0.5)
            starts: list[list[tuple[int, int]]] = []
            sched, top_status = solve_instance(
                inst,
                target,
                top_time,
                self.backend,
                self.opt.seed,
                self.deterministic,
                corrections=True,
                deadline=self.deadline,
                prefer=prefer,
                flat=self.flat_seq if follows else None,
                starts=starts,
            )
            statuses.append(top_status)
            if sched is None and follows and self.flat_start is not None:
                # the instance follows the whole-graph schedule, so that schedule is its start
                # (decoded exactly, see flat_hint): an H-ILP too large to build or solve in time
                # (the dense refined top of torch_resnet_train) still returns it, as a MIP
                # engine returns its start
                statuses[-1] += " (its start, the whole-graph schedule it follows)"
                return self.flat_start, statuses, min(lowest, self.flat_start[2])
            if sched is None:
                break
            sims = []
            # a start the engine did not improve on is its schedule: simulated once
            for cand in (sched, *(s for s in starts if s != sched)):
                steps = steps_from_sequence(g, flatten(inst, cand)[0])
                csim = self.simulated(steps)
                if csim is not None:
                    sims.append((csim, steps))
            if not sims:
                break
            sim, steps = sims[0]
            lowest = min(lowest, sim.peak_memory)
            self.opt.progress(stage="top", attempt=tries, peak=sim.peak_memory, cost=sim.cost)
            if sim.peak_memory <= self.budget:
                # the engine's schedule may be cheaper than its start in the H-ILP's objective
                # (App. B.3's approximations) but not in the simulator: the cheaper one counts,
                # so that a top is never costlier than its start
                fits = [(c.cost, st, c.peak_memory) for c, st in sims if c.peak_memory <= self.budget]
                return min(fits, key=lambda f: f[0]), statuses, lowest
            # the engine's schedule fails the simulator; its start (an H-ILP solution too) may not
            for ssim, ssteps in sims[1:]:
                if ssim.peak_memory <= self.budget and (kept is None or ssim.cost < kept[0]):
                    kept = (ssim.cost, ssteps, ssim.peak_memory)
            if kept is not None:
                break  # the start holds: asking for less would rule it out
            # the ILP's memory model was optimistic: ask it for proportionally less
            over = sim.peak_memory - self.budget
            target -= max(over, int(0.02 * max(target, 1)))
            if target <= 0:
                break
        return kept, statuses, lowest

    def simulated(self, steps: list[Step]) -> SimResult | None:
        """The simulator's verdict on a schedule decoded from the H-ILP's units, or None (and a
        note in the message) where it is not a valid schedule: resnet50_b32 at 70%, 60 s, one
        worker, a trivial-option sequence read a value before its producer ran (a unit's
        option built from the flat start, since fixed in `flat_option`), and the run ended in
        a traceback instead of with the flat start's schedule. Kept as the net under every
        option source."""
        try:
            return simulate(self.g, steps)
        except ScheduleError as e:
            note = f"an H-ILP schedule failed the simulator and was skipped ({e})"
            if note not in self.helper_notes:
                self.helper_notes.append(note)
            return None

    def flat_order(self) -> dict[str, int] | None:
        """Operator -> rank of its first computation in the whole-graph schedule (flat_start)."""
        return first_ranks(self.flat_seq) if self.flat_seq else None


def _leaf_failure_notes(failures: list[tuple[str, str]]) -> list[str]:
    """One note per failed leaf solver: its first failure, and on how many more subgraphs."""
    first: dict[str, str] = {}
    more: dict[str, int] = {}
    for name, note in failures:
        if name in first:
            more[name] = more.get(name, 0) + 1
        else:
            first[name] = note
    return [
        note + (f" (and on {more[name]} more subgraphs)" if name in more else "")
        for name, note in first.items()
    ]


def _baseline_steps(g: Graph) -> list[Step]:
    from remat_cli.schedule import baseline_steps

    return baseline_steps(g)
