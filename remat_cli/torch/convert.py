"""The joint forward-backward FX graph of ``aot_autograd`` as a remat graph (DESIGN.md §1).

One remat node per FX ``call_function`` (a ``getitem`` of a multi-output operator is no node:
it names one of that operator's outputs). Sizes come from each value's ``meta["val"]``.

Views own no memory and have no lifetime of their own. An operator whose every output shares
its storage with a value already made (``view``, ``t``, ``permute``, ``expand``, ``detach``,
``split``, ...) is no remat node: a node that reads such a view reads the storage's owner, and
the split makes the view again from the owner's copy live at that read
(:mod:`remat_cli.torch.apply`). A view kept from its first making would hold the storage of an
owner the schedule has freed and recomputed: two copies of one tensor alive, which the
simulator never sees. A view output of an operator that also makes new storage (rare) stays
that node's output, with size 0; its readers also read the owner.

Inputs: the primals (parameters and the step's inputs) are resident, as the simulator's start
state counts them (§2), so a budget above them is the step's peak above what was resident
before it. The tangents are made by a zero-cost *boundary* node that reads every forward
output: the schedule's forward is everything before it, the backward everything after.

Costs are seconds: each operator's measured time, and its workspace (the scratch a kernel
holds while it runs), both from :mod:`remat_cli.torch.probe`. An operator that cannot be
measured costs its FLOPs from :mod:`torch.utils.flop_counter` plus :data:`FLOPS_PER_BYTE` per
byte it reads and writes, at least :data:`MIN_COST`, at :data:`FLOPS_PER_SECOND`.

Random operators (``nondeterministic_seeded``, e.g. ``native_dropout``) are chained by zero-size
tokens in their program order, so every schedule makes their first draws in eager's order and a
seeded run gives eager's dropout masks. A functional random operator on the CPU or a CUDA device
is recomputable: :mod:`remat_cli.torch.apply` saves the generator's state at its first run and
replays the draw from it (``run_and_save_rng_state`` / ``run_with_rng_state``, as PyTorch's
partitioner replays a checkpointed dropout), so a recomputation draws eager's mask again. The
saved state is the value of a node of its own (:data:`RNG_SAVE`, no FX node, run once, after
the draw before: the token), which the random node reads, of the state's size
(:func:`rng_state_bytes`): it lives until the draw's last replay, and a replay never needs the
draws before it run again. Not recomputable: other random operators (no replayable state) and
impure ones.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.flop_counter import flop_registry

from remat_cli.graph import Graph, Node, Value
from remat_cli.torch.dropout import PRODUCT_OF
from remat_cli.torch.probe import probe

#: cost units per byte an operator reads or writes (a CPU core's FLOP rate over its bandwidth)
FLOPS_PER_BYTE = 4.0
#: the least cost of an operator (a kernel launch), in FLOPs
MIN_COST = 1000.0
#: the FLOP rate that turns an unmeasured operator's FLOPs into seconds (one CPU core)
FLOPS_PER_SECOND = 1e10
#: the node that makes the tangents: the schedule's forward/backward boundary
BOUNDARY = "remat.boundary"
#: the op of the nodes that save a random operator's generator state (no FX node)
RNG_SAVE = "remat.rng_save"


class Unsupported(ValueError):
    """A joint graph the converter does not take (the partitioner falls back to PyTorch's)."""


@dataclass
class JointGraph:
    """A joint graph's remat form and what maps it back to FX."""

    graph: Graph
    #: FX node name -> the remat value it stands for (getitems name their operator's output)
    value_of: dict[str, str]
    #: remat value id -> the FX node that makes it (an operator's getitem, or the node itself)
    fx_of: dict[str, str]
    #: bytes resident before the step (the primals)
    resident: int
    num_fwd_outputs: int
    #: the graph's hash without its costs (measured times vary): the solve cache's key
    key: str = ""
    #: the owner of each view's storage
    owner: dict[str, str] = field(default_factory=dict)
    #: the views made again at every read (no remat node), each with its storage's owner; a
    #: multi-output view operator is there under its FX name too
    views: dict[str, str] = field(default_factory=dict)


def _tensor_val(node: fx.Node) -> torch.Tensor | None:
    v = node.meta.get("val")
    return v if isinstance(v, torch.Tensor) else None


def rng_state_bytes(device: str) -> int:
    """Bytes of the memory measured on `device` that a saved generator state holds: the CPU
    generator's whole state (a Mersenne Twister), and nothing for CUDA, whose state (seed and
    offset) ``run_and_save_rng_state`` returns as a small host tensor."""
    return int(torch.get_rng_state().nbytes) if device == "cpu" else 0


def rng_device(node: fx.Node) -> str | None:
    """The device type whose generator `node`, a random operator, draws from, when its draw
    can be saved and replayed: a functional operator on the CPU or a CUDA device."""
    if node.target._schema.is_mutable:
        return None

    def meta(a: fx.Node) -> object:
        return a.meta.get("val")

    args = fx.node.map_arg(node.args, meta)
    kwargs = fx.node.map_arg(node.kwargs, meta)
    device = torch._prims.rng_prims.get_device(args, kwargs)
    return device if device in ("cpu", "cuda") else None


def module_scope(node: fx.Node) -> str | None:
    """The path of the innermost module that ran `node` (``blocks.7.attn``), as ``named_modules``
    names it: dynamo records it on a forward node (``nn_module_stack``) and aot_autograd copies
    the forward node's onto the backward nodes that differentiate it
    (``fwd_nn_module_stack``). None outside every submodule."""
    stack = node.meta.get("nn_module_stack") or node.meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    path, _ = list(stack.values())[-1]
    path = re.sub(r"\._modules\['([^']*)'\]", r".\1", str(path))  # older dynamo spellings
    path = re.sub(r"\[(\d+)\]", r".\1", path)
    path = re.sub(r"^L\['self'\]\.?|^L__self__[._]?", "", path)
    return path or None


def _check_supported(gm: fx.GraphModule) -> None:
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if not (node.name.startswith("primals") or node.name.startswith("tangents")):
                raise Unsupported(f"placeholder {node.name} (RNG seeds or backward state)")
            if node.meta.get("val") is not None and _tensor_val(node) is None:
                raise Unsupported(f"placeholder {node.name} is not a tensor (dynamic shapes)")
        elif node.op == "call_function":
            target = node.target
            if target is operator.getitem:
                continue
            if not isinstance(target, torch._ops.OpOverload):
                raise Unsupported(f"{node.name}: {target} is not an ATen operator")
            if target._schema.is_mutable and not is_input_update(node):
                raise Unsupported(f"{node.name}: {target} mutates its input")
            val = node.meta.get("val")
            leaves = val if isinstance(val, (tuple, list)) else [val]
            if not any(isinstance(x, torch.Tensor) for x in leaves):
                raise Unsupported(f"{node.name}: {target} returns no tensor")
            if any(x is not None and not isinstance(x, torch.Tensor) for x in leaves):
                raise Unsupported(f"{node.name}: {target} returns a non-tensor (dynamic shapes)")
            if node.meta.get("recompute") is not None:
                raise Unsupported(f"{node.name}: a user checkpointing policy is set")
        elif node.op == "get_attr":
            raise Unsupported(f"{node.name}: get_attr nodes")


def is_input_update(node: fx.Node) -> bool:
    """A ``copy_`` into a primal that must stay in the forward (inductor keeps the step's input
    mutations, such as BatchNorm's running statistics, in the graph)."""
    dst = node.args[0] if node.args else None
    return (
        node.target is torch.ops.aten.copy_.default
        and isinstance(dst, fx.Node)
        and dst.op == "placeholder"
        and dst.name.startswith("primals")
        and node.meta.get("partitioner_tag") == "must_be_in_forward"
    )


def _cost(node: fx.Node, read: int, written: int) -> float:
    packet = getattr(node.target, "overloadpacket", None)
    flops = 0
    if packet in flop_registry:

        def meta(a: fx.Node) -> object:
            return a.meta["val"]

        args = fx.node.map_arg(node.args, meta)
        kwargs = fx.node.map_arg(node.kwargs, meta)
        flops = int(flop_registry[packet](*args, **kwargs, out_val=node.meta["val"]))
    return max(MIN_COST, flops + FLOPS_PER_BYTE * (read + written))


class _Builder:
    def __init__(self, gm: fx.GraphModule, static_inputs: set[int]) -> None:
        self.gm = gm
        self.static_inputs = static_inputs
        self.values: dict[str, Value] = {}
        self.nodes: list[Node] = []
        self.value_of: dict[str, str] = {}
        self.fx_of: dict[str, str] = {}
        self.owner: dict[str, str] = {}
        #: views inlined at their readers -> their storage's owner
        self.views: dict[str, str] = {}
        self.storage_owner: dict[StorageWeakRef, str] = {}
        self.rng_token: str | None = None
        #: primals the step mutates (BatchNorm's running statistics): what reads them runs once,
        #: before the update that follows the forward
        self.mutated: set[str] = set()
        #: the in-graph input updates (``copy_`` into a primal), which the forward must run
        self.updates: list[str] = []

    def add_value(self, vid: str, t: torch.Tensor, role: str = "intermediate") -> None:
        ref = StorageWeakRef(t.untyped_storage())
        base = self.storage_owner.get(ref)
        size = 0
        if base is None:
            self.storage_owner[ref] = vid
            size = int(t.untyped_storage().nbytes())
        else:
            self.owner[vid] = self.owner.get(base, base)
        self.values[vid] = Value(
            id=vid, size=size, role=role, dtype=str(t.dtype).removeprefix("torch."), shape=list(t.shape)
        )

    def with_owners(self, vids: list[str]) -> list[str]:
        """`vids` as a remat node reads them: an inlined view as its owner, another view
        together with its owner."""
        vids = [self.views.get(v, v) for v in vids]
        return list(dict.fromkeys([*vids, *(self.owner[v] for v in vids if v in self.owner)]))

    def inline_view(self, node: fx.Node, outs: list[tuple[str, torch.Tensor]]) -> bool:
        """Record `node` as a view operator made again at each read, when every output of it
        aliases a storage already made and it neither mutates nor draws random numbers."""
        if node.target._schema.is_mutable or torch.Tag.nondeterministic_seeded in node.target.tags:
            return False
        refs = [StorageWeakRef(t.untyped_storage()) for _, t in outs]
        if not all(r in self.storage_owner for r in refs):
            return False
        for (vid, _), ref in zip(outs, refs, strict=True):
            base = self.storage_owner[ref]
            self.views[vid] = self.owner.get(base, base)
        if len(outs) != 1 or outs[0][0] != node.name:
            self.views[node.name] = self.views[outs[0][0]]
            self.value_of[node.name] = node.name
        return True

    def placeholder(self, node: fx.Node, index: int) -> None:
        t = _tensor_val(node)
        if t is None:
            raise Unsupported(f"placeholder {node.name} has no tensor value")
        self.value_of[node.name] = node.name
        self.fx_of[node.name] = node.name
        if node.name.startswith("primals"):
            self.add_value(node.name, t, "parameter" if index in self.static_inputs else "input")

    def call(self, node: fx.Node) -> list[str]:
        """Convert one FX call; the remat nodes made for it in their order (none for a
        getitem or an inlined view; a random operator's state node before it)."""
        if node.target is operator.getitem:
            src, index = node.args
            vid = f"{src.name}.{index}"
            self.value_of[node.name] = vid
            self.fx_of.setdefault(vid, node.name)
            return []
        val = node.meta["val"]
        if isinstance(val, (tuple, list)):
            outs = [(f"{node.name}.{i}", t) for i, t in enumerate(val) if isinstance(t, torch.Tensor)]
        else:
            outs = [(node.name, val)]
            self.value_of[node.name] = node.name
        if PRODUCT_OF in node.meta:  # the views made from the dropout's output read the product
            for _, t in outs:
                self.storage_owner.pop(StorageWeakRef(t.untyped_storage()), None)
        elif self.inline_view(node, outs):
            return []
        if not isinstance(val, (tuple, list)):
            self.fx_of[node.name] = node.name
        reads = self.with_owners([self.value_of[a.name] for a in node.all_input_nodes])
        for vid, t in outs:
            self.add_value(vid, t)
        inputs = reads + [self.owner[v] for v, _ in outs if v in self.owner and self.owner[v] not in reads]
        outputs = [v for v, _ in outs]
        random = torch.Tag.nondeterministic_seeded in node.target.tags
        if is_input_update(node):
            # after every other reader of the primal so far (through its views too), and
            # before the boundary
            dst = node.args[0].name
            inputs += [n.outputs[0] for n in self.nodes if dst in n.inputs]
            inputs = list(dict.fromkeys(i for i in inputs if i != node.name))
            self.updates.append(node.name)
        made = [node.name]
        device = rng_device(node) if random else None
        if random:
            # a replayable draw reads its saved state (made after the draw before it), any
            # other the draw before it: either way the first draws keep eager's order
            state = self.rng_state(node, device)
            if state is not None:
                inputs.append(state.outputs[0])
                made.insert(0, state.id)
            elif self.rng_token is not None:
                inputs.append(self.rng_token)
            self.rng_token = f"{node.name}.rng"
            self.values[self.rng_token] = Value(id=self.rng_token, size=0)
            outputs.append(self.rng_token)
        read = sum(self.values[v].size for v in reads)
        written = sum(self.values[v].size for v, _ in outs)
        self.nodes.append(
            Node(
                id=node.name,
                op=str(node.target),
                inputs=inputs,
                outputs=outputs,
                cost=(MIN_COST if written == 0 else _cost(node, read, written)) / FLOPS_PER_SECOND,
                phase="backward" if node.meta.get("partitioner_tag") == "is_backward" else "forward",
                scope=module_scope(node),
                recomputable=(not random or device is not None)
                and not node.is_impure(impure_random=False)
                and not any(i in self.mutated for i in reads),
            )
        )
        return made

    def rng_state(self, node: fx.Node, device: str | None) -> Node | None:
        """The node that saves the generator's state for the replays of the random `node`
        (None when its draw cannot be replayed): it runs once, after the draw before (the
        token), and its value, the state, lives until `node`'s last run."""
        if device is None:
            return None
        vid = f"{node.name}.rng_state"
        self.values[vid] = Value(id=vid, size=rng_state_bytes(device), dtype="uint8")
        state = Node(
            id=f"{node.name}.rng_save",
            op=RNG_SAVE,
            inputs=[self.rng_token] if self.rng_token else [],
            outputs=[vid],
            cost=0.0,
            phase="backward" if node.meta.get("partitioner_tag") == "is_backward" else "forward",
            recomputable=False,
        )
        self.nodes.append(state)
        return state


def _boundary(b: _Builder, fwd_outputs: list[str], tangents: list[fx.Node]) -> Node:
    outputs = []
    for t in tangents:
        b.add_value(t.name, _tensor_val(t))
        outputs.append(t.name)
    token = f"{BOUNDARY}.token"
    b.values[token] = Value(id=token, size=0)
    return Node(
        id=BOUNDARY,
        op=BOUNDARY,
        inputs=b.with_owners([*fwd_outputs, *b.updates]),
        outputs=[*outputs, token],
        cost=0.0,
        phase="loss",
        recomputable=False,
    )


def _walk(b: _Builder, gm: fx.GraphModule, fwd_out_nodes: list[fx.Node]) -> tuple[list[str], Node]:
    """Convert every node of `gm` in its order; the boundary goes before the first node that
    reads a tangent (directly or not). Returns the remat order and the boundary node."""
    tangents: list[fx.Node] = []
    pending = {n.name for n in fwd_out_nodes if n.op != "placeholder"}
    boundary: Node | None = None
    order: list[str] = []
    after: set[str] = set()  # the FX nodes that read a tangent, directly or not
    for index, node in enumerate(gm.graph.nodes):
        if node.op == "placeholder":
            b.placeholder(node, index)
            if node.name.startswith("tangents"):
                tangents.append(node)
                after.add(node.name)
            continue
        if node.op != "call_function":
            continue
        if any(a.name in after for a in node.all_input_nodes):
            after.add(node.name)
            if boundary is None:
                if pending:
                    raise Unsupported(f"{node.name} reads a tangent before the forward outputs are made")
                boundary = _place_boundary(b, fwd_out_nodes, tangents, order)
        order.extend(b.call(node))
        pending.discard(node.name)
    if boundary is None:
        if pending:
            raise Unsupported("the forward outputs are not all made")
        boundary = _place_boundary(b, fwd_out_nodes, tangents, order)
    return order, boundary


def joint_graph(
    gm: fx.GraphModule,
    *,
    num_fwd_outputs: int,
    static_lifetime_input_indices: list[int] | None = None,
    name: str = "torch-joint",
) -> JointGraph:
    """The remat graph of `gm`, an ``aot_autograd`` joint graph whose first `num_fwd_outputs`
    outputs are the forward's. Raises :class:`Unsupported` for what it does not take."""
    _check_supported(gm)
    b = _Builder(gm, set(static_lifetime_input_indices or []))
    out_node = next(iter(gm.graph.find_nodes(op="output")))
    b.mutated = _mutated_primals(gm, out_node) | {
        n.args[0].name for n in gm.graph.nodes if n.op == "call_function" and is_input_update(n)
    }
    joint_outputs = list(out_node.args[0])
    fwd_out_nodes = [o for o in joint_outputs[:num_fwd_outputs] if isinstance(o, fx.Node)]
    order, boundary = _walk(b, gm, fwd_out_nodes)
    _measure(b, gm)
    outputs = [b.value_of[o.name] for o in joint_outputs if isinstance(o, fx.Node)]
    graph = Graph(
        name=name,
        cost_unit="seconds",
        values=list(b.values.values()),
        nodes=[*b.nodes, boundary],
        outputs=b.with_owners(list(dict.fromkeys(outputs))),
        order=order,
    )
    costless = [n.model_copy(update={"cost": 0.0}) for n in graph.nodes]
    return JointGraph(
        graph=graph,
        key=graph.model_copy(update={"nodes": costless}).sha256(),
        value_of=b.value_of,
        fx_of=b.fx_of,
        resident=graph.resident_bytes,
        num_fwd_outputs=num_fwd_outputs,
        owner=b.owner,
        views=b.views,
    )


def _mutated_primals(gm: fx.GraphModule, out_node: fx.Node) -> set[str]:
    primals = [n.name for n in gm.graph.find_nodes(op="placeholder") if n.name.startswith("primals")]
    mutated = set()
    for desc in out_node.meta.get("desc") or []:
        if type(desc).__name__ != "InputMutationAOTOutput":
            continue
        source = desc.mutated_input
        if type(source).__name__ != "PlainAOTInput" or not 0 <= source.idx < len(primals):
            raise Unsupported(f"an input mutation of {source}")
        mutated.add(primals[source.idx])
    return mutated


def _place_boundary(b: _Builder, fwd: list[fx.Node], tangents: list[fx.Node], order: list[str]) -> Node:
    node = _boundary(b, [b.value_of[o.name] for o in fwd], tangents)
    order.append(node.id)
    return node


def _measure(b: _Builder, gm: fx.GraphModule) -> None:
    """Each node's time and workspace, and a value's size where the real storage is larger
    than the fake tensor's (all from :func:`remat_cli.torch.probe.probe`)."""
    made = {n.id: n for n in b.nodes if not n.op.startswith("aten.copy_")}
    for name, found in probe(gm, skip=lambda n: n.name not in made).items():
        node = made[name]
        node.workspace = found.workspace
        if found.seconds is not None:
            node.cost = found.seconds
        tensors = [v for v in node.outputs if not v.endswith(".rng")]
        for vid, real in zip(tensors, found.storages, strict=False):
            value = b.values[vid]
            if value.size and real > value.size:
                value.size = real
