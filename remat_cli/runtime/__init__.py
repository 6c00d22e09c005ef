"""ONNX Runtime replay of schedules (`remat run`: session mode and interpret mode) and their
deployment (`remat optimize`, `remat apply`, the plan executor)."""

from remat_cli.runtime.deploy import Applied, ApplyRefused, apply_schedule, deployed_session
from remat_cli.runtime.model import ModelMismatch
from remat_cli.runtime.optimize import Optimized, OptimizeRefused, optimize_model
from remat_cli.runtime.ort import ModelRejected, RunFailed, RuntimeUnavailable
from remat_cli.runtime.plan_executor import PlanExecutor
from remat_cli.runtime.replay import RunReport, load_schedule, run_schedule

__all__ = [
    "Applied",
    "ApplyRefused",
    "ModelMismatch",
    "ModelRejected",
    "OptimizeRefused",
    "Optimized",
    "PlanExecutor",
    "RunFailed",
    "RunReport",
    "RuntimeUnavailable",
    "apply_schedule",
    "deployed_session",
    "load_schedule",
    "optimize_model",
    "run_schedule",
]
