"""numba's on-disk cache (``cache=True``) for compiled kernels spread over several files.

numba keys a function's cache entry on the *source stamp of the file that defines it* (the file's
mtime and size before numba 0.61, a hash of its contents since) plus the function's own bytecode.
The machine code of a kernel includes the kernels it calls, so when kernel ``f`` in ``a.py`` calls
``g`` in ``b.py`` and ``b.py`` is edited, the next process still loads ``f`` from the cache, with
the old ``g`` inside it: a stale result and no warning (``tests/test_numba_cache.py`` builds that
situation). Keeping every kernel of a solver in one file avoids it, at the cost of one long module.

:func:`package_njit` is ``numba.njit(cache=True)`` with a wider stamp: the stamp numba would use
*and* a hash of every ``.py`` file in the directory of the defining module. A kernel package (one
directory whose modules are all kernels, e.g. ``remat_cli/solvers/fastsa/kernel/``) whose modules
all decorate with it then recompiles as a whole when any of its files changes, and loads from the
cache otherwise. The cache files stay where numba puts them (``__pycache__`` beside the module,
``NUMBA_CACHE_DIR``, or the user's cache folder), so ``registry.numba_cache_cold`` still finds
them. Kernels must not call jitted functions outside their own directory (those would be stale
again); constants and plain Python imported from elsewhere are fine only if they never change.

It uses two numba internals that have been stable for years (the cache locator interface of
``numba.core.caching`` and ``Dispatcher._cache``); the test above fails if they stop working.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any

import numba
from numba.core import caching


@lru_cache(maxsize=64)
def _directory_hash(directory: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    """sha256 over the names and contents of the .py files of `directory`; `stats` (name, mtime_ns,
    size) is only the memo key, so that a file changed while the process runs is hashed again."""
    h = hashlib.sha256()
    for name, _, _ in stats:
        h.update(name.encode() + b"\0")
        h.update(Path(directory, name).read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def directory_stamp(directory: str) -> str:
    """The hash of every ``.py`` file directly in `directory` (names and contents)."""
    entries = sorted(
        (e.name, e.stat()) for e in os.scandir(directory) if e.name.endswith(".py") and e.is_file()
    )
    stats = tuple((name, st.st_mtime_ns, st.st_size) for name, st in entries)
    return _directory_hash(directory, stats)


class _DirectoryStampLocator(caching._CacheLocator):
    """The locator numba itself would choose for the function, with the stamp widened to the
    whole directory of its source file (see the module docstring)."""

    def __init__(self, inner: Any, py_file: str) -> None:
        self._inner = inner
        self._py_file = py_file  # numba's cachability warnings read it
        self._directory = os.path.dirname(os.path.abspath(py_file))

    @classmethod
    def from_function(cls, py_func: Callable[..., Any], py_file: str) -> _DirectoryStampLocator | None:
        for locator_class in caching.CompileResultCacheImpl._locator_classes:
            inner = locator_class.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, py_file)
        return None

    def ensure_cache_path(self) -> None:
        self._inner.ensure_cache_path()

    def get_cache_path(self) -> str:
        return self._inner.get_cache_path()

    def get_disambiguator(self) -> str:
        return self._inner.get_disambiguator()

    def get_source_stamp(self) -> Any:
        if not os.path.isdir(self._directory):  # e.g. inside a zip: nothing there can be edited
            return self._inner.get_source_stamp()
        return self._inner.get_source_stamp(), directory_stamp(self._directory)


class _DirectoryStampImpl(caching.CompileResultCacheImpl):
    _locator_classes = [_DirectoryStampLocator]


class _DirectoryStampCache(caching.FunctionCache):
    _impl_class = _DirectoryStampImpl


def package_njit(**options: Any) -> Callable[[Callable[..., Any]], Any]:
    """``numba.njit(cache=True, **options)`` whose cache entries are valid only while no ``.py``
    file in the defining module's directory has changed."""

    def decorate(fn: Callable[..., Any]) -> Any:
        dispatcher = numba.njit(**options)(fn)
        if hasattr(dispatcher, "enable_caching"):  # not with NUMBA_DISABLE_JIT (a plain function)
            # what Dispatcher.enable_caching() does, with the wider stamp
            dispatcher._cache = _DirectoryStampCache(fn)
        return dispatcher

    return decorate
