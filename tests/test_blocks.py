"""--solver blocks (per-block checkpointing): on the shipped 12-layer decoder its peak and overhead
are those worked out here from the blocks' values and scopes alone, and `remat run` replays it
with matching outputs; graphs without scopes are refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

from remat_cli import registry
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.schedule import baseline
from remat_cli.solver import OptionError, SolveOptions

ROOT = Path(__file__).resolve().parents[1]
DECODER = ROOT / "graphs" / "torch_decoder12_train.onnx"


@cache
def decoder() -> Graph:
    return from_onnx_file(DECODER)


def block_of(graph: Graph, node: str) -> int | None:
    scope = graph.node_map[node].scope or ""
    parts = scope.split(".")
    return int(parts[1]) if parts[0] == "blocks" and len(parts) > 1 else None


def by_hand(graph: Graph) -> tuple[list[str], dict[int, float]]:
    """The compute sequence per-block checkpointing runs, and what each block recomputes (cost):
    a block keeps the values a forward node outside it reads; the others it frees and, right
    before the first backward node that reads one, recomputes as far as the backward reads."""
    nm = graph.node_map
    order = graph.needed_order
    forward = [n for n in order if nm[n].phase in ("forward", "loss")]
    backward = [n for n in order if nm[n].phase == "backward"]
    made_in = {v: block_of(graph, n) for n in forward for v in nm[n].outputs}
    kept = {
        v
        for n in forward
        for v in nm[n].inputs
        if made_in.get(v) is not None and made_in[v] != block_of(graph, n)
    }
    freed = {v for v, b in made_in.items() if b is not None and v not in kept}
    read_by_backward = {v for n in backward for v in nm[n].inputs}
    recompute: dict[int, list[str]] = {}
    for n in reversed(forward):  # a node is recomputed when the backward or a recomputed node reads it
        b = block_of(graph, n)
        wanted = read_by_backward | {v for m in recompute.get(b, []) for v in nm[m].inputs}
        if b is not None and any(v in freed and v in wanted for v in nm[n].outputs):
            recompute.setdefault(b, []).insert(0, n)
    seq, done = list(forward), set()
    for n in backward:
        for b in dict.fromkeys(made_in[v] for v in nm[n].inputs if v in freed):
            if b not in done:
                seq += recompute[b]
                done.add(b)
        seq.append(n)
    return seq, {b: sum(nm[n].cost for n in ns) for b, ns in recompute.items()}


def peak_of(graph: Graph, seq: list[str]) -> int:
    """Live bytes at each compute (inputs, parameters, live values and its outputs), each value
    freed after its last read before it is made again."""
    nm, vm = graph.node_map, graph.value_map
    last: dict[tuple[str, int], int] = {}  # (value, position made) -> position of its last read
    made: dict[str, int] = {}
    for k, n in enumerate(seq):
        for v in nm[n].inputs:
            if v in made:
                last[(v, made[v])] = k
        for v in nm[n].outputs:
            made[v] = k
            last[(v, k)] = k
    free_at: dict[int, list[str]] = {}
    for (v, _), k in last.items():
        if not (v in graph.outputs and made[v] == _):
            free_at.setdefault(k, []).append(v)
    live = graph.resident_bytes
    peak = 0
    for k, n in enumerate(seq):
        live += sum(vm[v].size for v in nm[n].outputs)
        peak = max(peak, live)
        live -= sum(vm[v].size for v in free_at.get(k, []))
    return peak


def test_blocks_on_the_decoder_costs_what_the_blocks_say() -> None:
    g = decoder()
    base = baseline(g)
    seq, per_block = by_hand(g)
    assert sorted(per_block) == list(range(12))
    # twelve identical blocks recompute the same (float32 FLOPs of the same shapes)
    assert max(per_block.values()) == pytest.approx(min(per_block.values()))
    want_overhead = sum(per_block.values()) / base.cost
    want_peak = peak_of(g, seq)
    schedule, result = run_solver(g, base.peak_memory, "blocks", SolveOptions())
    assert schedule is not None and result.status == "feasible"
    assert schedule.summary.peak_memory == want_peak
    assert schedule.summary.cost / base.cost - 1 == pytest.approx(want_overhead, rel=1e-9)
    assert want_peak < 0.3 * base.peak_memory and 0.2 < want_overhead < 0.3


@pytest.mark.slow
def test_every_k_keeps_fewer_inputs_and_a_budget_below_its_peak_is_infeasible() -> None:
    g = decoder()
    base = baseline(g)
    one, _ = run_solver(g, base.peak_memory, "blocks", SolveOptions())
    three, _ = run_solver(g, base.peak_memory, "blocks", SolveOptions(params={"every": 3}))
    assert one is not None and three is not None
    assert three.summary.peak_memory > one.summary.peak_memory  # three blocks recomputed at once
    solver = registry.get("blocks")
    result = solver.solve(g, one.summary.peak_memory - 1, solver.resolve(SolveOptions()))
    assert result.status == "infeasible" and result.best_peak == one.summary.peak_memory


def test_a_graph_without_scopes_is_refused() -> None:
    solver = registry.get("blocks")
    assert "no module scopes" in (solver.supports(G.random_layered(30, seed=1)) or "")
    assert solver.supports(G.transformer(layers=2)) is None
    g = G.transformer(layers=2)
    with pytest.raises(OptionError, match="no module list 'nope'"):
        solver.solve(g, baseline(g).peak_memory, solver.resolve(SolveOptions(params={"blocks": "nope"})))


@pytest.mark.slow
def test_cli_refuses_a_graph_without_scopes_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "remat_cli", "solve", str(ROOT / "graphs" / "torch_mlp_train.onnx")]
    out = tmp_path / "s.json"
    p = subprocess.run(
        [*cmd, "--budget", "80%", "--solver", "blocks", "-o", str(out)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert p.returncode == 2 and not out.exists()
    assert p.stderr.count("\n") == 1 and "no module scopes" in p.stderr


@pytest.mark.slow
def test_remat_run_replays_blocks_with_matching_outputs(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    schedule = tmp_path / "blocks.json"
    cli = [sys.executable, "-m", "remat_cli"]
    subprocess.run(
        [
            *cli,
            "solve",
            str(DECODER),
            "--budget",
            "30%",
            "--solver",
            "blocks",
            "-o",
            str(schedule),
            "--quiet",
        ],
        check=True,
        env=env,
    )
    p = subprocess.run(
        [*cli, "run", str(DECODER), str(schedule), "--repeat", "1", "--warmup", "0", "--no-ort-defaults", "--json"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    report = json.loads(p.stdout)
    assert report["solver"] == "blocks" and report["outputs_match"] is True
