"""Module scopes of an exported PyTorch training step: which module of the model each ONNX node
belongs to (``blocks.7.attn``), written as the ONNX node metadata ``remat.scope`` and read by the
ONNX importer as ``Node.scope``.

While the step is traced, every module's forward runs inside a pre/post hook pair that records its
path (as ``named_modules`` names it) in torch.fx's current node metadata (``custom``), which
``make_fx`` copies onto each traced op, the ops of decompositions included; the innermost module
wins. A forward op's ONNX node gets the scope of the traced op it comes from (the exporter's
``pkg.torch.onnx.fx_node`` provenance); a backward node gets the scope of the forward node it
differentiates (``remat.grad_of``), as autograd runs no module while differentiating. A node the
exporter's own optimizer made (a Split fused from the slices of ``chunk``) has no traced op: it
gets the deepest module that holds the producers of all its inputs. Ops of the model itself
(outside every submodule) and of the loss function get no scope.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import onnx
import torch
import torch.fx.traceback as fx_traceback
from torch import nn

from remat_cli.importers.onnx import GRAD_OF_KEY, SCOPE_KEY


@contextlib.contextmanager
def recording_scopes(model: nn.Module) -> Iterator[None]:
    """While inside, the ops traced under ``fx_traceback.preserve_node_meta()`` carry the path of
    the innermost submodule running them as ``meta["custom"][SCOPE_KEY]``."""
    open_scopes: list[contextlib.AbstractContextManager] = []

    def enter(path: str):  # noqa: ANN202 - a forward pre-hook
        def hook(_module: nn.Module, _args: object) -> None:
            cm = fx_traceback.annotate({SCOPE_KEY: path})
            cm.__enter__()
            open_scopes.append(cm)

        return hook

    def leave(_module: nn.Module, _args: object, _out: object) -> None:
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    handles = []
    for path, module in model.named_modules():
        if path:
            handles.append(module.register_forward_pre_hook(enter(path)))
            handles.append(module.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        while open_scopes:  # a forward that raised leaves its scopes open
            open_scopes.pop().__exit__(None, None, None)


def traced_scopes(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Traced node name -> the module scope recorded on it (:func:`recording_scopes`)."""
    out: dict[str, str] = {}
    for n in gm.graph.nodes:
        scope = (n.meta.get("custom") or {}).get(SCOPE_KEY)
        if isinstance(scope, str) and scope:
            out[n.name] = scope
    return out


def write_scopes(proto: onnx.ModelProto, step_of: dict[str, str], scopes: dict[str, str]) -> None:
    """Give each ONNX node its ``SCOPE_KEY`` metadata: the scope of the traced node it comes from
    (`step_of`: ONNX node -> traced node), else, for a backward node, the scope of the forward
    node its ``GRAD_OF_KEY`` names."""
    own: dict[str, str] = {}
    producer = {o: n.name for n in proto.graph.node for o in n.output if o}
    for node in proto.graph.node:  # topological: a node's producers come first
        if any(p.key == GRAD_OF_KEY for p in node.metadata_props):
            continue
        scope = scopes.get(step_of.get(node.name, ""))
        if scope is None and node.name not in step_of:
            scope = _common_scope([own.get(producer[i]) for i in node.input if i in producer])
        if scope is not None:
            own[node.name] = scope
    for node in proto.graph.node:
        grad_of = next((p.value for p in node.metadata_props if p.key == GRAD_OF_KEY), None)
        scope = own.get(grad_of) if grad_of is not None else own.get(node.name)
        if scope is not None:
            node.metadata_props.add(key=SCOPE_KEY, value=scope)


def _common_scope(scopes: list[str | None]) -> str | None:
    """The deepest module path that every one of `scopes` lies in; None when one has no scope or
    they share no module."""
    if not scopes or any(s is None for s in scopes):
        return None
    parts = [s.split(".") for s in scopes if s is not None]
    common: list[str] = []
    for names in zip(*parts, strict=False):
        if len(set(names)) > 1:
            break
        common.append(names[0])
    return ".".join(common) or None
