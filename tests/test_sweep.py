"""`remat sweep` on the local pool: one record a cell, schedules that simulate to the recorded
numbers, resume without re-running, Ctrl-C keeps finished cells only."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest

from remat_cli.graph import Graph
from remat_cli.importers import generators, load_graph
from remat_cli.schedule import Schedule, baseline, simulate
from remat_cli.sweep import runner
from remat_cli.sweep.cells import RESULTS_FILE, GraphEntry, RecordWriter, make_cells, read_records, record_key
from remat_cli.sweep.pool import LocalPool
from remat_cli.sweep.sweep import run_sweep
from tests.clirun import remat as _remat

#: a sweep runs several solves in one command
remat = partial(_remat, timeout=300)


@pytest.fixture
def graphs(tmp_path: Path) -> list[Path]:
    a = tmp_path / "lin.json"
    a.write_text(generators.linear(6, seed=1).to_json())
    b = tmp_path / "rl.json"
    b.write_text(generators.random_layered(24, seed=3).to_json())
    return [a, b]


@pytest.mark.slow
def test_sweep_writes_one_record_per_cell_and_resumes(graphs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "res"
    args = ["sweep", *graphs, "--budgets", "100%,75%", "--solvers", "greedy,checkpoint-all"]
    args += ["--time-limit", "5", "-o", out, "-q"]
    first = remat(*args)
    assert first.returncode == 0, first.stderr
    records = read_records(out)
    assert len(records) == 2 * 2 * 2
    assert len({record_key(r) for r in records}) == 8
    for r in records:
        g = load_graph(r["graph_file"])
        assert r["graph_sha256"] == g.sha256() and r["graph"] == g.name
        base = baseline(g)
        assert r["baseline_peak"] == base.peak_memory
        assert r["budget_bytes"] == int(float(r["budget"].rstrip("%")) / 100 * base.peak_memory)
        if r["status"] in ("optimal", "feasible"):
            s = Schedule.model_validate_json((out / r["schedule"]).read_text())
            sim = simulate(g, s.steps)
            assert (sim.peak_memory, sim.cost) == (r["peak"], r["cost"])
            assert sim.peak_memory <= r["budget_bytes"]
            assert r["overhead"] == pytest.approx(sim.cost / base.cost - 1)
        else:
            assert r["status"] == "infeasible" and r["schedule"] is None
            assert r["peak"] is not None and r["peak"] > r["budget_bytes"]
    # checkpoint-all cannot go below the baseline peak; greedy can on the chain
    by = {(r["graph"], r["budget"], r["solver"]): r["status"] for r in records}
    assert by[("linear_n6_s1", "75%", "checkpoint-all")] == "infeasible"
    assert by[("linear_n6_s1", "75%", "greedy")] == "feasible"

    again = remat(*args)
    assert again.returncode == 0, again.stderr
    assert "0 cells ran, 8 already" in again.stderr
    assert len(read_records(out)) == 8


@pytest.mark.slow
def test_resume_runs_only_the_missing_cells(graphs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "res"
    args = [
        "sweep",
        graphs[0],
        "--budgets",
        "100%,80%",
        "--solvers",
        "greedy,chen-sqrtn",
        "--time-limit",
        "5",
    ]
    args += ["-o", out, "-q"]
    assert remat(*args).returncode == 0
    lines = (out / RESULTS_FILE).read_text().splitlines()
    kept = lines[:1]
    # an interrupted earlier run: one finished record and a torn line from the crash
    (out / RESULTS_FILE).write_text("\n".join(kept) + "\n" + lines[1][:40])
    again = remat(*args)
    assert again.returncode == 0, again.stderr
    assert "3 cells ran, 1 already" in again.stderr
    records = read_records(out)
    assert len(records) == 4 and len({record_key(r) for r in records}) == 4
    assert records[0] == json.loads(kept[0])  # untouched


@pytest.mark.slow
def test_ctrl_c_keeps_finished_cells_and_kills_children(tmp_path: Path) -> None:
    g = generators.linear(6, seed=1)
    entry = GraphEntry.of("lin.json", g)
    cells = make_cells([entry], ["100%", "90%", "80%", "70%"], ["greedy", "chen-sqrtn"], seed=0, time_limit=5)
    seen: list[dict] = []

    def ctrl_c_after_two(record: dict) -> None:
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt  # what the terminal delivers to the main thread

    out = tmp_path / "res"
    outcome = run_sweep(cells, {entry.sha256: g}, LocalPool(2), out, on_record=ctrl_c_after_two)
    assert outcome.interrupted
    assert runner.kill_running() == 0  # no child outlives the interrupt
    records = read_records(out)
    assert [record_key(r) for r in records] == [record_key(r) for r in seen]
    assert all(r["status"] == "feasible" for r in records)

    resumed = run_sweep(cells, {entry.sha256: g}, LocalPool(1), out)
    assert not resumed.interrupted and resumed.already_done == 2 and resumed.ran == len(cells) - 2
    assert {record_key(r) for r in read_records(out)} == {c.key for c in cells}


def test_torn_line_is_skipped_and_closed(tmp_path: Path) -> None:
    p = tmp_path / RESULTS_FILE
    p.write_text('{"graph_sha256": "a", "budget_bytes": 1, "solver": "greedy", "seed": 0}\n{"graph_sha')
    assert len(read_records(p)) == 1
    with RecordWriter(p) as w:
        w.append({"graph_sha256": "b", "budget_bytes": 2, "solver": "greedy", "seed": 0})
    assert [r["graph_sha256"] for r in read_records(p)] == ["a", "b"]


def test_cells_below_the_lower_bound_are_recorded_as_skipped(tmp_path: Path) -> None:
    g: Graph = generators.linear(4, seed=0)
    entry = GraphEntry.of("g.json", g)
    cells = make_cells([entry], ["1%"], ["greedy"], seed=0, time_limit=5)
    outcome = run_sweep(cells, {entry.sha256: g}, LocalPool(1), tmp_path)
    assert outcome.skipped == 1 and outcome.ran == 0
    (r,) = read_records(tmp_path)
    assert r["status"] == "skipped" and "lower bound" in r["message"]


@pytest.mark.slow
def test_bad_input_is_one_line(graphs: list[Path], tmp_path: Path) -> None:
    proc = remat("sweep", graphs[0], "--solvers", "greedy,nosuch", "-o", tmp_path / "r")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "nosuch" in proc.stderr
    assert not (tmp_path / "r").exists()
