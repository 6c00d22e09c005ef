"""`remat sweep --scheduler`: the cells as tasks on a 2-worker Dask LocalCluster give the same
records as the local pool (deterministic solvers field by field; a time-limited one by status)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from remat_cli.importers import generators
from remat_cli.sweep.cells import DETERMINISTIC_FIELDS, GraphEntry, make_cells, read_records, record_key
from remat_cli.sweep.dask_backend import DaskBackend
from remat_cli.sweep.pool import LocalPool
from remat_cli.sweep.sweep import run_sweep

distributed = pytest.importorskip("distributed")  # the `distributed` extra (in `test`)

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():  # noqa: ANN201
    # processes=False: the workers are threads of this process (no fork/spawn, works headless in
    # CI); each cell still runs its solver in its own child process on the worker. tcp so that a
    # `remat sweep --scheduler` in another process can reach it.
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=False,
        protocol="tcp",
        host="127.0.0.1",
        dashboard_address=None,
    ) as c:
        yield c


def _cells():  # noqa: ANN202
    graphs = [generators.linear(6, seed=1), generators.random_layered(24, seed=3)]
    entries = [GraphEntry.of(f"g{i}.json", g) for i, g in enumerate(graphs)]
    # two deterministic solvers (field by field) and a time-limited one (by status), 3 s each
    solvers = ["greedy", "chen-sqrtn", "fastsa"]
    cells = make_cells(entries, ["100%", "70%"], solvers, seed=7, time_limit=3)
    return cells, {e.sha256: g for e, g in zip(entries, graphs, strict=True)}


def _by_key(where: Path) -> dict:
    return {record_key(r): r for r in read_records(where)}


@pytest.mark.slow
def test_dask_cluster_gives_the_local_pool_records(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    cells, graphs = _cells()
    local = run_sweep(cells, graphs, LocalPool(1), tmp_path / "local")
    with distributed.Client(cluster) as client:
        backend = DaskBackend(client)
        assert "2 workers" in backend.describe()
        remote = run_sweep(cells, graphs, backend, tmp_path / "dask")
    assert local.ran == remote.ran == len(cells)
    a, b = _by_key(tmp_path / "local"), _by_key(tmp_path / "dask")
    assert set(a) == set(b) == {c.key for c in cells}
    for key, ra in a.items():
        rb = b[key]
        if ra["solver"] == "fastsa":  # time-limited: the same status, not necessarily the same schedule
            assert ra["status"] == rb["status"]
            continue
        assert {f: ra[f] for f in DETERMINISTIC_FIELDS} == {f: rb[f] for f in DETERMINISTIC_FIELDS}
        if ra["schedule"]:
            sa = json.loads((tmp_path / "local" / ra["schedule"]).read_text())
            sb = json.loads((tmp_path / "dask" / rb["schedule"]).read_text())
            assert sa["steps"] == sb["steps"] and sa["steps"]
    # both pools really ran something different from a constant: budgets and statuses vary
    assert {r["status"] for r in a.values()} >= {"feasible", "infeasible"}


@pytest.mark.slow
def test_cli_scheduler_option_streams_records_to_the_results(cluster, tmp_path: Path) -> None:  # noqa: ANN001
    g = tmp_path / "lin.json"
    g.write_text(generators.linear(5, seed=2).to_json())
    out = tmp_path / "res"
    proc = subprocess.run(
        [sys.executable, "-m", "remat_cli", "sweep", str(g), "--budgets", "100%,80%", "--solvers", "greedy"]
        + ["--time-limit", "5", "-o", str(out), "-q", "--scheduler", cluster.scheduler_address],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "Dask scheduler" in proc.stderr and "2 workers" in proc.stderr
    records = read_records(out)
    assert sorted(r["budget"] for r in records) == ["100%", "80%"]
    assert all(r["status"] == "feasible" and (out / r["schedule"]).exists() for r in records)
