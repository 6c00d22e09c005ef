"""Device placement over a fixed compute sequence: XEngine's fast path for large graphs.

Not in the paper, whose MIQP takes hours on ResNet18 (§4.2); this makes multi-device graphs of
thousands of nodes schedulable. A *placement* is a compute sequence (node ids, recomputations
allowed: a single-device solver's schedule) and one device per entry. :func:`steps_from_placement`
turns it into steps by the rules of :mod:`remat_cli.devices`: every input missing on the
consumer's device is copied there right before its first use, from the device that produced it
(inputs and parameters: from home); a copy is freed after its last use on that device, the
original after its last use or copy-out. So one lifetime of a value costs at most one copy per
device that reads it.

:func:`improve_placement` is a local search: move a window of consecutive entries to one device
(windows from the whole sequence down to single entries, coarse to fine), keep the move when it
lowers (memory over the budgets, cost) lexicographically; repeat until a pass changes nothing or
the deadline passes. Trial placements are scored by :func:`placement_score` (the simulator's counts on
plain tuples, 3x faster), the final one by the simulator. Started from a single-device schedule within budget, every accepted move
keeps all devices within budget, so the result is never worse than that schedule.
"""

from __future__ import annotations

import time
from collections import defaultdict

from remat_cli.devices import simulate_devices
from remat_cli.graph import Graph
from remat_cli.schedule import ScheduleError, SimResult, Step, copy, free


def steps_from_placement(graph: Graph, seq: list[str], dev: list[str]) -> list[Step]:
    steps: list[Step] = []
    for op, x, a, b in _plan(graph, seq, dev):
        if op == "copy":
            steps.append(copy(x, a, b))
        elif op == "compute":
            steps.append(Step(op="compute", node=x, device=a))
        else:
            steps.append(free(x, a))
    return steps


def _plan(graph: Graph, seq: list[str], dev: list[str]) -> list[tuple[str, str, str, str]]:
    """The steps of :func:`steps_from_placement` as plain tuples (op, node or value, device or
    from, to): the search scores thousands of placements, and Step objects cost more than the
    scoring itself."""
    home = graph.device_model.home
    nodes = graph.node_map
    outputs = set(graph.outputs)
    cur: dict[str, int] = {}  # value -> entry producing its current lifetime (-1: resident)
    uses: dict[tuple[str, int], dict[str, list[int]]] = {}  # (value, lifetime) -> device -> [first, last]
    copies: list[list[tuple[str, str, str]]] = [[] for _ in seq]
    for j, n in enumerate(seq):
        d = dev[j]
        for v in dict.fromkeys(nodes[n].inputs):
            life = cur.get(v, -1)
            src = home if life == -1 else dev[life]
            u = uses.setdefault((v, life), {})
            if d in u:
                u[d][1] = j
            else:
                u[d] = [j, j]
                if d != src:
                    copies[j].append((v, src, d))
        for v in nodes[n].outputs:
            cur[v] = j
            uses.setdefault((v, j), {})
    free_after: dict[int, list[tuple[str, str]]] = defaultdict(list)
    for (v, life), u in uses.items():
        src = home if life == -1 else dev[life]
        for d, (_, last) in u.items():
            if d != src:
                free_after[last].append((v, d))
        if life == -1 or (v in outputs and cur.get(v) == life):
            continue  # resident on home, or a graph output at the end
        last_src = max([life, *(u[src][1:] if src in u else []), *(f for d, (f, _) in u.items() if d != src)])
        free_after[last_src].append((v, src))
    plan: list[tuple[str, str, str, str]] = []
    for j, n in enumerate(seq):
        plan.extend(("copy", v, a, b) for v, a, b in copies[j])
        plan.append(("compute", n, dev[j], ""))
        plan.extend(("free", v, d, "") for v, d in free_after.get(j, ()))
    return plan


def placement_score(
    graph: Graph, seq: list[str], dev: list[str], budgets: dict[str, int]
) -> tuple[float, float]:
    """(bytes over the budgets, cost) of a placement, counted as :mod:`remat_cli.devices` does
    but without its checks, which every plan of :func:`_plan` passes by construction (the
    search's final placement still goes through the simulator); ScheduleError for a copy
    with no link."""
    dm = graph.device_model
    nodes, size = graph.node_map, {v.id: v.size for v in graph.values}
    mem = dict.fromkeys(dm.ids, 0)
    mem[dm.home] = graph.resident_bytes
    peak = dict(mem)
    cost = 0.0
    for op, x, a, b in _plan(graph, seq, dev):
        if op == "compute":
            n = nodes[x]
            out = sum(size[v] for v in n.outputs)
            peak[a] = max(peak[a], mem[a] + out + n.workspace)
            mem[a] += out
            cost += dm.cost(x, a)
        elif op == "copy":
            c = dm.copy_cost(x, a, b)
            if c is None:
                raise ScheduleError(f"no link and no copy cost for {x!r} from {a!r} to {b!r}")
            peak[b] = max(peak[b], mem[b] + size[x])
            mem[b] += size[x]
            cost += c
        else:
            mem[a] -= size[x]
    return float(sum(max(0, p - budgets[d]) for d, p in peak.items())), cost


def evaluate(
    graph: Graph, seq: list[str], dev: list[str], budgets: dict[str, int]
) -> tuple[float, float, SimResult]:
    """(bytes over the budgets summed over devices, cost, simulation) of a placement."""
    sim = simulate_devices(graph, steps_from_placement(graph, seq, dev))
    assert sim.peak_by_device is not None
    over = float(sum(max(0, p - budgets[d]) for d, p in sim.peak_by_device.items()))
    return over, sim.cost, sim


def improve_placement(
    graph: Graph, seq: list[str], dev: list[str], budgets: dict[str, int], deadline: float
) -> tuple[list[str], float, float]:
    """Local search over window moves (module docstring); returns (placement, over, cost)."""
    start = list(dev)
    dev, over, cost = _search(graph, seq, start, budgets, deadline)
    try:  # the fast score's placement through the real simulator
        over, cost, _ = evaluate(graph, seq, dev, budgets)
    except ScheduleError:  # never seen: placement_score and the simulator disagree; keep the start
        over, cost, _ = evaluate(graph, seq, start, budgets)
        dev = start
    return dev, over, cost


def _search(
    graph: Graph, seq: list[str], dev: list[str], budgets: dict[str, int], deadline: float
) -> tuple[list[str], float, float]:
    devices = graph.device_model.ids
    dev = list(dev)
    over, cost = placement_score(graph, seq, dev, budgets)
    n = len(seq)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        w = 1 << max(n - 1, 0).bit_length()
        while w >= 1:
            for start in range(0, n, max(w // 2, 1)):
                window = range(start, min(start + w, n))
                for d in devices:
                    if all(dev[j] == d for j in window):
                        continue
                    trial = list(dev)
                    for j in window:
                        trial[j] = d
                    try:
                        o2, c2 = placement_score(graph, seq, trial, budgets)
                    except ScheduleError:  # a copy with no link
                        continue
                    if (o2, c2) < (over, cost - 1e-12 * max(abs(cost), 1.0)):
                        dev, over, cost, improved = trial, o2, c2, True
                if time.monotonic() >= deadline:
                    return dev, over, cost
            w //= 2
    return dev, over, cost
