"""Memory plans: the independent checker rejects hand-made bad plans; `remat plan` plans any
schedule (recomputations included); `remat validate` checks the plan and reports fragmentation."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from model_graphs import fan
from test_model import first_fit

from remat_cli.cli import main
from remat_cli.graph import Graph, Node, Value
from remat_cli.importers import generators
from remat_cli.planning.addresses import PATIENCE, place, repack, squeaky_wheel
from remat_cli.planning.check import PlanError, check_plan
from remat_cli.planning.memory_plan import (
    Buffer,
    arena_peak,
    best_fit,
    buffers_of,
    greedy_offsets,
    make_plan,
    perturbed_offsets,
    plan_schedule,
)
from remat_cli.schedule import MemoryPlan, PlacedBuffer, baseline_steps, compute, free


def chain() -> Graph:
    """a -> b -> c: a and b live together at b's step, b and c at c's step; a and c never."""
    return Graph(
        values=[Value(id="a", size=10), Value(id="b", size=20), Value(id="c", size=10)],
        nodes=[
            Node(id="A", outputs=["a"]),
            Node(id="B", inputs=["a"], outputs=["b"]),
            Node(id="C", inputs=["b"], outputs=["c"]),
        ],
        outputs=["c"],
    )


STEPS = [compute("A"), compute("B"), free("a"), compute("C"), free("b")]


def plan(a: int, b: int, c: int, arena: int = 30, alignment: int = 1) -> MemoryPlan:
    return MemoryPlan(
        arena=arena,
        alignment=alignment,
        offsets=[
            PlacedBuffer(value="a", step=0, offset=a, size=10),
            PlacedBuffer(value="b", step=1, offset=b, size=20),
            PlacedBuffer(value="c", step=3, offset=c, size=10),
        ],
    )


def test_a_tight_plan_is_accepted_with_zero_fragmentation() -> None:
    r = check_plan(chain(), STEPS, plan(0, 10, 0))  # c reuses a's bytes: they are never live together
    assert r.arena == 30 and r.peak == 30 and r.fragmentation == 0.0


@pytest.mark.parametrize(
    "bad, words",
    [
        (plan(0, 5, 0), "overlaps live 'a'"),  # b on a's bytes while a is read
        (plan(0, 10, 5), "overlaps live 'b'"),  # c on the head of b, which it reads
        (plan(0, 10, 25, arena=40), "overlaps live 'b'"),
        (plan(0, 10, 0, arena=29), "outside the arena"),
        (plan(0, 10, 0, arena=40, alignment=4), "alignment"),  # 10 is not a multiple of 4
    ],
)
def test_hand_made_bad_plans_are_rejected(bad: MemoryPlan, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        check_plan(chain(), STEPS, bad)


def test_missing_short_or_extra_buffers_are_rejected() -> None:
    p = plan(0, 10, 0)
    with pytest.raises(PlanError, match="no offset for 'c'"):
        check_plan(chain(), STEPS, p.model_copy(update={"offsets": p.offsets[:2]}))
    short = [*p.offsets[:2], PlacedBuffer(value="c", step=3, offset=0, size=5)]
    with pytest.raises(PlanError, match="needs 10 B"):
        check_plan(chain(), STEPS, p.model_copy(update={"offsets": short}))
    extra = [*p.offsets, PlacedBuffer(value="a", step=4, offset=0, size=10)]
    with pytest.raises(PlanError, match="does not produce it"):
        check_plan(chain(), STEPS, p.model_copy(update={"offsets": extra}))


def test_recomputed_values_are_separate_buffers() -> None:
    g = chain()
    steps = [compute("A"), compute("B"), free("a"), free("b"), compute("A")]
    steps += [compute("B"), free("a"), compute("C"), free("b")]
    p = plan_schedule(g, steps, alignment=1)
    assert sorted((b.value, b.step) for b in p.offsets) == [("a", 0), ("a", 4), ("b", 1), ("b", 5), ("c", 7)]
    check_plan(g, steps, p)


@pytest.mark.parametrize("seed", range(3))
def test_greedy_plans_pass_the_checker_and_never_beat_the_peak(seed: int) -> None:
    g = generators.random_layered(40, seed=seed)
    steps = baseline_steps(g)
    for alignment in (1, 64):
        p = plan_schedule(g, steps, alignment)
        r = check_plan(g, steps, p)
        assert r.fragmentation >= 0.0
        assert len(p.offsets) == len(buffers_of(g, steps))


def test_cli_plan_searches_past_best_fit_by_default(tmp_path: Path) -> None:
    """Best fit alone leaves random_layered(40, seed=1)'s program order 6.5% above its peak;
    `remat plan` with its default time limit places it at the peak, and --time-limit 0 is the
    best fit (the default was best fit only: 5.3% above the peak on the shipped MLP step's fastsa
    schedule at 60%, where ten seconds give 0.07%)."""
    g = generators.random_layered(40, seed=1)
    gp = _write(tmp_path / "g.json", g.to_json())
    sp = str(tmp_path / "s.json")
    r = CliRunner().invoke(main, ["solve", gp, "-b", "100%", "-s", "checkpoint-all", "-q", "-o", sp])
    assert r.exit_code == 0, r.output
    steps = json.loads(Path(sp).read_text())["steps"]
    assert [s["node"] for s in steps if s["op"] == "compute"] == [
        s.node for s in baseline_steps(g) if s.op == "compute"
    ]
    peak = arena_peak(buffers_of(g, baseline_steps(g)), 64)
    arenas = []
    for extra in ([], ["--time-limit", "0"]):
        r = CliRunner().invoke(main, ["plan", gp, sp, "-o", str(tmp_path / "p.json"), *extra])
        assert r.exit_code == 0, r.output
        arenas.append(json.loads((tmp_path / "p.json").read_text())["memory_plan"]["arena"])
    assert arenas[0] == peak < arenas[1] == plan_schedule(g, baseline_steps(g), 64).arena


def _write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_cli_plan_then_validate_reports_fragmentation(tmp_path: Path) -> None:
    g = generators.linear(6, seed=1)
    gp = _write(tmp_path / "g.json", g.to_json())
    r = CliRunner().invoke(
        main, ["solve", gp, "-b", "70%", "-s", "checkmate", "-q", "-o", str(tmp_path / "s.json")]
    )
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["plan", gp, str(tmp_path / "s.json"), "-o", str(tmp_path / "p.json")])
    assert r.exit_code == 0, r.output
    planned = json.loads((tmp_path / "p.json").read_text())
    assert planned["memory_plan"]["alignment"] == 64
    r = CliRunner().invoke(main, ["validate", gp, str(tmp_path / "p.json"), "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.stdout[r.stdout.index("{") :])
    assert report["memory_plan"]["valid"] and report["memory_plan"]["fragmentation"] >= 0
    # a broken plan: every buffer at offset 0 -> validate fails with exit 1
    for b in planned["memory_plan"]["offsets"]:
        b["offset"] = 0
    bad = _write(tmp_path / "bad.json", json.dumps(planned))
    r = CliRunner().invoke(main, ["validate", gp, bad])
    assert r.exit_code == 1 and "invalid memory plan" in r.output


def test_cli_solve_model_exit_codes(tmp_path: Path) -> None:
    gp = _write(tmp_path / "fan.json", fan(4).to_json())
    r = CliRunner().invoke(main, ["solve", gp, "-b", "104", "-s", "model", "-q", "--workers", "1"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["memory_plan"]["arena"] == 104
    r = CliRunner().invoke(main, ["solve", gp, "-b", "103", "-s", "model", "-q", "--workers", "1"])
    assert r.exit_code == 1 and "104" in r.output


# ---- the address stage against brute force (first fit over every placement order is optimal) ----
def random_buffers(seed: int, n: int = 7) -> list[Buffer]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        start = int(rng.integers(0, 8))
        out.append(
            Buffer(
                f"v{k}", f"n{k}", start, start + int(rng.integers(1, 6)), int(rng.choice([1, 2, 3, 4, 5, 8]))
            )
        )
    return out


def optimum(buffers: list[Buffer]) -> int:
    return min(first_fit(buffers, perm) for perm in itertools.permutations(range(len(buffers))))


def arena_of(buffers: list[Buffer], offsets: list[int]) -> int:
    return max(o + b.size for o, b in zip(offsets, buffers, strict=True))


@pytest.mark.parametrize("seed", [14])  # the one instance of seeds 0..399 where greedy_offsets misses
def test_perturbed_orders_reach_the_optimum_the_fixed_ones_miss(seed: int) -> None:
    bufs = random_buffers(seed)
    greedy = greedy_offsets(bufs, 1)
    best = optimum(bufs)
    assert arena_of(bufs, greedy) > best
    assert arena_of(bufs, perturbed_offsets(bufs, 1, greedy, 300, seed=0)) == best
    # the solver's stopping rule (draws in a row without a smaller arena) keeps these
    assert arena_of(bufs, perturbed_offsets(bufs, 1, greedy, 300, seed=0, patience=PATIENCE)) == best


@pytest.mark.parametrize("seed", [14, 110, 347, *range(6)])
def test_place_is_optimal_against_brute_force(seed: int) -> None:
    bufs = random_buffers(seed)
    offsets, arena, bound, proven = place(bufs, 1, 10.0)
    assert arena == arena_of(bufs, offsets) == optimum(bufs)
    assert bound <= arena and proven == (bound == arena)
    for i, a in enumerate(bufs):  # no two buffers live together share a byte
        for j, b in enumerate(bufs[:i]):
            if a.start < b.end and b.start < a.end:
                assert offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]


def _disjoint(bufs: list[Buffer], offsets: list[int]) -> bool:
    return all(
        offsets[i] + a.size <= offsets[j] or offsets[j] + b.size <= offsets[i]
        for i, a in enumerate(bufs)
        for j, b in enumerate(bufs[:i])
        if a.start < b.end and b.start < a.end
    )


@pytest.mark.parametrize("seed", [2, 13, 14, 49, 110, 143, 171])  # size order alone misses the optimum
def test_repack_never_loses_to_its_start_and_repeats_for_a_seed(seed: int) -> None:
    bufs = random_buffers(seed)
    by_size = best_fit(bufs, sorted(range(len(bufs)), key=lambda i: -bufs[i].size), 1)
    packed = repack(bufs, 1, by_size, seed=0, patience=500)
    assert _disjoint(bufs, packed)
    assert optimum(bufs) <= arena_of(bufs, packed) <= arena_of(bufs, by_size)
    assert repack(bufs, 1, by_size, seed=0, patience=500) == packed
    if seed in (2, 49, 110, 143, 171):  # from 1-3 above the optimum to it (13: 29 -> 28 of 24; 14: stays)
        assert arena_of(bufs, packed) == optimum(bufs)


def test_squeaky_wheel_gives_the_long_lived_small_buffers_a_lane() -> None:
    """Two 1-byte buffers with long lifetimes: every fixed order of `greedy_offsets` and ruin and
    recreate leave them above the larger ones (arena 10); raised in priority, they are placed
    first and the arena is the peak, 9 (a lower bound, so optimal)."""
    spans = [(1, 4, 3), (4, 8, 1), (5, 10, 3), (3, 8, 5), (3, 5, 1)]
    bufs = [Buffer(f"v{k}", f"n{k}", s, e, z) for k, (s, e, z) in enumerate(spans)]
    greedy = greedy_offsets(bufs, 1)
    assert arena_of(bufs, greedy) == 10 == arena_of(bufs, repack(bufs, 1, greedy, seed=0, patience=500))
    raised = squeaky_wheel(bufs, 1, greedy, seed=0)
    assert _disjoint(bufs, raised)
    assert arena_of(bufs, raised) == arena_peak(bufs, 1) == 9
    assert squeaky_wheel(bufs, 1, greedy, seed=0) == raised


@pytest.mark.parametrize("seed", range(40))
def test_squeaky_wheel_never_loses_to_its_start_and_repeats_for_a_seed(seed: int) -> None:
    bufs = random_buffers(seed)
    greedy = greedy_offsets(bufs, 1)
    raised = squeaky_wheel(bufs, 1, greedy, seed=seed, patience=200)
    assert _disjoint(bufs, raised)
    assert optimum(bufs) <= arena_of(bufs, raised) <= arena_of(bufs, greedy)
    assert squeaky_wheel(bufs, 1, greedy, seed=seed, patience=200) == raised


@pytest.mark.parametrize("seed", range(6))
def test_repack_never_grows_the_arena(seed: int) -> None:
    g = generators.random_layered(40, seed=seed)
    bufs = buffers_of(g, baseline_steps(g))
    start = greedy_offsets(bufs, 64)
    packed = repack(bufs, 64, start, seed=seed, patience=200)
    assert all(o % 64 == 0 for o in packed)
    assert max(o + -(-b.size // 64) * 64 for o, b in zip(packed, bufs, strict=True)) <= max(
        o + -(-b.size // 64) * 64 for o, b in zip(start, bufs, strict=True)
    )
    check_plan(g, baseline_steps(g), make_plan(bufs, packed, 64))


def test_cpsat_stall_rounds_repeat_and_never_pass_the_incumbent() -> None:
    """Rounds of deterministic time, each from the last one's solution: the same answer twice for
    a seed, an objective no worse than the warm start's, a bound no higher than the objective."""
    from ortools.sat.python import cp_model

    from remat_cli.milp import cpsat

    def model() -> tuple[cp_model.CpModel, list[cp_model.IntVar]]:
        rng = np.random.default_rng(3)
        m = cp_model.CpModel()
        xs = [m.new_int_var(0, 200, f"x{i}") for i in range(30)]
        for i in range(29):
            m.add(xs[i] + int(rng.integers(1, 5)) <= xs[i + 1] + int(rng.integers(0, 9)))
        m.add_all_different(xs)
        m.minimize(sum(int(rng.integers(1, 9)) * x for x in xs))
        for x in xs:
            m.add_hint(x, 6 * xs.index(x) + 20)
        return m, xs

    got = []
    for _ in range(2):
        m, xs = model()
        found = cpsat.run(m, 10.0, 1, 5, stall=0.01, incumbent=10**9)
        assert found is not None
        solver, optimal, bound = found
        assert bound <= solver.objective_value and optimal == (bound >= solver.objective_value)
        got.append([solver.value(x) for x in xs])
    assert got[0] == got[1]


def test_breadth_places_the_busiest_step_first() -> None:
    """Steps by decreasing live bytes, at each the buffers not yet placed by decreasing size."""
    from remat_cli.planning.memory_plan import breadth_order

    start, end, size = np.array([0, 0, 2, 3]), np.array([2, 4, 4, 4]), np.array([1, 2, 5, 3])
    # live bytes per step: 3, 3, 7, 10 -> step 3 first (buffers 2, 3, 1), then 2, then 0 (buffer 0)
    assert breadth_order(start, end, size).tolist() == [2, 3, 1, 0]


@pytest.mark.parametrize("seed", range(4))
def test_perturbed_breadth_never_grows_and_repeats(seed: int) -> None:
    from remat_cli.planning.memory_plan import perturbed_breadth

    g = generators.random_layered(40, seed=seed)
    bufs = buffers_of(g, baseline_steps(g))
    start = greedy_offsets(bufs, 64)
    got = perturbed_breadth(bufs, 64, start, 20, seed=seed, patience=10)
    assert got == perturbed_breadth(bufs, 64, start, 20, seed=seed, patience=10)
    check_plan(g, baseline_steps(g), make_plan(bufs, got, 64))
    assert make_plan(bufs, got, 64).arena <= make_plan(bufs, start, 64).arena
