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
    names, SCIP parameter paths, CP-SAT SatParameters fields, Gurobi parameter names), ``on_log`` (engine log lines).

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

Speed, measured on the Checkmate model of random_layered_n250 at 90% (T = 250: 223,844 columns,
769,982 rows, 2.06 M nonzeros) on the loaded 2-core dev machine: numpy build 1.4 s, CSR 0.7 s,
ModelProto fill 3.6 s — against minutes through ``mathopt.Model`` Python expressions. The
``LinearModel`` arrays are backend-neutral, so H-ILP and Checkmate share this path.
"""

from __future__ import annotations

import functools
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from remat_cli.schedule import relative_gap

Status = Literal["optimal", "feasible", "infeasible", "unknown"]
BACKENDS: tuple[str, ...] = ("highs", "scip", "cpsat", "gurobi")
#: engines for LP relaxations only (``relax=True``): OR-Tools' PDLP, a first-order primal-dual
#: method whose cost per iteration is two sparse matrix-vector products, so it scales to the
#: 10⁶-row relaxations that simplex and barrier do not finish on two cores
LP_BACKENDS: tuple[str, ...] = ("pdlp",)
DEFAULT_AUTO_ORDER: tuple[str, ...] = ("gurobi", "highs", "scip", "cpsat")


class EngineError(RuntimeError):
    """A backend could not run the model (missing, licence, unsupported model)."""


# ----------------------------------------------------------------------------------------------
# The model


class LinearModel:
    """min c·x + offset  s.t.  lb_row ≤ A x ≤ ub_row,  lb ≤ x ≤ ub,  x_j ∈ ℤ for integer j."""

    def __init__(self, name: str = "model") -> None:
        self.name = name
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._cost: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rlb: list[np.ndarray] = []
        self._rub: list[np.ndarray] = []
        self.num_vars = 0
        self.num_constraints = 0
        self.objective_offset = 0.0
        self._cache: dict[str, Any] = {}

    def add_vars(
        self,
        n: int,
        lb: float | np.ndarray = 0.0,
        ub: float | np.ndarray = 1.0,
        integer: bool = True,
        cost: float | np.ndarray = 0.0,
    ) -> np.ndarray:
        idx = np.arange(self.num_vars, self.num_vars + n, dtype=np.int64)
        self._lb.append(np.broadcast_to(np.asarray(lb, dtype=float), (n,)).copy())
        self._ub.append(np.broadcast_to(np.asarray(ub, dtype=float), (n,)).copy())
        self._int.append(np.full(n, integer, dtype=bool))
        self._cost.append(np.broadcast_to(np.asarray(cost, dtype=float), (n,)).copy())
        self.num_vars += n
        self._cache.clear()
        return idx

    def add_constraints(
        self,
        rows: np.ndarray | Sequence[int],
        cols: np.ndarray | Sequence[int],
        coefs: np.ndarray | Sequence[float] | float,
        lb: np.ndarray | float,
        ub: np.ndarray | float,
        count: int | None = None,
    ) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(coefs, dtype=float), rows.shape).copy()
        if count is None:
            count = len(lb) if np.ndim(lb) else len(ub) if np.ndim(ub) else int(rows.max(initial=-1)) + 1
        lbs = np.broadcast_to(np.asarray(lb, dtype=float), (count,)).copy()
        ubs = np.broadcast_to(np.asarray(ub, dtype=float), (count,)).copy()
        if rows.size and (rows.min() < 0 or rows.max() >= count):
            raise ValueError("constraint row index outside the block")
        if cols.size and (cols.min() < 0 or cols.max() >= self.num_vars):
            raise ValueError("constraint names a variable that does not exist")
        first = self.num_constraints
        self._rows.append(rows + first)
        self._cols.append(cols)
        self._vals.append(vals)
        self._rlb.append(lbs)
        self._rub.append(ubs)
        self.num_constraints += count
        self._cache.clear()
        return np.arange(first, first + count, dtype=np.int64)

    # ---- assembled arrays (cached until the next add) ----
    def _cat(self, parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    @property
    def lb(self) -> np.ndarray:
        return self._cat(self._lb, float)

    @property
    def ub(self) -> np.ndarray:
        return self._cat(self._ub, float)

    @property
    def integer(self) -> np.ndarray:
        return self._cat(self._int, bool)

    @property
    def cost(self) -> np.ndarray:
        return self._cat(self._cost, float)

    @property
    def row_lb(self) -> np.ndarray:
        return self._cat(self._rlb, float)

    @property
    def row_ub(self) -> np.ndarray:
        return self._cat(self._rub, float)

    def matrix(self) -> sp.csr_matrix:
        if "A" not in self._cache:
            A = sp.csr_matrix(
                (
                    self._cat(self._vals, float),
                    (self._cat(self._rows, np.int64), self._cat(self._cols, np.int64)),
                ),
                shape=(self.num_constraints, self.num_vars),
            )
            A.sum_duplicates()
            A.eliminate_zeros()
            A.sort_indices()
            self._cache["A"] = A
        return self._cache["A"]

    def objective(self, x: np.ndarray) -> float:
        return float(self.cost @ x) + self.objective_offset

    def violation(self, x: np.ndarray) -> float:
        """Largest bound or row violation of `x` (0 when feasible), for checking hints."""
        ax = self.matrix() @ x
        worst = max(
            float(np.max(self.row_lb - ax, initial=0.0)),
            float(np.max(ax - self.row_ub, initial=0.0)),
            float(np.max(self.lb - x, initial=0.0)),
            float(np.max(x - self.ub, initial=0.0)),
        )
        frac = np.abs(x - np.round(x))[self.integer]
        return max(worst, float(frac.max(initial=0.0)))

    def integral(self) -> str | None:
        """None when CP-SAT can take the model as is, else why not."""
        if not self.integer.all():
            return f"{int((~self.integer).sum())} continuous variables"
        A = self.matrix()
        if not np.all(A.data == np.round(A.data)):
            return "fractional constraint coefficients"
        for b in (self.row_lb, self.row_ub, self.lb, self.ub):
            fin = b[np.isfinite(b)]
            if not np.all(fin == np.round(fin)):
                return "fractional bounds"
        return None


# ----------------------------------------------------------------------------------------------
# Settings and result


@dataclass
class EngineSettings:
    backend: str = "auto"
    auto_order: tuple[str, ...] = DEFAULT_AUTO_ORDER
    time_limit: float | None = None
    threads: int = 1
    seed: int = 0
    rel_gap: float = 1e-6
    hint: np.ndarray | None = None
    relax: bool = False
    deterministic: bool = False
    #: LP algorithm for relax=True: "" (engine default), "primal", "dual", "barrier", "first_order"
    lp_algorithm: str = ""
    on_solution: Callable[[np.ndarray, float], None] | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    #: engine-specific options, e.g. {"highs": {"mip_heuristic_effort": 0.3}} (HiGHS option
    #: names; CP-SAT: SatParameters fields; gurobi: parameter names)
    engine_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: extra engine log lines go here (None: dropped)
    on_log: Callable[[str], None] | None = None


@dataclass
class MilpResult:
    status: Status
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    x: np.ndarray | None = None
    backend: str = ""
    message: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Backend discovery


def _gurobi_status() -> tuple[bool, str]:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False, "gurobipy is not installed"
    return True, ""


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
    out["gurobi"] = _gurobi_status()
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
            if b == "gurobi":
                res = _solve_gurobi(model, s, left)
            else:
                res = _solve_mathopt(model, s, b, left)
        except EngineError as e:
            notes.append(f"{b}: {e}")
            continue
        why_this = f"{b} ran" + (f" (auto: first usable of {'/'.join(order)})" if s.backend == "auto" else "")
        res.message = "; ".join([*notes, why_this] + ([res.message] if res.message else []))
        res.seconds = time.monotonic() - t0
        return res
    raise EngineError("no MILP engine could run the model: " + "; ".join(notes))


# ----------------------------------------------------------------------------------------------
# OR-Tools MathOpt, called on a ModelProto built straight from the arrays

_FEASIBLE = 2  # SolutionStatusProto.SOLUTION_STATUS_FEASIBLE
#: seconds an engine spends outside its own time limit per constraint nonzero (loading the model,
#: uninterruptible presolve steps), measured on the Checkmate model of RL n250 (2.3 M nonzeros)
#: on the loaded 2-core machine: a 5 s limit returned after 19 s on SCIP, 8 s on HiGHS; PDLP on
#: RL n1000's live LP (22.5 M nonzeros), the 2-core machine alone: a 48 s limit returned after
#: 82 s (13 s of it the proto build), and after 61 s when the engine was given 12.5 s of it
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


def _solve_mathopt(
    model: LinearModel, s: EngineSettings, backend: str, time_left: float | None
) -> MilpResult:
    from ortools.math_opt import (
        callback_pb2,
        model_parameters_pb2,
        parameters_pb2,
        result_pb2,
    )
    from ortools.math_opt.core.python import solver

    relax = s.relax
    if relax and backend not in ("highs", *LP_BACKENDS):
        backend = "highs"  # SCIP's LP goes through SoPlex-less gscip; HiGHS is the LP engine here
    t_build = time.monotonic()
    proto = model_proto(model, relax=relax)
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
    for key, val in s.engine_options.get(backend, {}).items():
        if backend == "highs":
            group = (
                params.highs.bool_options
                if isinstance(val, bool)
                else params.highs.int_options
                if isinstance(val, int)
                else params.highs.double_options
                if isinstance(val, float)
                else params.highs.string_options
            )
            group[key] = val
        elif backend == "scip":
            # SCIP parameter names ("presolving/probing/maxrounds"), by value type
            group = (
                params.gscip.bool_params
                if isinstance(val, bool)
                else params.gscip.int_params
                if isinstance(val, int)
                else params.gscip.real_params
                if isinstance(val, float)
                else params.gscip.string_params
            )
            group[key] = val
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
    mparams = model_parameters_pb2.ModelSolveParametersProto()
    if s.hint is not None and not relax:
        h = mparams.solution_hints.add()
        h.variable_values.ids.extend(range(model.num_vars))
        h.variable_values.values.extend(np.asarray(s.hint, dtype=float).tolist())

    t0 = time.monotonic()
    reg = callback_pb2.CallbackRegistrationProto()
    cb = None
    best = [math.inf]
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

    init = parameters_pb2.SolverInitializerProto()
    try:
        raw = solver.solve(
            proto,
            parameters_pb2.SolverTypeProto.Value(_MATHOPT_TYPES[backend]),
            init,
            params,
            mparams,
            on_lines,
            reg,
            cb,
            None,
        )
    except Exception as e:  # StatusNotOk from the C++ layer: the engine refused the model
        raise EngineError(str(e).splitlines()[0][:300]) from e
    r = raw if isinstance(raw, result_pb2.SolveResultProto) else result_pb2.SolveResultProto.FromString(raw)
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
    if x is not None and s.on_solution is not None and obj is not None and obj < best[0] - 1e-12:
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


# ----------------------------------------------------------------------------------------------
# Gurobi (optional): gurobipy matrix API


#: the size limit of gurobipy's bundled pip licence (variables, and linear constraints)
GUROBI_PIP_LIMIT = 2000


@functools.cache  # probed once per process
def _gurobi_size_limited() -> bool:
    """Whether the licence gurobipy finds is the size-limited one: a model one variable over the
    limit is refused (error 10010) at once, without building the real model."""
    import gurobipy as gp

    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        probe = gp.Model("probe", env=env)
        probe.addMVar(GUROBI_PIP_LIMIT + 1)
        probe.optimize()
        return False
    except gp.GurobiError as e:
        return getattr(e, "errno", None) == 10010


def _solve_gurobi(model: LinearModel, s: EngineSettings, time_left: float | None) -> MilpResult:
    try:
        import gurobipy as gp
        from gurobipy import GRB
    except ImportError as e:
        raise EngineError("gurobipy is not installed") from e
    if max(model.num_vars, model.num_constraints) > GUROBI_PIP_LIMIT and _gurobi_size_limited():
        # building a large model in gurobipy takes seconds before the licence refuses it
        raise EngineError(
            f"gurobi refused the model ({model.num_vars} variables, {model.num_constraints} constraints): "
            f"its size-limited licence stops at {GUROBI_PIP_LIMIT} variables and constraints"
        )
    try:
        env = gp.Env(empty=True)
        env.setParam("OutputFlag", 0)
        env.start()
        g = gp.Model(model.name, env=env)
        vtype = np.where(model.integer & (not s.relax), GRB.INTEGER, GRB.CONTINUOUS)
        x = g.addMVar(model.num_vars, lb=model.lb, ub=model.ub, vtype=vtype, obj=model.cost)
        g.ObjCon = model.objective_offset
        A = model.matrix()
        rlb, rub = model.row_lb, model.row_ub
        eq = rlb == rub
        le = ~eq & np.isfinite(rub)
        ge = ~eq & np.isfinite(rlb)
        for mask, sense, rhs in ((eq, "=", rub), (le, "<", rub), (ge, ">", rlb)):
            if mask.any():
                g.addMConstr(A[mask], x, sense, rhs[mask])
        if time_left is not None:
            g.Params.TimeLimit = max(time_left, 0.01)
        g.Params.Threads = max(1, s.threads)
        for key, val in s.engine_options.get("gurobi", {}).items():
            g.setParam(key, val)
        g.Params.Seed = s.seed
        if not s.relax:
            g.Params.MIPGap = s.rel_gap
        if s.hint is not None and not s.relax:
            x.Start = np.asarray(s.hint, dtype=float)
        t0 = time.monotonic()

        def cb(m: Any, where: int) -> None:
            if where == GRB.Callback.MIPSOL and s.on_solution is not None:
                vals = np.asarray(m.cbGetSolution(x))
                s.on_solution(vals, model.objective(vals))
            elif where == GRB.Callback.MIP and s.on_progress is not None:
                obj = m.cbGet(GRB.Callback.MIP_OBJBST)
                bnd = m.cbGet(GRB.Callback.MIP_OBJBND)
                obj_v = obj if abs(obj) < GRB.INFINITY else None
                s.on_progress(
                    {
                        "elapsed": time.monotonic() - t0,
                        "objective": obj_v,
                        "bound": bnd,
                        "gap": relative_gap(obj_v, bnd),
                    }
                )

        g.optimize(cb if (s.on_solution or s.on_progress) else None)
    except gp.GurobiError as e:
        # 10010: model too large for a size-limited licence; 10009: no licence
        raise EngineError(
            f"gurobi refused the model ({model.num_vars} variables, {model.num_constraints} constraints): {e}"
        ) from e
    st = g.Status
    has = g.SolCount > 0
    xv = np.asarray(x.X) if has else None
    obj = float(g.ObjVal) if has else None
    bound = None
    if not s.relax:
        try:
            bound = float(g.ObjBound)
        except (gp.GurobiError, AttributeError):
            bound = None
        if bound is not None and not math.isfinite(bound):
            bound = None  # infeasible or no bound yet, as MathOpt's results say it
    status: Status
    if st == GRB.OPTIMAL:
        status = "optimal"
        if s.relax:
            bound = obj
    elif st in (GRB.INFEASIBLE, GRB.INF_OR_UNBD):
        status = "infeasible"
    elif has:
        status = "feasible"
    else:
        status = "unknown"
    return MilpResult(
        status=status,
        objective=obj,
        bound=bound,
        gap=relative_gap(obj, bound),
        x=xv,
        backend="gurobi" + (" (lp)" if s.relax else ""),
    )
