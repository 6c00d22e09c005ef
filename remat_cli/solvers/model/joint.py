"""MODeL §4.4, program (9): order and addresses together, minimising the arena.

The time axis is `ordering.order_vars` (eqs. 1-5 with one operator per step); each tensor also
gets an address interval [A_e, A_e + S_e) and CP-SAT's ``AddNoOverlap2D`` over (lifetime x
address) replaces eqs. (6)-(7b): two boxes may not intersect, so tensors share bytes only when
their lifetimes are disjoint, with no pair binaries and no big-M. Eq. (8) is A_e + S_e <= arena.
A redundant ``AddCumulative`` over the lifetimes (the §5.5 order-only relaxation) gives CP-SAT
the fragmentation-free peak as its bound from the first second.
"""

from __future__ import annotations

from dataclasses import dataclass

from ortools.sat.python import cp_model

from remat_cli.milp import cpsat
from remat_cli.planning.memory_plan import align
from remat_cli.solvers.model.lifetimes import Problem
from remat_cli.solvers.model.ordering import decode, hint_order, order_vars


@dataclass
class JointResult:
    order: list[int]
    offsets: list[int]  # per tensor of problem.tensors, in bytes
    arena: int
    bound: int
    optimal: bool


def solve_joint(
    p: Problem,
    alignment: int,
    start_order: list[int],
    start_offsets: list[int],
    start_arena: int,
    floor: int,
    time_limit: float,
    workers: int,
    seed: int,
    gap: float = 0.0,
    stall: float | None = None,
) -> JointResult | None:
    """Minimise the arena over orders and offsets, warm-started from a full solution; `stall`:
    CP-SAT's rounds of deterministic time (`cpsat.run`)."""
    m = cp_model.CpModel()
    v = order_vars(m, p)
    top = start_arena // alignment
    arena = m.new_int_var(floor // alignment, top, "arena")
    a_vars: list[cp_model.IntVar | None] = []
    xs, ys, sizes = [], [], []
    for k, (t, iv) in enumerate(zip(p.tensors, v.intervals, strict=True)):
        if iv is None:
            a_vars.append(None)
            continue
        u = align(t.size, alignment) // alignment
        a = m.new_int_var(0, top - u, f"A{k}")
        m.add(a + u <= arena)  # eq. (8)
        m.add_hint(a, start_offsets[k] // alignment)
        a_vars.append(a)
        xs.append(iv)
        ys.append(m.new_fixed_size_interval_var(a, u, f"y{k}"))
        sizes.append(u)
    m.add_no_overlap_2d(xs, ys)
    m.add_cumulative(xs, sizes, arena)  # redundant: the order-only relaxation (§5.5)
    m.minimize(arena)
    hint_order(m, v, start_order)
    got = cpsat.run(m, time_limit, workers, seed, gap, stall, incumbent=top)
    if got is None:
        return None
    solver, optimal, bound = got
    return JointResult(
        decode(solver, v),
        cpsat.offsets(solver, a_vars, alignment),
        solver.value(arena) * alignment,
        int(round(bound)) * alignment,
        optimal,
    )
