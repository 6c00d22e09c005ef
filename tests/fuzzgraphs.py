"""Random small valid graphs and the properties every solver must keep on them (issue 20, fuzzing).

`random_graph(draw)` builds a remat-graph from a source of integers ``draw(lo, hi)``: hypothesis
(which shrinks a failure to a small graph) in tests/test_fuzz.py, numpy's generator in
bench/fuzz.py. The graphs have multi-output nodes, zero-size values (views), outputs nothing
reads, nodes no graph output needs, parameters, workspaces and non-recomputable nodes.

`check(graph, budget, solver, brute)` runs one solver and returns the broken promise, if any:
every schedule valid per the simulator, within budget when its status says so, and `optimal`
never claimed above the brute-force optimum (tests/bruteforce.py).
"""

from __future__ import annotations

from collections.abc import Callable

from remat_cli.execution.runner import SolverBug, run_solver
from remat_cli.graph import Graph, Node, Value
from remat_cli.schedule import ScheduleError, baseline, peak_lower_bound, simulate
from remat_cli.solver import SolveOptions

Draw = Callable[[int, int], int]
MAX_NODES = 6


def random_graph(draw: Draw, max_nodes: int = MAX_NODES) -> Graph:
    values: list[Value] = []
    avail: list[str] = []
    for i in range(draw(1, 2)):
        values.append(Value(id=f"x{i}", size=draw(1, 50), role="input"))
        avail.append(f"x{i}")
    if draw(0, 1):
        values.append(Value(id="w", size=draw(1, 50), role="parameter"))
        avail.append("w")
    nodes: list[Node] = []
    produced: list[str] = []
    for i in range(draw(1, max_nodes)):
        inputs: list[str] = []
        for _ in range(draw(0, min(3, len(avail)))):
            v = avail[draw(0, len(avail) - 1)]
            if v not in inputs:
                inputs.append(v)
        outputs = []
        for j in range(1 if draw(0, 3) else 2):  # a quarter of the nodes have two outputs
            size = 0 if draw(0, 5) == 0 else draw(1, 100)  # zero-size: a view
            values.append(Value(id=f"v{i}_{j}", size=size))
            outputs.append(f"v{i}_{j}")
        nodes.append(
            Node(
                id=f"n{i}",
                inputs=inputs,
                outputs=outputs,
                cost=float(draw(1, 10)),
                workspace=draw(1, 30) if draw(0, 4) == 0 else 0,
                recomputable=draw(0, 9) != 0,
            )
        )
        avail += outputs
        produced += outputs
    outs = list(dict.fromkeys(produced[draw(0, len(produced) - 1)] for _ in range(draw(1, 2))))
    return Graph(name="fuzz", values=values, nodes=nodes, outputs=outs)


def budget_between(g: Graph, quarter: int) -> int:
    """The lower bound (quarter 0) ... the baseline peak (quarter 4)."""
    lb, base = peak_lower_bound(g), baseline(g).peak_memory
    return lb + quarter * max(0, base - lb) // 4


def check(g: Graph, budget: int, solver: str, brute: float | None, time_limit: float = 2.0) -> str | None:
    """The promise `solver` breaks on (g, budget), or None."""
    try:
        schedule, result = run_solver(
            g, budget, solver, SolveOptions(time_limit=time_limit, seed=0, workers=1)
        )
    except SolverBug as e:
        return f"invalid schedule: {e}"
    except Exception as e:  # noqa: BLE001 - a crash is a finding, not a test error
        return f"crash: {type(e).__name__}: {e}"
    if schedule is None:
        return None
    try:
        sim = simulate(g, schedule.steps)
    except ScheduleError as e:
        return f"invalid schedule: {e}"
    status = schedule.solver.status
    if status in ("optimal", "feasible") and sim.peak_memory > budget:
        return f"status {status} but peak {sim.peak_memory} > budget {budget}"
    if status == "optimal" and brute is not None and sim.cost > brute + 1e-6 * max(1.0, brute):
        return f"claims optimal at cost {sim.cost}, brute force finds {brute}"
    return None
