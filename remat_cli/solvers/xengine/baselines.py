"""XEngine §4.1: the single-device baselines (Checkmate on the CPU, Checkmate on the GPU).

Each device d gets the graph projected onto it (:func:`.problem.single_device_graph`: d's costs,
inputs and parameters resident) solved at d's budget by the project's single-device solvers; the
schedule's compute sequence, placed entirely on d by :func:`.placement.steps_from_placement`
(inputs and parameters copied from home before their first use, freed after their last), is a
multi-device schedule whose peak on d is at most the projection's. The cheapest one within every
budget is XEngine's reference ("best single device"), its warm start, and a floor: the solver
never returns anything costlier. Also here: the check that some operator fits nowhere.

Beyond the paper, *relaxed* candidates: greedy's schedule of each projection at ``RELAX`` × the
device's budget. Over budget on one device, such a sequence may fit once the placement search
spreads it over all devices (together they hold more than any one); at budgets where no single
device has a schedule (the ONNX training graphs at 25%) these are the only starts that do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.schedule import Step, baseline, baseline_steps
from remat_cli.solver import SolveOptions
from remat_cli.solvers.checkmate import S_from_steps, minimal_R
from remat_cli.solvers.xengine.placement import evaluate
from remat_cli.solvers.xengine.problem import Problem, single_device_graph

#: relaxed candidates: greedy at these multiples of a device's budget (below the baseline peak)
RELAX = (1.25, 1.5)


@dataclass
class Candidate:
    device: str  #: where it came from: a device id, "placement" or "milp"
    seq: list[str]
    dev: list[str]
    over: float  #: bytes over the budgets, summed over devices
    cost: float
    steps: list[Step] | None = None
    single_steps: list[Step] | None = None  #: the projection's steps (for the MILP warm start)
    relaxed: bool = False  #: solved at a multiple of the budget: a placement start only


def infeasible_operator(graph: Graph, budgets: dict[str, int]) -> str | None:
    """Why no schedule can exist: the inputs and parameters exceed the home budget, or some needed
    operator's working set (inputs, outputs, workspace) exceeds every device's budget."""
    dm = graph.device_model
    vm = graph.value_map
    home = dm.home
    if graph.resident_bytes > budgets[home]:
        return (
            f"the inputs and parameters ({graph.resident_bytes:,} B) exceed the budget of the home "
            f"device {home!r} ({budgets[home]:,} B)"
        )
    for n_id in graph.topo_order:
        if n_id not in graph.needed_nodes:
            continue
        n = graph.node_map[n_id]
        need = {}
        for d in dm.ids:
            ins = {v for v in n.inputs if not (vm[v].resident and d == home)}
            need[d] = sum(vm[v].size for v in ins | set(n.outputs)) + n.workspace
            need[d] += graph.resident_bytes if d == home else 0
        if all(need[d] > budgets[d] for d in dm.ids):
            where = ", ".join(f"{d}: needs {need[d]:,} B, budget {budgets[d]:,} B" for d in dm.ids)
            return f"operator {n_id!r} fits on no device ({where})"
    return None


def single_device_candidates(
    graph: Graph,
    budgets: dict[str, int],
    options: SolveOptions,
    single: str,
    max_stages: int,
    seconds: float,
    notes: list[str] | None = None,
) -> list[Candidate]:
    """Every single-device schedule found within `seconds` (shared by the devices); a helper
    solver's failure is added to `notes` (registry.call_solver)."""
    dm = graph.device_model
    T = len(graph.needed_nodes)
    names = ["checkpoint-all", "greedy"] + (["checkmate"] if T <= max_stages else [])
    if single != "auto":
        names = [s.strip() for s in single.split(",") if s.strip()]
    out: list[Candidate] = []
    end = time.monotonic() + seconds
    for k, d in enumerate(dm.ids):
        proj = single_device_graph(graph, d)
        for name in names:
            if name == "checkpoint-all":
                steps: list[Step] | None = baseline_steps(proj)
            else:
                left = end - time.monotonic()
                per = max(left / max(len(dm.ids) - k, 1), 0.5)
                sub = SolveOptions(time_limit=per, seed=options.seed, workers=options.workers)
                result = registry.call_solver(name, proj, budgets[d], sub, notes if notes is not None else [])
                steps = result.steps if result is not None else None
            if steps is None:
                continue
            out.append(_candidate(graph, budgets, d, steps))
        if len(dm.ids) > 1 and "greedy" in names:
            peak = baseline(proj).peak_memory
            for m in RELAX:
                relaxed = int(m * budgets[d])
                if relaxed >= peak or time.monotonic() >= end:
                    break
                sub = SolveOptions(time_limit=max(end - time.monotonic(), 0.5), seed=options.seed)
                result = registry.call_solver(
                    "greedy", proj, relaxed, sub, notes if notes is not None else []
                )
                steps = result.steps if result is not None else None
                if steps is not None:
                    out.append(_candidate(graph, budgets, d, steps, relaxed=True))
    return out


def _candidate(
    graph: Graph, budgets: dict[str, int], d: str, steps: list[Step], relaxed: bool = False
) -> Candidate:
    seq = [s.node for s in steps if s.op == "compute" and s.node is not None]
    dev = [d] * len(seq)
    over, cost, _ = evaluate(graph, seq, dev, budgets)
    # A relaxed schedule is no single-device baseline: it seeds the placement search only.
    return Candidate(d, seq, dev, over, cost, single_steps=None if relaxed else steps, relaxed=relaxed)


def decision_of_single(p: Problem, c: Candidate) -> object | None:
    """The MILP decision of a single-device schedule, when it lies in the stage space."""
    from remat_cli.solvers.xengine.milp import Decision

    if c.single_steps is None or c.device not in p.devices:
        return None
    S1 = S_from_steps(p.stages, c.single_steps)
    if S1 is None:
        return None
    S1, R1 = minimal_R(p.stages, S1)
    T, D = p.T, p.D
    d = p.devices.index(c.device)
    dec = Decision(
        R=np.zeros((D, T, T), dtype=bool),
        S=np.zeros((D, T + 1, T), dtype=bool),
        X=np.zeros((D, D, T, T), dtype=bool),
        K=np.zeros((D, T, len(p.resident)), dtype=bool),
    )
    dec.R[d] = R1
    dec.S[d] = S1
    if d != p.home:
        dec.K[d] = True
    return dec
