"""The cut bound (remat_cli/execution/cost_bound.py) against the free-order optimum found by brute force."""

from __future__ import annotations

import heapq
import itertools
import json
import random
import time
from pathlib import Path

import pytest

from remat_cli.execution import cost_bound
from remat_cli.execution.cost_bound import cost_lower_bound
from remat_cli.execution.runner import build_schedule, with_cost_bound
from remat_cli.graph import Graph, Node, Value
from remat_cli.schedule import baseline, peak_lower_bound, steps_from_sequence
from remat_cli.solver import SolverResult
from remat_cli.testing.instances import tiny_graph
from tests.clirun import remat


def free_order_min_extra(g: Graph, budget: int) -> float | None:
    """The least extra cost of any schedule the simulator accepts within `budget`, in any order
    with any recomputation: Dijkstra over (live values, nodes run at least once). None: none fits."""
    order = g.needed_order
    nodes = [g.node_map[n] for n in order]
    vm = g.value_map
    vals = [v for n in nodes for v in n.outputs]
    bit = {v: 1 << k for k, v in enumerate(vals)}
    ins = [sum(bit[v] for v in n.inputs if v in bit) for n in nodes]
    outs = [sum(bit[v] for v in n.outputs) for n in nodes]
    extra = [sum(vm[v].size for v in n.outputs) + n.workspace for n in nodes]
    final = sum(bit[v] for v in g.outputs if v in bit)

    def live_bytes(live: int) -> int:
        return g.resident_bytes + sum(vm[v].size for v in vals if live & bit[v])

    dist = {(0, 0): 0.0}
    heap = [(0.0, 0, (0, 0))]
    tick = itertools.count(1)
    while heap:
        c, _, (live, ran) = heapq.heappop(heap)
        if c > dist[(live, ran)] + 1e-12:
            continue
        if live & final == final:
            return c - baseline(g).cost
        moves = [(live & ~low, ran, c) for low in (1 << k for k in range(len(vals))) if live & low]
        for k, n in enumerate(nodes):
            if live & ins[k] == ins[k] and not live & outs[k] and live_bytes(live) + extra[k] <= budget:
                moves.append((live | outs[k], ran | 1 << k, c + n.cost))
        for live2, ran2, c2 in moves:
            if c2 < dist.get((live2, ran2), float("inf")) - 1e-12:
                dist[(live2, ran2)] = c2
                heapq.heappush(heap, (c2, next(tick), (live2, ran2)))
    return None


def budgets(g: Graph) -> list[int]:
    lo, hi = peak_lower_bound(g), baseline(g).peak_memory
    return sorted(set(range(lo, hi + 1, max(1, (hi - lo) // 6))))


def two_output(g: Graph, seed: int) -> Graph:
    """`g` with a second output on every third node, read by a later node (the bound's y is per
    node, its x per value: a node run again makes both)."""
    rng = random.Random(seed)
    nodes = [n.model_copy(deep=True) for n in g.nodes]
    values = list(g.values)
    for k in range(1, len(nodes) - 1, 3):
        extra = f"{nodes[k].outputs[0]}b"
        values.append(Value(id=extra, size=rng.randint(1, 4)))
        nodes[k].outputs.append(extra)
        nodes[rng.randrange(k + 1, len(nodes))].inputs.append(extra)
    return Graph(name=f"{g.name}m", values=values, nodes=nodes, outputs=g.outputs)


def cases() -> list[Graph]:
    return (
        [tiny_graph(7, 300 + seed) for seed in range(16)]
        + [tiny_graph(8, 400 + seed) for seed in range(4)]
        + [two_output(tiny_graph(7, 500 + seed), seed) for seed in range(6)]
    )


@pytest.mark.parametrize("g", cases(), ids=lambda g: g.name)
def test_never_above_the_free_order_optimum(g: Graph) -> None:
    for budget in budgets(g):
        want = free_order_min_extra(g, budget)
        got = cost_lower_bound(g, budget, exact=100, time_limit=20).extra_cost
        if want is None:
            continue
        assert got <= want + 1e-9, (budget, got, want)


def random_chain(inst: cost_bound.Instants, rng: random.Random) -> list[str]:
    """Instants each a descendant of the one before, from a random start."""
    n = len(inst.order)
    chain = [rng.randrange(n)]
    while rng.random() > 0.25 and (below := [j for j in range(n) if inst.anc[j, chain[-1]]]):
        chain.append(rng.choice(below))
    return [inst.order[j] for j in chain]


@pytest.mark.parametrize("g", cases(), ids=lambda g: g.name)
def test_chain_bound_never_above_the_free_order_optimum(g: Graph) -> None:
    """Any chain of instants, not only the one cost_lower_bound picks."""
    rng = random.Random(g.name)
    inst = cost_bound.Instants(g)
    for budget in budgets(g):
        want = free_order_min_extra(g, budget)
        for _ in range(3):
            chain = random_chain(inst, rng)
            if want is not None:
                assert inst.chain_bound(chain, budget, time.monotonic() + 10)[0] <= want + 1e-9, (
                    budget,
                    chain,
                )


def random_training_chain(seed: int) -> Graph:
    """A training chain of 3-6 layers with random forward costs and value sizes: the shape where
    the chain bound, not one instant, gives the bound."""
    rng = random.Random(seed)
    g = training_chain(tuple(rng.randint(1, 9) for _ in range(rng.randint(3, 6))))
    values = [v if v.role == "input" else v.model_copy(update={"size": rng.randint(1, 3)}) for v in g.values]
    return Graph(name=f"chain{seed}", values=values, nodes=g.nodes, outputs=g.outputs)


@pytest.mark.slow
def test_chain_bound_never_above_the_optimum_of_random_training_chains() -> None:
    """On 25 random training chains at every budget, the bound (and any chain's) stays at or
    below the free-order optimum, and the chain gives it on some of them (measured: 42 cells)."""
    rng = random.Random(2)
    chained = 0
    for seed in range(25):
        g = random_training_chain(seed)
        inst = cost_bound.Instants(g)
        for budget in budgets(g):
            want = free_order_min_extra(g, budget)
            if want is None:
                continue
            bound = cost_lower_bound(g, budget, exact=100, time_limit=20)
            assert bound.extra_cost <= want + 1e-9, (g.name, budget)
            chained += bool(bound.chain)
            chain = random_chain(inst, rng)
            assert inst.chain_bound(chain, budget, time.monotonic() + 10)[0] <= want + 1e-9, (
                g.name,
                budget,
                chain,
            )
    assert chained >= 10


@pytest.mark.parametrize("costs", [(3, 5, 2, 7, 4), (3, 5, 2, 7, 4, 6)])
def test_chain_bound_reaches_the_optimum_of_training_chains(
    costs: tuple[int, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """At 4-5 units one instant forces only the recomputations its backward needs (six layers at
    4 units: 21 of 59); a chain of instants counts every later window's again and meets the
    free-order optimum."""
    g = training_chain(costs)
    for budget in (4, 5):
        want = free_order_min_extra(g, budget)
        bound = cost_lower_bound(g, budget)
        assert bound.chain and bound.node == bound.chain[-1]
        assert bound.extra_cost == pytest.approx(want)
        with monkeypatch.context() as m:
            m.setattr(cost_bound, "CHAIN_SIZES", ())
            single = cost_lower_bound(g, budget)
        assert not single.chain and single.extra_cost < want - 1


def test_tight_on_tiny_graphs() -> None:
    """The bound is not trivially 0: where recomputation is needed, it mostly reaches the optimum
    (measured: on all of them)."""
    hits = positive = 0
    for g in cases():
        for budget in budgets(g):
            want = free_order_min_extra(g, budget)
            if want:
                got = cost_lower_bound(g, budget, exact=100, time_limit=20).extra_cost
                positive += 1
                hits += got == pytest.approx(want)
    assert positive >= 10 and hits >= positive / 2, (hits, positive)


@pytest.mark.parametrize("scale", [1e16, 1e290])
def test_the_bound_holds_at_any_cost_scale(scale: float) -> None:
    """HiGHS takes a cost of 1e20 for infinite and matrix coefficients past 1e15 for errors: the
    ILPs are posed in the largest node cost (a graph of 1e16 flops a node got an infinite bound,
    of 1e100 the trivial 0)."""
    g = training_chain((3, 5, 2, 7, 4, 6))
    nodes = [n.model_copy(update={"cost": n.cost * scale}) for n in g.nodes]
    big = Graph(name="big", values=g.values, nodes=nodes, outputs=g.outputs)
    for budget in (4, 5):
        want = free_order_min_extra(g, budget)
        assert cost_lower_bound(big, budget).extra_cost == pytest.approx(want * scale)


def training_chain(costs: tuple[int, ...] = (5, 3, 7)) -> Graph:
    """x -> f1 -> f2 -> ... -> loss, then ..., b2, b1 each reading its forward value: the classic
    shape; with the default three layers keeping every activation costs 4 units, and the
    budget allows 3."""
    n = len(costs)
    values = [Value(id="x", size=1, role="input")]
    values += [Value(id=f"a{i}", size=1) for i in range(1, n + 1)] + [Value(id="l", size=1)]
    values += [Value(id=f"g{i}", size=1) for i in range(n, 0, -1)]
    nodes = [
        Node(id=f"f{i}", inputs=[f"a{i - 1}" if i > 1 else "x"], outputs=[f"a{i}"], cost=c)
        for i, c in enumerate(costs, 1)
    ]
    nodes.append(Node(id="loss", inputs=[f"a{n}"], outputs=["l"], cost=1))
    nodes += [
        Node(id=f"b{i}", inputs=["l" if i == n else f"g{i + 1}", f"a{i}"], outputs=[f"g{i}"], cost=1)
        for i in range(n, 0, -1)
    ]
    return Graph(name="chain", values=values, nodes=nodes, outputs=["g1"])


@pytest.fixture
def chain_file(tmp_path: Path) -> Path:
    """`training_chain()` as a remat-graph file, for the command-line tests."""
    path = tmp_path / "chain.json"
    path.write_text(training_chain().to_json())
    return path


def test_training_chain_pays_the_cheapest_forward() -> None:
    """With one byte fewer than the baseline's peak, some forward value is dropped before the loss
    and made again: the cheapest is a2 (cost 3, from a1, which is kept)."""
    g = training_chain()
    budget = baseline(g).peak_memory - 1
    assert free_order_min_extra(g, budget) == 3
    bound = cost_lower_bound(g, budget)
    assert bound.extra_cost == pytest.approx(3)
    assert cost_lower_bound(g, baseline(g).peak_memory).extra_cost == 0


def test_too_many_nodes_or_too_little_time_give_the_trivial_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ancestor matrix takes n^2 bytes and O(n^2) steps (a 20,001-node chain: 20 s for a 10 s
    limit; 100,000 nodes would take 10 GB): above MAX_NODES, or once the deadline passes while it
    is built, the bound is the trivial 0 with no instant solved."""
    g = training_chain()
    budget = baseline(g).peak_memory - 1
    assert cost_lower_bound(g, budget).extra_cost > 0
    monkeypatch.setattr(cost_bound, "MAX_NODES", len(g.needed_nodes) - 1)
    assert cost_lower_bound(g, budget) == cost_bound.CostBound(0.0, None, 0)
    with pytest.raises(cost_bound.OutOfTime):
        cost_bound.Instants(g, deadline=0.0)  # time.monotonic() is past it


@pytest.mark.slow
def test_info_reports_the_bound_a_solver_meets(chain_file: Path) -> None:
    """`remat info --budget` prints the bound as JSON on stdout; Checkmate's optimum meets it."""
    g, path = training_chain(), chain_file
    budget = str(baseline(g).peak_memory - 1)
    proc = remat("info", path, "--budget", budget, "--json")
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)
    assert facts["extra_cost_lower_bound"] == pytest.approx(3)
    assert facts["overhead_lower_bound"] == pytest.approx(3 / baseline(g).cost)
    solved = remat("solve", path, "--budget", budget, "--solver", "checkmate")
    assert solved.returncode == 0, solved.stderr
    summary = json.loads(solved.stdout)["summary"]
    assert summary["cost"] - summary["baseline_cost"] == pytest.approx(facts["extra_cost_lower_bound"])
    bad = remat("info", path, "--budget", "1")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and bad.stdout == ""


@pytest.mark.slow
def test_solve_bound_proves_greedy_optimal_on_a_longer_chain(tmp_path: Path) -> None:
    """Six layers at 4 units: greedy's schedule costs the optimum (59), which only the chain
    bound reaches (the single instants: 21), so `--bound` proves it optimal; `info` names the
    chain's instants, on stdout as JSON and on stderr as a line."""
    path = tmp_path / "chain6.json"
    path.write_text(training_chain((3, 5, 2, 7, 4, 6)).to_json())
    proc = remat("solve", path, "--budget", "4", "--solver", "greedy", "--bound")
    assert proc.returncode == 0, proc.stderr
    schedule = json.loads(proc.stdout)
    assert schedule["summary"]["cost"] - schedule["summary"]["baseline_cost"] == pytest.approx(59)
    assert schedule["solver"]["status"] == "optimal"
    facts = json.loads(remat("info", path, "--budget", "4", "--json").stdout)
    assert facts["bound_instants"][-1] == facts["bound_instant"] and len(facts["bound_instants"]) > 1
    shown = remat("info", path, "--budget", "4").stderr
    assert " -> ".join(facts["bound_instants"]) in shown


@pytest.mark.slow
def test_validate_bound_tells_optimal_from_not(chain_file: Path, tmp_path: Path) -> None:
    """`remat validate --bound`: Checkmate's schedule meets the bound (optimal); one that recomputes
    both f1 and f2 (8 units where 3 suffice) within the same budget does not."""
    g, path = training_chain(), chain_file
    budget = baseline(g).peak_memory - 1
    optimal = tmp_path / "optimal.json"
    optimal.write_text(remat("solve", path, "--budget", str(budget), "--solver", "checkmate").stdout)
    steps = steps_from_sequence(g, ["f1", "f2", "f3", "loss", "b3", "f1", "f2", "b2", "b1"])
    worse = tmp_path / "worse.json"
    worse.write_text(
        build_schedule(g, budget, "by-hand", SolverResult(steps=steps, status="feasible"), 0.0).to_json()
    )
    for schedule, want in ((optimal, True), (worse, False)):
        proc = remat("validate", path, schedule, "--bound", "--json")
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["within_budget"] is True
        assert report["overhead_lower_bound"] == pytest.approx(3 / baseline(g).cost)
        assert report["proven_optimal"] is want, report


def test_with_cost_bound_proves_what_meets_it() -> None:
    """A heuristic's schedule that meets the bound becomes "optimal"; one above it keeps its
    status, with the bound as its lower bound and the gap between them."""
    g = training_chain()
    budget = baseline(g).peak_memory - 1
    base = baseline(g).cost

    def schedule(sequence: list[str]):  # noqa: ANN202
        steps = steps_from_sequence(g, sequence)
        return build_schedule(g, budget, "greedy", SolverResult(steps=steps, status="feasible"), 0.0)

    best = with_cost_bound(g, schedule(["f1", "f2", "f3", "loss", "b3", "f2", "b2", "b1"]), 10)
    assert best.summary.peak_memory <= budget and best.summary.cost == base + 3
    assert best.solver.status == "optimal" and best.solver.lower_bound == pytest.approx(base + 3)
    worse = with_cost_bound(g, schedule(["f1", "f2", "f3", "loss", "b3", "f1", "f2", "b2", "b1"]), 10)
    assert worse.summary.peak_memory <= budget and worse.summary.cost == base + 8
    assert worse.solver.status == "feasible" and worse.solver.lower_bound == pytest.approx(base + 3)
    assert worse.solver.gap == pytest.approx(5 / (base + 8))


@pytest.mark.slow
def test_solve_bound_keeps_stdout_json(chain_file: Path) -> None:
    g, path = training_chain(), chain_file
    proc = remat("solve", path, "--budget", str(baseline(g).peak_memory - 1), "--solver", "greedy", "--bound")
    assert proc.returncode == 0, proc.stderr
    solver = json.loads(proc.stdout)["solver"]
    assert solver["lower_bound"] == pytest.approx(baseline(g).cost + 3)
    assert "cut bound" in solver["message"]


@pytest.mark.slow
def test_compare_bound_marks_the_optimal_rows(chain_file: Path) -> None:
    g, path = training_chain(), chain_file
    budget = str(baseline(g).peak_memory - 1)
    proc = remat(
        "compare", path, "--budget", budget, "--solvers", "checkmate,checkpoint-all", "--bound", "--json"
    )
    assert proc.returncode == 0, proc.stderr
    rows = {r["solver"]: r for r in json.loads(proc.stdout)}
    assert rows["checkmate"]["overhead_lower_bound"] == pytest.approx(3 / baseline(g).cost)
    assert rows["checkmate"]["proven_optimal"] is True
    assert not rows["checkpoint-all"].get("proven_optimal")  # keeps everything: over the budget
