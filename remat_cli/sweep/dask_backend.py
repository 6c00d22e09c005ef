"""Cells as tasks on a Dask distributed cluster (`remat sweep --scheduler tcp://host:8786`).

Each task is `runner.run_cell` on a worker: the worker writes the graph to its own temporary
folder, runs the solver in a child process under the cell's time limit, and sends back the record
and the schedule text; the client writes both into the results folder as they arrive, so the
JSON Lines file is the same as with the local pool. Graphs are scattered once, not sent per cell.
Workers need the same remat-cli installed (they run `python -m remat_cli solve`).
"""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from typing import Any

from remat_cli.sweep.cells import Cell
from remat_cli.sweep.pool import Result, error_record
from remat_cli.sweep.runner import run_cell

INSTALL_HINT = "the Dask backend needs `pip install remat-cli[distributed]`"


class DistributedMissing(ImportError):
    pass


def connect(address: str, timeout: float = 30.0) -> Any:
    """A distributed.Client for `address` (tcp://host:port)."""
    try:
        from distributed import Client
    except ImportError:
        raise DistributedMissing(INSTALL_HINT) from None
    return Client(address, timeout=timeout)


class DaskBackend:
    name = "dask"

    def __init__(self, client: Any) -> None:
        self.client = client
        self._futures: list[Any] = []

    def describe(self) -> str:
        info = self.client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(w.get("nthreads", 0) for w in workers.values())
        return f"Dask scheduler {info.get('address', '?')}: {len(workers)} workers, {threads} threads"

    def run(self, cells: list[Cell], graphs: dict[str, str]) -> Iterator[Result]:
        from distributed import as_completed

        needed = {c.graph_sha256 for c in cells}
        shared = {sha: self.client.scatter(graphs[sha], hash=False) for sha in needed}
        by_key: dict[str, Cell] = {}
        for c in cells:
            # pure=False: a re-run cell is a new task, never a cached result
            f = self.client.submit(run_cell, c.as_dict(), shared[c.graph_sha256], pure=False, retries=0)
            by_key[f.key] = c
            self._futures.append(f)
        for f in as_completed(self._futures):
            cell = by_key[f.key]
            if f.status == "cancelled":
                continue
            if f.status == "error":
                exc = f.exception()
                msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                yield cell, error_record(cell, f"worker failed: {msg}"), None
                continue
            record, text = f.result()
            yield cell, record, text

    def stop(self) -> None:
        """Cancel the cells not finished; a child already running on a worker ends at its time limit."""
        if self._futures:
            self.client.cancel(self._futures)
