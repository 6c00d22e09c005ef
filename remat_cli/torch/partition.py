"""remat as ``torch.compile``'s partitioner: solve the joint graph under a peak-memory budget.

:class:`RematPartitioner` is a :class:`~torch._inductor.custom_graph_pass.CustomPartitionerFn`
(inductor's ``custom_partitioner_fn``) and an ``aot_autograd`` ``partition_fn``: it converts
the joint graph (:mod:`remat_cli.torch.convert`), solves it with remat's registry, and splits
the schedule into the forward and backward graphs (:mod:`remat_cli.torch.apply`).

The budget is the step's peak above what was resident before it (the primals): bytes as the
CLI writes them (``"4GB"``, ``"3.5GiB"``, an int), or a percentage of the joint graph's
no-rematerialization peak above the same baseline. A solve is cached by (graph hash, budget,
solver, options), so a recompilation for the same shapes does not solve again.

remat never breaks training: a graph the converter refuses, a budget no schedule reaches or a
failure while splitting is one :class:`RematFallback` warning, and PyTorch's own
``min_cut_rematerialization_partition`` partitions the graph instead.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch.fx as fx
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from remat_cli import NoSchedule, budget_bytes, simulate, solve
from remat_cli.budget import parse_budget
from remat_cli.schedule import Schedule, steps_from_sequence
from remat_cli.torch.apply import split
from remat_cli.torch.convert import JointGraph, Unsupported, joint_graph
from remat_cli.torch.dropout import dropout_products


class RematFallback(UserWarning):
    """remat did not partition a graph; PyTorch's partitioner did (the message says why)."""


@dataclass
class Solved:
    """One partitioned joint graph: its remat form, the schedule and its predicted peak."""

    joint: JointGraph
    schedule: Schedule
    #: bytes above the primals: the schedule's simulated peak minus the resident bytes
    predicted_peak: int
    #: the same for the joint graph's no-rematerialization order
    baseline_peak: int
    budget: int
    #: True when the schedule came from the solve cache
    cached: bool = False


def remat_version() -> str:
    try:
        return version("remat-cli")
    except PackageNotFoundError:
        return "0+unknown"


def step_budget(joint: JointGraph, budget: int | str) -> tuple[int, int]:
    """(bytes the step may add above the primals, the no-rematerialization peak above them)."""
    base = budget_bytes(joint.graph, "100%") - joint.resident
    return parse_budget(str(budget), base), base


class RematPartitioner(CustomPartitionerFn):
    """Partition a joint graph by a remat schedule within `budget` (see the module)."""

    #: solves shared by every partitioner of the process: (graph hash, budget, solver, options)
    cache: dict[tuple[str, str, str, str], Solved] = {}

    def __init__(
        self, budget: int | str, solver: str = "auto", time_limit: float = 30, **solver_options: Any
    ) -> None:
        parse_budget(str(budget), 1)  # the grammar's errors here, not at the first compile
        self.budget = budget
        self.solver = solver
        self.time_limit = time_limit
        self.solver_options = solver_options
        #: the last graph partitioned by remat (None after a fallback)
        self.last: Solved | None = None
        #: every solve this partitioner used, in call order
        self.solved: list[Solved] = []

    def options_key(self) -> str:
        return json.dumps({"time_limit": self.time_limit, **self.solver_options}, sort_keys=True, default=str)

    def uuid(self) -> str:
        key = [self.solver, str(self.budget), self.options_key(), remat_version()]
        return hashlib.sha256(json.dumps(key).encode()).hexdigest()

    def solve(self, gm: fx.GraphModule, num_fwd_outputs: int, static: list[int] | None) -> Solved:
        """Convert and solve `gm` (cached); raises Unsupported or NoSchedule."""
        joint = joint_graph(gm, num_fwd_outputs=num_fwd_outputs, static_lifetime_input_indices=static)
        key = (joint.key, str(self.budget), self.solver, self.options_key())
        hit = self.cache.get(key)
        if hit is not None:
            return Solved(joint, hit.schedule, hit.predicted_peak, hit.baseline_peak, hit.budget, cached=True)
        extra, base = step_budget(joint, self.budget)
        schedule = solve(
            joint.graph,
            joint.resident + extra,
            solver=self.solver,
            time_limit=self.time_limit,
            **self.solver_options,
        )
        computed = Counter(s.node for s in schedule.steps if s.op == "compute")
        again = [n for n, k in computed.items() if k > 1 and not joint.graph.node_map[n].recomputable]
        if again:  # a random draw or a read of a mutated input run twice would change the step
            raise NoSchedule(f"{self.solver}'s schedule runs {again[0]} again, which must run once")
        # run as FX runs it: each copy freed after its last reader (at or before the schedule's frees)
        schedule = schedule.model_copy(
            update={
                "steps": steps_from_sequence(
                    joint.graph, [s.node for s in schedule.steps if s.op == "compute"]
                )
            }
        )
        peak = simulate(joint.graph, schedule).peak_memory - joint.resident
        solved = Solved(joint, schedule, peak, base, extra)
        self.cache[key] = solved
        return solved

    def __call__(
        self, gm: fx.GraphModule, joint_inputs: Sequence[object], **kwargs: Any
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        num_fwd_outputs = kwargs["num_fwd_outputs"]
        static = kwargs.get("static_lifetime_input_indices")
        self.last = None
        undo = dropout_products(gm)
        try:
            solved = self.solve(gm, num_fwd_outputs, static)
            fw, bw = split(gm, solved.joint, solved.schedule.steps)
        except (Unsupported, NoSchedule, ValueError) as e:
            undo()
            warnings.warn(
                RematFallback(f"remat: {e}; PyTorch's min-cut partitioner runs instead"), stacklevel=2
            )
            return min_cut_rematerialization_partition(gm, joint_inputs, **kwargs)
        self.last = solved
        self.solved.append(solved)
        return fw, bw


def partitioner(
    budget: int | str, solver: str = "auto", time_limit: float = 30, **solver_options: Any
) -> RematPartitioner:
    """A partitioner for ``torch._inductor.config.custom_partitioner_fn`` or ``aot_autograd``'s
    ``partition_fn``: remat's `solver` (a registry name) within `budget` (see the module)."""
    return RematPartitioner(budget, solver, time_limit, **solver_options)


def backend(
    budget: int | str,
    solver: str = "auto",
    inner: str = "aot_eager",
    time_limit: float = 30,
    **solver_options: Any,
) -> Callable[..., Any]:
    """A ``torch.compile`` backend whose partitioner is remat's: ``inner="aot_eager"`` runs
    the two graphs as they are (``aot_autograd`` with no decompositions and no-op boxed
    compilers), ``inner="inductor"`` compiles them with inductor. The partitioner is the
    backend's ``partitioner`` attribute."""
    part = partitioner(budget, solver, time_limit, **solver_options)
    if inner == "aot_eager":
        from torch._dynamo.backends.common import aot_autograd
        from torch._dynamo.backends.debugging import boxed_nop

        compile_fn = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=part)
    elif inner == "inductor":
        import torch._inductor.config as inductor_config
        from torch._inductor.compile_fx import compile_fx

        def compile_fn(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
            with inductor_config.patch(custom_partitioner_fn=part):
                return compile_fx(gm, example_inputs)

    else:
        raise ValueError(f"inner must be 'aot_eager' or 'inductor', not {inner!r}")

    def run(gm: fx.GraphModule, example_inputs: list[Any]) -> Any:
        return compile_fn(gm, example_inputs)

    run.partitioner = part  # type: ignore[attr-defined]
    return run
