"""ONNX Runtime replay of schedules (`remat run`): session mode and interpret mode."""

from remat_cli.runtime.model import ModelMismatch
from remat_cli.runtime.replay import RunReport, load_schedule, run_schedule
from remat_cli.runtime.session import ModelRejected, RunFailed, RuntimeUnavailable

__all__ = [
    "ModelMismatch",
    "ModelRejected",
    "RunFailed",
    "RunReport",
    "RuntimeUnavailable",
    "load_schedule",
    "run_schedule",
]
