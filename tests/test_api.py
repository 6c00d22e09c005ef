"""The Python API (`from remat_cli import load_graph, solve, simulate`): the CLI's checks and
messages as exceptions, simulator-checked schedules, the README's example, a light import."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import remat_cli
from remat_cli import InputError, NoSchedule, budget_bytes, load_graph, simulate, solve
from remat_cli.cli import main
from remat_cli.importers.generators import unet
from remat_cli.schedule import Schedule, baseline, peak_lower_bound

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("api") / "unet.json"
    path.write_text(unet(2, 2, seed=3).to_json())
    return path


def cli_error(*args: str | Path) -> tuple[int, str]:
    """Exit code and the one stderr line of a failing CLI call, without its "remat: [error: ]"."""
    try:  # click < 8.2 mixes stderr into output unless told not to
        runner = CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        runner = CliRunner()
    r = runner.invoke(main, [str(a) for a in args])
    lines = r.stderr.strip().splitlines()
    assert r.stdout == "" and len(lines) == 1, r.stderr
    return r.exit_code, re.sub(r"^remat: (error: )?", "", lines[0])


def test_load_solve_simulate_round_trip(graph_file: Path) -> None:
    g = load_graph(graph_file)
    base = baseline(g).peak_memory
    s = solve(g, "80%", solver="greedy", strategy="split")
    assert isinstance(s, Schedule) and s.budget == int(0.8 * base)
    sim = simulate(g, s)
    assert sim.peak_memory == s.summary.peak_memory <= s.budget
    assert sim.recomputations == s.summary.recomputations >= 1
    assert simulate(g, s.steps) == sim
    assert s.solver.params["strategy"] == "split"
    # a path works as well as a Graph, and a byte budget as well as text
    again = solve(graph_file, s.budget, solver="greedy", strategy="split")
    assert again.steps == s.steps


def test_same_messages_as_the_cli(graph_file: Path, tmp_path: Path) -> None:
    g = load_graph(graph_file)
    corrupt = tmp_path / "bad.onnx"
    corrupt.write_bytes(b"\x00not a model")
    bad_hint = tmp_path / "hint.json"
    other = solve(load_graph_of(unet(1, 1, seed=0), tmp_path), "100%", solver="checkpoint-all")
    bad_hint.write_text(other.to_json())
    cases = [
        (["--budget", "lots"], {"budget": "lots"}),
        (["--budget", "1%"], {"budget": "1%"}),
        (["--budget", "90%", "--solver", "nope"], {"budget": "90%", "solver": "nope"}),
        (["--budget", "90%", "--hint", str(bad_hint)], {"budget": "90%", "hint": other}),
    ]
    for args, kwargs in cases:
        code, line = cli_error("solve", graph_file, *args)
        with pytest.raises(InputError) as e:
            solve(g, **kwargs)
        assert code == 2 and str(e.value) == line
    # the hint's own fault is named as the hint's, not as a bare step of "the schedule"
    assert line.startswith("the hint is not a valid schedule of this graph: step ")
    code, line = cli_error("info", corrupt)
    with pytest.raises(InputError) as e:
        load_graph(corrupt)
    assert code == 2 and str(e.value) == line and "is not an ONNX model" in line
    with pytest.raises(InputError, match="unknown option 'max_copies' for solver 'greedy'"):
        solve(g, "90%", solver="greedy", max_copies=2)
    with pytest.raises(InputError, match="'sideways' is not one of"):
        solve(g, "90%", solver="greedy", strategy="sideways")
    with pytest.raises(InputError, match="--max-copies: 0 is below its minimum 1"):
        solve(g, "90%", solver="moccasin", max_copies=0)


def load_graph_of(g, tmp_path: Path):  # noqa: ANN001, ANN201 - a tiny helper for one test
    path = tmp_path / f"{g.name}.json"
    path.write_text(g.to_json())
    return load_graph(path)


def test_no_schedule_is_the_cli_exit_1(graph_file: Path) -> None:
    g = load_graph(graph_file)
    budget = peak_lower_bound(g)
    code, line = cli_error("solve", graph_file, "--budget", str(budget), "--solver", "checkpoint-all", "-q")
    with pytest.raises(NoSchedule) as e:
        solve(g, budget, solver="checkpoint-all")
    assert code == 1 and str(e.value) == line
    assert e.value.schedule is not None and e.value.schedule.summary.peak_memory > budget


def test_budget_bytes_and_invalid_schedule(graph_file: Path) -> None:
    g = load_graph(graph_file)
    base = baseline(g).peak_memory
    assert budget_bytes(g, "90%") == int(0.9 * base) and budget_bytes(g, base) == base
    with pytest.raises(InputError, match="is below what any schedule can reach"):
        budget_bytes(g, peak_lower_bound(g) - 1)
    s = solve(g, "100%", solver="checkpoint-all")
    with pytest.raises(InputError):  # a ScheduleError's message, as `remat validate` reports it
        simulate(g, s.steps[1:])
    assert issubclass(InputError, ValueError)


def test_nothing_printed(graph_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    solve(load_graph(graph_file), "80%", solver="greedy")
    assert capsys.readouterr() == ("", "")


def test_readme_example_runs(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Python API", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    assert capsys.readouterr().out.startswith("True ")


def test_import_is_light_and_names_resolve() -> None:
    probe = (
        "import json, sys, remat_cli; before = sorted(m for m in ('onnx', 'numba', 'remat_cli.api', "
        "'ortools') if m in sys.modules); remat_cli.solve; "
        "print(json.dumps([before, 'remat_cli.api' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=ROOT)
    before, loaded = json.loads(out.stdout)
    assert before == [] and loaded
    assert set(remat_cli.__all__) <= set(dir(remat_cli))
    with pytest.raises(AttributeError):
        remat_cli.no_such_name  # noqa: B018


@pytest.mark.skipif(not hasattr(__import__("os"), "sched_setaffinity"), reason="no CPU affinity here")
def test_default_workers_are_the_cores_this_process_may_use() -> None:
    """Pinned to one core (taskset, a container's cpuset), a solve defaults to one worker: with
    the machine's count, hilp's and auto's helpers shared that core and found nothing in 10 s."""
    code = (
        "import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))});"
        "from remat_cli.solver import SolveOptions; from remat_cli.sweep.pool import default_jobs;"
        "print(SolveOptions().workers, default_jobs())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]
