"""The loop both backends share: skip finished cells, run the rest, write each record as it arrives.

A record is written only after its schedule file is in place (atomically), so every record's
`schedule` path exists. On Ctrl-C the backend stops; results that arrive after the interrupt
(children killed mid-solve) are dropped, so the file holds finished cells only and a resumed
sweep runs exactly the cells that are missing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.sweep.cells import RESULTS_FILE, Cell, Key, RecordWriter, read_records, record_key
from remat_cli.sweep.runner import skipped_record
from remat_cli.util.files import write_atomic


class Backend(Protocol):
    name: str

    def describe(self) -> str: ...

    def run(
        self, cells: list[Cell], graphs: dict[str, str]
    ) -> Iterator[tuple[Cell, dict[str, Any], str | None]]: ...

    def stop(self) -> None: ...


@dataclass
class SweepOutcome:
    ran: int = 0
    skipped: int = 0  # cells that could not run here (solver unavailable, budget below the bound)
    already_done: int = 0
    interrupted: bool = False
    records: list[dict[str, Any]] = field(default_factory=list)


def finished_keys(results_dir: Path) -> set[Key]:
    return {record_key(r) for r in read_records(results_dir)}


def why_not_run(cell: Cell, graph: Graph) -> str | None:
    """Why a cell cannot run at all, decided here rather than in a child process."""
    if cell.budget_bytes < cell.peak_lower_bound:
        return f"budget {cell.budget_bytes:,} B is below the lower bound {cell.peak_lower_bound:,} B"
    solver = registry.get(cell.solver)
    state, reason = solver.availability()
    if state != "available":
        return f"solver unavailable: {reason}"
    return solver.supports(graph)


def run_sweep(
    cells: list[Cell],
    graphs: dict[str, Graph],
    backend: Backend,
    results_dir: Path,
    on_record: Callable[[dict[str, Any]], None] | None = None,
) -> SweepOutcome:
    """Run every cell of `cells` not yet in `results_dir`; records go to results_dir/sweep.jsonl."""
    outcome = SweepOutcome()
    done = finished_keys(results_dir)
    todo = [c for c in cells if c.key not in done]
    outcome.already_done = len(cells) - len(todo)
    texts = {sha: g.to_json() for sha, g in graphs.items()}
    with RecordWriter(results_dir / RESULTS_FILE) as writer:

        def keep(record: dict[str, Any]) -> None:
            writer.append(record)
            outcome.records.append(record)
            if on_record is not None:
                on_record(record)

        runnable: list[Cell] = []
        for c in todo:
            reason = why_not_run(c, graphs[c.graph_sha256])
            if reason is None:
                runnable.append(c)
            else:
                keep(skipped_record(c, reason))
                outcome.skipped += 1
        try:
            for cell, record, text in backend.run(runnable, texts):
                record["schedule"] = None
                if text is not None:
                    rel = cell.schedule_path()
                    (results_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    write_atomic(str(results_dir / rel), text)
                    record["schedule"] = rel
                keep(record)
                outcome.ran += 1
        except KeyboardInterrupt:
            outcome.interrupted = True
            backend.stop()
    return outcome


def best_by_graph(records: list[dict[str, Any]]) -> dict[str, str]:
    """Per graph sha: the cheapest schedule within budget at the tightest budget reached so far."""
    best: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("status") not in ("optimal", "feasible") or r.get("overhead") is None:
            continue
        b = best.get(r["graph_sha256"])
        if b is None or (r["budget_bytes"], r["overhead"]) < (b["budget_bytes"], b["overhead"]):
            best[r["graph_sha256"]] = r
    return {sha: f"{r['budget']}: {r['solver']} +{100 * r['overhead']:.2f}%" for sha, r in best.items()}
