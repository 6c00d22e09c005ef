"""Thin glue to the MILP/CP engines (OR-Tools MathOpt: HiGHS, SCIP, CP-SAT; gurobipy when licensed).

See :mod:`remat_cli.milp.engine` for the API; the common names are re-exported here.
"""

from remat_cli.milp.engine import (
    BACKENDS,
    EngineError,
    EngineSettings,
    LinearModel,
    MilpResult,
    available_backends,
    solve,
)

__all__ = [
    "BACKENDS",
    "EngineError",
    "EngineSettings",
    "LinearModel",
    "MilpResult",
    "available_backends",
    "solve",
]
