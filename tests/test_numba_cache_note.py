"""`registry.numba_cache_cold`: `remat solve` notes on stderr that a numba solver's first import
compiles its kernels (outside --time-limit), judged from numba's cache files beside the module."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from remat_cli import registry


@pytest.fixture()
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two solver modules needing numba, never imported: a package and a plain module."""
    (tmp_path / "fakepkg").mkdir()
    (tmp_path / "fakepkg" / "__init__.py").write_text("raise ImportError('must not be imported')\n")
    (tmp_path / "fakemod.py").write_text("raise ImportError('must not be imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    for name, path in (("fake-pkg", "fakepkg:S"), ("fake-mod", "fakemod:S"), ("fake-plain", "fakemod:T")):
        requires = () if name == "fake-plain" else ("numba",)
        monkeypatch.setitem(registry.BUILTIN, name, registry.Entry(path, "m", "p", requires=requires))
    return tmp_path


def test_cold_until_numba_has_cached_a_kernel(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert registry.numba_cache_cold("fake-pkg") and registry.numba_cache_cold("fake-mod")
    assert not registry.numba_cache_cold("fake-plain")  # no numba: nothing to compile
    assert not registry.numba_cache_cold("no-such-solver")
    # numba's cache files: <dir>/__pycache__/<module>.<function>-<line>.py<ver>.nbi
    py = f"py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    kernels = fake / "fakepkg" / "kernels"
    (kernels / "__pycache__").mkdir(parents=True)
    (kernels / "__pycache__" / f"kernel.sa_chunk-101.{py}.nbi").write_bytes(b"")
    # left behind by a module that is gone (e.g. moved into a package), or for another Python
    (kernels / "__pycache__" / "mutations._add-20.py27.nbi").write_bytes(b"")
    (kernels / "mutations.py").write_text("")
    assert registry.numba_cache_cold("fake-pkg")
    (kernels / "kernel.py").write_text("")
    assert not registry.numba_cache_cold("fake-pkg")
    (fake / "__pycache__").mkdir()
    (fake / "other_kernel.py").write_text("")
    (fake / "__pycache__" / f"other_kernel.f-1.{py}.nbi").write_bytes(b"")
    assert registry.numba_cache_cold("fake-mod")  # another module's cache does not count
    (fake / "__pycache__" / f"fakemod_kernel.f-1.{py}.nbi").write_bytes(b"")
    assert registry.numba_cache_cold("fake-mod")  # no fakemod_kernel.py any more
    (fake / "fakemod_kernel.py").write_text("")
    assert not registry.numba_cache_cold("fake-mod")
    assert "fakepkg" not in sys.modules and "fakemod" not in sys.modules


def test_unknown_cache_location_says_nothing(fake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(fake / "elsewhere"))
    assert not registry.numba_cache_cold("fake-pkg")


def test_solve_prints_the_note_only_when_cold(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from remat_cli.cli import main
    from remat_cli.importers.generators import linear

    g = tmp_path / "g.json"
    g.write_text(linear(4, seed=1).to_json())
    asked: list[str] = []

    def cold(name: str) -> bool:
        asked.append(name)
        return True

    monkeypatch.setattr(registry, "numba_cache_cold", cold)
    res = CliRunner().invoke(main, ["solve", str(g), "-b", "100%", "-s", "greedy"])
    assert res.exit_code == 0 and asked == ["greedy"]
    notes = [ln for ln in res.output.splitlines() if ln.startswith("remat: note: greedy compiles")]
    assert len(notes) == 1 and "not counted in --time-limit" in notes[0]
    res = CliRunner().invoke(main, ["solve", str(g), "-b", "100%", "-s", "greedy", "-q"])
    assert res.exit_code == 0 and "remat: note:" not in res.output
    monkeypatch.setattr(registry, "numba_cache_cold", lambda name: False)
    res = CliRunner().invoke(main, ["solve", str(g), "-b", "100%", "-s", "greedy"])
    assert res.exit_code == 0 and "remat: note:" not in res.output
