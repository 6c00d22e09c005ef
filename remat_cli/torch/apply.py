"""A schedule of a joint graph as the forward and backward FX graphs ``aot_autograd`` runs.

The joint graph is rewritten in the schedule's order: each compute step copies its FX node (a
recomputation is a second copy, reading the copies live at that step), so a value is made
where the schedule makes it and read from the copy the schedule keeps. The boundary step
splits the sequence: the forward graph is the copies before it and returns the forward's
outputs plus exactly the values the backward reads (the values live at the boundary that a
later step uses); the backward graph is the copies after it, recomputations included.

A view (:mod:`remat_cli.torch.convert` inlines them) is made again at its reads, from the copy
of its owner live at that read, once per owner copy and side of the boundary: a view never
outlives the owner copy it was made from, so no storage stays alive after the schedule frees
it, and the backward makes its views from the saved owners.

A random operator the schedule runs more than once draws at its first run through
``run_and_save_rng_state``, which also returns the generator's state; every later run is
``run_with_rng_state`` from that state, which replays the same draw and puts the generator
back, so the recomputation gives eager's mask and later draws are not moved. The state is a
value like any other: saved across the boundary when a replay follows it.

Frees: FX's generated code drops each value after its last reader (``x = None``), and the
boxed calling convention of ``aot_autograd`` clears the argument list, so a value is released
at its last use in the copy the schedule reads it from, which is at or before the schedule's
own free of it. The split itself is PyTorch's (``_extract_fwd_bwd_modules``), so the saved
values follow ``aot_autograd``'s conventions (tensors saved with a version check first).
"""

from __future__ import annotations

import operator
from collections import Counter
from collections.abc import Iterable

import torch
import torch.fx as fx
from torch._functorch.partitioners import _extract_fwd_bwd_modules
from torch._guards import detect_fake_mode
from torch._prims.rng_prims import run_and_save_rng_state, run_with_rng_state

from remat_cli.schedule import Step
from remat_cli.torch.convert import BOUNDARY, RNG_SAVE, JointGraph, rng_device
from remat_cli.torch.dropout import PRODUCT_OF

#: meta key of a node copied from the joint graph: how many times that node ran before it
COPY_KEY = "remat_copy"
#: meta key of a node copied from the joint graph: the joint graph node's name
SOURCE_KEY = "remat_source"


class _Rewriter:
    def __init__(self, gm: fx.GraphModule, joint: JointGraph, replayed: set[str]) -> None:
        self.joint = joint
        #: the random nodes run more than once, and the generator state of each one's first run
        self.replayed = replayed
        self.rng_states: dict[str, fx.Node] = {}
        self.orig = {n.name: n for n in gm.graph.nodes}
        self.old_output = next(iter(gm.graph.find_nodes(op="output")))
        self.graph = fx.Graph()
        self.env: dict[str, fx.Node] = {}
        self.runs: dict[str, int] = {}
        self.before: set[fx.Node] = set()  # copies (and placeholders) made before the boundary
        self.at_boundary: dict[str, fx.Node] | None = None
        #: views made so far: (FX name, before the boundary, the copies read) -> the view's copy
        self.views: dict[tuple[object, ...], fx.Node] = {}
        #: the last node computed (None at the start and at the boundary), and each
        #: multi-output node's latest copy: a dropout's product right after its draw's first
        #: run is the draw's own output (:mod:`remat_cli.torch.dropout`)
        self.prev: str | None = None
        self.tuples: dict[str, fx.Node] = {}
        #: the forward outputs that are views, made just before the boundary
        self.fwd_views: dict[str, fx.Node] = {}
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                p = self.graph.placeholder(node.name)
                p.meta = dict(node.meta)
                self.env[joint.value_of[node.name]] = p
                if not node.name.startswith("tangents"):
                    self.before.add(p)

    def read(self, a: fx.Node) -> fx.Node:
        """The copy a step reads for the joint graph's node `a` (a view made again)."""
        vid = self.joint.value_of[a.name]
        if vid not in self.joint.views:
            return self.env[vid]
        args = {x: self.read(x) for x in a.all_input_nodes}
        key = (a.name, self.at_boundary is None, *args.values())
        copy = self.views.get(key)
        if copy is None:
            copy = self.graph.node_copy(a, args.__getitem__)
            copy.meta = {**a.meta, SOURCE_KEY: a.name}
            self.views[key] = copy
            if self.at_boundary is None:
                self.before.add(copy)
        return copy

    def compute(self, name: str) -> None:
        if self.joint.graph.node_map[name].op == RNG_SAVE:  # the state: made by the first draw
            return
        if name == BOUNDARY:
            for o in self.forward_outputs():
                if self.joint.value_of[o.name] in self.joint.views:
                    self.fwd_views[o.name] = self.read(o)
            self.at_boundary = dict(self.env)
            self.prev = None
            return
        node = self.orig[name]
        draw = node.meta.get(PRODUCT_OF)
        if draw is not None and name not in self.runs and self.prev == draw and self.runs[draw] == 1:
            copy = self.graph.call_function(operator.getitem, (self.tuples[draw], 0))
        elif name in self.replayed:
            copy = self.copy(node)
        else:
            copy = self.graph.node_copy(node, self.read)
        copy.meta = {**node.meta, COPY_KEY: self.runs.get(name, 0), SOURCE_KEY: name}
        self.runs[name] = self.runs.get(name, 0) + 1
        self.prev = name
        made = [copy]
        if isinstance(node.meta.get("val"), (tuple, list)):
            self.tuples[name] = copy
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

    def copy(self, node: fx.Node) -> fx.Node:
        """A run of the random `node`: the first saves the generator's state, a later one
        replays the draw from it (the made nodes go before the boundary with the copy)."""
        args = fx.node.map_arg(node.args, self.read)
        kwargs = fx.node.map_arg(node.kwargs, self.read)
        state = self.rng_states.get(node.name)
        if state is not None:
            return self.graph.call_function(run_with_rng_state, (state, node.target, *args), kwargs)
        both = self.graph.call_function(run_and_save_rng_state, (node.target, *args), kwargs)
        state = self.graph.call_function(operator.getitem, (both, 0))
        val = node.meta["val"]
        fake = detect_fake_mode([*(val if isinstance(val, (tuple, list)) else [val])])
        sample = torch.cuda.get_rng_state() if rng_device(node) == "cuda" else torch.get_rng_state()
        # a generator state's fake tensor, as aot_autograd's saved values carry one
        state.meta["val"] = sample if fake is None else fake.from_tensor(sample)
        self.rng_states[node.name] = state
        if self.at_boundary is None:
            self.before.update((both, state))
        return self.graph.call_function(operator.getitem, (both, 1))

    def forward_outputs(self) -> list[fx.Node]:
        return [o for o in self.old_output.args[0][: self.joint.num_fwd_outputs] if isinstance(o, fx.Node)]

    def output(self) -> tuple[list[fx.Node | None], list[fx.Node]]:
        """The joint outputs (forward ones as live at the boundary) and the saved values."""
        assert self.at_boundary is not None
        old = self.old_output
        outs: list[fx.Node | None] = []
        for i, o in enumerate(old.args[0]):
            if not isinstance(o, fx.Node):
                outs.append(o)
            elif i >= self.joint.num_fwd_outputs:
                outs.append(self.read(o))
            elif o.name in self.fwd_views:
                outs.append(self.fwd_views[o.name])
            else:
                outs.append(self.at_boundary[self.joint.value_of[o.name]])
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


def is_side_effect(node: fx.Node) -> bool:
    """Whether dead-code elimination must keep `node` although nothing reads it: a mutation,
    never a random draw. The extraction copies into each side every node whose inputs are
    there (the backward gets each forward node computable from the saved values), and FX keeps
    a dead random draw when ``torch._inductor.config.fallback_random`` is set: a dropout run
    again in the backward, which costs its time and advances the generator."""
    return node.is_impure(impure_random=False)


def split(
    gm: fx.GraphModule, joint: JointGraph, steps: Iterable[Step]
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """(forward, backward) GraphModules that run `steps`, a schedule of ``joint`` (made from
    `gm`), as ``aot_autograd``'s partitioners return them."""
    steps = list(steps)
    runs = Counter(s.node for s in steps if s.op == "compute")
    replayed = {
        n.name
        for n in gm.graph.nodes
        if runs[n.name] > 1 and torch.Tag.nondeterministic_seeded in getattr(n.target, "tags", ())
    }
    r = _Rewriter(gm, joint, replayed)
    for step in steps:
        if step.op == "compute":
            r.compute(step.node)
    _, saved = r.output()
    rewritten = fx.GraphModule(gm, r.graph)
    fw, bw = _extract_fwd_bwd_modules(
        rewritten, saved, saved_sym_nodes=[], num_fwd_outputs=joint.num_fwd_outputs
    )
    fw.graph.eliminate_dead_code(is_impure_node=is_side_effect)
    bw.graph.eliminate_dead_code(is_impure_node=is_side_effect)
    fw.graph.lint()
    bw.graph.lint()
    fw.recompile()
    bw.recompile()
    return fw, bw
