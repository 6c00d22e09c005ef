"""From CP-SAT solutions to steps: read the present intervals, sort them by start and decode the
compute sequence with the shared ``steps_from_sequence`` (see "Decoding" in :mod:`.model`)."""

from __future__ import annotations

from collections.abc import Callable

from ortools.sat.python import cp_model

from remat_cli.graph import Graph
from remat_cli.schedule import Step, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.moccasin.model import Expr, Interval, Model
from remat_cli.solvers.moccasin.starts import sequence_of


class Incumbents(cp_model.CpSolverSolutionCallback):
    """Reports each CP-SAT solution (eq. (1) value, bound, decoded steps) to the CLI."""

    def __init__(self, m: Model, graph: Graph, options: SolveOptions, phase: int, cap: int, unit: float):
        super().__init__()
        self.m, self.graph, self.options = m, graph, options
        self.phase, self.cap, self.unit = phase, cap, unit

    def intervals(self) -> list[list[Interval]]:
        return read_solution(self.m, self.value)

    def on_solution_callback(self) -> None:
        ivs = self.intervals()
        if self.phase == 1:
            peak = self.value(self.m.m_var)
            self.options.progress(phase=1, peak=peak, elapsed=self.wall_time)
            if peak > self.cap:
                return
        steps = decode_schedule(self.m, self.graph, ivs)
        self.options.incumbent(steps)
        if self.phase == 1:
            self.stop_search()  # phase 1 ends at the first memory-feasible solution (§2.4)
            return
        if self.phase == 2:
            obj, bound = self.objective_value, self.best_objective_bound
            self.options.progress(
                phase=2,
                elapsed=self.wall_time,
                incumbent=obj * self.unit,
                bound=bound * self.unit,
                gap=(obj - bound) / obj if obj else 0.0,
            )


def read_solution(m: Model, value: Callable[[Expr], int]) -> list[list[Interval]]:
    """Present intervals per node from a solution (`CpSolver.value` or a callback's `value`)."""
    out: list[list[Interval]] = []
    for k in range(len(m.nodes)):
        lst = []
        for i in range(m.space.copies[k]):
            if isinstance(m.a[k][i], int) or value(m.a[k][i]):
                st = m.s[k][i] if isinstance(m.s[k][i], int) else value(m.s[k][i])
                lst.append((int(st), int(value(m.e[k][i]))))
        out.append(lst)
    return out


def decode_schedule(m: Model, graph: Graph, ivs: list[list[Interval]]) -> list[Step]:
    ids = graph.node_view.ids
    return steps_from_sequence(graph, [ids[m.nodes[k]] for k in sequence_of(ivs)])


def local_sequence(m: Model, graph: Graph, steps: list[Step]) -> list[int]:
    local = {graph.node_view.ids[v]: k for k, v in enumerate(m.nodes)}
    return [local[s.node] for s in steps if s.op == "compute" and s.node in local]
