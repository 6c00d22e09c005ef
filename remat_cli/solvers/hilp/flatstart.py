"""The H-ILP's whole-graph schedules: the flat start it is cut along and starts from, the
early incumbent and the fallbacks it competes with (HiREmate's "framework of solvers",
§3.2.1, applied to the whole graph). A mixin of :class:`remat_cli.solvers.hilp.solver.HilpRun`.
"""

from __future__ import annotations

import multiprocessing
import time
from functools import cached_property
from typing import Any

from remat_cli.graph import Graph
from remat_cli.schedule import Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.solvers.hilp.context import Ctx
from remat_cli.solvers.hilp.portfolio import FALLBACK
from remat_cli.solvers.hilp.units import Unit, flat_option

#: nominal share of the time limit for the whole-graph solvers of ``flat_start``: the hierarchy's
#: nominal shares are taken of the rest (:meth:`Levels.span`). fastsa runs as it would alone
#: with the whole limit (its iteration budget and its own clock check), so that the H-ILP starts
#: where fastsa alone ends (with a share of the limit's iterations it starts well above that)
FLAT_SHARE = 0.3
#: each other flat-start solver's limit, a share of the limit (moccasin: deterministic time with
#: one worker), at most what fastsa left of it (and 1 s at least)
FLAT_OTHER = 0.1
#: with one worker (reproducible runs) that limit is at least this: moccasin stops on CP-SAT's
#: deterministic time only while its wall clock has room (a 3-layer transformer at 50%, seed 3,
#: six runs each: 0.8 s gave two different schedules, 2 s one), and the flat start it may win
#: decides the H-ILP's result
FLAT_OTHER_REPRODUCIBLE = 2.0


def solver_names(p: dict[str, Any], key: str) -> list[str]:
    """The solver names of a comma-separated option (--flat-start, --leaf-solvers)."""
    return [n for n in str(p.get(key) or "").split(",") if n]


class WholeGraph:
    """The whole-graph solvers around the H-ILP; the state they read and set is :class:`_Solve`'s."""

    g: Graph
    budget: int
    opt: SolveOptions
    p: dict[str, Any]
    limit: float | None
    deterministic: bool
    parallel: bool
    helper_notes: list[str]
    flat_seq: list[str] | None
    flat_start: tuple[float, list[Step], int] | None
    flat_name: str
    started: float

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @cached_property
    def fitting_hint(self) -> tuple[float, list[Step], int] | None:
        """The caller's hint as (cost, steps, peak) where it is within the budget, else None
        (simulated once: the flat start, the early incumbent and the fallbacks all ask)."""
        if self.opt.hint is None:
            return None
        sim = simulate(self.g, self.opt.hint)
        return (sim.cost, list(self.opt.hint), sim.peak_memory) if sim.peak_memory <= self.budget else None

    def flat_schedule(self) -> None:
        """Issue 18: the whole-graph schedules of ``flat_start`` (fastsa's and moccasin's by
        default), run first: fastsa as it runs alone with the whole limit, the others with
        ``FLAT_OTHER`` of it (at most what fastsa left); the hint, when within budget, is one
        more (``warm_starts``). The cheapest
        within budget is kept in ``flat_seq`` (its compute sequence); when none is, greedy's (at
        most 5 s;
        transformer_b32 at 50%: fastsa had none in 15 s where greedy's cost 11.9%, and the
        H-ILP's own top 70.7%). The refined top is cut along it (:func:`follow`) and starts from
        it (:func:`flat_hint`); it gives the layers one more option each (:meth:`flat_options`)."""
        self.flat_seq = []
        named = solver_names(self.p, "flat_start")
        from remat_cli import registry

        found: tuple[float, list[Step], int, str] | None = None
        if self.fitting_hint is not None:
            # the caller's schedule (--hint; auto's lane: the schedule of the solvers before this
            # one, fastsa's, which it then leaves out of --flat-start rather than run it twice)
            found = (*self.fitting_hint, "the hint")
            self.opt.incumbent(found[1])
        for name in named + (["greedy"] if named and "greedy" not in named else []):
            if name == "greedy" and name not in named and found is not None:
                break
            if name not in registry.names():
                continue
            solver = registry.get(name)
            if solver.availability()[0] != "available" or solver.supports(self.g) is not None:
                continue
            # compiled kernels loaded (fastsa: numba) before its clock starts, as the CLI does
            # for the solver it runs
            solver.prepare()
            params = solver.defaults()
            left = None
            if self.limit is not None:
                left = (
                    self.limit
                    if name == "fastsa"
                    else min(FLAT_OTHER * self.limit, max(1.0, self.limit - self.elapsed()))
                )
                if self.deterministic and name != "fastsa":
                    left = max(left, FLAT_OTHER_REPRODUCIBLE)
                if name not in named:
                    left = min(5.0, left)
            # greedy with one worker (the deterministic mode) runs every strategy to its end
            # whatever its limit (resnet18_b32 at 50%: 10 s and more for "at most 5 s"); with two
            # it is held to it, at the price of a clock-dependent start where it is cut
            # fastsa runs one chain per core the portfolio leaves (its chains module)
            workers = {"greedy": 2, "fastsa": max(1, self.opt.workers - self.parallel)}.get(name, 1)
            opts = SolveOptions(time_limit=left, seed=self.opt.seed, workers=workers)
            if name == "fastsa":
                # its schedules so far are the flat start's (the H-ILP's own, see below); with
                # fallbacks on they stand in for early_incumbent's greedy
                opts.on_incumbent = self.opt.on_incumbent
            if name == "fastsa" and left is not None:
                # as fastsa runs alone: the same iterations, and the same clock for shortening its
                # first stage and cutting its greedy start, so the flat start is fastsa's own
                # schedule. Stopped at 0.75 or 0.9 of the limit, on the ONNX exports at 50% the
                # H-ILP's own schedule ended 1.5-4 points above fastsa alone (torch_resnet_train
                # 13.7% vs 9.85%, mobilenet_v2_b1 14.0% vs 9.9%); the clock still decides where
                # its first stage is shortened (unshortened, both 9.85%). The H-ILP gets what it
                # leaves, and the CLI's watchdog returns the flat start where the H-ILP overruns
                opts.nominal_limit = self.opt.work_limit()
            opts.params = params
            if name == "fastsa" or left is None or multiprocessing.current_process().daemon:
                r = registry.call_solver(name, self.g, self.budget, opts, self.helper_notes)
            else:
                r = self.guarded(name, opts)
            if r is None or r.steps is None:
                continue
            if self.deterministic and r.params.get("clock_stopped"):
                # one worker promises the same schedule for a seed: moccasin's where the clock, not
                # its deterministic budget, stopped it is not (a 3-layer transformer at 50%, seed 3,
                # limit 8: three schedules in four runs, fresh-clone CI saw two)
                self.helper_notes.append(f"{name}'s schedule dropped for determinism (stopped by the clock)")
                continue
            sim = simulate(self.g, r.steps)
            if sim.peak_memory <= self.budget and (found is None or sim.cost < found[0]):
                found = (sim.cost, r.steps, sim.peak_memory, name)
                # at once, with fallbacks off too: the flat start is the H-ILP's own schedule (the
                # refined top's start, and its schedule where that top is not solved in time), and
                # a hierarchy or engine overrunning the limit (the watchdog then returns the last
                # incumbent) must not cost it (mobilenet_v2_b32 at 50%, --fallback none: 34.2%
                # returned at the limit where the flat start had 1.44% at 22 s)
                self.opt.incumbent(r.steps)
        if found is None:
            return
        cost, steps, peak, self.flat_name = found
        self.flat_seq = [s.node for s in steps if s.op == "compute" and s.node is not None]
        self.flat_start = (cost, steps, peak)

    def guarded(self, name: str, opts: SolveOptions) -> SolverResult | None:
        """A flat-start solver other than fastsa (which keeps to its clock) in a forked child
        killed 1 s after its limit, with its best schedule so far: moccasin's model building and
        eviction starts are not clocked (resnet18_b32 at 50%: 25 s for a share of 6 s). The
        child is daemonic and stays in this process group, so that whoever kills this process
        (the CLI's watchdog kills its group) kills it too; not the watchdog's own ``run_guarded``,
        whose child leaves the group and would outlive a killed H-ILP."""
        from remat_cli import registry

        assert opts.time_limit is not None
        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)

        def child() -> None:
            opts.on_incumbent = lambda steps: send.send(("incumbent", steps))
            notes: list[str] = []
            r = registry.call_solver(name, self.g, self.budget, opts, notes)
            send.send(("result", (r, notes)))

        proc = ctx.Process(target=child, daemon=True)
        deadline = time.monotonic() + opts.time_limit + 1.0
        proc.start()
        send.close()
        last: list[Step] | None = None
        try:
            while recv.poll(max(0.0, deadline - time.monotonic())):
                kind, payload = recv.recv()
                if kind == "result":
                    r, notes = payload
                    self.helper_notes.extend(notes)
                    return r  # type: ignore[no-any-return]
                last = payload
        except EOFError:
            self.helper_notes.append(f"{name} failed: its process ended without a result")
        finally:
            if proc.is_alive():
                proc.kill()
            proc.join()
            recv.close()
        if last is None:
            return None
        return SolverResult(steps=last, status="feasible", message="stopped", params={"clock_stopped": True})

    def flat_options(self, ctx: Ctx, units: list[Unit]) -> list[int | None] | None:
        """The whole-graph schedule (:meth:`flat_schedule`) translated into one more option per
        layer unit (:func:`flat_option`); returns each unit's index of it (None where none),
        which the top H-ILP's sequential start tries first (:func:`sequential_hint`)."""
        if self.flat_seq is None:
            self.flat_schedule()
        if not self.flat_seq or not any(u.layer for u in units):
            return None
        prefer: list[int | None] = []
        for u in units:
            o = flat_option(ctx, u, self.flat_seq)
            if o is None:
                prefer.append(None)
                continue
            same = [i for i, q in enumerate(u.options) if (q.fwd, q.bwd) == (o.fwd, o.bwd)]
            if not same:
                u.options.append(o)
                same = [len(u.options) - 1]
            prefer.append(same[0])
        return prefer if any(o is not None for o in prefer) else None

    def fallback(self, best: tuple[float, list[Step]] | None) -> tuple[float, list[Step], int, str] | None:
        """The cheapest schedule within budget of greedy and fastsa (in this fixed order, fastsa
        with the time left and the cheapest schedule so far as its hint: where its first stage
        ends above the budget, its second starts from there), or None. The flat start is not
        among them: it is already a candidate of the H-ILP's own schedule, `best`."""
        from remat_cli import registry

        out: tuple[float, list[Step], int, str] | None = None
        for name in FALLBACK:
            if name not in registry.names():
                continue
            solver = registry.get(name)
            if solver.availability()[0] != "available" or solver.supports(self.g) is not None:
                continue
            if name == "greedy" and self.fitting_hint is not None:
                continue  # a last resort where the hint is one (auto's lane: greedy's or better)
            left = None
            if self.limit is not None:
                # the 15% kept for this step; deterministic runs take the nominal share (fastsa
                # sizes its iteration budget from it), others whatever the clock has left. (The
                # clock as the deterministic runs' limit too, with the share as their work, broke
                # test_deterministic_when_ilps_hit_their_limits: where the hierarchy overran, the
                # clock cut fastsa.)
                left = 0.15 * self.limit if self.deterministic else self.limit - self.elapsed() - 0.5
                # greedy is cheap and needs its few strategies to finish: never less than 5 s
                left = max(5.0 if name == "greedy" else 0.5, left)
            hint = min((c for c in (best, out and out[:2]) if c), key=lambda c: c[0], default=(0, None))[1]
            # greedy held to its limit even in the deterministic mode (see flat_schedule)
            workers = max(2, self.opt.workers) if name == "greedy" else self.opt.workers
            opts = SolveOptions(time_limit=left, seed=self.opt.seed, workers=workers, hint=hint)
            opts.params = solver.defaults()
            r = solver.solve(self.g, self.budget, opts)
            if r.steps is None:
                continue
            sim = simulate(self.g, r.steps)
            if sim.peak_memory <= self.budget and (out is None or sim.cost < out[0]):
                out = (sim.cost, r.steps, sim.peak_memory, name)
        return out

    def early_incumbent(self) -> None:
        """Greedy's schedule as an incumbent at once: the hierarchy's leaf ILPs may use up the
        whole time limit, and a watchdog then returns the last incumbent."""
        from remat_cli import registry

        if self.opt.on_incumbent is None or self.p.get("fallback") == "none":
            return  # with fallbacks off, greedy's schedule is not the H-ILP's to return
        if self.fitting_hint is not None:
            return  # the hint is reported at once (flat_schedule), and the last resort
        if "fastsa" in solver_names(self.p, "flat_start"):
            return  # the flat fastsa reports its incumbents within seconds (flat_schedule)
        left = min(5.0, self.limit) if self.limit is not None else 5.0
        sub = SolveOptions(time_limit=left, seed=self.opt.seed, workers=2)  # held to it (flat_schedule)
        r = registry.call_solver("greedy", self.g, self.budget, sub, self.helper_notes)
        if r is not None and r.steps is not None and simulate(self.g, r.steps).peak_memory <= self.budget:
            self.opt.incumbent(r.steps)
