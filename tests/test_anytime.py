"""Anytime answers: the ratio construction (a first schedule within budget in seconds), the solve
trace of every improving incumbent, and the live line of `remat solve` on a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import pytest

from remat_cli.cli.live import BackgroundBound
from remat_cli.execution.cost_bound import cost_lower_bound
from remat_cli.execution.trace import TraceRecorder
from remat_cli.execution.watchdog import run_guarded
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.schedule import baseline, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions
from remat_cli.solvers.ratio import Ratio

ROOT = Path(__file__).resolve().parents[1]


def budget(g: Graph, fraction: float) -> int:
    return max(int(fraction * baseline(g).peak_memory), peak_lower_bound(g))


@pytest.mark.parametrize(("layers", "fraction"), [(4, 0.5), (8, 0.5), (8, 0.3), (16, 0.3)])
def test_ratio_fits_the_budget_on_a_repeated_stack(layers: int, fraction: float) -> None:
    g = G.transformer(layers)
    b = budget(g, fraction)
    res = Ratio().solve(g, b, SolveOptions(time_limit=10))
    assert res.status == "feasible" and res.steps is not None
    sim = simulate(g, res.steps)  # raises on an invalid schedule
    assert sim.peak_memory <= b
    assert sim.cost == res.objective
    assert sim.recomputations > 0  # the baseline does not fit: something is made again


def test_ratio_without_a_fit_returns_its_lowest_peak() -> None:
    g = G.transformer(2)
    b = peak_lower_bound(g)
    res = Ratio().solve(g, b, SolveOptions(time_limit=5))
    assert res.status == "infeasible" and res.steps is not None
    assert res.best_peak == simulate(g, res.steps).peak_memory
    assert b < res.best_peak < baseline(g).peak_memory


@pytest.mark.slow
def test_the_trace_records_each_improving_incumbent() -> None:
    g = G.transformer(8)
    b = budget(g, 0.5)
    rec = TraceRecorder(b, baseline(g).cost)
    out = run_guarded(g, b, "auto", SolveOptions(time_limit=3, workers=1, seed=0), trace=rec)
    assert out.schedule is not None
    trace = out.schedule.solver.trace
    assert trace is not None and trace.incumbents
    within = [p for p in trace.incumbents if p.peak_memory <= b]
    assert trace.first_within_budget == within[0].seconds
    assert [p.seconds for p in trace.incumbents] == sorted(p.seconds for p in trace.incumbents)
    costs = [p.cost for p in within]
    assert all(a > c for a, c in zip(costs, costs[1:], strict=False))  # each one cheaper
    assert costs[-1] == out.schedule.summary.cost  # the last point is the schedule written
    assert {p.method for p in trace.incumbents} <= {
        "stack",
        "ratio",
        "greedy",
        "fastsa",
        "hilp",
        "checkmate",
        "moccasin",
    }


def test_a_trace_point_that_does_not_improve_is_not_recorded() -> None:
    rec = TraceRecorder(budget=100, baseline_cost=10.0)
    assert rec.offer(150, 10.0, "a")  # over the budget: ranked by peak
    assert not rec.offer(160, 9.0, "b")
    assert rec.offer(90, 14.0, "c")  # the first within budget
    assert not rec.offer(80, 14.0, "d")  # as dear
    assert rec.offer(100, 12.0, "e")
    t = rec.snapshot()
    assert [p.method for p in t.incumbents] == ["a", "c", "e"]
    assert t.first_within_budget == t.incumbents[1].seconds
    assert t.incumbents[2].overhead == pytest.approx(0.2)


def _solve_on_a_terminal(args: list[str], timeout: float = 90) -> tuple[int, str, str]:
    """`remat solve ARGS` with stderr on a pseudo-terminal and stdout on a pipe: exit code,
    stdout, and everything the terminal received."""
    master, slave = pty.openpty()
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "TERM": "xterm", "COLUMNS": "160"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "remat_cli", "solve", *args],
        stdout=subprocess.PIPE,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        env=env,
    )
    os.close(slave)
    seen = b""
    while True:
        ready, _, _ = select.select([master], [], [], timeout)
        if not ready:
            proc.kill()
            raise AssertionError(f"no output for {timeout} s: {seen[-500:]!r}")
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        seen += chunk
    out = proc.stdout.read().decode() if proc.stdout else ""
    code = proc.wait(timeout)
    os.close(master)
    return code, out, seen.decode(errors="replace")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("live") / "stack.json"
    p.write_text(G.transformer(8).to_json())
    return p


@pytest.mark.slow
def test_the_live_line_shows_on_a_terminal_and_stdout_stays_the_schedule(stack: Path) -> None:
    # ratio ends within a second; a loaded machine may spend seconds of the limit on imports
    code, out, term = _solve_on_a_terminal([str(stack), "-b", "50%", "-s", "ratio", "--time-limit", "60"])
    assert code == 0, term[-2000:]
    s = json.loads(out)  # nothing but the schedule on stdout
    assert s["solver"]["trace"]["first_within_budget"] is not None
    assert "/60 s" in term and "best " in term and "bound " in term  # elapsed/limit, incumbent, bound
    first = s["solver"]["trace"]["incumbents"][0]
    assert f"{100 * first['overhead']:.2f}%" in term and first["method"] in term  # its log line


@pytest.mark.slow
def test_quiet_silences_the_live_line(stack: Path) -> None:
    args = [str(stack), "-b", "50%", "-s", "ratio", "--time-limit", "60", "--quiet"]
    code, out, term = _solve_on_a_terminal(args)
    assert code == 0, term[-2000:]
    assert json.loads(out)["solver"]["trace"]["first_within_budget"] is not None
    assert "/60 s" not in term and "overhead" not in term and "preparing" not in term


@pytest.mark.slow
def test_the_background_bound_is_the_cut_bound() -> None:
    g = G.linear(8)
    b = budget(g, 0.5)
    bg = BackgroundBound(g, b, 30.0)
    try:
        cut = bg.poll(60.0)
    finally:
        bg.stop()
    assert cut is not None
    assert cut.extra_cost == cost_lower_bound(g, b, time_limit=30.0).extra_cost > 0
