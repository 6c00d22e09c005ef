"""A schedule whose memory plan fits the budget: solved again below it where the placement
leaves the arena above the schedule's live peak."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from remat_cli.cli import main
from remat_cli.execution.fit import fit_plan, level_and_place, recompute_to_fit
from remat_cli.execution.level import level
from remat_cli.execution.order import restore_order
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph
from remat_cli.importers.onnx import from_onnx_file
from remat_cli.planning.addresses import place
from remat_cli.planning.check import check_plan
from remat_cli.planning.memory_plan import buffers_of, make_plan
from remat_cli.schedule import Schedule, Step, baseline, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions

GRAPHS = Path(__file__).resolve().parents[1] / "graphs"


def test_the_fitted_plan_fits_where_the_schedule_at_the_budget_does_not() -> None:
    """Placed by best fit alone (no time for more: deterministic), greedy's schedule of the
    transformer at 55% fits the budget and its arena does not."""
    g = from_onnx_file(GRAPHS / "torch_transformer_train.onnx")
    budget = int(0.55 * baseline(g).peak_memory)
    options = SolveOptions(time_limit=2.0, seed=0, workers=1)
    plain, _ = run_solver(g, budget, "greedy", options)
    assert plain is not None and plain.summary.peak_memory <= budget
    _, arena, _, _ = place(buffers_of(g, plain.steps), 64, 0.0, 1)
    assert g.resident_bytes + arena > budget
    fitted, _ = fit_plan(g, budget, "greedy", options, place_time=0.0)
    assert fitted is not None and fitted.memory_plan is not None
    assert fitted.budget == budget and fitted.solver.status != "infeasible"
    assert g.resident_bytes + fitted.memory_plan.arena <= budget
    check_plan(g, fitted.steps, fitted.memory_plan)


def test_a_budget_below_every_schedule_is_not_lowered_further() -> None:
    """Where the first schedule's live peak already passes the budget, that schedule is the
    answer (a lower budget cannot help), with its plan, its order the graph's where its peak
    allows: the same computations at a peak no higher."""
    g = from_onnx_file(GRAPHS / "mlp_train.onnx")
    options = SolveOptions(time_limit=2.0, seed=0, workers=1)
    fitted, _ = fit_plan(g, g.resident_bytes, "greedy", options, place_time=0.0)
    plain, _ = run_solver(g, g.resident_bytes, "greedy", options)
    assert fitted is not None and plain is not None and fitted.memory_plan is not None
    assert fitted.solver.status == "infeasible"
    assert sorted(computed(fitted.steps)) == sorted(computed(plain.steps))
    assert fitted.summary.peak_memory <= plain.summary.peak_memory


def computed(steps: list[Step]) -> list[str]:
    return [s.node for s in steps if s.op == "compute" and s.node is not None]


def inversions(g: Graph, seq: list[str]) -> int:
    rank = {n.id: k for k, n in enumerate(g.nodes)}
    r = [rank[n] for n in seq]
    return sum(1 for i in range(len(r)) for j in range(i + 1, len(r)) if r[i] > r[j])


def test_restore_order_brings_a_shuffled_order_back_at_no_higher_peak() -> None:
    """A random topological order of the transformer export, brought back towards the graph's
    own: far fewer operators out of order, the same computations, and no instant above the
    shuffled order's peak (red where a swap's memory change is computed wrongly)."""
    g = from_onnx_file(GRAPHS / "torch_transformer_train.onnx")
    rng = random.Random(0)
    readers: dict[str, list[str]] = {}
    for n in g.nodes:
        for v in n.inputs:
            readers.setdefault(v, []).append(n.id)
    made_by = g.producer
    waiting = {n.id: len({v for v in n.inputs if v in made_by}) for n in g.nodes}
    ready = [n for n, k in waiting.items() if k == 0]
    seq: list[str] = []
    while ready:
        n = ready.pop(rng.randrange(len(ready)))
        seq.append(n)
        for v in g.node_map[n].outputs:
            for r in dict.fromkeys(readers.get(v, [])):
                waiting[r] -= 1
                if waiting[r] == 0:
                    ready.append(r)
    shuffled = steps_from_sequence(g, seq)
    restored = restore_order(g, shuffled)
    assert sorted(computed(restored)) == sorted(seq)
    assert simulate(g, restored).peak_memory <= simulate(g, shuffled).peak_memory
    assert inversions(g, computed(restored)) < inversions(g, seq) // 2


def solved(tmp_path: Path, budget: str, solver: str) -> tuple[str, Path, CliRunner]:
    """The transformer export, `remat solve`'s schedule of it at `budget` written to a file,
    and the runner that wrote it."""
    model = str(GRAPHS / "torch_transformer_train.onnx")
    s = tmp_path / "s.json"
    runner = CliRunner()
    got = runner.invoke(main, ["solve", model, "-b", budget, "-s", solver, "-q", "-o", str(s)])
    assert got.exit_code == 0, got.output
    return model, s, runner


def test_remat_plan_fit_writes_a_plan_within_the_budget(tmp_path: Path) -> None:
    model, s, runner = solved(tmp_path, "55%", "greedy")
    plans = {}
    for flags in ([], ["--fit", "--solve-time-limit", "5"]):
        out = tmp_path / f"p{len(flags)}.json"
        got = runner.invoke(main, ["plan", model, str(s), "--time-limit", "0", "-o", str(out), *flags])
        assert got.exit_code == 0, got.output
        plans[bool(flags)] = Schedule.model_validate_json(out.read_text())
    g = from_onnx_file(model)
    budget = plans[False].budget
    assert budget is not None and plans[True].budget == budget
    footprint = {k: g.resident_bytes + p.memory_plan.arena for k, p in plans.items() if p.memory_plan}
    assert footprint[False] > budget >= footprint[True]
    check_plan(g, plans[True].steps, plans[True].memory_plan)


def test_remat_plan_fit_refuses_a_schedule_without_a_budget(tmp_path: Path) -> None:
    model, s, runner = solved(tmp_path, "100%", "checkpoint-all")
    doc = json.loads(s.read_text())
    del doc["budget"]
    s.write_text(json.dumps(doc))
    out = tmp_path / "p.json"
    got = runner.invoke(main, ["plan", model, str(s), "--fit", "-o", str(out)])
    assert got.exit_code == 2 and "--fit needs a schedule with a budget" in got.output
    assert not out.exists()


def test_levelling_keeps_the_computations_and_packs_the_plateau() -> None:
    """Greedy's schedule of the MLP export at 50% sits near its peak over many instants: its
    best-fit plan passes the budget. Levelled under the band that plan's gap spans, the same
    computations in another order place (best fit again) within the budget, at a peak no higher."""
    g = from_onnx_file(GRAPHS / "torch_mlp_train.onnx")
    budget = int(0.5 * baseline(g).peak_memory)
    plain, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=2.0, seed=0, workers=1))
    assert plain is not None
    peak = plain.summary.peak_memory
    _, arena, _, _ = place(buffers_of(g, plain.steps), 64, 0.0, 1)
    assert g.resident_bytes + arena > budget >= peak
    steps = level(g, plain.steps, peak - (g.resident_bytes + arena - peak))
    computed = Counter(s.node for s in steps if s.op == "compute")
    assert computed == Counter(s.node for s in plain.steps if s.op == "compute")
    assert simulate(g, steps).peak_memory <= peak
    _, levelled, _, _ = place(buffers_of(g, steps), 64, 0.0, 1)
    assert g.resident_bytes + levelled <= budget


def test_fit_plan_levels_before_it_solves_again() -> None:
    """The same cell through fit_plan: the plan that fits is greedy's schedule levelled, at
    greedy's cost; with no time to level, it is a schedule solved again below the budget."""
    g = from_onnx_file(GRAPHS / "torch_mlp_train.onnx")
    budget = int(0.5 * baseline(g).peak_memory)
    options = SolveOptions(time_limit=2.0, seed=0, workers=1)
    plain, _ = run_solver(g, budget, "greedy", options)
    assert plain is not None
    fitted, _ = fit_plan(g, budget, "greedy", options, place_time=0.0, level_time=30.0)
    assert fitted is not None and fitted.memory_plan is not None
    assert g.resident_bytes + fitted.memory_plan.arena <= budget
    assert fitted.summary.cost == plain.summary.cost and fitted.steps != plain.steps
    assert "levelled" in (fitted.solver.message or "")
    check_plan(g, fitted.steps, fitted.memory_plan)
    unlevelled, _ = fit_plan(g, budget, "greedy", options, place_time=0.0, level_time=0.0)
    assert unlevelled is not None and "levelled" not in (unlevelled.solver.message or "")


def test_recomputing_below_the_peak_fits_what_levelling_does_not() -> None:
    """Greedy's schedule of the transformer export at 50%, levelled and best fitted, still
    passes the budget; repaired below its peak and levelled again, its plan fits, at a lower
    live peak and a higher cost."""
    g = from_onnx_file(GRAPHS / "torch_transformer_train.onnx")
    budget = int(0.5 * baseline(g).peak_memory)
    plain, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=2.0, seed=0, workers=1))
    assert plain is not None
    levelled = level_and_place(g, budget, plain.steps, budget // 100, 64, (0.0, 60.0), 1)
    assert levelled.footprint > budget >= levelled.peak
    repaired = recompute_to_fit(g, budget, levelled, budget // 100, 64, (0.0, 60.0), 1)
    assert repaired is not None and repaired.footprint <= budget and repaired.peak < levelled.peak
    assert simulate(g, repaired.steps).cost > plain.summary.cost
    check_plan(g, repaired.steps, make_plan(repaired.buffers, repaired.offsets, 64))


def test_restore_order_keeps_a_lower_peak_than_the_graphs_order() -> None:
    """The U-Net export levelled from its own order peaks well below it; brought back towards
    that order, it keeps the levelled peak (red where a swap's memory change is computed
    wrongly: the swaps then walk back to the graph's order and its peak)."""
    g = from_onnx_file(GRAPHS / "torch_unet_train.onnx")
    own = steps_from_sequence(g, [n.id for n in g.nodes])
    peak = simulate(g, own).peak_memory
    levelled = level(g, own, int(0.7 * peak))
    low = simulate(g, levelled).peak_memory
    assert low < 0.9 * peak
    restored = restore_order(g, levelled)
    assert sorted(computed(restored)) == sorted(computed(levelled))
    assert simulate(g, restored).peak_memory <= low
