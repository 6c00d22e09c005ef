"""A schedule of a joint graph as the forward and backward FX graphs ``aot_autograd`` runs.

The joint graph is rewritten in the schedule's order: each compute step copies its FX node (a
recomputation is a second copy, reading the copies live at that step), so a value is made
where the schedule makes it and read from the copy the schedule keeps. The boundary step
splits the sequence: the forward graph is the copies before it and returns the forward's
outputs plus exactly the values the backward reads (the values live at the boundary that a
later step uses); the backward graph is the copies after it, recomputations included.

Frees: FX's generated code drops each value after its last reader (``x = None``), and the
boxed calling convention of ``aot_autograd`` clears the argument list, so a value is released
at its last use in the copy the schedule reads it from, which is at or before the schedule's
own free of it. The split itself is PyTorch's (``_extract_fwd_bwd_modules``), so the saved
values follow ``aot_autograd``'s conventions (tensors saved with a version check first).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable

import torch.fx as fx
from torch._functorch.partitioners import _extract_fwd_bwd_modules, is_not_collective

from remat_cli.schedule import Step
from remat_cli.torch.convert import BOUNDARY, JointGraph

#: meta key of a node copied from the joint graph: how many times that node ran before it
COPY_KEY = "remat_copy"
#: meta key of a node copied from the joint graph: the joint graph node's name
SOURCE_KEY = "remat_source"


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, joint: JointGraph) -> None:
        self.joint = joint
        self.orig = {n.name: n for n in gm.graph.nodes}
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}
        self.runs: dict[str, int] = {}
        self.before: set[fx.Node] = set()  # copies (and placeholders) made before the boundary
        self.at_boundary: dict[str, fx.Node] | None = None
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                p = self.graph.placeholder(node.name)
                p.meta = dict(node.meta)
                self.env[joint.value_of[node.name]] = p
                if not node.name.startswith("tangents"):
                    self.before.add(p)

    def read(self, a: fx.Node) -> fx.Node:
        return self.env[self.joint.value_of[a.name]]

    def compute(self, name: str) -> None:
        if name == BOUNDARY:
            self.at_boundary = dict(self.env)
            return
        node = self.orig[name]
        copy = self.graph.node_copy(node, self.read)
        copy.meta = {**node.meta, COPY_KEY: self.runs.get(name, 0), SOURCE_KEY: name}
        self.runs[name] = self.runs.get(name, 0) + 1
        made = [copy]
        if isinstance(node.meta.get("val"), (tuple, list)):
            seen: set[object] = set()
            for user in node.users:
                index = user.args[1]
                if user.target is operator.getitem and index not in seen:
                    seen.add(index)
                    g = self.graph.call_function(operator.getitem, (copy, index))
                    g.meta = dict(user.meta)
                    self.env[f"{name}.{index}"] = g
                    made.append(g)
        else:
            self.env[name] = copy
        if self.at_boundary is None:
            self.before.update(made)

    def output(self, gm: fx.GraphModule) -> tuple[list[fx.Node | None], list[fx.Node]]:
        """The joint outputs (forward ones as live at the boundary) and the saved values."""
        assert self.at_boundary is not None
        old = next(iter(gm.graph.find_nodes(op="output")))
        outs: list[fx.Node | None] = []
        for i, o in enumerate(old.args[0]):
            if not isinstance(o, fx.Node):
                outs.append(o)
                continue
            env = self.at_boundary if i < self.joint.num_fwd_outputs else self.env
            outs.append(env[self.joint.value_of[o.name]])
        out = self.graph.output(tuple(outs))
        out.meta = dict(old.meta)
        saved: dict[fx.Node, None] = {}
        for node in self.graph.nodes:
            if node.op == "call_function" and node not in self.before:
                saved.update((a, None) for a in node.all_input_nodes if a in self.before)
        for o in outs[self.joint.num_fwd_outputs :]:
            if isinstance(o, fx.Node) and o in self.before:
                saved[o] = None
        return outs, list(saved)


def split(
    gm: fx.GraphModule, joint: JointGraph, steps: Iterable[Step]
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(forward, backward) GraphModules that run `steps`, a schedule of ``joint`` (made from
    `gm`), as ``aot_autograd``'s partitioners return them."""
    r = _Rewriter(gm, joint)
    for step in steps:
        if step.op == "compute":
            r.compute(step.node)
    _, saved = r.output(gm)
    rewritten = fx.GraphModule(gm, r.graph)
    fw, bw = _extract_fwd_bwd_modules(
        rewritten, saved, saved_sym_nodes=[], num_fwd_outputs=joint.num_fwd_outputs
    )
    fw.graph.eliminate_dead_code(is_impure_node=is_not_collective)
    bw.graph.eliminate_dead_code(is_impure_node=is_not_collective)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return fw, bw
