"""Cells of a sweep and the JSON Lines file that records them.

A cell is one (graph, budget, solver, seed) solve. Its key is (graph sha256, budget in bytes,
solver, seed): a budget written as `90%` and the same budget in bytes are the same cell, and a
graph renamed or moved is still the same graph. The results file is append-only, one record a
line; a line is written with a single `write` and fsync'd, so an interrupt leaves every finished
record intact, and a torn last line (power loss) is ignored on reading and closed before the
next append.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from remat_cli.budget import parse_budget
from remat_cli.graph import Graph
from remat_cli.schedule import baseline, peak_lower_bound

RESULTS_FILE = "sweep.jsonl"
SCHEDULES_DIR = "schedules"

#: record fields that depend only on the solve, not on where or how fast it ran: the local pool
#: and a Dask cluster give equal values for deterministic solvers
DETERMINISTIC_FIELDS = (
    "graph_sha256",
    "graph",
    "budget",
    "budget_bytes",
    "solver",
    "seed",
    "status",
    "peak",
    "cost",
    "overhead",
    "recomputations",
    "schedule",
)

Key = tuple[str, int, str, int]


@dataclass(frozen=True)
class GraphEntry:
    """A graph as the sweep sends it to workers: canonical remat-graph JSON plus its baseline."""

    path: str
    name: str
    sha256: str
    text: str
    baseline_peak: int
    baseline_cost: float
    peak_lower_bound: int

    @classmethod
    def of(cls, path: str, graph: Graph) -> GraphEntry:
        base = baseline(graph)
        return cls(
            path=path,
            name=graph.name,
            sha256=graph.sha256(),
            text=graph.to_json(),
            baseline_peak=base.peak_memory,
            baseline_cost=base.cost,
            peak_lower_bound=peak_lower_bound(graph),
        )


@dataclass(frozen=True)
class Cell:
    """One solve; plain data so it pickles to a Dask worker."""

    graph_sha256: str
    graph: str
    graph_file: str
    budget: str
    budget_bytes: int
    solver: str
    seed: int
    time_limit: float
    baseline_peak: int
    baseline_cost: float
    peak_lower_bound: int

    @property
    def key(self) -> Key:
        return (self.graph_sha256, self.budget_bytes, self.solver, self.seed)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def schedule_path(self) -> str:
        """Where this cell's schedule goes, relative to the results folder."""
        name = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.graph).strip("_") or "graph"
        budget = re.sub(r"[^A-Za-z0-9_.-]+", "_", self.budget.replace("%", "pct"))
        return f"{SCHEDULES_DIR}/{name}-{self.graph_sha256[:8]}/{budget}-{self.solver}-s{self.seed}.json"


def split_list(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def make_cells(
    graphs: Iterable[GraphEntry], budgets: Iterable[str], solvers: Iterable[str], seed: int, time_limit: float
) -> list[Cell]:
    """Every (graph, budget, solver) cell in that nesting order; a budget that resolves to the
    same bytes as an earlier one on a graph is one cell."""
    cells: list[Cell] = []
    seen: set[Key] = set()
    budgets, solvers = list(budgets), list(solvers)
    for g in graphs:
        for spec in budgets:
            nbytes = parse_budget(spec, g.baseline_peak)
            for s in solvers:
                cell = Cell(
                    graph_sha256=g.sha256,
                    graph=g.name,
                    graph_file=g.path,
                    budget=spec,
                    budget_bytes=nbytes,
                    solver=s,
                    seed=seed,
                    time_limit=time_limit,
                    baseline_peak=g.baseline_peak,
                    baseline_cost=g.baseline_cost,
                    peak_lower_bound=g.peak_lower_bound,
                )
                if cell.key not in seen:
                    seen.add(cell.key)
                    cells.append(cell)
    return cells


def record_key(record: dict[str, Any]) -> Key:
    return (record["graph_sha256"], int(record["budget_bytes"]), record["solver"], int(record["seed"]))


# ---- the JSON Lines file ----
def results_files(where: str | Path) -> list[Path]:
    """A results folder's *.jsonl files (sorted), or the one file given."""
    p = Path(where)
    if p.is_dir():
        return sorted(p.glob("*.jsonl"))
    return [p] if p.exists() else []


def read_records(where: str | Path) -> list[dict[str, Any]]:
    """Every complete record under `where`; a line that does not parse (torn by a crash) is skipped."""
    records: list[dict[str, Any]] = []
    for path in results_files(where):
        for line in iter_lines(path):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(rec, dict) and "graph_sha256" in rec and "solver" in rec:
                records.append(rec)
    return records


def iter_lines(path: Path) -> Iterator[str]:
    with path.open(encoding="utf-8", errors="replace") as f:
        for line in f:
            if line.strip():
                yield line


class RecordWriter:
    """Appends one record a line to `path`: one `write` call, flushed and fsync'd."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        size = os.fstat(self.fd).st_size
        if size:
            with path.open("rb") as f:
                f.seek(size - 1)
                if f.read(1) != b"\n":  # a torn last line: end it so the next record stands alone
                    os.write(self.fd, b"\n")

    def append(self, record: dict[str, Any]) -> None:
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())
        os.fsync(self.fd)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
