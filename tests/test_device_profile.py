"""`remat profile` (issue 17 item 4) on the CPU: per-device node times, link fits, the CLI, and a
profiled graph solved by xengine and replayed on two CPU devices. Real onnxruntime throughout."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner

from remat_cli.cli import main
from remat_cli.graph import Graph
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.runtime.device_profile import fit_link, parse_devices, profile_devices
from tests.test_xengine_runtime import chain_model

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return chain_model(tmp_path_factory.mktemp("prof") / "chain.onnx")


def test_parse_devices() -> None:
    assert parse_devices("cpu,cuda") == ["cpu", "cuda:0"]
    assert parse_devices("cpu, cpu:1") == ["cpu", "cpu:1"]
    for bad in ("cpu,,cuda", "cpu,cpu", "cuda,cuda:0"):
        with pytest.raises(ValueError):
            parse_devices(bad)


def test_fit_link_recovers_latency_and_bandwidth() -> None:
    samples = [(b, 2e-5 + b / 8e9) for b in (4096, 1 << 18, 1 << 22)]
    latency, bandwidth = fit_link(samples)
    assert latency == pytest.approx(2e-5, rel=1e-6) and bandwidth == pytest.approx(8e9, rel=1e-6)
    # Noise making larger copies faster: the largest copy's average rate, no negative bandwidth.
    latency, bandwidth = fit_link([(1000, 2e-3), (2000, 1e-3)])
    assert latency >= 0 and bandwidth == pytest.approx(2000 / 1e-3)


def test_profile_two_cpu_devices(model: Path) -> None:
    g0 = from_onnx_file(model)
    prof = profile_devices(onnx.load(str(model)), g0, ["cpu", "cpu:1"], runs=2)
    g = prof.graph
    assert [d.id for d in g.devices or []] == ["cpu", "cpu:1"] and g.home_device == "cpu"
    assert g.cost_unit == "seconds" and not prof.unavailable
    for n in g.nodes:
        assert n.device_costs is not None and set(n.device_costs) == {"cpu", "cpu:1"}
        assert n.cost == n.device_costs["cpu"] > 0
        assert n.device_costs["cpu:1"] == n.device_costs["cpu"]  # one provider, one measurement
    # The matmuls are timed, not given a flop count: the graph is otherwise the import.
    assert [v.model_dump() for v in g.values] == [v.model_dump() for v in g0.values]
    assert {(k.source, k.target) for k in g.links or []} == {("cpu", "cpu:1"), ("cpu:1", "cpu")}
    for k in prof.links:
        assert k.bandwidth > 0 and k.latency >= 0 and len(k.samples) >= 2
    assert g.device_model.copy_cost("h1", "cpu", "cpu:1") is not None


def test_cli_profiles_what_exists(model: Path, tmp_path: Path) -> None:
    out = tmp_path / "g.json"
    res = CliRunner().invoke(
        main, ["profile", str(model), "--devices", "cpu,cuda", "--runs", "1", "-o", str(out)]
    )
    assert res.exit_code == 0, res.output
    g = Graph.model_validate(json.loads(out.read_text()))
    ids = [d.id for d in g.devices or []]
    if HAS_CUDA:
        assert ids == ["cpu", "cuda:0"]
    else:
        assert ids == ["cpu"]
        assert "cuda:0 left out" in res.stderr and "CUDAExecutionProvider" in res.stderr
    for bad in (
        ["--devices", "tpu"],
        ["--devices", "cpu,cpu"],
        ["--devices", "cuda"] if not HAS_CUDA else [],
    ):
        if not bad:
            continue
        res = CliRunner().invoke(main, ["profile", str(model), *bad, "-o", str(tmp_path / "x.json")])
        assert res.exit_code == 2 and res.output.startswith("remat: error:"), res.output
        assert not (tmp_path / "x.json").exists()


def test_profile_solve_run(model: Path, tmp_path: Path) -> None:
    """The whole path: profile two CPU devices, solve with xengine, replay on both."""
    gp, sp = tmp_path / "g.json", tmp_path / "s.json"
    runner = CliRunner()
    res = runner.invoke(main, ["profile", str(model), "--devices", "cpu,cpu:1", "--runs", "1", "-o", str(gp)])
    assert res.exit_code == 0, res.output
    res = runner.invoke(
        main,
        ["solve", str(gp), "-s", "xengine", "--budget", "100%", "--time-limit", "20", "-o", str(sp)],
    )
    assert res.exit_code == 0, res.output
    args = [str(model), str(sp), "--graph", str(gp), "--mode", "interpret", "--repeat", "1", "--json"]
    res = runner.invoke(main, ["run", *args])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)
    assert rep["outputs_match"]
    assert {d["id"] for d in rep["devices"]} == {"cpu", "cpu:1"}
    for d in rep["devices"]:
        assert d["measured_peak"] == d["predicted_peak"]
