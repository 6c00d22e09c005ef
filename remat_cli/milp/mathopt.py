"""The OR-Tools MathOpt backends (HiGHS, SCIP, CP-SAT, PDLP): a ``ModelProto`` filled straight from
the :class:`~remat_cli.milp.model.LinearModel` arrays, solved through MathOpt's C++ ``solve``
(no Python ``mathopt.Model``); progress parsed from the engines' logs; and the Lagrangian bound
that makes an approximate (PDLP) dual a valid lower bound."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from remat_cli.milp.model import LP_BACKENDS, EngineError, EngineSettings, LinearModel, MilpResult, Status
from remat_cli.schedule import relative_gap

_FEASIBLE = 2  # SolutionStatusProto.SOLUTION_STATUS_FEASIBLE
#: seconds an engine spends outside its own time limit per constraint nonzero (loading the model,
#: uninterruptible presolve steps), measured on Checkmate models of millions of nonzeros: the
#: engine is given its limit less this, so that the whole solve keeps the caller's limit
LOAD_SECONDS_PER_NONZERO = {"scip": 6e-6, "highs": 1.5e-6, "pdlp": 1.6e-6}
#: building the ModelProto from the arrays (model_proto), per nonzero: 13 s for 22.5 M
PROTO_SECONDS_PER_NONZERO = 6e-7


def setup_seconds(model: LinearModel, backend: str) -> float:
    """Seconds a MathOpt solve of `model` spends before and after the engine's own clock (proto
    build, load, result transfer): a caller whose time share is below this should not start it."""
    per = PROTO_SECONDS_PER_NONZERO + LOAD_SECONDS_PER_NONZERO.get(backend, 0.0)
    return per * model.matrix().nnz


_MATHOPT_TYPES = {
    "highs": "SOLVER_TYPE_HIGHS",
    "scip": "SOLVER_TYPE_GSCIP",
    "cpsat": "SOLVER_TYPE_CP_SAT",
    "pdlp": "SOLVER_TYPE_PDLP",
}

# HiGHS MIP log: "Src Proc. InQueue | Leaves Expl. | BestBound BestSol Gap | ... Time"
_HIGHS_ROW = re.compile(
    r"^\s*[A-Za-z]?\s+\d+\s+\d+\s+\d+\s+[\d.]+%\s+(\S+)\s+(\S+)\s+(\S+)\s.*?([\d.]+)s\s*$"
)


def _scip_row(line: str) -> tuple[float, float | None, float | None] | None:
    """(elapsed, dual bound, primal bound) of a SCIP node-table line
    ("d 1.2s|  node | … | dualbound | primalbound |  gap  | compl."), else None."""
    parts = [p.strip() for p in line.split("|")]
    if len(parts) < 6:
        return None
    mt = re.match(r"^[A-Za-z*]?\s*([\d.]+)s$", parts[0])
    if not mt:
        return None
    for i in range(len(parts) - 1, 2, -1):
        if parts[i].endswith("%") or parts[i] == "Inf":
            return float(mt.group(1)), _num(parts[i - 2]), _num(parts[i - 1])
    return None


def _num(tok: str) -> float | None:
    try:
        v = float(tok.rstrip("%"))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def model_proto(model: LinearModel, relax: bool = False) -> Any:
    """The MathOpt ModelProto of `model` (integrality dropped when `relax`)."""
    from ortools.math_opt import model_pb2

    cache_key = f"proto{int(relax)}"
    if cache_key in model._cache:
        return model._cache[cache_key]
    p = model_pb2.ModelProto(name=model.name)
    n = model.num_vars
    p.variables.ids.extend(range(n))
    p.variables.lower_bounds.extend(model.lb.tolist())
    p.variables.upper_bounds.extend(model.ub.tolist())
    p.variables.integers.extend([False] * n if relax else model.integer.tolist())
    c = model.cost
    nz = np.flatnonzero(c)
    p.objective.linear_coefficients.ids.extend(nz.tolist())
    p.objective.linear_coefficients.values.extend(c[nz].tolist())
    p.objective.offset = model.objective_offset
    m = model.num_constraints
    p.linear_constraints.ids.extend(range(m))
    p.linear_constraints.lower_bounds.extend(model.row_lb.tolist())
    p.linear_constraints.upper_bounds.extend(model.row_ub.tolist())
    A = model.matrix()
    mat = p.linear_constraint_matrix
    mat.row_ids.extend(np.repeat(np.arange(m, dtype=np.int64), np.diff(A.indptr)).tolist())
    mat.column_ids.extend(A.indices.tolist())
    mat.coefficients.extend(A.data.tolist())
    model._cache[cache_key] = p
    return p


def _by_type(val: Any, bools: Any, ints: Any, reals: Any, strings: Any) -> Any:
    """The engine's option map for `val`'s type (bool before int: a bool is an int)."""
    if isinstance(val, bool):
        return bools
    if isinstance(val, int):
        return ints
    return reals if isinstance(val, float) else strings


def solve_mathopt(model: LinearModel, s: EngineSettings, backend: str, time_left: float | None) -> MilpResult:
    """`model` solved by `backend` through MathOpt, with the settings `s` within `time_left`
    seconds; the engine's termination, solution, bound and (first-order LPs) dual as a result."""
    from ortools.math_opt import parameters_pb2, result_pb2
    from ortools.math_opt.core.python import solver

    relax = s.relax
    if relax and backend not in ("highs", *LP_BACKENDS):
        backend = "highs"  # SCIP's LP goes through SoPlex-less gscip; HiGHS is the LP engine here
    t_build = time.monotonic()
    proto = model_proto(model, relax=relax)
    params = _solve_parameters(model, s, backend, time_left, t_build)
    mparams = _model_parameters(model, s)
    t0 = time.monotonic()
    best = [math.inf]
    reg, cb = _callback(model, s, backend, t0, best)
    init = parameters_pb2.SolverInitializerProto()
    try:
        raw = solver.solve(
            proto,
            parameters_pb2.SolverTypeProto.Value(_MATHOPT_TYPES[backend]),
            init,
            params,
            mparams,
            _log_reader(s, backend, t0),
            reg,
            cb,
            None,
        )
    except Exception as e:  # StatusNotOk from the C++ layer: the engine refused the model
        raise EngineError(str(e).splitlines()[0][:300]) from e
    r = raw if isinstance(raw, result_pb2.SolveResultProto) else result_pb2.SolveResultProto.FromString(raw)
    return _result(model, s, backend, r, best[0])


def _solve_parameters(
    model: LinearModel, s: EngineSettings, backend: str, time_left: float | None, t_build: float
) -> Any:
    """The engine's SolveParametersProto: time limit (less the model's build and load), threads,
    seed, gaps, LP algorithm and the engine's own options."""
    from ortools.math_opt import parameters_pb2

    relax = s.relax
    params = parameters_pb2.SolveParametersProto()
    if time_left is not None:
        # the engines' clocks start after they have loaded the model, which for SCIP takes
        # seconds on large models: spend the proto build and a load estimate from the budget
        load = LOAD_SECONDS_PER_NONZERO.get(backend, 0.0) * model.matrix().nnz
        secs = max(time_left - (time.monotonic() - t_build) - load, 0.01)
        params.time_limit.seconds = int(secs)
        params.time_limit.nanos = int((secs - int(secs)) * 1e9)
    if backend == "cpsat":
        params.threads = max(1, s.threads)
        params.random_seed = s.seed
        # the MIP importer refuses variables with bounds above mip_max_bound (1e7 by default)
        params.cp_sat.mip_max_bound = 1e15
        if s.deterministic and time_left is not None:
            # a seeded single-worker CP-SAT run is reproducible only when it stops on work done
            params.cp_sat.max_deterministic_time = max(0.05, 0.5 * time_left)
    elif backend == "scip":
        params.random_seed = s.seed
    elif backend == "pdlp":
        params.threads = max(1, s.threads)
    else:
        params.random_seed = s.seed
    if relax and s.lp_algorithm:
        params.lp_algorithm = parameters_pb2.LPAlgorithmProto.Value(
            "LP_ALGORITHM_"
            + {"primal": "PRIMAL_SIMPLEX", "dual": "DUAL_SIMPLEX"}.get(s.lp_algorithm, s.lp_algorithm.upper())
        )
    if not relax:
        params.relative_gap_tolerance = s.rel_gap
        params.absolute_gap_tolerance = 1e-9
    _engine_options(params, s, backend)
    return params


def _engine_options(params: Any, s: EngineSettings, backend: str) -> None:
    """The engine-specific options of `s` (``engine_options[backend]``) set on `params`."""
    for key, val in s.engine_options.get(backend, {}).items():
        if backend == "highs":
            h = params.highs
            _by_type(val, h.bool_options, h.int_options, h.double_options, h.string_options)[key] = val
        elif backend == "scip":
            # SCIP parameter names ("presolving/probing/maxrounds"), by value type
            g = params.gscip
            _by_type(val, g.bool_params, g.int_params, g.real_params, g.string_params)[key] = val
        elif backend == "cpsat":
            setattr(params.cp_sat, key, val)
        elif backend == "pdlp":
            # the two tolerances of PDLP's simple optimality criterion, or PrimalDualHybridGradient
            # parameter fields
            if key in ("eps_optimal_relative", "eps_optimal_absolute"):
                crit = params.pdlp.termination_criteria.simple_optimality_criteria
                setattr(crit, key, float(val))
            else:
                setattr(params.pdlp, key, val)


def _model_parameters(model: LinearModel, s: EngineSettings) -> Any:
    """The ModelSolveParametersProto: the hint (MIP only) as a solution hint."""
    from ortools.math_opt import model_parameters_pb2

    relax = s.relax
    mparams = model_parameters_pb2.ModelSolveParametersProto()
    if s.hint is not None and not relax:
        h = mparams.solution_hints.add()
        h.variable_values.ids.extend(range(model.num_vars))
        h.variable_values.values.extend(np.asarray(s.hint, dtype=float).tolist())

    return mparams


def _callback(
    model: LinearModel, s: EngineSettings, backend: str, t0: float, best: list[float]
) -> tuple[Any, Any]:
    """The callback registration and callback: CP-SAT's MIP solutions reported to `s`'s
    on_solution/on_progress (`best` holds the best objective reported)."""
    from ortools.math_opt import callback_pb2

    relax = s.relax
    reg = callback_pb2.CallbackRegistrationProto()
    cb = None
    # SCIP's MathOpt event handler logs C-level errors on registration; CP-SAT reports cleanly
    if backend == "cpsat" and not relax and (s.on_solution or s.on_progress):
        reg.request_registration.append(callback_pb2.CALLBACK_EVENT_MIP_SOLUTION)

        def cb(data: Any) -> Any:
            vec = data.primal_solution_vector
            x = np.zeros(model.num_vars)
            x[np.asarray(vec.ids, dtype=np.int64)] = np.asarray(vec.values)
            obj = model.objective(x)
            bound = data.mip_stats.dual_bound if data.HasField("mip_stats") else None
            if obj < best[0] - 1e-12:
                best[0] = obj
                if s.on_solution is not None:
                    s.on_solution(x, obj)
            if s.on_progress is not None:
                s.on_progress(
                    {
                        "elapsed": time.monotonic() - t0,
                        "objective": obj,
                        "bound": bound,
                        "gap": relative_gap(obj, bound),
                    }
                )
            return callback_pb2.CallbackResultProto()

    return reg, cb


def _log_reader(s: EngineSettings, backend: str, t0: float) -> Callable[[list[str]], None]:
    """The engine's log lines to `s`'s on_log, and SCIP's and HiGHS's node tables to its
    on_progress."""

    def on_lines(lines: list[str]) -> None:
        for line in lines:
            if s.on_log is not None:
                s.on_log(line)
            if backend == "scip" and s.on_progress is not None:
                # SCIP's incumbents are not reported through MathOpt callbacks (see above): its
                # node table carries the progress
                row = _scip_row(line)
                if row is not None:
                    _, bound, obj = row
                    s.on_progress(
                        {
                            "elapsed": time.monotonic() - t0,
                            "objective": obj,
                            "bound": bound,
                            "gap": relative_gap(obj, bound),
                        }
                    )
            if backend == "highs" and s.on_progress is not None:
                mt = _HIGHS_ROW.match(line)
                if mt:
                    bound, obj = _num(mt.group(1)), _num(mt.group(2))
                    s.on_progress(
                        {
                            "elapsed": time.monotonic() - t0,
                            "objective": obj,
                            "bound": bound,
                            "gap": relative_gap(obj, bound),
                        }
                    )

    return on_lines


def _result(model: LinearModel, s: EngineSettings, backend: str, r: Any, best: float) -> MilpResult:
    """The MilpResult of the engine's SolveResultProto `r`."""
    from ortools.math_opt import result_pb2

    relax = s.relax
    reason = result_pb2.TerminationReasonProto.Name(r.termination.reason).removeprefix("TERMINATION_REASON_")
    x = None
    obj = None
    first_order = backend in LP_BACKENDS
    y = None
    for sol in r.solutions:
        # PDLP's iterate is approximate (feasible within its tolerances, or the last average
        # iterate at a limit): kept, since rounding only needs a fractional point, and the bound
        # comes from its dual through lagrangian_bound, which is valid for any multipliers
        if (
            x is None
            and sol.HasField("primal_solution")
            and (first_order or sol.primal_solution.feasibility_status == _FEASIBLE)
        ):
            vv = sol.primal_solution.variable_values
            x = np.zeros(model.num_vars)
            x[np.asarray(vv.ids, dtype=np.int64)] = np.asarray(vv.values)
            obj = model.objective(x) if first_order else sol.primal_solution.objective_value
        if first_order and y is None and sol.HasField("dual_solution"):
            dv = sol.dual_solution.dual_values
            y = np.zeros(model.num_constraints)
            y[np.asarray(dv.ids, dtype=np.int64)] = np.asarray(dv.values)
    bound = _num(str(r.termination.objective_bounds.dual_bound))
    if first_order:
        bound = lagrangian_bound(model, y) if y is not None else None
        bound = bound if bound is not None and math.isfinite(bound) else None
    status: Status
    if reason == "OPTIMAL":
        status = "optimal"
        if bound is None and obj is not None:
            bound = obj
    elif reason == "INFEASIBLE":
        status = "infeasible"
    elif x is not None:
        status = "feasible"
    else:
        status = "unknown"
    if relax and status == "optimal" and not first_order:
        bound = obj
    msg = "" if reason in ("OPTIMAL", "FEASIBLE", "INFEASIBLE") else f"{backend}: {reason.lower()}"
    if r.termination.detail and status not in ("optimal",):
        msg = (msg + " " if msg else "") + r.termination.detail[:200]
    if first_order and status == "feasible":
        msg = (msg + "; " if msg else "") + "approximate LP point"
    if x is not None and s.on_solution is not None and obj is not None and obj < best - 1e-12:
        s.on_solution(x, obj)
    return MilpResult(
        status=status,
        objective=obj,
        bound=bound,
        gap=relative_gap(obj, bound),
        x=x,
        backend=backend + (" (lp)" if relax and backend != "pdlp" else ""),
        message=msg,
        extra={"dual": y} if y is not None else {},
    )


def lagrangian_bound(model: LinearModel, y: np.ndarray) -> float:
    """A valid lower bound on min c·x over the LP relaxation of `model` from any row multipliers.

    For y_i > 0 the row is used as A_i x ≥ lb_i, for y_i < 0 as A_i x ≤ ub_i (a multiplier whose
    side is unbounded is dropped); then c·x ≥ Σ y_i·side_i + Σ_j min_{lb_j ≤ x_j ≤ ub_j} d_j x_j
    with d = c − Aᵀy. Exact weak duality, so an approximate or interrupted dual (PDLP) still
    bounds the LP optimum — and hence the MILP's — from below; −inf when a reduced cost points at
    an infinite variable bound.
    """
    rlb, rub = model.row_lb, model.row_ub
    y = np.where(((y > 0) & ~np.isfinite(rlb)) | ((y < 0) & ~np.isfinite(rub)), 0.0, y)
    rows = float(np.where(y > 0, y * np.where(np.isfinite(rlb), rlb, 0.0), 0.0).sum())
    rows += float(np.where(y < 0, y * np.where(np.isfinite(rub), rub, 0.0), 0.0).sum())
    d = model.cost - model.matrix().T @ y
    at = np.where(d > 0, model.lb, np.where(d < 0, model.ub, 0.0))
    if not np.all(np.isfinite(at[d != 0])):
        return -math.inf
    return rows + float((d * np.where(d != 0, at, 0.0)).sum()) + model.objective_offset
