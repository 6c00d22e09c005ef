"""The optional Gurobi backend: gurobipy's matrix API (``addMVar``/``addMConstr`` with a scipy CSR
matrix), and the probe for its size-limited pip licence."""

from __future__ import annotations

import functools
import math
import time
from typing import Any

import numpy as np

from remat_cli.milp.model import EngineError, EngineSettings, LinearModel, MilpResult, Status
from remat_cli.schedule import relative_gap


def gurobi_status() -> tuple[bool, str]:
    try:
        import gurobipy  # noqa: F401
    except ImportError:
        return False, "gurobipy is not installed"
    return True, ""


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


def solve_gurobi(model: LinearModel, s: EngineSettings, time_left: float | None) -> MilpResult:
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
