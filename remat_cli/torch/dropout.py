"""A dropout's output as a product of its mask, so that making it again costs a multiply.

``native_dropout(x, p, train=True)`` draws a Bernoulli mask and returns ``(x * mask / (1 - p),
mask)``. Made again by a replay of the draw (:mod:`remat_cli.torch.apply`), the output costs
the whole draw again, and on the CPU the draw is most of it: 1.9 ms against 0.37 ms for the
product on 256 Ki floats. So before conversion each such output is rewritten as
``native_dropout_backward(x, mask, 1 / (1 - p))``, the same product bit for bit, of the draw's
mask: the output becomes a node of its own, which a schedule makes again from a kept mask (a
quarter of the output's bytes, and kept for the backward anyway) at the cost of the product,
and the draw runs again only where the mask itself was dropped.

The product keeps the output's fake value, which the views made from the output share: the
converter makes the product the owner of that storage from there on. The first run stays one
call: where a schedule runs the product right after the draw's first
run, the split takes the draw's own output instead (:data:`PRODUCT_OF` names the draw).
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx

#: meta key of a dropout's product node: the name of the draw whose mask it reads
PRODUCT_OF = "remat_dropout_product_of"

_DROPOUT = torch.ops.aten.native_dropout.default
_PRODUCT = torch.ops.aten.native_dropout_backward.default


def dropout_products(gm: fx.GraphModule) -> Callable[[], None]:
    """Rewrite every training dropout of `gm` whose output is read and whose mask is read by
    ``native_dropout_backward`` (the graph's own backward of it: an undecomposed graph, whose
    compiler runs that operator): the output's readers read ``native_dropout_backward(x, mask,
    1 / (1 - p))`` instead (module docstring). Returns a function that puts the graph back."""
    made: list[tuple[fx.Node, fx.Node]] = []
    position = {n: k for k, n in enumerate(gm.graph.nodes)}  # the original nodes keep their order
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not _DROPOUT:
            continue
        x, p = node.args[0], float(node.args[1])
        train = node.args[2] if len(node.args) > 2 else node.kwargs.get("train")
        outs = {u.args[1]: u for u in node.users if u.target is operator.getitem}
        if train is False or p >= 1.0 or 0 not in outs or 1 not in outs or len(outs) != len(node.users):
            continue
        out, mask = outs[0], outs[1]
        if not any(u.target is _PRODUCT for u in mask.users):
            continue  # a decomposed graph (inductor's): the product is the backend's to lower
        with gm.graph.inserting_after(max(out, mask, key=position.__getitem__)):
            product = gm.graph.call_function(_PRODUCT, (x, mask, 1.0 / (1.0 - p)))
        product.meta = {**out.meta, PRODUCT_OF: node.name}
        out.replace_all_uses_with(product)
        made.append((out, product))

    def undo() -> None:
        for out, product in made:
            product.replace_all_uses_with(out)
            gm.graph.erase_node(product)
        gm.recompile()

    if made:
        gm.recompile()
    return undo
