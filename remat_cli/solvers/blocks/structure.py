"""The blocks of a model, from its nodes' module scopes (``Node.scope``): the children of a module
list (``blocks.0``, ``blocks.1``, … of ``nn.ModuleList`` ``blocks``) and which forward nodes each
holds.

A module list is a dotted path whose children are numbered: a scope ``model.layers.7.attn`` lies in
child 7 of the list ``model.layers``. The list chosen by default is the one whose children hold the
most forward nodes (the one that covers the forward pass); among lists holding equally many, the
deepest. Blocks are ordered by where their first forward node runs (a U-Net's up path runs its
children from the last index down).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from remat_cli.graph import Graph


class NoBlocks(ValueError):
    """The graph has no module list to take blocks from (or not the one asked for)."""


@dataclass(frozen=True)
class Passes:
    """A training graph's forward pass (the needed nodes that are not backward and read nothing
    the backward made) and what runs after it, both in the graph's order."""

    forward: list[str]
    rest: list[str]

    @classmethod
    def of(cls, graph: Graph) -> Passes:
        nm, producer = graph.node_map, graph.producer
        after: set[str] = set()
        for n in graph.needed_order:
            if nm[n].phase == "backward" or any(producer.get(v) in after for v in nm[n].inputs):
                after.add(n)
        return cls(
            forward=[n for n in graph.needed_order if n not in after],
            rest=[n for n in graph.needed_order if n in after],
        )


def module_lists(graph: Graph, forward: list[str]) -> dict[str, dict[int, list[str]]]:
    """Each module list of the forward nodes' scopes -> child index -> its forward nodes."""
    lists: dict[str, dict[int, list[str]]] = defaultdict(lambda: defaultdict(list))
    nm = graph.node_map
    for n in forward:
        scope = nm[n].scope
        if not scope:
            continue
        parts = scope.split(".")
        for k in range(1, len(parts)):
            if parts[k].isdigit():
                lists[".".join(parts[:k])][int(parts[k])].append(n)
    return {path: dict(children) for path, children in lists.items()}


def choose_list(lists: dict[str, dict[int, list[str]]], path: str = "") -> str:
    """`path` when the scopes have that module list (NoBlocks otherwise); without one, the list
    whose children hold the most forward nodes, the deepest among equals."""
    if not lists:
        raise NoBlocks(
            "the graph's nodes carry no module scopes with numbered children (export the model "
            "with `remat export-torch`, whose nodes record the module that ran them)"
        )
    if path:
        if path not in lists:
            raise NoBlocks(
                f"--blocks: no module list {path!r} in the graph's scopes (lists: {_names(lists)})"
            )
        return path

    def held(p: str) -> tuple[int, int]:
        return sum(len(ns) for ns in lists[p].values()), p.count(".")

    return max(sorted(lists), key=held)


def _names(lists: dict[str, dict[int, list[str]]]) -> str:
    return ", ".join(sorted(lists)[:8]) + (", …" if len(lists) > 8 else "")


def blocks_of(graph: Graph, forward: list[str], path: str = "") -> tuple[str, list[list[str]]]:
    """The chosen module list and its blocks' forward nodes, blocks in the order they run."""
    lists = module_lists(graph, forward)
    chosen = choose_list(lists, path)
    pos = {n: i for i, n in enumerate(forward)}
    blocks = sorted(lists[chosen].values(), key=lambda ns: min(pos[n] for n in ns))
    return chosen, [sorted(ns, key=pos.__getitem__) for ns in blocks]
