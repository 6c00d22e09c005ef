"""One thin layer over the MILP engines: build a model in bulk with numpy, solve it on any backend.

Why this shape: the rematerialization MILPs (Checkmate, H-ILP) have O(T²)–O(T·E) variables and
rows — ~10⁵–10⁶ at T = 250. Building them through a modelling language's Python expressions
costs seconds to minutes; here a model is a handful of numpy arrays (a COO matrix appended block
by block) and each backend receives it in one piece: OR-Tools MathOpt gets a ``ModelProto``
filled from the arrays and is called through its C++ ``solve`` directly (no Python
``mathopt.Model``), gurobipy gets ``addMVar``/``addMConstr`` with a scipy CSR matrix.

API
---
``LinearModel``
    ``x = m.add_vars(n, lb=0, ub=1, integer=True, cost=0.0)`` → int array of the new column
    indices (``lb``/``ub``/``cost`` scalars or arrays of length ``n``).
    ``m.add_constraints(rows, cols, coefs, lb, ub)`` adds ``len(lb)`` rows (``lb``/``ub`` arrays,
    or scalars with ``count=``); ``rows`` are 0-based *within the block*; duplicate (row, col)
    pairs are summed; ``-inf``/``inf`` bounds mean one-sided. Returns the new row indices.
    ``m.objective_offset`` is added to every reported objective and bound.
    ``m.num_vars``, ``m.num_constraints``, ``m.matrix()`` (scipy CSR).

``EngineSettings`` (all optional)
    ``backend``: ``"auto" | "highs" | "scip" | "cpsat" | "gurobi"``; ``"auto"`` tries
    ``auto_order`` (default gurobi → highs → scip → cpsat) and takes the first usable one.
    ``time_limit`` (s, None = none), ``threads`` (HiGHS and SCIP ignore it: MathOpt's HiGHS
    rejects ``threads`` — it is a HiGHS global — and SCIP is single-threaded), ``seed``,
    ``rel_gap`` (relative MIP gap at which a solution counts as optimal; default 1e-6),
    ``hint`` (a full vector of variable values used as the engine's starting solution),
    ``relax`` (solve the LP relaxation: integrality dropped; HiGHS, SCIP→HiGHS, Gurobi, and
    ``backend="pdlp"``: OR-Tools' first-order PDLP, for LPs too large for simplex — its point is
    approximate, its ``bound`` the :func:`lagrangian_bound` of its dual, always valid),
    ``deterministic`` (CP-SAT: stop on a deterministic-time budget instead of wall time, so a
    seeded single-worker run is reproducible), ``on_solution(x, objective)`` called for each
    new incumbent while the engine runs (CP-SAT, SCIP and Gurobi report them; HiGHS does not
    expose incumbents through MathOpt, so only the final one), ``on_progress(facts)`` with
    ``elapsed``, ``objective``, ``bound``, ``gap`` (HiGHS: parsed from its log lines),
    ``lp_algorithm`` (relax only: ``primal``, ``dual``, ``barrier``, ``first_order``),
    ``engine_options`` (per backend: ``{"highs": {"mip_heuristic_effort": 0.3}}`` — HiGHS option
    names, SCIP parameter paths, CP-SAT SatParameters fields, Gurobi parameter names), ``on_log`` (engine log lines),
    ``hard_deadline`` (time.monotonic(): the engine runs in a forked process killed then).

``solve(model, settings) -> MilpResult``
    ``status``: ``optimal`` (proved within ``rel_gap``), ``feasible`` (a solution, limit hit),
    ``infeasible`` (proved), ``unknown`` (no solution, nothing proved); ``objective``,
    ``bound`` (best proved lower bound, minimisation), ``gap`` (relative), ``x`` (numpy
    array or None), ``backend`` (the engine that actually ran), ``message`` (why that engine,
    e.g. "gurobi: size-limited licence refused the model (12000 variables); fell back to
    highs"), ``seconds``.

CP-SAT works on integers: every variable must be integer and every constraint coefficient and
bound integral (scale memory by the gcd of the sizes before building); the objective may be
fractional. ``solve`` says so in ``message`` and falls back when that does not hold.

The model is built as numpy arrays and handed to the engine as one sparse matrix (CSR, then
MathOpt's ModelProto), not through ``mathopt.Model``'s Python expressions, which take minutes on
the 10⁶-row Checkmate models. The ``LinearModel`` arrays are backend-neutral, so H-ILP and
Checkmate share this path.

Layout: :mod:`remat_cli.milp.model` (the model, settings and result types), :mod:`remat_cli.milp.mathopt`
(OR-Tools MathOpt backends), :mod:`remat_cli.milp.gurobi` (gurobipy); this module discovers the
backends, picks one (:func:`solve`) and re-exports the names above.
"""

from __future__ import annotations

import multiprocessing
import os
import time

from remat_cli.milp.gurobi import GUROBI_PIP_LIMIT, gurobi_status, solve_gurobi
from remat_cli.milp.mathopt import (
    LOAD_SECONDS_PER_NONZERO,
    PROTO_SECONDS_PER_NONZERO,
    lagrangian_bound,
    model_proto,
    setup_seconds,
    solve_mathopt,
)
from remat_cli.milp.model import (
    BACKENDS,
    DEFAULT_AUTO_ORDER,
    LP_BACKENDS,
    EngineError,
    EngineSettings,
    LinearModel,
    MilpResult,
    Status,
)

__all__ = [
    "BACKENDS",
    "DEFAULT_AUTO_ORDER",
    "EngineError",
    "EngineSettings",
    "GUROBI_PIP_LIMIT",
    "LOAD_SECONDS_PER_NONZERO",
    "LP_BACKENDS",
    "LinearModel",
    "MilpResult",
    "PROTO_SECONDS_PER_NONZERO",
    "Status",
    "available_backends",
    "lagrangian_bound",
    "model_proto",
    "setup_seconds",
    "solve",
]


def available_backends() -> dict[str, tuple[bool, str]]:
    """name → (usable, reason when not). MathOpt's HiGHS, SCIP and CP-SAT ship with ortools."""
    out: dict[str, tuple[bool, str]] = {}
    try:
        from ortools.math_opt.core.python import solver  # noqa: F401

        for b in ("highs", "scip", "cpsat", *LP_BACKENDS):
            out[b] = (True, "")
    except ImportError as e:  # pragma: no cover - ortools is a dependency
        for b in ("highs", "scip", "cpsat", *LP_BACKENDS):
            out[b] = (False, f"ortools.math_opt unavailable: {e}")
    out["gurobi"] = gurobi_status()
    return out


# ----------------------------------------------------------------------------------------------
# Entry point


def solve(model: LinearModel, settings: EngineSettings | None = None) -> MilpResult:
    """Solve `model` on the chosen backend, falling back (and saying why) when it cannot run."""
    s = settings or EngineSettings()
    avail = available_backends()
    if s.backend == "auto":
        order = list(s.auto_order)
    elif s.backend in BACKENDS or s.backend in LP_BACKENDS:
        order = [s.backend] + [b for b in s.auto_order if b != s.backend]
    else:
        raise ValueError(f"unknown backend {s.backend!r} (known: auto, {', '.join(BACKENDS)})")
    notes: list[str] = []
    t0 = time.monotonic()
    for b in order:
        ok, why = avail.get(b, (False, "unknown backend"))
        if not ok:
            if s.backend != "auto" or b == "gurobi":
                notes.append(f"{b}: {why}")
            continue
        if b == "cpsat" and not s.relax:
            why = model.integral()
            if why is not None:
                notes.append(f"cpsat: needs an all-integer model ({why})")
                continue
        if b == "cpsat" and s.relax:
            notes.append("cpsat: cannot solve an LP relaxation")
            continue
        if b in LP_BACKENDS and not s.relax:
            notes.append(f"{b}: solves LP relaxations only")
            continue
        left = None if s.time_limit is None else max(0.0, s.time_limit - (time.monotonic() - t0))
        try:
            if _killable(s):
                res = _solve_in_child(model, s, b, left)
            elif b == "gurobi":
                res = solve_gurobi(model, s, left)
            else:
                res = solve_mathopt(model, s, b, left)
        except EngineError as e:
            notes.append(f"{b}: {e}")
            continue
        why_this = f"{b} ran" + (f" (auto: first usable of {'/'.join(order)})" if s.backend == "auto" else "")
        res.message = "; ".join([*notes, why_this] + ([res.message] if res.message else []))
        res.seconds = time.monotonic() - t0
        return res
    raise EngineError("no MILP engine could run the model: " + "; ".join(notes))


def _killable(s: EngineSettings) -> bool:
    """Whether the solve runs in a child process killed at ``s.hard_deadline``: callbacks would
    fire in the child, so they keep the solve in this process, and a daemonic process (e.g. a
    portfolio member) may not have children."""
    return (
        s.hard_deadline is not None
        and hasattr(os, "fork")
        and not multiprocessing.current_process().daemon
        and s.on_solution is None
        and s.on_progress is None
        and s.on_log is None
    )


def _solve_in_child(model: LinearModel, s: EngineSettings, backend: str, left: float | None) -> MilpResult:
    """The solve in a forked process, killed at ``s.hard_deadline`` (then "unknown", no solution)."""
    assert s.hard_deadline is not None
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child() -> None:
        try:
            res = (
                solve_gurobi(model, s, left)
                if backend == "gurobi"
                else solve_mathopt(model, s, backend, left)
            )
            send.send(("ok", res))
        except EngineError as e:
            send.send(("engine", str(e)))
        except BaseException as e:  # noqa: BLE001 - re-raised in the parent
            send.send(("error", RuntimeError(f"{type(e).__name__}: {e}")))

    proc = ctx.Process(target=child, daemon=True)
    proc.start()
    send.close()
    try:
        if recv.poll(max(0.0, s.hard_deadline - time.monotonic())):
            kind, payload = recv.recv()
        else:
            kind, payload = "killed", None
    except EOFError:
        kind, payload = "error", RuntimeError("the engine's process ended without a result")
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()
        recv.close()
    if kind == "ok":
        return payload  # type: ignore[no-any-return]
    if kind == "engine":
        raise EngineError(payload)
    if kind == "error":
        raise payload
    return MilpResult(status="unknown", backend=backend, message=f"{backend} killed at the hard deadline")
