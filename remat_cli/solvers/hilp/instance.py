"""The H-ILP instance over a list of units (Gusak et al., *HiREmate*, App. B.2): compute nodes
(F_j/B_j per layer, one per plain unit, the virtual loss) and the data nodes between them.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field

from remat_cli.solvers.hilp.context import TOKEN, Ctx
from remat_cli.solvers.hilp.units import Unit


@dataclass
class Item:
    kind: str  # "plain" | "F" | "B" | "loss"
    unit: int  # index in the instance's units (-1 for the loss)
    side: int  # 0 forward, 1 loss, 2 backward (tie-break of the topological order)
    seqs: list[tuple[str, ...]]
    times: list[float]
    m: list[int]
    phantom: list[int]
    deps: list[frozenset[str]]
    corr: list[tuple[tuple[int, frozenset[str]], ...]] = field(default_factory=list)
    outs: list[int] = field(default_factory=list)  # data nodes it produces


@dataclass
class Instance:
    units: list[Unit]
    items: list[Item]
    sizes: list[int]  # s_d
    producer: list[int]  # item producing data node d
    users: list[list[tuple[int, int]]]  # (item, option) pairs that read d
    final: list[bool]
    layer_of: dict[int, tuple[int, int]]  # unit index -> (F item, B item)
    loss: int | None
    data: dict[str, int] = field(default_factory=dict)


def build_instance(
    ctx: Ctx, units: list[Unit], with_loss: bool, order: dict[str, int] | None = None
) -> Instance:
    """Compute nodes (F_j/B_j per layer, one per plain unit, the virtual loss when the instance
    is a layer being solved for its options) and data nodes (values crossing between them).
    ``order`` (operator -> position in a whole-graph schedule) orders the compute nodes by
    their last operator there (when the schedule has run all of it), so that the schedule
    reads as phases of this instance (:func:`remat_cli.solvers.hilp.warmstart.flat_hint`)."""
    raw = _compute_nodes(ctx, units, with_loss)
    data, sizes, prod, final, users = _data_nodes(ctx, units, raw, with_loss)
    ranked = _topological(ctx, units, raw, prod, users, order)
    new_index = {k: i for i, k in enumerate(ranked)}
    items = [raw[k] for k in ranked]
    prod = [new_index[p] for p in prod]
    users = [sorted((new_index[k], o) for k, o in us) for us in users]
    for d, p in enumerate(prod):
        items[p].outs.append(d)
    layer_of: dict[int, tuple[int, int]] = {}
    for i, it in enumerate(items):
        if it.kind in ("F", "B"):
            f, b = layer_of.get(it.unit, (-1, -1))
            layer_of[it.unit] = (i, b) if it.kind == "F" else (f, i)
    loss = next((i for i, it in enumerate(items) if it.kind == "loss"), None)
    return Instance(units, items, sizes, prod, users, final, layer_of, loss, data)


def _compute_nodes(ctx: Ctx, units: list[Unit], with_loss: bool) -> list[Item]:
    """The compute nodes in unit order: F_j and B_j for a layer, one for a plain unit, and the
    virtual loss when `with_loss` (App. B.2)."""
    raw: list[Item] = []
    for ui, u in enumerate(units):
        if u.layer:
            raw.append(_item("F", ui, 0, u, forward=True))
            raw.append(_item("B", ui, 2, u, forward=False))
        else:
            side = 0 if (not ctx.forward or set(u.fwd) <= ctx.forward) else 2
            raw.append(_item("plain", ui, side, u, forward=True))
    if with_loss:
        raw.append(Item("loss", -1, 1, [()], [0.0], [0], [0], [frozenset()], [()]))
    return raw


def _item(kind: str, ui: int, side: int, u: Unit, forward: bool) -> Item:
    """The compute node of unit `ui`'s forward or backward part, one entry per option (a plain
    unit's options hold no phantom)."""
    opts = u.options
    return Item(
        kind,
        ui,
        side,
        [o.fwd if forward else o.bwd for o in opts],
        [o.time_f if forward else o.time_b for o in opts],
        [o.m_f if forward else o.m_b for o in opts],
        [o.phantom if kind != "plain" else 0 for o in opts],
        [o.deps_f if forward else o.deps_b for o in opts],
        [o.corr_f if forward else o.corr_b for o in opts],
    )


def _data_nodes(
    ctx: Ctx, units: list[Unit], raw: list[Item], with_loss: bool
) -> tuple[dict[str, int], list[int], list[int], list[bool], list[list[tuple[int, int]]]]:
    """The data nodes (values crossing their unit's boundary, incoming gradients and the loss's
    token): their index by value, sizes s_d, producing compute node, whether final, and the
    (compute node, option) pairs that read each."""
    owner: dict[str, int] = {}
    for k, it in enumerate(raw):
        if it.kind == "loss":
            continue
        u = units[it.unit]
        for n in u.bwd if it.kind == "B" else u.fwd:
            owner[n] = k
    all_owned = set(owner)
    loss_k = len(raw) - 1 if with_loss else None
    # data nodes: values that cross their unit's boundary
    data: dict[str, int] = {}
    sizes: list[int] = []
    prod: list[int] = []
    final: list[bool] = []
    loss_uses: list[str] = []
    for k, it in enumerate(raw):
        if it.kind == "loss":
            continue
        u = units[it.unit]
        owned_u = u.owned
        for n in u.bwd if it.kind == "B" else u.fwd:
            for v in ctx.nodes[n].outputs:
                if not ctx.crossing(v, owned_u):
                    continue
                outside = v in ctx.outputs or any(c not in all_owned for c in ctx.consumers[v])
                is_final = outside
                if outside and with_loss and n in ctx.forward:
                    is_final = v in ctx.outputs
                    loss_uses.append(v)
                data[v] = len(sizes)
                sizes.append(ctx.size(v))
                prod.append(k)
                final.append(is_final)
    users: list[list[tuple[int, int]]] = [[] for _ in sizes]

    def add_data(v: str, size: int, producer: int) -> int:
        data[v] = len(sizes)
        sizes.append(size)
        prod.append(producer)
        final.append(False)
        users.append([])
        return data[v]

    for k, it in enumerate(raw):
        for o, deps in enumerate(it.deps):
            for v in sorted(deps):
                if v in data:
                    if prod[data[v]] != k:
                        users[data[v]].append((k, o))
                elif with_loss and v not in ctx.resident and ctx.producer.get(v) not in ctx.forward:
                    # an incoming gradient: produced after the forward part, i.e. by the loss
                    add_data(v, ctx.size(v), loss_k)  # type: ignore[arg-type]
                    users[data[v]].append((k, o))
    if with_loss:
        assert loss_k is not None
        for v in loss_uses:
            users[data[v]].append((loss_k, 0))
        d = add_data(TOKEN, 0, loss_k)
        for k, it in enumerate(raw):
            if it.side == 2:
                users[d].extend((k, o) for o in range(len(it.seqs)))
    return data, sizes, prod, final, users


def _topological(
    ctx: Ctx,
    units: list[Unit],
    raw: list[Item],
    prod: list[int],
    users: list[list[tuple[int, int]]],
    order: dict[str, int] | None,
) -> list[int]:
    """A topological order of the compute nodes (by data dependencies and F_j before B_j), ties
    broken by the graph's own order or `order` (see build_instance)."""
    # topological order of the items (by data dependencies and F_j before B_j)
    n_items = len(raw)
    succ: list[set[int]] = [set() for _ in range(n_items)]
    for d, us in enumerate(users):
        for k, _ in us:
            if k != prod[d]:
                succ[prod[d]].add(k)
    for k, it in enumerate(raw):
        if it.kind == "F":
            succ[k].add(k + 1)
    indeg = [0] * n_items
    for k in range(n_items):
        for s in succ[k]:
            indeg[s] += 1

    def key(k: int) -> tuple[int, int, int]:
        # among ready items, the one the graph's own order finishes first: a forward item by
        # its first operator, a backward one by its last (a backward block can hold operators
        # that the order runs early, e.g. ONNX's max-pool index arithmetic; by its first one
        # such a block would jump ahead and keep large gradients alive across it)
        it = raw[k]
        if order is not None and it.kind != "loss":
            u = units[it.unit]
            return (
                0,
                max((order[n] for n in (u.bwd if it.kind == "B" else u.fwd) if n in order), default=0),
                k,
            )
        pos = [ctx.pos[n] for n in it.seqs[0]]
        at = (max(pos) if it.side == 2 else min(pos)) if pos else 0
        return (it.side, at, k)

    ready = [key(k) for k in range(n_items) if indeg[k] == 0]
    heapq.heapify(ready)
    ranked: list[int] = []
    while ready:
        *_, k = heapq.heappop(ready)
        ranked.append(k)
        for s in succ[k]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, key(s))
    if len(ranked) != n_items:
        raise AssertionError("H-ILP instance has a cyclic dependency between compute nodes")
    return ranked
