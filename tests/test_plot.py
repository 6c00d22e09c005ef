"""`remat plot` and `remat report`: the figures' data (not pixels) against the sweep's JSONL."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from remat_cli.graph import Graph
from remat_cli.importers import generators, load_graph
from remat_cli.schedule import Schedule, baseline, simulate
from remat_cli.sweep.cells import GraphEntry, make_cells, read_records
from remat_cli.sweep.plot import BASELINE_LABEL, memory_figure, tradeoff_figure
from remat_cli.sweep.pool import LocalPool
from remat_cli.sweep.report import report_html
from remat_cli.sweep.sweep import run_sweep
from tests.clirun import remat


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Graph]]:
    """A real sweep: two graphs × 3 budgets × greedy and moccasin (which proves bounds)."""
    tmp = tmp_path_factory.mktemp("plot")
    graphs = {"lin.json": generators.linear(6, seed=1), "rl.json": generators.random_layered(16, seed=5)}
    entries = []
    for name, g in graphs.items():
        (tmp / name).write_text(g.to_json())
        entries.append(GraphEntry.of(str(tmp / name), g))
    cells = make_cells(entries, ["100%", "85%", "70%"], ["greedy", "moccasin"], seed=0, time_limit=5)
    run_sweep(
        cells, {e.sha256: g for e, g in zip(entries, graphs.values(), strict=True)}, LocalPool(1), tmp / "res"
    )
    return tmp / "res", {e.name: g for e, g in zip(entries, graphs.values(), strict=True)}


def expected_points(records: list[dict[str, Any]], graph: str, solver: str) -> list[tuple[float, float]]:
    rs = [
        r
        for r in records
        if r["graph"] == graph and r["solver"] == solver and r["status"] in ("optimal", "feasible")
    ]
    rs.sort(key=lambda r: -r["budget_bytes"])
    return [(100 * r["peak"] / r["baseline_peak"], 100 * r["overhead"]) for r in rs]


def panel(fig: Any, graph: str) -> Any:
    (ax,) = [a for a in fig.axes if a.get_visible() and a.get_title().startswith(graph + "\n")]
    return ax


@pytest.mark.slow
def test_tradeoff_figure_data_is_the_jsonl(sweep: tuple[Path, dict[str, Graph]]) -> None:
    results, graphs = sweep
    records = read_records(results)
    fig = tradeoff_figure(records)
    assert sum(a.get_visible() for a in fig.axes) == len(graphs)
    some_bound = False
    for name in graphs:
        ax = panel(fig, name)
        lines = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
        for solver in ("greedy", "moccasin"):
            want = expected_points(records, name, solver)
            assert want, f"{solver} found nothing on {name}"
            got = lines[f"solver:{solver}"].get_xydata().ravel().tolist()
            assert got == pytest.approx([v for p in want for v in p])
        assert [tuple(p) for p in lines["baseline"].get_xydata()] == [(100.0, 0.0)]
        bounds = [
            r["bound_overhead"]
            for r in records
            if r["graph"] == name and r["solver"] == "moccasin" and r.get("bound_overhead") is not None
        ]
        shaded = [c for c in ax.collections if c.get_gid() == "bound:moccasin"]
        assert len(shaded) == (1 if bounds else 0)
        if bounds:
            some_bound = True
            top = max(v[1] for p in shaded[0].get_paths() for v in p.vertices)
            assert top == pytest.approx(100 * max(0.0, *bounds))
        assert "%" in ax.get_xlabel() and "%" in ax.get_ylabel()
    assert some_bound  # moccasin proves its optimum on these small graphs
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert {"greedy", "moccasin", BASELINE_LABEL} <= set(labels)


@pytest.mark.slow
def test_memory_figure_follows_the_simulator(sweep: tuple[Path, dict[str, Graph]]) -> None:
    results, graphs = sweep
    (r,) = [
        r
        for r in read_records(results)
        if r["graph"].startswith("linear") and r["budget"] == "70%" and r["solver"] == "greedy"
    ]
    g = graphs[r["graph"]]
    s = Schedule.model_validate_json((results / r["schedule"]).read_text())
    fig = memory_figure(g, s)
    ax = fig.axes[0]
    unit = re.search(r"\((\w+)\)", ax.get_ylabel()).group(1)
    scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    lines = {ln.get_gid(): ln for ln in ax.get_lines()}
    profile = simulate(g, s.steps, keep_profile=True).profile
    assert list(lines["live"].get_ydata() * scale) == pytest.approx(list(profile))
    assert max(lines["live"].get_ydata()) * scale == pytest.approx(r["peak"])
    assert lines["budget"].get_ydata()[0] * scale == pytest.approx(r["budget_bytes"])
    assert r["peak"] <= r["budget_bytes"] < baseline(g).peak_memory


@pytest.mark.slow
def test_report_has_the_figure_and_every_cell(sweep: tuple[Path, dict[str, Graph]]) -> None:
    results, graphs = sweep
    records = read_records(results)
    page = report_html(records, results, load_graph=load_graph)
    assert page.count("<svg") == 1
    assert page.count("<tr") == len(records) + 1  # one header row
    assert page.count("data:image/png;base64,") == len(graphs)
    for r in records:
        if r.get("schedule"):
            assert f"href='{r['schedule']}'" in page


@pytest.mark.slow
def test_cli_writes_figures_and_report(sweep: tuple[Path, dict[str, Graph]], tmp_path: Path) -> None:
    results, _ = sweep
    for name in ("t.png", "t.svg"):
        proc = remat("plot", results, "-o", tmp_path / name)
        assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "t.svg").read_text()
    r = next(r for r in read_records(results) if r.get("schedule"))
    proc = remat("plot", "--memory", results / r["schedule"], "-g", r["graph_file"], "-o", tmp_path / "m.png")
    assert proc.returncode == 0, proc.stderr
    proc = remat("report", results, "-o", tmp_path / "r.html")
    assert proc.returncode == 0 and "<table>" in (tmp_path / "r.html").read_text()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["-o", "x.gif"], ".png, .svg or .pdf"),
        (["--memory", "s.json", "-o", "m.png"], "-g GRAPH"),
        (["-o", "t.png"], "results folder"),
    ],
)
def test_plot_bad_input_is_one_line(args: list[str], fragment: str, tmp_path: Path) -> None:
    proc = remat("plot", *args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and fragment in proc.stderr


@pytest.mark.slow
def test_plot_of_an_empty_folder_is_bad_input(tmp_path: Path) -> None:
    proc = remat("plot", tmp_path, "-o", tmp_path / "t.png")
    assert proc.returncode == 2 and "no sweep records" in proc.stderr
    assert not (tmp_path / "t.png").exists()


@pytest.mark.slow
def test_memory_figure_per_device(tmp_path: Path) -> None:
    """A multi-device schedule (xengine, with copies): one live line per device, each the simulator's
    per-device profile, against that device's budget; the CLI renders it."""
    from click.testing import CliRunner

    from remat_cli.cli import main
    from remat_cli.devices import synthetic_devices

    g = synthetic_devices(generators.linear(5, seed=0), speedup=10, memory_fraction=0.3)
    gp, sp = tmp_path / "g.json", tmp_path / "s.json"
    gp.write_text(g.to_json())
    res = CliRunner().invoke(
        main, ["solve", str(gp), "--budget", "cpu=100%,accel=30%", "-s", "xengine", "-o", str(sp)]
    )
    assert res.exit_code == 0, res.output
    s = Schedule.model_validate_json(sp.read_text())
    sim = simulate(g, s.steps, keep_profile=True)
    assert sim.copies > 0 and sim.device_profile is not None  # the accelerator is used
    fig = memory_figure(g, s)
    ax = fig.axes[0]
    unit = re.search(r"\((\w+)\)", ax.get_ylabel()).group(1)
    scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    lines = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
    assert {k for k in lines if k.startswith("live")} == {"live:cpu", "live:accel"}
    for d, prof in sim.device_profile.items():
        assert list(lines[f"live:{d}"].get_ydata() * scale) == pytest.approx(list(prof))
        assert max(lines[f"live:{d}"].get_ydata()) * scale == pytest.approx(
            s.summary.peak_memory_by_device[d]
        )
        assert lines[f"budget:{d}"].get_ydata()[0] * scale == pytest.approx(s.budgets[d])
        assert lines[f"live:{d}"].get_color() == lines[f"budget:{d}"].get_color()
    assert max(sim.device_profile["accel"]) <= s.budgets["accel"] < s.budgets["cpu"]
    # --budget names each device's line
    fig = memory_figure(g, s, budgets={"cpu": 123, "accel": 45})
    ax = fig.axes[0]
    scale = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9}[re.search(r"\((\w+)\)", ax.get_ylabel()).group(1)]
    lines = {ln.get_gid(): ln for ln in ax.get_lines() if ln.get_gid()}
    assert lines["budget:accel"].get_ydata()[0] * scale == pytest.approx(45)
    out = tmp_path / "m.png"
    proc = remat("plot", "--memory", sp, "-g", gp, "-b", "cpu=100%,accel=20%", "-o", out)
    assert proc.returncode == 0, proc.stderr
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    proc = remat("plot", "--memory", sp, "-g", gp, "-b", "gpu=1MB", "-o", tmp_path / "x.png")
    assert proc.returncode == 2 and "unknown device" in proc.stderr
