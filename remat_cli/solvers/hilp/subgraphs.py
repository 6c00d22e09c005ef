"""Solving one H-ILP, and one unit for its options under several budgets (Gusak et al.,
*HiREmate*, §3.2.1-3.2.2: the bottom-up H-Solver and the "framework of solvers").
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from remat_cli.graph import Graph
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.schedule import baseline, peak_lower_bound
from remat_cli.solver import SolveOptions
from remat_cli.solvers.hilp.context import LOSS, Ctx
from remat_cli.solvers.hilp.instance import Instance, build_instance
from remat_cli.solvers.hilp.model import (
    OutOfTime,
    decode,
    flatten,
    hilp_model,
    trivial,
)
from remat_cli.solvers.hilp.units import (
    Opt,
    Unit,
    measure,
    pareto,
    unit_graph,
)
from remat_cli.solvers.hilp.warmstart import flat_hint, recompute_hint, sequential_hint

# ------------------------------------------------------------------------------------------------
# Solving one unit for its options


@dataclass
class Job:
    unit: Unit
    fractions: tuple[float, ...]
    time_limit: float | None
    backend: str
    seed: int
    deterministic: bool
    leaf_solvers: tuple[str, ...]
    deadline: float | None = None  # epoch seconds (worker processes share the clock)


_CTX: Ctx | None = None  # set before forking the worker processes


#: deterministic mode: HiGHS branch-and-bound nodes per second of an ILP's share, per unit of
#: model size (variables + rows) -- a work limit in place of the wall clock
NODE_RATE = 2e6


def solve_instance(
    inst: Instance,
    budget: int,
    time_limit: float | None,
    backend: str,
    seed: int,
    deterministic: bool,
    corrections: bool = False,
    kept_budget: int | None = None,
    gap: float = 1e-4,
    deadline: float | None = None,
    prefer: list[int | None] | None = None,
    flat: Sequence[str] | None = None,
    starts: list[list[tuple[int, int]]] | None = None,
) -> tuple[list[tuple[int, int]] | None, str]:
    """Solve one H-ILP. With ``deterministic`` (one worker and a seed) the engine stops on work
    done, not on the wall clock, so a seeded run repeats exactly: CP-SAT on its deterministic
    time, HiGHS on a node limit sized from ``time_limit`` and the model. The wall clock
    (``deadline``, epoch seconds: the end of the ILP work) still stops a HiGHS run that would
    overrun the user's time limit -- HiGHS has no work limit on its root node -- and what such
    a run found is dropped (the status says so), so that only work-limited results count."""
    if deadline is not None and time.time() > deadline:
        # said apart from a model too large to build in time: where the flat start and the
        # hierarchy used the ILP work's share, the tops are never built (the ONNX exports at 60 s)
        return None, "not solved: the end of the ILP work had passed before its model was built"
    # building the model and its start must not outlast the end of the ILP work either: a top
    # level the H-Partition could not shrink takes minutes to build (RL n500: 310 items, 170 s)
    try:
        integral = backend == "cpsat"  # CP-SAT takes integer variables only
        model, R = hilp_model(inst, budget, corrections, kept_budget, deadline=deadline, integral=integral)
        hint = sequential_hint(inst, model, prefer)
        if hint is None:
            hint = recompute_hint(inst, model, budget, deadline=deadline)
        if flat is not None:
            fh, need = flat_hint(inst, model, flat, prefer)
            if fh is None and need is not None:
                # the H-ILP's memory rows are stricter than the simulator on this schedule (App.
                # B.3's correction terms bound a compute node's sub-steps from above): the
                # instance is posed under the budget the start needs, and every schedule it
                # gives is checked by the simulator against the real one (solve_top)
                model, R = hilp_model(
                    inst, need, corrections, kept_budget, deadline=deadline, integral=integral
                )
                fh, _ = flat_hint(inst, model, flat, prefer)
            if fh is not None and (hint is None or model.objective(fh) < model.objective(hint)):
                hint = fh
        if hint is not None and starts is not None:
            starts.append(decode(inst, hint, R))
    except OutOfTime:
        return None, f"not solved: its model ({len(inst.items)} items) took longer to build than its time"
    engine_options: dict[str, dict[str, Any]] = {}
    wall = time_limit
    if deterministic and time_limit is not None:
        size = model.num_vars + model.num_constraints
        nodes = max(10, int(time_limit * NODE_RATE / max(1, size)))
        engine_options["highs"] = {"mip_max_nodes": nodes}
        if backend == "highs":
            wall = None if deadline is None else max(0.05, deadline - time.time())
    settings = EngineSettings(
        backend=backend,
        time_limit=wall,
        threads=1,
        seed=seed,
        deterministic=deterministic,
        rel_gap=gap,
        engine_options=engine_options,
        hint=hint,
        # HiGHS can stay a minute in native code past its own limit (after the root cut loop of
        # torch_resnet_train's refined top at 70%: 94-104 s on a 40 s limit): killed 1 s after
        # the end of the ILP work, what it found is lost and the start stands
        hard_deadline=None if deadline is None else time.monotonic() + max(0.0, deadline - time.time()) + 1.0,
    )
    res = milp_solve(model, settings)
    status = res.status
    if res.backend and res.backend != backend:
        # the engine asked for could not take the model (a size-limited Gurobi licence): the
        # message must name the one that ran, not the one asked for
        status += f" ({res.message})"
    if deterministic and wall is not None and deadline is not None and time.time() >= deadline - 0.05:
        # a solution the clock picked is not reproducible: drop it; the sequential start (a
        # deterministic function of the options) and the fallbacks stand in
        res.x = None
        status += " (stopped by the clock: dropped for determinism)"
    if res.x is None or (hint is not None and model.objective(res.x) > model.objective(hint) + 1e-9):
        if hint is None:
            return None, status
        return decode(inst, hint, R), status + " (its start)"
    return decode(inst, res.x, R), status


def unit_options(ctx: Ctx, job: Job) -> tuple[list[Opt], list[tuple[str, str]]]:
    """Schedules of the unit under several budgets (its options), plus the two trivial ones;
    and the failures of its leaf solvers as (solver, note) for the H-ILP's message."""
    unit = job.unit
    assert unit.children is not None
    inst = build_instance(ctx, unit.children, with_loss=unit.layer)
    owned = unit.owned
    found: list[Opt] = []
    for pick in ("time", "peak"):
        f, b = flatten(inst, trivial(inst, pick))
        found.append(measure(ctx, owned, f, b))
        if unit.layer:
            # keep nothing between forward and backward: the backward pass recomputes the forward
            found.append(measure(ctx, owned, f, f + b))
    sub = unit_graph(ctx, unit)
    hi = baseline(sub).peak_memory
    lo = peak_lower_bound(sub)
    res = sub.resident_bytes
    runs: list[tuple[int, int | None]] = [(int(lo + frac * (hi - lo)) - res, None) for frac in job.fractions]
    if unit.layer and inst.loss is not None:
        # options that bound what is kept from forward to backward (the phantom) rather than
        # the peak: the top level trades exactly that against backward time
        fixed = sum(s for d, s in enumerate(inst.sizes) if inst.producer[d] == inst.loss)
        fixed += sum(s for d, s in enumerate(inst.sizes) if any(k == inst.loss for k, _ in inst.users[d]))
        p0 = found[0].phantom
        runs += [(hi - res, fixed + int(frac * p0)) for frac in job.fractions[1:]]
    per = None if job.time_limit is None else job.time_limit / max(1, len(runs))
    for budget, kept in runs:
        # options need not be proven optimal: a 1% gap saves most of the search
        sched, _ = solve_instance(
            inst, budget, per, job.backend, job.seed, job.deterministic, True, kept, 0.01, job.deadline
        )
        if sched is not None:
            f, b = flatten(inst, sched)
            found.append(measure(ctx, owned, f, b))
    failures: list[tuple[str, str]] = []
    for name in job.leaf_solvers:
        found.extend(_leaf_solver_options(ctx, unit, sub, name, lo, hi, job, failures))
    return pareto(found), failures


#: longest note on a failed leaf solver sent back from a worker process
NOTE_CHARS = 200


def _leaf_solver_options(
    ctx: Ctx, unit: Unit, sub: Graph, name: str, lo: int, hi: int, job: Job, failures: list[tuple[str, str]]
) -> list[Opt]:
    """Options from another registered solver run on the unit's own Graph (the "framework of
    solvers", §3.2.1): its compute sequence, split at the virtual loss. Run through
    ``registry.call_solver``: an unknown, unavailable or inapplicable solver adds nothing; a
    failure costs the options of that budget and adds a short note to `failures` (its first
    failure on this unit), which travels back from a job process with the options."""
    from remat_cli import registry

    out = []
    per = None if job.time_limit is None else job.time_limit / max(1, len(job.fractions))
    notes: list[str] = []
    for frac in job.fractions:
        budget = int(lo + frac * (hi - lo))
        failed = len(notes)
        r = registry.call_solver(
            name, sub, budget, SolveOptions(time_limit=per, seed=job.seed, workers=1), notes
        )
        if r is None and len(notes) == failed:
            break  # unknown, unavailable or not applicable: at any budget
        if r is None:
            if failed == 0:
                note = f"subgraph {(unit.fwd + unit.bwd)[0]!r} ({unit.ops} operators): {notes[0]}"
                failures.append((name, note if len(note) <= NOTE_CHARS else note[: NOTE_CHARS - 1] + "…"))
            continue
        if r.steps is None:
            continue
        seq = [s.node for s in r.steps if s.op == "compute" and s.node is not None]
        if seq.count(LOSS) > 1:
            continue  # the rest of the graph runs once
        if LOSS in seq:
            i = seq.index(LOSS)
            fwd, bwd = seq[:i], seq[i + 1 :]
        else:
            fwd, bwd = seq, []
        if any(n in unit.bwd for n in fwd) or not set(unit.fwd) <= set(fwd) or not set(unit.bwd) <= set(bwd):
            continue  # not a forward/backward schedule of the whole unit
        out.append(measure(ctx, unit.owned, fwd, bwd))
    return out


def _run_job(job: Job) -> tuple[list[Opt], list[tuple[str, str]]]:
    assert _CTX is not None
    return unit_options(_CTX, job)


def run_jobs(ctx: Ctx, jobs: list[Job], n: int) -> list[tuple[list[Opt], list[tuple[str, str]]]]:
    """Options of independent units (and their leaf solvers' failures, see :func:`unit_options`),
    in `n` forked processes when n > 1."""
    if n <= 1 or len(jobs) <= 1:
        return [unit_options(ctx, j) for j in jobs]
    global _CTX
    _CTX = ctx
    import multiprocessing as mp

    with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("fork")) as ex:
        return list(ex.map(_run_job, jobs))
