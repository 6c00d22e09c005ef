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
# Modules that need an optional extra: without it they fail on exactly that package.
EXTRAS = {"remat_cli.importers.torch_export": "torch"}


def test_the_walk_finds_the_package() -> None:
    assert "remat_cli.cli" in MODULES and "remat_cli.milp.engine" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_module_imports(name: str) -> None:
    extra = EXTRAS.get(name)
    if extra is not None and importlib.util.find_spec(extra) is None:
        with pytest.raises(ModuleNotFoundError) as e:
            importlib.import_module(name)
        assert e.value.name == extra
        return
    importlib.import_module(name)


@pytest.mark.parametrize("name", registry.names())
def test_registered_solver_loads(name: str) -> None:
    solver = registry.get(name)
    assert solver.name == name
    state, reason = solver.availability()
    assert state in ("available", "unavailable"), reason
