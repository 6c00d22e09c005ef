"""The public API's docstrings (numpydoc) hold Examples, and the Examples run: each docstring's
doctest is one test. The API is what ``remat_cli/__init__.py`` exports (defined in api.py) and the
solver interface, registry and contract suite a plugin author uses."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

MODULES = (
    "remat_cli.api",
    "remat_cli.solver",
    "remat_cli.registry",
    "remat_cli.testing",
    "remat_cli.testing.instances",
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _doctests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    found = [t for m in MODULES for t in finder.find(importlib.import_module(m))]
    return sorted(found, key=lambda t: t.name)


def _public(module_name: str) -> list[str]:
    """The module's public functions and classes, those it defines (not imports)."""
    module = importlib.import_module(module_name)
    names = getattr(module, "__all__", None) or [n for n in vars(module) if not n.startswith("_")]
    return [
        f"{module_name}.{n}"
        for n in names
        if (inspect.isfunction(obj := getattr(module, n)) or inspect.isclass(obj))
        and obj.__module__ == module_name
    ]


@pytest.mark.parametrize("test", _doctests(), ids=lambda t: t.name.removeprefix("remat_cli."))
def test_docstring_examples_run(test: doctest.DocTest) -> None:
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report: list[str] = []
    runner.run(test, out=report.append)
    assert runner.failures == 0, "".join(report)


@pytest.mark.parametrize("name", [n for m in MODULES for n in _public(m)])
def test_public_names_have_numpydoc_examples(name: str) -> None:
    module, _, attr = name.rpartition(".")
    obj = getattr(importlib.import_module(module), attr)
    doc = inspect.getdoc(obj) or ""
    assert "\nExamples\n--------\n" in doc and ">>> " in doc, f"{name}: no Examples section"
    takes = inspect.isfunction(obj) and len(inspect.signature(obj).parameters) > 0
    assert not takes or "\nParameters\n----------\n" in doc, f"{name}: no Parameters section"
