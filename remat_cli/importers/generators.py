"""Synthetic graphs for tests and benchmarks, deterministic by seed.

- `linear`: Checkmate's gen_linear_graph — n forward nodes, a loss, n backward nodes.
- `random_layered`: Moccasin's random layered DAGs (§3: layers of random width, edges to the
  following layers with density `ed`, long skips with probability `scd`).
- `unet`: a U-Net-style training graph (encoder, decoder, long skips).
- `transformer`: a transformer-encoder-like training graph (attention + MLP blocks, residuals).

Nodes of `linear`, `unet` and `transformer` carry module scopes as an exporter records them
(``layers.3``, ``downs.1``; a backward node its forward node's), so per-block solvers apply.

Training graphs are built from a forward DAG by `training_graph`, which adds the loss and one
backward node per forward node that reads the output gradients of its successors and the
activations its own derivative needs (its inputs and its output), as reverse-mode autodiff does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from remat_cli.graph import Graph, Node, Value


@dataclass
class Forward:
    """A forward DAG: node k reads the outputs of preds[k] (and the input when preds is empty)."""

    names: list[str] = field(default_factory=list)
    preds: list[list[int]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)
    #: the module each node belongs to (``Node.scope``), as an exporter records it
    scopes: list[str | None] = field(default_factory=list)

    def add(self, name: str, preds: list[int], size: int, cost: float, scope: str | None = None) -> int:
        self.names.append(name)
        self.scopes.append(scope)
        self.preds.append(preds)
        self.sizes.append(int(size))
        self.costs.append(float(cost))
        return len(self.names) - 1


def training_graph(fw: Forward, name: str, input_size: int, param_size: int = 0) -> Graph:
    """Forward + loss + backward (reverse-mode autodiff structure, as in Checkmate's graphs)."""
    n = len(fw.names)
    values = [Value(id="x", size=input_size, role="input")]
    nodes: list[Node] = []
    succs: list[list[int]] = [[] for _ in range(n)]
    for k, ps in enumerate(fw.preds):
        for p in ps:
            succs[p].append(k)

    def act(k: int) -> str:
        return f"a{k}"

    for k in range(n):
        ins = [act(p) for p in fw.preds[k]] or ["x"]
        if param_size:
            values.append(Value(id=f"w{k}", size=param_size, role="parameter"))
            ins.append(f"w{k}")
        values.append(Value(id=act(k), size=fw.sizes[k]))
        nodes.append(
            Node(
                id=fw.names[k],
                inputs=ins,
                outputs=[act(k)],
                cost=fw.costs[k],
                phase="forward",
                scope=fw.scopes[k],
            )
        )
    sinks = [k for k in range(n) if not succs[k]]
    values.append(Value(id="loss", size=4))
    nodes.append(Node(id="loss", inputs=[act(k) for k in sinks], outputs=["loss"], cost=1.0, phase="loss"))
    outputs = []
    for k in reversed(range(n)):
        grads_in = [f"d{s}" for s in succs[k]] or ["loss"]
        saved = [act(p) for p in fw.preds[k]] + [act(k)]
        values.append(Value(id=f"d{k}", size=fw.sizes[k]))
        nodes.append(
            Node(
                id=f"grad_{fw.names[k]}",
                inputs=list(dict.fromkeys(grads_in + saved)),
                outputs=[f"d{k}"],
                cost=2.0 * fw.costs[k],
                phase="backward",
                grad_of=fw.names[k],
                scope=fw.scopes[k],
            )
        )
        if not fw.preds[k]:
            outputs.append(f"d{k}")
    return Graph(name=name, values=values, nodes=nodes, outputs=outputs, cost_unit="units")


def linear(n: int = 8, seed: int = 0, size: int | None = None) -> Graph:
    """Checkmate's gen_linear_graph: a chain of n forward nodes and its backward pass."""
    rng = np.random.default_rng(seed)
    fw = Forward()
    for k in range(n):
        s = size if size is not None else int(rng.integers(1, 11)) * 1000
        fw.add(f"f{k}", [k - 1] if k else [], s, float(rng.integers(1, 11)), scope=f"layers.{k}")
    return training_graph(fw, f"linear_n{n}_s{seed}", input_size=size or 1000)


def random_layered(
    n: int = 100,
    width: float = 0.3,
    nlv: float = 0.75,
    ed: float = 0.2,
    scd: float = 0.14,
    seed: int = 0,
) -> Graph:
    """Random layered DAG (Moccasin §3): about width·sqrt(n)... nodes per layer, each layer's width
    varying by ±nlv; every node gets an edge from the previous layer, further edges to the next
    layer with probability `ed` and long skips to later layers with probability `scd`."""
    rng = np.random.default_rng(seed)
    mean_w = max(1.0, width * np.sqrt(n) * 2)
    layers: list[list[int]] = []
    count = 0
    while count < n:
        w = max(1, int(round(mean_w * (1 + rng.uniform(-nlv, nlv)))))
        w = min(w, n - count)
        layers.append(list(range(count, count + w)))
        count += w
    preds: list[set[int]] = [set() for _ in range(n)]
    for li in range(1, len(layers)):
        prev, cur = layers[li - 1], layers[li]
        for v in cur:
            preds[v].add(int(rng.choice(prev)))
            for u in prev:
                if rng.random() < ed:
                    preds[v].add(u)
            for lj in range(max(0, li - 4), li - 1):  # long skips from up to 4 layers back
                for u in layers[lj]:
                    if rng.random() < scd / max(1, len(layers[lj])):
                        preds[v].add(u)
    values: list[Value] = []
    nodes: list[Node] = []
    has_succ = {u for ps in preds for u in ps}
    for v in range(n):
        values.append(Value(id=f"v{v}", size=int(rng.integers(10, 1000))))
        ins = [f"v{u}" for u in sorted(preds[v])]
        if not ins:
            values.append(Value(id=f"p{v}", size=int(rng.integers(0, 100)), role="input"))
            ins = [f"p{v}"]
        nodes.append(Node(id=str(v), inputs=ins, outputs=[f"v{v}"], cost=float(rng.integers(1, 1000))))
    return Graph(
        name=f"random_layered_n{n}_w{width}_nlv{nlv}_ed{ed}_scd{scd}_s{seed}",
        values=values,
        nodes=nodes,
        outputs=[f"v{v}" for v in range(n) if v not in has_succ],
    )


def unet(depth: int = 3, convs: int = 2, seed: int = 0, base: int = 64_000) -> Graph:
    """U-Net-style training graph: `depth` down blocks, a bottleneck, `depth` up blocks, each block
    `convs` convolutions; every up block reads the matching down block's output (long skips)."""
    rng = np.random.default_rng(seed)
    fw = Forward()
    prev = -1
    skips = []

    def conv(name: str, preds: list[int], size: int, scope: str) -> int:
        return fw.add(name, preds, size, float(size) / 1000 * (1 + rng.random()), scope)

    for d in range(depth):
        size = base // (2**d)
        for c in range(convs):
            prev = conv(f"down{d}_conv{c}", [prev] if prev >= 0 else [], size, f"downs.{d}")
        skips.append(prev)
        prev = conv(f"down{d}_pool", [prev], size // 4, f"downs.{d}")
    for c in range(convs):
        prev = conv(f"mid_conv{c}", [prev], base // (2**depth), "mid")
    for d in reversed(range(depth)):
        size = base // (2**d)
        prev = conv(f"up{d}_upsample", [prev], size, f"ups.{d}")
        prev = conv(f"up{d}_concat", [prev, skips[d]], 2 * size, f"ups.{d}")
        for c in range(convs):
            prev = conv(f"up{d}_conv{c}", [prev], size, f"ups.{d}")
    return training_graph(fw, f"unet_d{depth}_c{convs}_s{seed}", input_size=base // 4, param_size=100)


def transformer(layers: int = 4, seed: int = 0, hidden: int = 32_000) -> Graph:
    """Transformer-encoder-like training graph: per layer norm → qkv → scores → softmax → context →
    projection (+residual), norm → MLP up → activation → MLP down (+residual)."""
    rng = np.random.default_rng(seed)
    fw = Forward()
    h = fw.add("embed", [], hidden, 1.0, scope="embed")
    block = ""

    def op(name: str, preds: list[int], size: int, flops: float) -> int:
        return fw.add(name, preds, size, flops * (0.9 + 0.2 * rng.random()), block)

    for i in range(layers):
        block = f"layers.{i}"
        n1 = op(f"l{i}_norm1", [h], hidden, 1)
        qkv = op(f"l{i}_qkv", [n1], 3 * hidden, 6)
        sc = op(f"l{i}_scores", [qkv], 2 * hidden, 4)
        sm = op(f"l{i}_softmax", [sc], 2 * hidden, 1)
        ctx = op(f"l{i}_context", [sm, qkv], hidden, 4)
        pr = op(f"l{i}_proj", [ctx], hidden, 2)
        r1 = op(f"l{i}_residual1", [pr, h], hidden, 0.5)
        n2 = op(f"l{i}_norm2", [r1], hidden, 1)
        up = op(f"l{i}_mlp_up", [n2], 4 * hidden, 8)
        ac = op(f"l{i}_gelu", [up], 4 * hidden, 1)
        dn = op(f"l{i}_mlp_down", [ac], hidden, 8)
        h = op(f"l{i}_residual2", [dn, r1], hidden, 0.5)
    return training_graph(fw, f"transformer_l{layers}_s{seed}", input_size=hidden // 4, param_size=1000)
