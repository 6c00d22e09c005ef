"""remat: tensor rematerialization (activation checkpointing) solvers.

The Python API (:mod:`remat_cli.api`), for toolchains that should not shell out::

    from remat_cli import load_graph, simulate, solve

    graph = load_graph("model.onnx")
    schedule = solve(graph, "70%", solver="greedy")
    assert simulate(graph, schedule).peak_memory <= schedule.budget

Names are loaded on first use, so ``import remat_cli`` (and ``remat --help``) stays cheap.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

__all__ = ["InputError", "NoSchedule", "budget_bytes", "load_graph", "simulate", "solve"]

if TYPE_CHECKING:
    from remat_cli.api import InputError, NoSchedule, budget_bytes, load_graph, simulate, solve


class _Package(types.ModuleType):
    """The API's names win over submodules of the same name: importing ``remat_cli.solve`` (the
    module that runs one solver) sets the package attribute ``solve`` to that module, which
    would otherwise shadow the ``solve`` function here. Submodules stay importable by their
    dotted names (``from remat_cli.solve import run_solver``)."""

    def __getattribute__(self, name: str) -> Any:
        if name in __all__:
            from remat_cli import api

            return getattr(api, name)
        return super().__getattribute__(name)


sys.modules[__name__].__class__ = _Package


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
