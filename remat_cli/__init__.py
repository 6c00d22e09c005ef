"""remat: tensor rematerialization (activation checkpointing) solvers.

The Python API (:mod:`remat_cli.api`), for toolchains that should not shell out::

    from remat_cli import load_graph, simulate, solve

    graph = load_graph("model.onnx")
    schedule = solve(graph, "70%", solver="greedy")
    assert simulate(graph, schedule).peak_memory <= schedule.budget

Names are loaded on first use, so ``import remat_cli`` (and ``remat --help``) stays cheap.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__all__ = ["InputError", "NoSchedule", "budget_bytes", "load_graph", "simulate", "solve"]

if TYPE_CHECKING:
    from remat_cli.api import InputError, NoSchedule, budget_bytes, load_graph, simulate, solve


def __getattr__(name: str) -> Any:
    if name in __all__:
        from remat_cli import api

        return getattr(api, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
