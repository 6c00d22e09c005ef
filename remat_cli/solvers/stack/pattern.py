"""One layer's keep patterns: which of a block's saved values to keep through the forward pass,
and what making the others again in the backward pass costs, for every bytes-kept cap that
matters (the Pareto front of kept bytes against recompute cost).

A block's *saved* values are those of its forward nodes that the backward pass reads (a decoder
layer: the LayerNorm outputs, the attention probabilities, the MLP's activations). Keeping value
v costs its bytes from the forward pass to v's backward use; dropping it costs running its
producer again, and, recursively, the producers of the inputs that are neither kept nor live
then. With k_v = 1 for a kept saved value and r_n = 1 for a forward node run again:

    minimise  sum_n cost_n r_n
    s.t.      k_v + r_producer(v) >= 1                  each saved value v
              r_n <= r_m + k_u                          each input u of n made by m in the block
                                                        (k_u = 0 for a value the backward does not read)
              sum_v size_v k_v <= cap

the closure form of Checkmate's recomputation constraints (Jain et al., MLSys'20, eq. 1-2)
reduced to one stage: the block's backward, where every dropped value is made again once. The
model has one variable per node and value of one block (a few dozen), so CP-SAT proves each cap
in milliseconds; the front comes from solving it for decreasing caps (each time below the last
point's bytes): each time the cheapest cost c within the cap, then the fewest bytes within
c + THIN of the block's cost, so that points that save almost nothing over a smaller one are
left out.

Blocks are matched node by node through a key that does not depend on the block's index: the
node's scope below the block, its op, its outputs' sizes and how many such nodes came before it
in the block. A pattern found on one block applies to every block with the same keys.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass

from ortools.sat.python import cp_model

from remat_cli.graph import Graph

#: CP-SAT's time per cap (seconds); the model is tiny and proves optimality far sooner
CAP_SECONDS = 2.0
#: costs are scaled to integers: this many units for the whole block's forward cost
COST_UNITS = 10**6
#: points of the front closer in cost than this share of the block's forward cost are one: the
#: front keeps the one with the fewest bytes (steps of a few hundred kilobytes at no cost to speak
#: of, a weight's transpose, multiply the patterns to measure and gain the program nothing)
THIN = 0.005


@dataclass(frozen=True)
class Point:
    """One pattern of the front: the saved values it drops (keys) with the bytes it keeps and
    the cost of making the dropped ones again, per block."""

    dropped: frozenset[tuple]
    kept: int
    cost: float


def node_keys(graph: Graph, block: list[str], prefix: str) -> dict[str, tuple]:
    """Each node of `block` -> its key: (scope below `prefix`, op, output sizes, occurrence of
    those three in the block). The sizes tell apart a node some block has besides the others
    (the first decoder layer also makes the attention mask every layer reads)."""
    seen: Counter = Counter()
    out = {}
    for n in block:
        node = graph.node_map[n]
        scope = node.scope or ""
        rel = scope[len(prefix) :] if (scope + ".").startswith(prefix) else scope
        k = (rel, node.op, tuple(graph.value_map[v].size for v in node.outputs))
        out[n] = (*k, seen[k])
        seen[k] += 1
    return out


def value_keys(graph: Graph, block: list[str], prefix: str) -> dict[str, tuple]:
    """Each value made by `block` -> (its producer's key, output index)."""
    keys = node_keys(graph, block, prefix)
    return {v: (keys[n], i) for n in block for i, v in enumerate(graph.node_map[n].outputs)}


def saved_values(graph: Graph, block: list[str], forward: set[str], rest: set[str]) -> list[str]:
    """The values of `block` that may be dropped: made by a recomputable node, read by the
    backward pass (`rest`), read by no forward node outside the block, not graph outputs."""
    inside = set(block)
    outputs = set(graph.outputs)
    out = []
    for n in block:
        if not graph.node_map[n].recomputable:
            continue
        for v in graph.node_map[n].outputs:
            readers = graph.consumers.get(v, ())
            if v in outputs or not any(c in rest for c in readers):
                continue
            if any(c in forward and c not in inside for c in readers):
                continue
            out.append(v)
    return out


def front(
    graph: Graph, block: list[str], saved: list[str], keys: dict[str, tuple], until: float | None = None
) -> list[Point]:
    """The Pareto front of `block`'s keep patterns (module docstring), most bytes kept first:
    it starts at keeping everything (cost 0) and ends at the least the model can keep. Past
    `until` (time.monotonic()) the front jumps to its end (the fewest bytes), each solve given a
    tenth of a second: the solves take milliseconds unless the machine is starved."""
    nm, producer = graph.node_map, graph.producer
    inside = set(block)
    block_cost = sum(nm[n].cost for n in block) or 1.0
    unit = COST_UNITS / block_cost
    m = cp_model.CpModel()
    r = {n: m.new_bool_var(f"r{i}") for i, n in enumerate(block)}
    k = {v: m.new_bool_var(f"k{i}") for i, v in enumerate(saved)}
    for v in saved:
        m.add(k[v] + r[producer[v]] >= 1)
    for n in block:
        for u in nm[n].inputs:
            p = producer.get(u)
            if p is None or p not in inside:
                continue  # resident, or made outside the block and kept there
            m.add(r[n] <= r[p] + k[u] if u in k else r[n] <= r[p])
    size = {v: graph.value_map[v].size for v in saved}
    total = sum(size.values())
    kept = sum(size[v] * k[v] for v in saved)
    units = {n: round(nm[n].cost * unit) for n in block}
    cost = sum(units[n] * r[n] for n in block)
    kept_cap = m.new_int_var(0, total, "kept_cap")
    cost_cap = m.new_int_var(0, sum(units.values()), "cost_cap")
    m.add(kept <= kept_cap)
    m.add(cost <= cost_cap)
    eps = round(THIN * COST_UNITS)
    points: list[Point] = []
    limit = total
    while limit >= 0:
        # the cheapest pattern within `limit` bytes, then the fewest bytes within eps of its cost
        late = until is not None and time.monotonic() > until
        seconds = 0.1 if late else CAP_SECONDS
        end = late and bool(points)
        if end:
            limit = 0  # straight to the front's end: the pattern for the tightest budgets
        cheapest = _solve(m, cost, {kept_cap: limit, cost_cap: sum(units.values())}, seconds)
        if cheapest is None:
            break
        c = round(cheapest.objective_value)
        fewest = _solve(m, kept, {kept_cap: limit, cost_cap: c + eps}, seconds) or cheapest
        bytes_kept = sum(size[v] for v in saved if fewest.value(k[v]))
        dropped = frozenset(keys[v] for v in saved if not fewest.value(k[v]))
        spent = sum(nm[n].cost for n in block if fewest.value(r[n]))
        points.append(Point(dropped, bytes_kept, spent))
        if end:
            break
        limit = bytes_kept - 1
    return points


def _solve(
    m: cp_model.CpModel, objective: cp_model.LinearExpr, caps: dict, seconds: float = CAP_SECONDS
) -> cp_model.CpSolver | None:
    """`m` minimising `objective` with each cap variable's upper bound set; None if infeasible."""
    for var, high in caps.items():
        m.proto.variables[var.index].domain[1] = high
    m.minimize(objective)
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = seconds
    solver.parameters.num_workers = 1
    if solver.solve(m) not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return None
    return solver
