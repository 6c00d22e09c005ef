"""The command line: every bad-input path exits 2 with one line and no traceback; outputs pipe."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from remat_cli import load_graph
from remat_cli.importers import generators
from remat_cli.schedule import baseline, peak_lower_bound
from tests.clirun import remat

ROOT = Path(__file__).resolve().parents[1]


def assert_bad_input(proc: subprocess.CompletedProcess[str], fragment: str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert fragment in lines[0]
    assert proc.stdout == ""


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    p = tmp_path / "g.json"
    p.write_text(generators.linear(6, seed=1).to_json())
    return p


def broken(tmp_path: Path, mutate) -> Path:  # noqa: ANN001
    data = json.loads(generators.linear(3).to_json())
    mutate(data)
    p = tmp_path / "broken.json"
    p.write_text(json.dumps(data))
    return p


@pytest.mark.slow
def test_solve_pipes_json_and_validates(graph_file: Path, tmp_path: Path) -> None:
    proc = remat("solve", graph_file, "--budget", "100%", "--solver", "checkpoint-all")
    assert proc.returncode == 0, proc.stderr
    schedule = json.loads(proc.stdout)
    assert schedule["format"] == "remat-schedule" and schedule["solver"]["status"] in ("optimal", "feasible")
    out = tmp_path / "s.json"
    out.write_text(proc.stdout)
    ok = remat("validate", graph_file, out, "--json")
    assert ok.returncode == 0 and json.loads(ok.stdout)["within_budget"] is True
    over = remat("validate", graph_file, out, "--budget", "50%")
    assert over.returncode == 1


@pytest.mark.slow
def test_validate_rejects_a_schedule_for_another_graph(graph_file: Path, tmp_path: Path) -> None:
    proc = remat("solve", graph_file, "--budget", "100%", "--solver", "checkpoint-all")
    other = tmp_path / "other.json"
    other.write_text(generators.linear(6, seed=2).to_json())
    sched = tmp_path / "s.json"
    sched.write_text(proc.stdout)
    res = remat("validate", other, sched, "--json")
    assert res.returncode == 1 and json.loads(res.stdout)["graph_matches"] is False


@pytest.mark.slow
def test_info_json(graph_file: Path) -> None:
    proc = remat("info", graph_file, "--json")
    facts = json.loads(proc.stdout)
    assert facts["nodes"] == 13 and facts["peak_lower_bound"] <= facts["baseline_peak_memory"]


@pytest.mark.slow
def test_convert_and_generate(tmp_path: Path) -> None:
    g = tmp_path / "u.json"
    assert remat("generate", "unet", "--depth", "2", "-o", g).returncode == 0
    proc = remat("convert", g)
    assert proc.returncode == 0 and json.loads(proc.stdout)["format"] == "remat-graph"
    again = remat("generate", "unet", "--depth", "2")
    assert again.stdout.strip() == g.read_text().strip()  # deterministic by seed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("mutate", "fragment"),
    [
        (lambda d: d["nodes"][0]["inputs"].append(d["nodes"][2]["outputs"][0]), "cycle"),
        (lambda d: d["nodes"][1]["inputs"].append("ghost"), "unknown value 'ghost'"),
        (lambda d: d["values"].append(dict(d["values"][1])), "duplicate value id"),
        (lambda d: d["values"][1].update(size=-5), "greater than or equal to 0"),
    ],
)
def test_bad_graphs(tmp_path: Path, mutate, fragment: str) -> None:  # noqa: ANN001
    assert_bad_input(
        remat("solve", broken(tmp_path, mutate), "--budget", "90%", "-s", "checkpoint-all"), fragment
    )


@pytest.mark.slow
def test_corrupt_onnx(tmp_path: Path) -> None:
    p = tmp_path / "model.onnx"
    p.write_bytes(b"\x08\x07garbage\xff\xfe not a protobuf")
    assert_bad_input(remat("info", p), "is not an ONNX model (protobuf parse failed)")


@pytest.mark.slow
def test_unknown_solver(graph_file: Path) -> None:
    assert_bad_input(
        remat("solve", graph_file, "--budget", "90%", "--solver", "nope"), "unknown solver 'nope'"
    )


@pytest.mark.slow
def test_unparsable_budget(graph_file: Path) -> None:
    assert_bad_input(
        remat("solve", graph_file, "--budget", "lots", "-s", "checkpoint-all"), "cannot parse budget"
    )


@pytest.mark.slow
def test_budget_below_any_schedule(graph_file: Path) -> None:
    assert_bad_input(
        remat("solve", graph_file, "--budget", "10", "-s", "checkpoint-all"),
        "below what any schedule can reach",
    )


@pytest.mark.slow
def test_unknown_solver_option(graph_file: Path) -> None:
    proc = remat("solve", graph_file, "--budget", "90%", "--solver", "checkpoint-all", "--frobnicate", "3")
    assert_bad_input(proc, "unknown option '--frobnicate'")


@pytest.mark.slow
def test_missing_file() -> None:
    assert_bad_input(remat("info", "/nonexistent/graph.json"), "cannot read")


@pytest.mark.slow
def test_failed_run_keeps_existing_output(graph_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "keep.json"
    out.write_text("precious")
    proc = remat("solve", graph_file, "--budget", "lots", "-s", "checkpoint-all", "-o", out)
    assert proc.returncode == 2 and out.read_text() == "precious"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".keep")]


@pytest.mark.slow
def test_solvers_lists_registry() -> None:
    proc = remat("solvers", "--json")
    rows = json.loads(proc.stdout)
    assert {"checkpoint-all"} <= {r["name"] for r in rows}
    assert all(r["status"] in ("available", "missing engine", "licence-limited") for r in rows)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--help"], ["solvers"]])
def test_help_and_listing_import_no_solver(args: list[str]) -> None:
    # the registry's table describes the built-ins: listing them must not pay for numba/OR-Tools
    code = (
        "import sys; from click.testing import CliRunner; from remat_cli.cli import main; "
        f"r = CliRunner().invoke(main, {args!r}); assert r.exit_code == 0, r.output; "
        "print(sorted(m for m in sys.modules if m.startswith('remat_cli.solvers.')))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env={"PYTHONPATH": str(ROOT)}
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.slow
def test_compare_runs_each_solver(graph_file: Path) -> None:
    proc = remat(
        "compare",
        graph_file,
        "--budget",
        "100%",
        "--solvers",
        "checkpoint-all",
        "--json",
        "--time-limit",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert rows[0]["solver"] == "checkpoint-all" and rows[0]["peak_fraction"] == pytest.approx(1.0)


@pytest.mark.slow
def test_compare_says_how_far_off_the_budget_a_solver_stayed(graph_file: Path) -> None:
    """A row with no schedule within budget still tells how close its solver came: the lowest
    peak its schedules reached (checkpoint-all keeps every activation of the 6-node chain)."""
    g = load_graph(graph_file)
    budget = peak_lower_bound(g)
    proc = remat(
        "compare",
        graph_file,
        "--budget",
        str(budget),
        "--solvers",
        "checkpoint-all,greedy",
        "--json",
        "--time-limit",
        "5",
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["solver"]: r for r in json.loads(proc.stdout)}
    off = rows["checkpoint-all"]
    assert off["status"] == "infeasible" and off["lowest_peak"] > budget
    assert off["lowest_peak_fraction"] == pytest.approx(off["lowest_peak"] / baseline(g).peak_memory)
    assert "lowest_peak" not in rows["greedy"] and rows["greedy"]["peak_memory"] <= budget
    assert "lowest " in proc.stderr


def reader_gone(stream: str, *args: str | Path) -> subprocess.CompletedProcess[str]:
    """`remat ARGS` with `stream` ("stdout" or "stderr") a pipe whose reader is closed before the
    command starts, so that every write to it fails; the other stream is captured."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    other = "stderr" if stream == "stdout" else "stdout"
    try:
        return subprocess.run(
            [sys.executable, "-m", "remat_cli", *map(str, args)],
            text=True,
            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
            timeout=120,
            **{stream: write_end, other: subprocess.PIPE},
        )
    finally:
        os.close(write_end)


@pytest.mark.slow
@pytest.mark.parametrize("solver", ["greedy", "fastsa"])
def test_a_reader_gone_from_stderr_costs_no_schedule(graph_file: Path, tmp_path: Path, solver: str) -> None:
    """Human output is a courtesy: `remat solve ... -o s.json 2>&1 | head -1` once exited 1 with
    no s.json (the summary's write raised BrokenPipeError)."""
    out = tmp_path / "s.json"
    proc = reader_gone(
        "stderr", "solve", graph_file, "--budget", "70%", "--solver", solver, "--time-limit", "5", "-o", out
    )
    assert proc.returncode == 0
    schedule = json.loads(out.read_text())
    assert schedule["summary"]["peak_memory"] <= schedule["budget"]


@pytest.mark.slow
def test_an_output_that_is_no_regular_file_is_written_in_place(graph_file: Path, tmp_path: Path) -> None:
    """`-o /dev/stdout`, `-o /dev/null`, `-o >(jq .)`: the atomic rename replaced the device node
    itself (run as root, `-o /dev/null` left a regular file at /dev/null). A FIFO stands in for
    them here: its reader is open before the command starts, and the schedule must come through
    it, the FIFO still a FIFO."""
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        proc = remat("solve", graph_file, "--budget", "70%", "--solver", "greedy", "-q", "-o", fifo)
        assert proc.returncode == 0, proc.stderr
        received = os.read(reader, 1 << 16)
    finally:
        os.close(reader)
    assert fifo.is_fifo()
    assert json.loads(received)["format"] == "remat-schedule"


@pytest.mark.slow
def test_an_output_through_a_symlink_replaces_its_target(graph_file: Path, tmp_path: Path) -> None:
    """The link stays a link (the rename once replaced it with a regular file); its target gets
    the schedule."""
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "s.json"
    target.write_text("old")
    link = tmp_path / "s.json"
    link.symlink_to(target)
    proc = remat("solve", graph_file, "--budget", "70%", "--solver", "greedy", "-q", "-o", link)
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink()
    assert json.loads(target.read_text())["format"] == "remat-schedule"


@pytest.mark.slow
def test_dash_reads_the_graph_and_the_schedule_from_stdin(graph_file: Path) -> None:
    """`-` as GRAPH or SCHEDULE is stdin, as `-o -` is stdout: `remat solve g | remat validate g -`."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "remat_cli"]
    solved = subprocess.run(
        [*cmd, "solve", "-", "--budget", "70%", "--solver", "greedy", "-q"],
        input=graph_file.read_text(),
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert solved.returncode == 0, solved.stderr
    schedule = json.loads(solved.stdout)
    assert schedule["summary"]["peak_memory"] <= schedule["budget"]
    checked = subprocess.run(
        [*cmd, "validate", str(graph_file), "-", "--json"],
        input=solved.stdout,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["within_budget"] is True
    empty = subprocess.run(
        [*cmd, "info", "-"], input="", capture_output=True, text=True, env=env, timeout=120
    )
    assert_bad_input(empty, "stdin is empty")


@pytest.mark.slow
def test_a_reader_gone_from_stdout_ends_quietly(graph_file: Path) -> None:
    """`remat solve ... | remat validate g missing.json`: the reader quits at once, and the solve's
    write to stdout failed as 'internal error: BrokenPipeError', exit 3. Now exit 141 (as a
    process killed by SIGPIPE) and nothing on stderr."""
    proc = reader_gone("stdout", "solve", graph_file, "--budget", "70%", "--solver", "greedy", "-q")
    assert proc.returncode == 141, proc.stderr
    assert proc.stderr == ""
