"""A memory plan measured (runtime/arena.py): tensors placed in one numpy arena at the plan's
offsets reproduce the unscheduled outputs bitwise; a plan that overlaps live tensors does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from remat_cli.execution.runner import run_solver
from remat_cli.importers import load_graph
from remat_cli.planning.memory_plan import plan_schedule
from remat_cli.runtime import interpret as interp
from remat_cli.runtime.arena import arena_replay
from remat_cli.runtime.model import make_inputs
from remat_cli.schedule import baseline_steps
from remat_cli.solver import SolveOptions

MODEL = Path(__file__).resolve().parents[1] / "graphs" / "mlp_train.onnx"


@pytest.fixture(scope="module")
def setup():
    model = onnx.load(str(MODEL))
    g = load_graph(str(MODEL))
    feeds = make_inputs(model, seed=0, given=None, graph=g)
    engine = interp.Interpreter(model, g)
    ref = interp.interpret(engine, [baseline_steps(g)], feeds, warmup=0, repeat=1)[0].outputs
    return g, engine, feeds, ref


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_model_plan_runs_inside_its_arena(setup) -> None:
    g, engine, feeds, ref = setup
    # alignment 64: onnxruntime's SIMD reductions round differently on unaligned inputs
    s, _ = run_solver(g, 10**12, "model", SolveOptions(time_limit=10, workers=1, params={"alignment": 64}))
    assert s is not None and s.memory_plan is not None
    run = arena_replay(engine, s.steps, s.memory_plan, feeds)
    assert same(run.outputs, ref)
    assert 0 < run.measured_arena <= run.planned_arena


def test_an_overlapping_plan_corrupts_the_outputs(setup) -> None:
    g, engine, feeds, ref = setup
    steps = baseline_steps(g)
    good = plan_schedule(g, steps, alignment=64)
    assert same(arena_replay(engine, steps, good, feeds).outputs, ref)
    # everything at offset 0: each output overwrites the inputs its own successors still need
    biggest = max(b.size for b in good.offsets)
    bad = good.model_copy(
        update={"arena": biggest, "offsets": [b.model_copy(update={"offset": 0}) for b in good.offsets]}
    )
    assert not same(arena_replay(engine, steps, bad, feeds).outputs, ref)
