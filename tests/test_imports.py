"""Every module under remat_cli imports in the test environment, and every registered solver
loads: an import that pyproject.toml does not declare fails here (CI runs in a fresh venv)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil

import pytest

import remat_cli
from remat_cli import registry

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(remat_cli.__path__, "remat_cli.")
    if m.name != "remat_cli.__main__"  # runs the CLI
)
# The packages of the optional extras (pyproject.toml): a module that needs one fails on exactly
# that package where it is not installed.
EXTRAS = {"torch", "onnxscript", "gurobipy", "distributed"}


def installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ValueError:  # in sys.modules as None: imports of it fail
        return False


def test_the_walk_finds_the_package() -> None:
    assert "remat_cli.cli" in MODULES and "remat_cli.milp.engine" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as e:
        package = (e.name or "").partition(".")[0]
        if package not in EXTRAS or installed(package):
            raise


@pytest.mark.parametrize("name", registry.names())
def test_registered_solver_loads(name: str) -> None:
    solver = registry.get(name)
    assert solver.name == name
    state, reason = solver.availability()
    assert state in ("available", "unavailable"), reason
