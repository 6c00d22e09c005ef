"""The solver registry: built-in solvers plus the python entry-point group ``remat.solvers``.

Built-ins are imported lazily by dotted path, so a solver whose engine is missing never breaks
the others. An out-of-tree package registers ``name = "package.module:SolverClass"``.
"""

from __future__ import annotations

import importlib
import importlib.util
from functools import cache
from importlib.metadata import entry_points

from remat_cli.solvers.base import Solver

BUILTIN: dict[str, str] = {
    "checkpoint-all": "remat_cli.solvers.checkpoint_all:CheckpointAll",
    "greedy": "remat_cli.solvers.greedy:Greedy",
    "chen-sqrtn": "remat_cli.solvers.chen:ChenSqrtN",
    "chen-greedy": "remat_cli.solvers.chen:ChenGreedy",
    "checkmate": "remat_cli.solvers.checkmate:Checkmate",
    "checkmate-lp": "remat_cli.solvers.checkmate_lp:CheckmateLP",
    "moccasin": "remat_cli.solvers.moccasin:Moccasin",
    "fastsa": "remat_cli.solvers.fastsa:FastSA",
    "hilp": "remat_cli.solvers.hilp:HILP",
    "auto": "remat_cli.solvers.auto:Auto",
}

ENTRY_POINT_GROUP = "remat.solvers"


class UnknownSolver(KeyError):
    pass


def _load(path: str) -> type[Solver]:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


@cache
def _table() -> dict[str, str]:
    table = {}
    for name, path in BUILTIN.items():
        module = path.partition(":")[0]
        if importlib.util.find_spec(module) is not None:  # solvers still being written are absent
            table[name] = path
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        table.setdefault(ep.name, ep.value)
    return table


def names() -> list[str]:
    return list(_table())


def get(name: str) -> Solver:
    table = _table()
    if name not in table:
        raise UnknownSolver(f"unknown solver {name!r} (known: {', '.join(table)})")
    return _load(table[name])()
