"""H-Partition invariants (HiREmate App. A) and H-ILP checks (App. B) for the hilp solver."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from remat_cli import registry
from remat_cli.execution.runner import run_solver
from remat_cli.graph import Graph
from remat_cli.importers import generators as G
from remat_cli.milp import EngineSettings
from remat_cli.milp import solve as milp_solve
from remat_cli.schedule import baseline, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.hilp import (
    DEFAULT_TIME_LIMIT,
    HILP,
    Ctx,
    HilpRun,
    Unit,
    atomic,
    build_instance,
    canonical,
    decode,
    flat_hint,
    flatten,
    follow,
    hilp_model,
    measure,
    recompute_hint,
    refine,
    sequential_hint,
    sequential_x,
    trivial,
)
from remat_cli.solvers.hilp.hpartition import (
    LevelGraph,
    h_partition,
    is_acyclic_quotient,
    is_convex,
    quotient,
)


@st.composite
def dags(draw: st.DrawFn) -> LevelGraph:
    n = draw(st.integers(2, 40))
    preds: list[list[int]] = []
    for i in range(n):
        k = draw(st.integers(0, min(i, 3)))
        ps = sorted(set(draw(st.lists(st.integers(0, i - 1), min_size=k, max_size=k)))) if i else []
        preds.append(ps)
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    sizes = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    values = [(sizes[i], i, tuple(succs[i]), not succs[i]) for i in range(n)]
    return LevelGraph(preds, values, [1] * n)


def _check_partition(g: LevelGraph, levels: list[list[list[int]]], max_sub: int) -> None:
    cur = g
    for groups in levels:
        flat = sorted(i for grp in groups for i in grp)
        assert flat == list(range(cur.n)), "every node in exactly one subgraph"
        succs = cur.succs()
        for grp in groups:
            assert len(grp) <= max_sub
            assert is_convex(succs, set(grp)), f"subgraph {grp} is not convex"
        assert is_acyclic_quotient(cur, groups), "quotient graph has a cycle"
        cur = quotient(cur, groups)


@pytest.mark.slow
@settings(max_examples=150, deadline=None)
@given(dags(), st.integers(2, 8), st.integers(1, 10), st.sampled_from([0.0, 0.5, 1.0]))
def test_partition_invariants(g: LevelGraph, max_sub: int, max_top: int, alpha: float) -> None:
    levels = h_partition(g, max_sub, max_top, alpha)
    _check_partition(g, levels, max_sub)
    # the hierarchy shrinks the graph at every level
    sizes = [g.n] + [len(lv) for lv in levels]
    assert all(a > b for a, b in zip(sizes, sizes[1:], strict=False))


def test_partition_reaches_top_size_on_a_transformer() -> None:
    g = G.transformer(layers=12, seed=0)
    fw = [n.id for n in g.nodes if n.phase == "forward"]
    idx = {n: i for i, n in enumerate(fw)}
    preds = [
        sorted({idx[g.producer[v]] for v in g.node_map[n].inputs if g.producer.get(v) in idx}) for n in fw
    ]
    succs: list[list[int]] = [[] for _ in fw]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    lg = LevelGraph(preds, [(1, i, tuple(succs[i]), False) for i in range(len(fw))], [1] * len(fw))
    levels = h_partition(lg, 8, 12)
    _check_partition(lg, levels, 8)
    assert len(levels) >= 2 and len(levels[-1]) <= 12


def test_cyclic_merge_is_refused() -> None:
    # a1 -> b1 and b2 -> a2: {a1, a2} and {b1, b2} are each convex, together they'd form a cycle
    succs = [[1], [], [3], []]
    assert is_convex(succs, {0, 3}) and is_convex(succs, {1, 2})
    lg = LevelGraph([[], [0], [], [2]], [], [1, 1, 1, 1])
    assert is_acyclic_quotient(lg, [[0, 1], [2, 3]])
    lg2 = LevelGraph([[], [0], [1], [2]], [], [1, 1, 1, 1])  # chain 0->1->2->3
    assert not is_acyclic_quotient(lg2, [[0, 2], [1, 3]])


def _direct_optimum(g: Graph, budget: int) -> float | None:
    """The H-ILP over atomic units (one option each) is RK-Checkmate on the fixed order."""
    ctx = Ctx(g, False)
    inst = build_instance(ctx, [atomic(ctx, n) for n in g.topo_order if n in ctx.needed], False)
    model, R = hilp_model(inst, budget - g.resident_bytes)
    res = milp_solve(model, EngineSettings(backend="highs", time_limit=60))
    if res.status != "optimal" or res.x is None:
        return None
    fwd, _ = flatten(inst, decode(inst, res.x, R))
    sim = simulate(g, steps_from_sequence(g, fwd))
    assert sim.peak_memory <= budget  # with one op per unit the ILP's memory is exact
    return sim.cost


@pytest.mark.slow
@pytest.mark.parametrize("fraction", [0.9, 0.7])
def test_hierarchical_not_below_flat_optimum(fraction: float) -> None:
    g = G.linear(6, seed=3)
    budget = int(fraction * baseline(g).peak_memory)
    opt = _direct_optimum(g, budget)
    assert opt is not None
    sched, _ = run_solver(
        g,
        budget,
        "hilp",
        SolveOptions(time_limit=5, seed=0, workers=1, params={"max_subgraph": 3, "max_top": 3}),
    )
    assert sched is not None and sched.summary.peak_memory <= budget
    assert sched.summary.cost >= opt - 1e-6


def test_cpsat_solves_the_integral_h_ilp_to_the_highs_optimum() -> None:
    """--backend cpsat: the H-ILP's memory after each node (U^t_k) is continuous and free, which
    CP-SAT refuses, so the engine fell back to HiGHS while hilp's message said "on cpsat". Made
    integer and bounded (``integral``) the model is CP-SAT's, with the same optimum."""
    g = G.linear(6, seed=3)
    budget = int(0.7 * baseline(g).peak_memory) - g.resident_bytes
    ctx = Ctx(g, False)
    inst = build_instance(ctx, [atomic(ctx, n) for n in g.topo_order if n in ctx.needed], False)
    plain, _ = hilp_model(inst, budget)
    assert plain.integral() is not None  # continuous U^t_k
    model, R = hilp_model(inst, budget, integral=True)
    assert model.integral() is None
    highs = milp_solve(plain, EngineSettings(backend="highs", time_limit=60))
    cpsat = milp_solve(model, EngineSettings(backend="cpsat", time_limit=60))
    assert cpsat.backend == "cpsat" and highs.status == cpsat.status == "optimal"
    assert cpsat.objective == pytest.approx(highs.objective, rel=1e-6)
    assert cpsat.x is not None
    fwd, _ = flatten(inst, decode(inst, cpsat.x, R))
    assert simulate(g, steps_from_sequence(g, fwd)).peak_memory <= budget + g.resident_bytes


def test_layer_option_metrics() -> None:
    g = G.linear(4, seed=0, size=1000)
    ctx = Ctx(g, True)
    fwd = ("f1", "f2")
    bwd = ("grad_f2", "grad_f1")
    owned = frozenset(fwd + bwd)
    keep = measure(ctx, owned, fwd, bwd)
    recompute = measure(ctx, owned, fwd, fwd + bwd)
    assert keep.phantom == 1000  # a1 is kept for grad_f2/grad_f1; a2 is an output (read by f3)
    assert recompute.phantom == 0 and recompute.time > keep.time
    assert "a2" in keep.deps_b and "d3" in keep.deps_b  # option-specific dependencies


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["training", "inference", "nx"])
def test_solves_graph_kinds(kind: str) -> None:
    if kind == "training":
        g = G.unet(depth=3, convs=2, seed=1)
    elif kind == "inference":
        g = G.random_layered(60, seed=5)
    else:
        g = G.linear(8, seed=2)
        g = g.model_copy(update={"nodes": [n.model_copy(update={"grad_of": None}) for n in g.nodes]})
        g = Graph.model_validate(g.model_dump())
    base = baseline(g)
    # subgraphs of an inference graph keep all their outputs together: a mild budget there
    budget = int((0.97 if kind == "inference" else 0.85) * base.peak_memory)
    opts = SolveOptions(time_limit=8, seed=0, workers=1, params={"max_subgraph": 4, "max_top": 6})
    sched, res = run_solver(g, budget, "hilp", opts)
    assert sched is not None, res.message
    assert simulate(g, sched.steps).peak_memory <= budget


@pytest.mark.slow
def test_parallel_jobs_match_serial() -> None:
    """Subgraphs solved in two processes give the schedule solved in one. The H-ILPs alone: the
    flat start's and the fallbacks' fastsa, which ran to the 60 s default limit on either side,
    is cut by the clock on a loaded machine, and then the two sides differed (one failure while
    benchmarks shared the cores)."""
    g = G.transformer(layers=2, seed=1)
    budget = int(0.7 * baseline(g).peak_memory)
    p = {"max_subgraph": 6, "max_top": 8, "flat_start": "", "fallback": "none"}
    a, _ = run_solver(g, budget, "hilp", SolveOptions(seed=0, workers=1, params=p | {"jobs": 1}))
    b, _ = run_solver(g, budget, "hilp", SolveOptions(seed=0, workers=1, params=p | {"jobs": 2}))
    assert a is not None and b is not None and a.steps == b.steps


@pytest.mark.slow
def test_leaf_solvers_add_options() -> None:
    """The framework of solvers (§3.2.1): another registered solver's schedules of a leaf
    subgraph become options of it; the result stays valid."""
    g = G.transformer(layers=1, seed=2)
    budget = int(0.8 * baseline(g).peak_memory)
    params = {"max_subgraph": 5, "max_top": 4, "leaf_solvers": "checkpoint-all"}
    sched, res = run_solver(g, budget, "hilp", SolveOptions(time_limit=8, seed=0, workers=1, params=params))
    assert sched is not None, res.message
    assert simulate(g, sched.steps).peak_memory <= budget


FAILING_PLUGIN = """\
import os

from remat_cli.solver import Solver


class Refuses(Solver):
    name = "refuses"
    method = "a plugin solver that always raises"
    paper = "-"

    def solve(self, graph, budget, options):
        raise ValueError(f"refused in process {os.getpid()}")
"""


@pytest.fixture()
def failing_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A solver that raises, installed the way a plugin is: a distribution on sys.path whose
    entry point in the ``remat.solvers`` group names it."""
    from remat_cli import registry

    (tmp_path / "refuses_plugin.py").write_text(FAILING_PLUGIN)
    dist = tmp_path / "refuses_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: refuses-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        f"[{registry.ENTRY_POINT_GROUP}]\nrefuses = refuses_plugin:Refuses\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    registry.solver_table.cache_clear()
    assert "refuses" in registry.names()
    yield "refuses"
    monkeypatch.undo()
    registry.solver_table.cache_clear()


@pytest.mark.slow
@pytest.mark.parametrize("jobs", [1, 2])
def test_a_failing_leaf_solver_is_named_in_the_message(failing_plugin: str, jobs: int) -> None:
    """Issue 21 item 4: a leaf solver that raises costs only its options, and its failure reaches
    the H-ILP's message, also from the forked job processes (jobs=2: the pid in the note is not
    ours)."""
    g = G.transformer(layers=1, seed=2)
    budget = int(0.8 * baseline(g).peak_memory)
    params = {
        "max_subgraph": 5,
        "max_top": 4,
        "leaf_solvers": failing_plugin,
        "jobs": jobs,
        "fallback": "none",
    }
    sched, res = run_solver(g, budget, "hilp", SolveOptions(time_limit=8, seed=0, workers=1, params=params))
    assert sched is not None and simulate(g, sched.steps).peak_memory <= budget
    m = re.search(
        r"subgraph '[^']+' \((\d+) operators\): refuses failed: ValueError: refused in process (\d+)",
        res.message or "",
    )
    assert m is not None, res.message
    assert int(m.group(1)) > 1
    assert (int(m.group(2)) != os.getpid()) == (jobs > 1)
    assert res.message.count("refuses failed") == 1  # one note per solver, however many subgraphs


def test_backward_pairs_inferred_from_op_names() -> None:
    """networkx data (Checkmate/Moccasin) carry phase but no grad_of: "X_backward" pairs with X."""
    from remat_cli.solvers.hilp import grad_pairs

    g = G.linear(3, seed=0)
    nodes = []
    for n in g.nodes:
        op = f"{n.grad_of}_backward" if n.grad_of else n.id
        nodes.append(n.model_copy(update={"grad_of": None, "op": op}))
    g2 = Graph.model_validate(g.model_dump() | {"nodes": [n.model_dump() for n in nodes]})
    assert grad_pairs(g2) == {f"grad_f{k}": f"f{k}" for k in range(3)}


def test_structural_pairs_on_an_onnx_training_graph() -> None:
    """ONNX training graphs carry phase but no grad_of: every backward operator gets a forward
    partner, and along backward edges the partner never gets deeper (gradients flow from deep
    layers to shallow ones), which keeps the F -> loss -> B quotient acyclic."""
    from pathlib import Path

    from remat_cli.importers.onnx import from_onnx_file
    from remat_cli.solvers.hilp import grad_pairs

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / "torch_unet_train.onnx")
    assert all(n.grad_of is None for n in g.nodes)
    pairs = grad_pairs(g)
    backward = [n for n in g.nodes if n.phase == "backward"]
    assert {n.id for n in backward} == set(pairs)
    pos = {n: i for i, n in enumerate(g.topo_order)}
    forward = {n.id for n in g.nodes if n.phase == "forward"}
    assert set(pairs.values()) <= forward
    for n in backward:
        for v in n.inputs:
            p = g.producer.get(v)
            if p in pairs:
                assert pos[pairs[n.id]] <= pos[pairs[p]]


def with_gradient_sums(g: Graph) -> Graph:
    """`g` with each gradient that sums several uses made by a node of its own without
    ``grad_of`` (as autograd's engine adds them, outside any op's backward)."""
    data = g.model_dump(exclude_none=True)
    nodes, values = data["nodes"], data["values"]
    size = {v["id"]: v["size"] for v in values}
    for n in [n for n in nodes if n.get("phase") == "backward"]:
        grads = [v for v in n["inputs"] if v.startswith("d")]
        if len(grads) > 1:
            total = f"sum_{n['id']}"
            values.append({"id": total, "size": size[grads[0]]})
            nodes.insert(
                nodes.index(n), {"id": total, "inputs": grads, "outputs": [total], "phase": "backward"}
            )
            n["inputs"] = [total] + [v for v in n["inputs"] if v not in grads]
    return Graph.model_validate(data)


@pytest.mark.slow
def test_backward_nodes_without_grad_of_join_a_layer() -> None:
    """A gradient sum with no ``grad_of`` (export-torch's graphs: autograd runs it outside any
    op's backward) joins the layer it feeds. Left a unit of its own, it sat between two
    operators of a grouped layer's B_j, the top's quotient had a cycle and hilp dropped the
    layers (exported transformer at 70%: no schedule, 17.7% with structural pairs)."""
    from remat_cli.solvers.hilp import grad_pairs

    g = with_gradient_sums(G.transformer(2))
    sums = [n.id for n in g.nodes if n.id.startswith("sum_")]
    assert sums and all(g.node_map[s].grad_of is None for s in sums)
    pairs = grad_pairs(g)
    assert {n.id for n in g.nodes if n.phase == "backward"} == set(pairs)
    p = HILP().defaults() | {"max_top": 4, "flat_start": ""}
    s = HilpRun(g, baseline(g).peak_memory, SolveOptions(time_limit=30, workers=1), p)
    ctx = Ctx(g, s.training())
    units = s.hierarchy(ctx)
    assert any(u.layer and len(u.fwd) > 1 for u in units)
    build_instance(ctx, units, with_loss=False)  # raised on the cycle


@pytest.mark.slow
def test_onnx_training_graph_gets_a_schedule() -> None:
    """Where the hierarchy's grouping rules every schedule out, the whole-graph fallback still
    returns one (mlp_train at 70%: greedy and fastsa both reach it)."""
    from pathlib import Path

    from remat_cli.importers.onnx import from_onnx_file

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / "mlp_train.onnx")
    budget = int(0.7 * baseline(g).peak_memory)
    sched, res = run_solver(g, budget, "hilp", SolveOptions(time_limit=8, seed=0, workers=1))
    assert sched is not None, res.message
    assert simulate(g, sched.steps).peak_memory <= budget


@pytest.mark.slow
@pytest.mark.parametrize("fallback", ["auto", "none"])
def test_fallback_none_measures_the_h_ilp_alone(fallback: str) -> None:
    """Issue 18: --fallback none runs no whole-graph solver (the message says so and names no
    other method); with fallbacks on, the message names the method whose schedule is returned."""
    g = G.transformer(layers=2, seed=1)
    budget = int(0.6 * baseline(g).peak_memory)
    params = {"fallback": fallback}
    sched, res = run_solver(g, budget, "hilp", SolveOptions(time_limit=10, seed=0, workers=1, params=params))
    msg = res.message or ""
    if fallback == "none":
        assert "fallbacks off" in msg and "whole graph" not in msg
    else:
        assert "used: " in msg and "fallbacks off" not in msg
    if sched is not None:
        assert simulate(g, sched.steps).peak_memory <= budget


@pytest.mark.slow
def test_deterministic_when_ilps_hit_their_limits() -> None:
    """With one worker and a short limit the top H-ILP cannot finish: it stops on its node limit,
    or the clock stops it and its result is dropped; either way a seed repeats exactly. (12 s:
    within 4 s the flat start leaves the refined top's model on the edge of being built in time,
    and whether it is, is the clock's choice; 8 s was on that edge with the suite's two workers
    and a solve beside them.)"""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.5 * baseline(g).peak_memory)
    runs = [run_solver(g, budget, "hilp", SolveOptions(time_limit=12, seed=3, workers=1)) for _ in range(2)]
    assert runs[0][0] is not None and runs[1][0] is not None
    assert "optimal" not in (runs[0][1].message or "")  # a limit did stop the top H-ILP
    assert runs[0][0].steps == runs[1][0].steps


@pytest.mark.slow
@pytest.mark.parametrize("with_loss", [False, True])
def test_sequential_start_satisfies_the_h_ilp(with_loss: bool) -> None:
    """The warm start: the sequential schedule with any option per unit satisfies every H-ILP
    row but the memory ones (a huge budget: feasible); under a real budget the greedy start
    meets the H-ILP's memory rows, and decoded it is the same schedule."""
    g = G.transformer(layers=2, seed=0)
    base = baseline(g)
    s = HilpRun(g, base.peak_memory, SolveOptions(time_limit=20, seed=0, workers=1), HILP().defaults())
    s.p["max_top"] = 8
    ctx = Ctx(g, True)
    top = s.hierarchy(ctx)
    units = next(u.children for u in top if u.children) if with_loss else top
    inst = build_instance(ctx, units, with_loss=with_loss)
    model, R = hilp_model(inst, 10 * base.peak_memory, corrections=True)
    for pick in ("time", "peak", "kept"):
        choice = [o for _, o in trivial(inst, pick)]
        x = sequential_x(inst, model, choice)
        assert model.violation(x) <= 1e-9, pick
        assert decode(inst, x, R) == list(enumerate(choice))
    tight = int(0.5 * base.peak_memory) - g.resident_bytes
    model, R = hilp_model(inst, tight, corrections=True)
    hint = sequential_hint(inst, model)
    if not with_loss:
        assert hint is not None  # the phantom minimum fits half the peak
    if hint is not None:
        assert model.violation(hint) <= 1e-6
        assert [k for k, _ in decode(inst, hint, R)] == list(range(len(inst.items)))


@pytest.mark.slow
def test_flat_schedule_becomes_layer_options_and_a_start() -> None:
    """Issue 18's lever: greedy's whole-graph schedule gives each top layer one more option (its
    forward once, then what greedy computes of it up to its last backward operator); preferred,
    the sequential start still satisfies every H-ILP row and decodes to one item per phase."""
    g = G.transformer(layers=2, seed=0)
    base = baseline(g)
    budget = int(0.6 * base.peak_memory)
    params = HILP().defaults() | {"flat_start": "greedy", "max_top": 8}
    s = HilpRun(g, budget, SolveOptions(time_limit=20, seed=0, workers=1), params)
    ctx = Ctx(g, True)
    top = s.hierarchy(ctx)
    before = [len(u.options) for u in top]
    prefer = s.flat_options(ctx, top)
    assert prefer is not None and s.flat_seq
    for u, n, o in zip(top, before, prefer, strict=True):
        if o is None:
            continue
        opt = u.options[o]
        assert opt.fwd == u.fwd and set(u.bwd) <= set(opt.bwd) and set(opt.bwd) <= u.owned
        assert len(u.options) in (n, n + 1)
    inst = build_instance(ctx, top, with_loss=False)
    model, R = hilp_model(inst, 10 * base.peak_memory, corrections=True)
    hint = sequential_hint(inst, model, prefer)
    assert hint is not None and model.violation(hint) <= 1e-6
    assert [k for k, _ in decode(inst, hint, R)] == list(range(len(inst.items)))


@pytest.mark.slow
def test_a_backward_operator_run_during_the_forward_pass_opens_the_flat_option() -> None:
    """A whole-graph schedule may run a backward operator that needs nothing of the forward
    pass (a weight's transpose) before that pass ends, and again later. The flat option keeps
    that early computation at the head of its backward part: without it the option read the
    transpose before its later recomputation (resnet50_b32 at 70% ended in a ScheduleError)."""
    from remat_cli.importers.onnx import from_onnx_file
    from remat_cli.solvers.hilp.units import flat_option, reads_after_writes

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / "torch_mlp_train.onnx")
    ctx = Ctx(g, True)
    s = HilpRun(
        g,
        int(0.7 * baseline(g).peak_memory),
        SolveOptions(time_limit=20, seed=0, workers=1),
        HILP().defaults(),
    )
    order = list(g.needed_order)
    pos = {n: i for i, n in enumerate(order)}
    checked = 0
    for u in s.hierarchy(ctx):
        if not u.layer or not u.bwd:
            continue
        start = min(pos[n] for n in u.fwd)
        for n in u.bwd:
            ins = [ctx.producer.get(v) for v in g.node_map[n].inputs]
            if not all(p is None or pos[p] < start for p in ins):
                continue
            # n early, inside the forward pass, and again after its first consumer
            user = min(pos[c] for v in g.node_map[n].outputs for c in g.consumers.get(v, ()))
            seq = [m for m in order if m != n]
            seq.insert(seq.index(u.fwd[-1]), n)
            seq.insert(seq.index(order[user]) + 1, n)
            assert simulate(g, steps_from_sequence(g, seq)).cost > 0  # a valid schedule
            opt = flat_option(ctx, u, seq)
            assert opt is not None and opt.bwd[0] == n
            assert reads_after_writes(ctx, u.owned, (*opt.fwd, *opt.bwd))
            checked += 1
    assert checked >= 1


@pytest.mark.slow
def test_refined_top_splits_backward_blocks() -> None:
    """On an ONNX training graph the pairing from the dataflow makes backward blocks that hold
    their outputs together: the sequential top schedule peaks above the graph's own order.
    Refined, every operator is in exactly one convex piece, the instance stays within its cap
    and the sequential schedule peaks lower than before."""
    from pathlib import Path

    from remat_cli.importers.onnx import from_onnx_file

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / "torch_unet_train.onnx")
    base = baseline(g)
    s = HilpRun(g, base.peak_memory, SolveOptions(time_limit=20, seed=0, workers=1), HILP().defaults())
    ctx = Ctx(g, s.training())
    top = s.hierarchy(ctx)
    fin = refine(ctx, top, 72)
    assert fin is not None and len(fin) > len(top)
    owned = [n for u in fin for n in u.owned]
    assert sorted(owned) == sorted(n for n in g.topo_order if n in g.needed_nodes)
    succs: dict[str, set[str]] = {n.id: set() for n in g.nodes}
    for n in g.nodes:
        for v in n.inputs:
            if (p := g.producer.get(v)) is not None:
                succs[p].add(n.id)
    for u in fin:
        inside = set(u.owned)
        # convex: nothing reached by leaving the piece leads back into it
        stack = [c for n in inside for c in succs[n] if c not in inside]
        seen: set[str] = set()
        while stack:
            n = stack.pop()
            assert n not in inside, f"piece {sorted(inside)} is not convex"
            if n not in seen:
                seen.add(n)
                stack.extend(succs[n])
    peaks = []
    for units in (top, fin):
        inst = build_instance(ctx, units, with_loss=False)
        assert len(inst.items) <= 72 or units is top
        steps = steps_from_sequence(g, flatten(inst, trivial(inst, "peak"))[0])
        peaks.append(simulate(g, steps).peak_memory)
    assert peaks[1] < peaks[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("graph", "fraction", "with_loss"),
    [("transformer", 0.3, True), ("unet", 0.5, True), ("transformer", 0.4, False)],
)
def test_recompute_start_satisfies_the_h_ilp(graph: str, fraction: float, with_loss: bool) -> None:
    """Where no sequential schedule fits an H-ILP (a layer's, or the top with its layers),
    the recomputing start still meets every row (memory included), and it does recompute; at
    the top that means running some F_j again before B_j, which rows (8a)/(8b) allow."""
    g = G.transformer(layers=2, seed=0) if graph == "transformer" else G.unet(depth=3, convs=2, seed=0)
    base = baseline(g)
    s = HilpRun(g, base.peak_memory, SolveOptions(time_limit=20, seed=0, workers=1), HILP().defaults())
    s.p["max_top"] = 8
    ctx = Ctx(g, True)
    top = s.hierarchy(ctx)
    units = next(u.children for u in top if u.children and u.layer) if with_loss else top
    inst = build_instance(ctx, units, with_loss=with_loss)
    budget = int(fraction * base.peak_memory) - g.resident_bytes
    model, R = hilp_model(inst, budget, corrections=True)
    assert sequential_hint(inst, model) is None
    x = recompute_hint(inst, model, budget)
    assert x is not None
    assert model.violation(x) <= 1e-6
    sched = decode(inst, x, R)
    assert len(sched) > len(inst.items)
    assert sorted({k for k, _ in sched}) == list(range(len(inst.items)))
    if not with_loss:
        again = [k for k, _ in sched if [j for j, _ in sched].count(k) > 1]
        assert any(inst.items[k].kind == "F" for k in again)


@pytest.mark.slow
def test_identical_layers_are_solved_once() -> None:
    """App. C.1.1: two layers of one class are solved once; the other's options are the
    representative's schedules translated to its own operators, the same as solving it."""
    g = G.transformer(layers=4, seed=0)
    first: dict[str, float] = {}
    nodes = []
    for n in g.nodes:
        # every layer gets layer 0's costs, so the inner layers 1 and 2 are identical subgraphs
        nodes.append(n.model_copy(update={"cost": first.setdefault(re.sub(r"l\d+_", "", n.id), n.cost)}))
    g = Graph.model_validate(g.model_copy(update={"nodes": nodes}).model_dump())
    ctx = Ctx(g, True)

    def layer(i: int) -> Unit:
        fwd = tuple(n.id for n in g.nodes if n.id.startswith(f"l{i}_"))
        bwd = tuple(sorted((b for f in fwd for b in ctx.grads[f]), key=ctx.pos.__getitem__))
        u = Unit(fwd=fwd, bwd=bwd, layer=True)
        u.children = [atomic(ctx, n) for n in fwd + bwd]
        return u

    budget = int(0.6 * baseline(g).peak_memory)
    solver = HilpRun(g, budget, SolveOptions(seed=0, workers=1), HILP().defaults())
    pair = [layer(1), layer(2)]
    assert canonical(ctx, pair[0])[0] == canonical(ctx, pair[1])[0]
    assert solver.solve_level(ctx, pair, 0, 1, leaf=True) == 1  # one representative
    alone = [layer(2)]
    assert solver.solve_level(ctx, alone, 0, 1, leaf=True) == 1
    translated = pair[1].options
    assert translated and all(set(o.fwd) | set(o.bwd) == pair[1].owned for o in translated)
    assert [(o.fwd, o.bwd, o.time, o.peak, o.phantom) for o in translated] == [
        (o.fwd, o.bwd, o.time, o.peak, o.phantom) for o in alone[0].options
    ]


def test_an_h_ilp_that_cannot_be_built_in_time_is_reported_not_waited_for() -> None:
    # a top level the H-Partition cannot shrink (RL n500: 310 items) took 170 s to build under a
    # 20 s limit; the build now stops at the end of the ILP work and says so
    from remat_cli.solvers.hilp.model import OutOfTime
    from remat_cli.solvers.hilp.subgraphs import solve_instance

    g = G.linear(6, seed=3)
    ctx = Ctx(g, False)
    inst = build_instance(ctx, [atomic(ctx, n) for n in g.topo_order if n in ctx.needed], False)
    budget = baseline(g).peak_memory - g.resident_bytes
    assert hilp_model(inst, budget, deadline=time.time() + 60)[0].num_vars > 0
    with pytest.raises(OutOfTime):
        hilp_model(inst, budget, deadline=time.time() - 1)
    sched, status = solve_instance(inst, budget, 5.0, "highs", 0, False, deadline=time.time() - 1)
    assert sched is None and "had passed before its model was built" in status
    sched, status = solve_instance(inst, budget, 5.0, "highs", 0, False, deadline=time.time() + 60)
    assert sched is not None


@pytest.mark.slow
@pytest.mark.parametrize(("name", "fraction"), [("torch_unet_train", 0.5), ("torch_mlp_train", 0.7)])
def test_top_follows_a_flat_schedule_exactly(name: str, fraction: float) -> None:
    """Issue 18: the top units `follow` cuts along a whole-graph schedule with recomputations
    (greedy's) hold every operator once, and that schedule, translated into the H-ILP's
    variables, meets every row (under the budget it needs where the memory rows are stricter
    than the simulator) and decodes to a schedule of the same cost and peak."""
    from remat_cli.importers.onnx import from_onnx_file

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / f"{name}.onnx")
    budget = int(fraction * baseline(g).peak_memory)
    params = HILP().defaults() | {"flat_start": "greedy"}
    s = HilpRun(g, budget, SolveOptions(time_limit=20, seed=0, workers=1), params)
    ctx = Ctx(g, s.training())
    top = s.hierarchy(ctx)
    s.flat_options(ctx, top)
    assert s.flat_seq and len(s.flat_seq) > len(set(s.flat_seq))  # greedy recomputes here
    flat = simulate(g, steps_from_sequence(g, s.flat_seq))
    assert flat.peak_memory <= budget
    units = follow(ctx, top, s.flat_seq, 72)
    assert sorted(n for u in units for n in u.owned) == sorted(set(s.flat_seq))
    prefer = s.flat_options(ctx, units)
    inst = build_instance(ctx, units, with_loss=False, order=s.flat_order())
    target = budget - g.resident_bytes
    model, R = hilp_model(inst, target, corrections=True)
    x, need = flat_hint(inst, model, s.flat_seq, prefer)
    if x is None:
        assert need is not None and need > target
        model, R = hilp_model(inst, need, corrections=True)
        x, _ = flat_hint(inst, model, s.flat_seq, prefer)
    assert x is not None and model.violation(x) <= 1e-6
    sim = simulate(g, steps_from_sequence(g, flatten(inst, decode(inst, x, R))[0]))
    assert sim.cost == pytest.approx(flat.cost)
    assert sim.peak_memory == flat.peak_memory


@pytest.mark.slow
def test_h_ilp_from_a_flat_start_is_never_costlier_than_it() -> None:
    """The top H-ILP started from greedy's whole-graph schedule returns, with the fallbacks off,
    a schedule within budget at most as costly as greedy's (an H-ILP cut short keeps its start)."""
    from remat_cli.importers.onnx import from_onnx_file

    g = from_onnx_file(Path(__file__).resolve().parents[1] / "graphs" / "torch_unet_train.onnx")
    budget = int(0.5 * baseline(g).peak_memory)
    opts = SolveOptions(time_limit=20, seed=0, workers=1)
    greedy, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=5, seed=0, workers=1))
    assert greedy is not None
    opts.params = {"flat_start": "greedy", "fallback": "none"}
    sched, res = run_solver(g, budget, "hilp", opts)
    assert sched is not None, res.message
    assert "from greedy's schedule" in (res.message or "")
    assert sched.summary.peak_memory <= budget
    assert sched.summary.cost <= greedy.summary.cost * (1 + 1e-9)


@pytest.mark.slow
def test_the_flat_start_is_an_incumbent_at_once() -> None:
    """The flat start's schedule is reported as an incumbent before the hierarchy's levels run
    (a hierarchy or engine overrunning the limit must not cost it: the watchdog returns the last
    incumbent), with ``--fallback none`` too: it is the H-ILP's own schedule, the start of the
    refined top that follows it (mobilenet_v2_b32 at 50%: 34.2% returned at the limit, where
    the flat start had 1.44%)."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    # chen's: greedy's is an incumbent from the start anyway (early_incumbent)
    chen = registry.get("chen-sqrtn")
    got = chen.solve(g, budget, SolveOptions(time_limit=5, seed=0, workers=1, params=chen.defaults()))
    assert got.steps is not None and simulate(g, got.steps).peak_memory <= budget
    flat = [s.node for s in got.steps if s.op == "compute"]

    def first_flat_before_top(fallback: str) -> bool:
        events: list[str] = []
        opts = SolveOptions(time_limit=6, seed=0, workers=1)
        opts.params = HILP().defaults() | {"flat_start": "chen-sqrtn", "fallback": fallback}
        opts.on_incumbent = lambda steps: events.append(
            "flat" if [s.node for s in steps if s.op == "compute"] == flat else "other"
        )
        opts.on_progress = lambda facts: events.append(str(facts.get("stage")))
        HILP().solve(g, budget, opts)
        first_level = next(i for i, e in enumerate(events) if e.startswith("level"))
        return "flat" in events[:first_level]

    assert first_flat_before_top("auto")
    assert first_flat_before_top("none")


@pytest.mark.parametrize(
    "args",
    [["--flat-start", "nosuch"], ["--leaf-solvers", "checkpoint-all,nosuch"], ["--flat-start", "hilp"]],
)
def test_a_helper_solver_that_does_not_exist_is_an_input_error(tmp_path: Path, args: list[str]) -> None:
    """One line and exit 2 (it was silently skipped; ``hilp`` itself would recurse), and no
    schedule file."""
    from click.testing import CliRunner

    from remat_cli.cli import main

    graph = Path(__file__).resolve().parents[1] / "graphs" / "torch_mlp_train.onnx"
    out = tmp_path / "s.json"
    res = CliRunner().invoke(
        main,
        ["solve", str(graph), "--budget", "90%", "-s", "hilp", *args, "--time-limit", "10", "-o", str(out)],
    )
    assert res.exit_code == 2, res.output
    assert "is not a solver it can call" in res.output and "Traceback" not in res.output
    assert not out.exists()


def test_greedy_is_the_flat_start_when_the_named_one_finds_none() -> None:
    """checkpoint-all never recomputes, so at 70% it has no schedule within budget: greedy's is
    the flat start then (the refined top follows it), not none at all."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    s = HilpRun(g, budget, SolveOptions(time_limit=20, seed=0, workers=1), HILP().defaults())
    s.p = s.p | {"flat_start": "checkpoint-all"}
    s.flat_schedule()
    assert s.flat_name == "greedy" and s.flat_seq
    steps = steps_from_sequence(g, s.flat_seq)
    assert simulate(g, steps).peak_memory <= budget


def test_the_cheapest_flat_start_is_kept() -> None:
    """With several flat-start solvers the cheapest schedule within budget is the one the refined
    top follows, whichever ran first."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    costs = {}
    for name in ("greedy", "chen-sqrtn"):
        sched, _ = run_solver(g, budget, name, SolveOptions(time_limit=5, seed=0, workers=1))
        assert sched is not None and sched.summary.peak_memory <= budget
        costs[name] = sched.summary.cost
    assert costs["greedy"] != costs["chen-sqrtn"]
    cheaper = min(costs, key=costs.__getitem__)
    s = HilpRun(g, budget, SolveOptions(time_limit=20, seed=0, workers=1), HILP().defaults())
    s.p = s.p | {"flat_start": ",".join(sorted(costs, key=costs.__getitem__, reverse=True))}
    s.flat_schedule()
    assert s.flat_name == cheaper and s.flat_start is not None
    assert s.flat_start[0] == pytest.approx(costs[cheaper])
    assert simulate(g, steps_from_sequence(g, s.flat_seq)).cost == pytest.approx(costs[cheaper])


@pytest.mark.slow
def test_the_flat_fastsa_runs_the_iterations_of_the_whole_limit() -> None:
    """The H-ILP starts where fastsa alone, given the same limit and seed, ends: its flat start
    is the same annealing run (its iterations and clock check of the whole limit), so the
    H-ILP's own schedule is never costlier than fastsa's at the same time."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    alone, res = run_solver(g, budget, "fastsa", SolveOptions(time_limit=8, seed=2, workers=1))
    assert alone is not None and "wall clock" not in (res.message or "")
    s = HilpRun(g, budget, SolveOptions(time_limit=8, seed=2, workers=1), HILP().defaults())
    s.p = s.p | {"flat_start": "fastsa"}
    s.flat_schedule()
    assert s.flat_name == "fastsa"
    assert s.flat_seq == [st.node for st in alone.steps if st.op == "compute"]


@pytest.mark.slow
def test_a_top_that_follows_the_flat_start_returns_it_when_out_of_time() -> None:
    """A refined top cut along the whole-graph schedule has that schedule as its start: when its
    model cannot be built in time (here: the end of the ILP work has passed) it returns the
    start, as a MIP engine would; a top that does not follow it has nothing then."""
    from remat_cli.solvers.hilp.units import first_ranks

    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    params = HILP().defaults() | {"flat_start": "greedy", "fallback": "none"}
    s = HilpRun(g, budget, SolveOptions(time_limit=20, seed=0, workers=1), params)
    s.flat_schedule()
    assert s.flat_start is not None and s.flat_seq
    ctx = Ctx(g, s.training())
    top = s.hierarchy(ctx)
    finer = follow(ctx, top, s.flat_seq, 3 * int(s.p["max_top"]))
    assert finer is not None
    inst = build_instance(ctx, finer, with_loss=False, order=first_ranks(s.flat_seq))
    s.deadline = time.time() - 1.0
    target = budget - g.resident_bytes
    got, statuses, _ = s.solve_top(inst, target, follows=True)
    assert got is not None and got[1] == s.flat_start[1] and got[2] <= budget
    assert "its start" in statuses[-1]
    got, statuses, _ = s.solve_top(inst, target, follows=False)
    assert got is None and "had passed before its model was built" in statuses[-1]


@pytest.mark.slow
def test_a_flat_start_too_large_to_follow_is_the_refined_tops_result() -> None:
    """When following the whole-graph schedule needs more than twice the refined top's cap, that
    instance is not built (its model would outlast the limit): its start, the schedule itself,
    is its result, so the H-ILP's own schedule is never costlier than the flat start."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.5 * baseline(g).peak_memory)
    flat, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=5, seed=0, workers=1))
    assert flat is not None
    opts = SolveOptions(time_limit=20, seed=0, workers=1)
    opts.params = {"flat_start": "greedy", "fallback": "none", "max_top": 3}
    sched, res = run_solver(g, budget, "hilp", opts)
    assert sched is not None, res.message
    assert re.search(r"more than 18 compute nodes \(its start", res.message or ""), res.message
    assert sched.summary.peak_memory <= budget
    assert sched.summary.cost <= flat.summary.cost * (1 + 1e-9)


@pytest.mark.slow
def test_greedy_is_an_early_incumbent_only_with_fallbacks_on() -> None:
    """Greedy's schedule is reported at once (the watchdog returns the last incumbent when the
    engines overrun) only where a fallback may return it: with ``--fallback none`` a killed run
    must not pass greedy's schedule off as the H-ILP's."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    greedy = registry.get("greedy")
    got = greedy.solve(g, budget, SolveOptions(time_limit=5, seed=0, workers=1, params=greedy.defaults()))
    assert got.steps is not None
    seq = [s.node for s in got.steps if s.op == "compute"]

    def incumbents(fallback: str) -> list[list[str | None]]:
        seen: list[list[str | None]] = []
        opts = SolveOptions(time_limit=6, seed=0, workers=1)
        opts.params = HILP().defaults() | {"flat_start": "", "fallback": fallback}
        opts.on_incumbent = lambda steps: seen.append([s.node for s in steps if s.op == "compute"])
        HILP().solve(g, budget, opts)
        return seen

    on = incumbents("auto")
    assert on and on[0] == seq
    assert seq not in incumbents("none")


def test_a_schedule_the_simulator_rejects_is_skipped_and_said() -> None:
    """A sequence decoded from the H-ILP's units that is not a valid schedule (resnet50_b32 at
    70%: a trivial-option sequence read a value before its producer ran) is skipped with a note
    in the message, not raised as a traceback out of the solver."""
    from remat_cli.schedule import Step

    g = G.linear(4, seed=0)
    s = HilpRun(g, baseline(g).peak_memory, SolveOptions(time_limit=5, seed=0, workers=1), HILP().defaults())
    order = [n for n in g.topo_order if n in g.needed_nodes]
    good = steps_from_sequence(g, order)
    assert s.simulated(good) is not None and not s.helper_notes
    bad = [Step(op="compute", node=order[-1])]  # its inputs were never computed
    assert s.simulated(bad) is None
    assert any("failed the simulator" in n for n in s.helper_notes)


#: the limit of the tests whose H-ILP result needs engine time that a deterministic work limit
#: does not give (a window or top the clock stops first is dropped): slow machines included
SLOW_MACHINE_LIMIT = 30.0


def _hilp_own(
    g: Graph, budget: int, flat_start: str, time_limit: float = 8, **params: object
) -> tuple[float, str, str]:
    """The H-ILP's own schedule (fallbacks off) from `flat_start`: cost, produced_by, message."""
    opts = SolveOptions(
        time_limit=time_limit,
        seed=0,
        workers=1,
        params={"flat_start": flat_start, "fallback": "none", **params},
    )
    sched, res = run_solver(g, budget, "hilp", opts)
    assert sched is not None and sched.summary.peak_memory <= budget, res.message
    return sched.summary.cost, str(res.params.get("produced_by")), res.message or ""


@pytest.mark.slow
def test_an_h_ilp_schedule_cheaper_than_its_flat_start_is_the_h_ilps() -> None:
    """Issue 18, honest attribution: chen-sqrtn's schedule of a small transformer at 70% costs
    27% more than the baseline; the refined top that starts from it finds a cheaper one, and the
    result says the H-ILP produced it."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    chen, _ = run_solver(g, budget, "chen-sqrtn", SolveOptions(time_limit=8, seed=0, workers=1))
    assert chen is not None and chen.summary.peak_memory <= budget
    # the refined top's improvement needs the engine's time, not only its work: 8 s was enough
    # on a fast machine, not on a slow one (CI, 2026-11-29: the top dropped at the clock)
    cost, by, msg = _hilp_own(g, budget, "chen-sqrtn", time_limit=SLOW_MACHINE_LIMIT)
    assert cost < chen.summary.cost, msg
    assert by == "hilp" and "used: H-ILP (fallbacks off)" in msg


@pytest.mark.slow
def test_a_hint_is_a_flat_start() -> None:
    """hilp declares ``warm_starts``: a hint within budget is a flat start like fastsa's, so the
    H-ILP's own schedule (fallbacks off, no flat-start solvers) is cut along it and costs no more
    than it. Without, the H-ILP alone on this transformer at 50% ends above fastsa's schedule."""
    g = G.transformer(layers=3, seed=0)
    budget = int(0.5 * baseline(g).peak_memory)
    fastsa, _ = run_solver(g, budget, "fastsa", SolveOptions(time_limit=8, seed=0, workers=1))
    assert fastsa is not None and fastsa.summary.peak_memory <= budget
    opts = SolveOptions(
        time_limit=8, seed=0, workers=1, hint=fastsa.steps, params={"flat_start": "", "fallback": "none"}
    )
    sched, res = run_solver(g, budget, "hilp", opts)
    assert sched is not None and sched.summary.cost <= fastsa.summary.cost * (1 + 1e-9), res.message
    assert "from the hint's schedule" in (res.message or "")


@pytest.mark.slow
def test_a_flat_start_no_top_improves_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no refined top can follow the flat start (``follow`` finds no cut) and the top
    H-ILP is costlier, the flat start is still the H-ILP's own result (it was dropped, and a
    top schedule 9% costlier than greedy's returned), and the result names greedy as its
    producer instead of claiming it for the H-ILP."""
    from remat_cli.solvers.hilp import solver as hilp_solver

    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    greedy, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=8, seed=0, workers=2))
    assert greedy is not None and greedy.summary.peak_memory <= budget
    monkeypatch.setattr(hilp_solver, "follow", lambda *a, **k: None)
    cost, by, msg = _hilp_own(g, budget, "greedy", windows=0)
    assert cost == pytest.approx(greedy.summary.cost)
    assert by == "greedy (flat start)"
    assert "used: greedy's schedule, the flat start (no H-ILP schedule was cheaper)" in msg


@pytest.mark.slow
def test_windows_improve_a_flat_start_the_tops_do_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same transformer, flat start and tops as above, with the windows on: Checkmate's model
    in greedy's order, re-solved a window at a time, recomputes less than greedy's schedule, and
    the result says the H-ILP produced it (red with the windows' result left out)."""
    from remat_cli.solvers.hilp import solver as hilp_solver

    g = G.transformer(layers=3, seed=0)
    budget = int(0.7 * baseline(g).peak_memory)
    greedy, _ = run_solver(g, budget, "greedy", SolveOptions(time_limit=8, seed=0, workers=2))
    assert greedy is not None
    monkeypatch.setattr(hilp_solver, "follow", lambda *a, **k: None)
    # two windows of 40 stages take 7 s on a slow machine, and the windows get half the time
    # after the flat start: 8 s in all was not enough there (CI, 2026-11-29: 0 of 2 improved)
    cost, by, msg = _hilp_own(g, budget, "greedy", time_limit=SLOW_MACHINE_LIMIT)
    assert cost < greedy.summary.cost * (1 - 1e-9), msg
    assert by == "hilp" and "used: H-ILP (fallbacks off)" in msg
    assert re.search(r"windows of 40 stages over greedy's schedule: [1-9]\d* of \d+ windows improved it", msg)


@pytest.mark.slow
def test_without_a_time_limit_the_default_one_holds() -> None:
    """`remat solve g.onnx --budget 50% --solver hilp` (the pitch's command, no --time-limit) ran
    past 20 minutes on torch_resnet_train, every H-ILP solved to optimality; the solve now runs
    under DEFAULT_TIME_LIMIT and says so in its params."""
    g = G.linear(6, seed=3)
    budget = int(0.7 * baseline(g).peak_memory)
    alone = {"max_top": 3, "flat_start": "", "fallback": "none"}  # no helper spends the default limit
    sched, res = run_solver(g, budget, "hilp", SolveOptions(seed=0, workers=1, params=alone))
    assert sched is not None and sched.summary.peak_memory <= budget
    assert res.params["time_limit"] == DEFAULT_TIME_LIMIT
    _, given = run_solver(
        g, budget, "hilp", SolveOptions(time_limit=3, seed=0, workers=1, params={"max_top": 3})
    )
    assert given.params["time_limit"] == 3
