"""One solve in a child process, and one sweep cell turned into a record.

`solve_in_subprocess` is how `remat compare` and `remat sweep` run a solver: a child
`python -m remat_cli solve ... -o FILE` in its own session, so a solver that ignores its time
limit (or crashes the interpreter) costs one cell, never the sweep. The child is killed after
the time limit plus a grace for model building and decoding, which happen outside the engine's
own limit. The child's schedule went through the simulator before `remat solve` wrote it.

`run_cell` is what a worker runs, on the local pool or on a Dask worker: it writes the graph to a
temporary folder, runs the child there, and returns the record with the schedule text, so the
machine that owns the results folder writes both.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from remat_cli.execution.exit_codes import EXIT_INFEASIBLE
from remat_cli.schedule import Schedule
from remat_cli.sweep.cells import Cell

#: cores one sweep cell's solve may use (`--workers`): the pool runs one cell per this many
#: cores, so that a solver running one thread or chain per worker (CP-SAT, HiGHS, fastsa) is not
#: slowed by its neighbours, and the seconds recorded stay comparable with a solve run alone
CELL_CORES = 2

_running: set[subprocess.Popen[str]] = set()
_lock = threading.Lock()


def grace_seconds(time_limit: float) -> float:
    """Time a child gets beyond its limit before it is killed: model building and decoding happen
    outside the engine's own limit."""
    return 30.0 + 0.5 * time_limit


@dataclass
class ChildSolve:
    """What a child `remat solve` left: the schedule (None unless it exited 0), or why not."""

    status: str
    schedule: Schedule | None
    schedule_text: str | None
    wall_seconds: float
    message: str | None = None
    #: for an infeasible run, the lowest peak the solver reached (from its one-line message)
    best_peak: int | None = None


def solve_in_subprocess(
    graph_file: Path,
    budget: int,
    solver: str,
    time_limit: float,
    seed: int,
    out: Path,
    workers: int | None = None,
) -> ChildSolve:
    """`workers`: the child's --workers (None: its default, the cores it may run on)."""
    cmd = [sys.executable, "-m", "remat_cli", "solve", str(graph_file), "--budget", str(budget)]
    cmd += ["--solver", solver, "--time-limit", str(time_limit), "--seed", str(seed), "-q", "-o", str(out)]
    if workers is not None:
        cmd += ["--workers", str(workers)]
    t0 = time.monotonic()
    # Its own session: a Ctrl-C at the terminal reaches the sweep, which decides what to stop.
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    with _lock:
        _running.add(proc)
    try:
        _, stderr = proc.communicate(timeout=time_limit + grace_seconds(time_limit))
    except subprocess.TimeoutExpired:
        _kill(proc)
        proc.communicate()
        return ChildSolve(
            "timeout", None, None, time.monotonic() - t0, f"killed after {time_limit:g}s + grace"
        )
    except BaseException:  # Ctrl-C in the caller's thread: the child must not outlive it
        _kill(proc)
        proc.wait()
        raise
    finally:
        with _lock:
            _running.discard(proc)
    wall = time.monotonic() - t0
    if proc.returncode == 0 and out.exists():
        text = out.read_text()
        return ChildSolve("ok", Schedule.model_validate_json(text), text, wall)
    last = (stderr.strip().splitlines() or ["no output"])[-1]
    if proc.returncode == EXIT_INFEASIBLE:
        m = re.search(r"lowest peak reached ([0-9,]+) B", last)
        best = int(m.group(1).replace(",", "")) if m else None
        return ChildSolve("infeasible", None, None, wall, last, best)
    if proc.returncode < 0 and -proc.returncode == signal.SIGKILL:
        return ChildSolve("killed", None, None, wall, "killed (out of memory?)")
    return ChildSolve("error", None, None, wall, last)


def _kill(proc: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # the child and anything it started


def kill_running() -> int:
    """Kill every child solve this process started and is still waiting on; how many."""
    with _lock:
        procs = list(_running)
    for p in procs:
        _kill(p)
    return len(procs)


def run_cell(cell: Cell | dict[str, Any], graph_text: str) -> tuple[dict[str, Any], str | None]:
    """Solve one cell in a child process here; (record without its schedule path, schedule text)."""
    c = cell if isinstance(cell, Cell) else Cell(**cell)
    record = cell_fields(c) | {"host": socket.gethostname()}
    with tempfile.TemporaryDirectory(prefix="remat-sweep-") as tmp:
        graph_file = Path(tmp, "graph.json")
        graph_file.write_text(graph_text)
        child = solve_in_subprocess(
            graph_file, c.budget_bytes, c.solver, c.time_limit, c.seed, Path(tmp, "schedule.json"), CELL_CORES
        )
    record["wall_seconds"] = round(child.wall_seconds, 3)
    s = child.schedule
    if s is None:
        record |= {
            "status": child.status,
            "peak": child.best_peak,
            "peak_fraction": child.best_peak / c.baseline_peak
            if child.best_peak and c.baseline_peak
            else None,
            "cost": None,
            "overhead": None,
            "recomputations": None,
            "seconds": round(child.wall_seconds, 3),
            "bound": None,
            "bound_overhead": None,
            "message": child.message,
        }
        return record, None
    sm = s.summary
    bound = s.solver.lower_bound
    record |= {
        "status": s.solver.status,
        "peak": sm.peak_memory,
        "peak_fraction": sm.peak_memory / sm.baseline_peak_memory if sm.baseline_peak_memory else None,
        "cost": sm.cost,
        "overhead": sm.overhead,
        "recomputations": sm.recomputations,
        "seconds": s.solver.seconds,
        "bound": bound,
        # the solver's proof, as an overhead: no schedule within this budget is cheaper
        "bound_overhead": bound / sm.baseline_cost - 1.0 if bound is not None and sm.baseline_cost else None,
        "backend": s.solver.backend,
        "message": s.solver.message,
    }
    return record, child.schedule_text


def empty_record(cell: Cell, status: str, message: str) -> dict[str, Any]:
    """A record with no solve behind it: the cell's fields, `status`, `message` and no results."""
    return cell_fields(cell) | {
        "status": status,
        "peak": None,
        "peak_fraction": None,
        "cost": None,
        "overhead": None,
        "recomputations": None,
        "seconds": 0.0,
        "bound": None,
        "bound_overhead": None,
        "message": message,
    }


def skipped_record(cell: Cell, reason: str) -> dict[str, Any]:
    """A cell that never ran (solver unavailable, not applicable, budget below the lower bound)."""
    return empty_record(cell, "skipped", reason) | {"schedule": None}


def cell_fields(c: Cell) -> dict[str, Any]:
    """The fields of a record that describe the cell itself."""
    return {
        "graph_sha256": c.graph_sha256,
        "graph": c.graph,
        "graph_file": c.graph_file,
        "budget": c.budget,
        "budget_bytes": c.budget_bytes,
        "budget_fraction": c.budget_bytes / c.baseline_peak if c.baseline_peak else None,
        "solver": c.solver,
        "seed": c.seed,
        "time_limit": c.time_limit,
        "baseline_peak": c.baseline_peak,
        "baseline_cost": c.baseline_cost,
        "peak_lower_bound": c.peak_lower_bound,
    }
