"""The embedded pool: cells on local threads, each thread waiting on its own child solve.

The threads only wait; the work happens in the child processes `run_cell` starts. The default
is one solve per `CELL_CORES` (2) cores, each told to use that many workers (see runner.py).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import traceback
from collections.abc import Iterator
from typing import Any

from remat_cli.solver import usable_cores
from remat_cli.sweep.cells import Cell
from remat_cli.sweep.runner import CELL_CORES, empty_record, kill_running, run_cell

Result = tuple[Cell, dict[str, Any], str | None]


def default_jobs() -> int:
    return max(1, usable_cores() // CELL_CORES)


def error_record(cell: Cell, message: str) -> dict[str, Any]:
    """A cell whose worker failed outside the child solve (a bug, a lost worker)."""
    return empty_record(cell, "error", message)


class LocalPool:
    name = "local"

    def __init__(self, jobs: int | None = None) -> None:
        self.jobs = jobs or default_jobs()
        self._stop = threading.Event()
        self._futures: list[cf.Future[tuple[dict[str, Any], str | None]]] = []
        self._executor: cf.ThreadPoolExecutor | None = None

    def describe(self) -> str:
        return f"local pool, {self.jobs} solve{'s' if self.jobs > 1 else ''} at a time"

    def _one(self, cell: Cell, graph_text: str) -> tuple[dict[str, Any], str | None]:
        if self._stop.is_set():
            raise cf.CancelledError
        return run_cell(cell, graph_text)

    def run(self, cells: list[Cell], graphs: dict[str, str]) -> Iterator[Result]:
        self._executor = cf.ThreadPoolExecutor(self.jobs, thread_name_prefix="remat-sweep")
        by_future = {self._executor.submit(self._one, c, graphs[c.graph_sha256]): c for c in cells}
        self._futures = list(by_future)
        try:
            for f in cf.as_completed(by_future):
                cell = by_future[f]
                if f.cancelled():
                    continue
                exc = f.exception()
                if isinstance(exc, cf.CancelledError):
                    continue
                if exc is not None:
                    msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                    yield cell, error_record(cell, f"worker failed: {msg}"), None
                else:
                    record, text = f.result()
                    yield cell, record, text
        finally:
            self._executor.shutdown(wait=False, cancel_futures=True)

    def stop(self) -> None:
        """Cancel what has not started and kill the running child solves; returns when every thread
        has let go of its child."""
        self._stop.set()
        if self._executor is None:
            return
        self._executor.shutdown(wait=False, cancel_futures=True)
        pending = [f for f in self._futures if not f.done()]
        while pending:
            kill_running()  # again each round: a thread may have started its child just now
            _, not_done = cf.wait(pending, timeout=0.2)
            pending = list(not_done)
