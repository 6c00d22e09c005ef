"""Time limits, interrupts and atomic output (issue 20, part 3).

- every registered solver, run by the watchdog with a small --time-limit, returns within
  max(10%, 2 s) of it, with a valid schedule or none;
- SIGINT/SIGTERM during a solve keep the best schedule so far (status feasible, message
  "interrupted") and `remat solve` exits 130/143, writing a whole schedule or nothing;
- a process killed while writing leaves the old file or the new one, never a mix.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from remat_cli import registry
from remat_cli.execution.watchdog import run_guarded, tolerance
from remat_cli.importers import generators
from remat_cli.schedule import Step, baseline, simulate
from remat_cli.solver import SolveOptions

ROOT = Path(__file__).resolve().parents[1]
LIMIT = 2.0


@pytest.fixture(scope="module")
def big_graph():  # noqa: ANN201
    """Large enough that the exact solvers do not finish within the limit."""
    return generators.random_layered(300, seed=3)


@pytest.mark.parametrize("name", registry.names())
def test_time_limit_is_honoured(name: str, big_graph) -> None:  # noqa: ANN001
    solver = registry.get(name)
    if solver.availability()[0] != "available" or solver.supports(big_graph) is not None:
        pytest.skip(f"{name} does not apply here")
    budget = int(0.8 * baseline(big_graph).peak_memory)
    t0 = time.monotonic()
    out = run_guarded(big_graph, budget, name, SolveOptions(time_limit=LIMIT, seed=0, workers=1))
    elapsed = time.monotonic() - t0
    assert elapsed <= LIMIT + tolerance(LIMIT), f"{name}: {elapsed:.2f} s for a {LIMIT} s limit"
    if out.schedule is not None:
        sim = simulate(big_graph, out.schedule.steps)
        assert sim.peak_memory == out.schedule.summary.peak_memory
        if out.schedule.solver.status in ("optimal", "feasible"):
            assert sim.peak_memory <= budget


def test_signal_keeps_the_best_schedule_so_far(big_graph) -> None:  # noqa: ANN001
    """The first incumbent arrives, then SIGTERM: the outcome is that incumbent, feasible."""
    budget = int(0.9 * baseline(big_graph).peak_memory)  # greedy's warm start fits 90%
    seen: list[list[Step]] = []

    def on_incumbent(steps: list[Step]) -> None:
        if not seen:
            os.kill(os.getpid(), signal.SIGTERM)  # handled by the watchdog, which is running now
        seen.append(steps)

    out = run_guarded(big_graph, budget, "checkmate", SolveOptions(time_limit=120, on_incumbent=on_incumbent))
    assert out.signal == signal.SIGTERM
    assert out.schedule is not None and seen
    assert out.schedule.solver.status == "feasible"
    assert "interrupted" in (out.schedule.solver.message or "")
    assert simulate(big_graph, out.schedule.steps).peak_memory <= budget


@pytest.mark.slow
def test_a_stopped_portfolio_names_who_found_its_schedule(big_graph) -> None:  # noqa: ANN001
    """auto stopped by the watchdog returns its last incumbent; the message names the solver
    that found it (it said only "best schedule so far", whoever that was): greedy's here, the
    first incumbent, after which SIGTERM stops the run."""
    budget = int(0.9 * baseline(big_graph).peak_memory)

    def on_incumbent(steps: list[Step]) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    out = run_guarded(big_graph, budget, "auto", SolveOptions(time_limit=120, on_incumbent=on_incumbent))
    assert out.signal == signal.SIGTERM and out.schedule is not None
    assert out.schedule.solver.message == "interrupted (SIGTERM): best schedule so far, greedy's"


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc (Linux)")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_exits_128_plus_signal_and_writes_all_or_nothing(sig: int, tmp_path: Path, big_graph) -> None:  # noqa: ANN001
    graph = tmp_path / "g.json"
    graph.write_text(big_graph.to_json())
    out = tmp_path / "s.json"
    out.write_text("old\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "remat_cli", "solve", graph, "-b", "90%", "-s", "checkmate", "-o", out, "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    deadline = time.monotonic() + 120
    while not _children(proc.pid) and time.monotonic() < deadline:
        try:  # until the solver process exists (or the command ended early, which fails below)
            proc.wait(timeout=0.05)
            break
        except subprocess.TimeoutExpired:
            pass
    assert proc.poll() is None, proc.communicate()
    child = _children(proc.pid)[0]
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, stderr
    assert "Traceback" not in stderr
    assert not Path(f"/proc/{child}").exists() or "zombie" in Path(f"/proc/{child}/status").read_text()
    text = out.read_text()
    if text != "old\n":  # a schedule was found before the signal: whole, and marked so
        s = json.loads(text)
        assert s["solver"]["status"] == "feasible" and "interrupted" in s["solver"]["message"]
        simulate(big_graph, [Step.model_validate(x) for x in s["steps"]])
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


WRITER = """
import sys
from remat_cli.cli.common import write_atomic
text = sys.argv[2] * 20_000_000  # 20 MB: the kill lands while it is being written
print("writing", flush=True)
write_atomic(sys.argv[1], text)
print("done", flush=True)
"""


@pytest.mark.slow
def test_killed_writer_leaves_the_old_file_or_the_new(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    target.write_text("old\n")
    proc = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(target), "x"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "writing"
    while not [p for p in tmp_path.iterdir() if p.name.startswith(".")] and proc.poll() is None:
        pass  # until the temp file exists: the write is under way
    proc.kill()
    proc.wait()
    text = target.read_text()
    assert text in ("old\n", "x" * 20_000_000 + "\n")
    # and when it is not killed, the new file replaces the old in one piece
    done = subprocess.run(
        [sys.executable, "-c", WRITER, str(target), "y"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0 and target.read_text() == "y" * 20_000_000 + "\n"


def test_incumbents_keep_every_step_field() -> None:
    """What the solver child sends through the pipe comes back whole: copy steps keep their
    devices (a dropped field made a copy 'to itself' once)."""
    from remat_cli.execution.watchdog import pack_steps, unpack_steps
    from remat_cli.schedule import Step

    steps = [
        Step(op="compute", node="a", device="gpu"),
        Step.model_validate({"op": "copy", "value": "x", "from": "cpu", "to": "gpu"}),
        Step(op="free", value="x", device="cpu"),
    ]
    assert unpack_steps(pack_steps(steps)) == steps


def test_a_long_lived_process_counts_from_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Called in-process (a test runner, a notebook) the time limit counts from the command; the
    `remat` executable counts from its process's start."""
    from remat_cli.execution import watchdog

    later = watchdog.COMMAND_STARTED + 3600.0
    monkeypatch.setattr(watchdog, "_PROCESS_IS_COMMAND", False)
    assert watchdog.command_started(later) == later
    watchdog.process_is_command()
    assert watchdog.command_started(later) == watchdog.COMMAND_STARTED


ORPHAN = """
import os, signal, sys
from remat_cli.execution.watchdog import die_with_parent

parent = os.getpid()
pid = os.fork()
if pid == 0:
    die_with_parent(parent)
    signal.pause()  # a solve that would run on: only a signal ends it
    os._exit(0)
print(pid, flush=True)
signal.pause()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_solving_child_dies_with_a_killed_parent() -> None:
    """SIGKILL gives the parent no chance to stop its child, which has a process group of its own."""
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHAN],
        stdout=subprocess.PIPE,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    child = int(proc.stdout.readline())
    gone = os.pidfd_open(child)
    try:
        proc.kill()
        proc.wait(30)
        ready, _, _ = select.select([gone], [], [], 15)
        assert ready, "the child outlived its SIGKILLed parent"
    finally:
        os.close(gone)
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
