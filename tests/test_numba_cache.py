"""`remat_cli.util.numba_cache.package_njit`: a cached kernel that calls a kernel in another file of its
package follows an edit of that file in the next process (numba's own ``cache=True`` does not)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

B = """\
from remat_cli.util.numba_cache import package_njit

kernel = package_njit(error_model="numpy")


@kernel
def g(x):
    return x + {add}
"""

A = """\
from remat_cli.util.numba_cache import package_njit
from kpkg.b import g

kernel = package_njit(error_model="numpy")


@kernel
def f(x):
    return 10 * g(x)
"""

RUN = """\
import json
from kpkg.a import f

value = f(1)
print(json.dumps({"value": int(value), "hits": sum(f.stats.cache_hits.values()),
                  "locator": type(f._cache._impl.locator).__name__}))
"""


def _run(tmp: Path, cache_dir: Path | None) -> dict[str, object]:
    """A fresh interpreter imports kpkg.a and calls f(1) (no bytecode files, so that Python itself
    cannot serve an old b.py either)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp), str(ROOT)])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if cache_dir is not None:
        env["NUMBA_CACHE_DIR"] = str(cache_dir)
    out = subprocess.run(
        [sys.executable, "-c", RUN], cwd=tmp, env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("where", ["beside the module", "NUMBA_CACHE_DIR"])
def test_a_kernel_follows_an_edit_of_the_kernel_it_calls(tmp_path: Path, where: str) -> None:
    # With plain @njit(cache=True) in a.py and b.py this test fails at the second run: it prints
    # 20 (f loaded from the cache with the old g inlined), checked by hand on numba 0.68.
    pkg = tmp_path / "kpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text(A)
    (pkg / "b.py").write_text(B.format(add=1))
    cache_dir = tmp_path / "numba-cache" if where == "NUMBA_CACHE_DIR" else None

    first = _run(tmp_path, cache_dir)
    assert first == {"value": 20, "hits": 0, "locator": "_DirectoryStampLocator"}
    again = _run(tmp_path, cache_dir)
    assert again["value"] == 20 and again["hits"] == 1  # unchanged files: served from the cache
    cached = list((cache_dir or pkg / "__pycache__").rglob("a.f-*.nbi"))
    assert len(cached) == 1

    (pkg / "b.py").write_text(B.format(add=2))  # only b.py changes; a.py keeps its stamp
    edited = _run(tmp_path, cache_dir)
    assert edited["value"] == 30 and edited["hits"] == 0  # recompiled with the new g
    assert _run(tmp_path, cache_dir) == {"value": 30, "hits": 1, "locator": "_DirectoryStampLocator"}
