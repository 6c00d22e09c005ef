"""blocks: per-block checkpointing as users run it — ``torch.utils.checkpoint`` around each layer
of a model, what Hugging Face's ``gradient_checkpointing_enable()`` does (Chen et al. 2016, §4.1,
with the model's own blocks as the segments).

The blocks are the children of a module list found from the nodes' scopes
(:mod:`.structure`); ``--every K`` makes each segment K consecutive blocks (``checkpoint_sequential``
with segments of K layers), K = 1 being one checkpoint per block. A segment keeps what leaves it
— the input of the next (the residual stream), whatever a forward node outside it reads, graph
outputs and the outputs of nodes that cannot be recomputed — and frees everything else of its
forward pass after its last forward use. In the backward pass, right before the first node that
reads a freed value of a segment, the segment's forward is recomputed as far as the rest of the
backward needs (every node whose outputs it reads, and the freed ancestors of those within the
segment), as torch's non-reentrant checkpoint recomputes up to the last tensor its backward saved.
Every segment is checkpointed, the last one too (its forward is recomputed right after the
loss's backward), as torch does. Nodes outside the blocks (embeddings, the head, the loss) keep
their values as without checkpointing.

The compute sequence is decoded by ``steps_from_sequence`` (frees at last use). The schedule does
not adapt to the budget: "feasible" when its peak fits, else "infeasible" with that peak as
``best_peak`` — it is the baseline a solver has to beat.
"""

from __future__ import annotations

from remat_cli.graph import Graph
from remat_cli.schedule import simulate, steps_from_sequence
from remat_cli.solver import OptionError, Param, SolveOptions, Solver, SolverResult, cheapest_fitting
from remat_cli.solvers.blocks.structure import NoBlocks, Passes, blocks_of, module_lists


def segments(blocks: list[list[str]], every: int) -> list[list[str]]:
    """Consecutive runs of `every` blocks, as one node list each."""
    return [[n for b in blocks[k : k + every] for n in b] for k in range(0, len(blocks), every)]


def dropped_values(graph: Graph, passes: Passes, segs: list[list[str]]) -> dict[str, int]:
    """Value -> its segment, for each value a segment frees after its forward use: made in the
    segment by a recomputable node, read by no forward node outside it, not a graph output."""
    nm = graph.node_map
    seg_of = {n: k for k, seg in enumerate(segs) for n in seg}
    leaves: set[str] = set(graph.outputs)
    for n in passes.forward:
        for v in nm[n].inputs:
            p = graph.producer.get(v)
            if p in seg_of and seg_of.get(n) != seg_of[p]:
                leaves.add(v)
    return {v: seg_of[n] for n in seg_of if nm[n].recomputable for v in nm[n].outputs if v not in leaves}


def sequence(graph: Graph, passes: Passes, segs: list[list[str]]) -> list[str]:
    """The forward pass once, then the rest, recomputing a segment's forward (the part the rest
    still reads) right before the first node that reads one of its freed values."""
    nm = graph.node_map
    dropped = dropped_values(graph, passes, segs)
    seq = list(passes.forward)
    gone = set(dropped)  # freed values not made again yet
    for j, n in enumerate(passes.rest):
        needed = [v for v in nm[n].inputs if v in gone]
        for k in dict.fromkeys(dropped[v] for v in needed):
            # what the rest reads of segment k from here on, and its freed ancestors in it
            wanted = {v for m in passes.rest[j:] for v in nm[m].inputs if v in gone and dropped[v] == k}
            todo: list[str] = []
            for m in reversed(segs[k]):
                if any(v in wanted for v in nm[m].outputs):
                    todo.append(m)
                    wanted.update(v for v in nm[m].inputs if v in gone)
            for m in reversed(todo):
                seq.append(m)
                gone.difference_update(nm[m].outputs)
        seq.append(n)
    return seq


class Blocks(Solver):
    """Per-block checkpointing (module docstring). solve(): "feasible" when the schedule fits the
    budget, else "infeasible" with its steps and peak as `best_peak`."""

    name = "blocks"
    method = "per-block checkpointing: keep each block's input, recompute its forward before its backward"
    paper = (
        "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016, §4.1, with the model's blocks "
        "as segments (torch.utils.checkpoint per layer)"
    )
    params = (
        Param("blocks", str, "", "module list whose children are the blocks (default: the one that covers the forward)"),
        Param("every", int, 1, "keep the input of every K-th block (segments of K blocks)", low=1, high=100_000),
    )  # fmt: skip

    def supports(self, graph: Graph) -> str | None:
        why = super().supports(graph)
        if why is not None:
            return why
        if not module_lists(graph, Passes.of(graph).forward):
            return (
                "its nodes carry no module scopes with numbered children, so it has no blocks "
                "(export the model with `remat export-torch`, which records them)"
            )
        return None

    def notes(self) -> str:
        return "needs module scopes (Node.scope, written by remat export-torch); --blocks PATH picks the list"

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        passes = Passes.of(graph)
        try:
            path, blocks = blocks_of(graph, passes.forward, options.params["blocks"])
        except NoBlocks as e:
            raise OptionError(str(e)) from None
        every = options.params["every"]
        steps = steps_from_sequence(graph, sequence(graph, passes, segments(blocks, every)))
        sim = simulate(graph, steps)
        how = f"{len(blocks)} blocks of {path}" + (f", a checkpoint every {every}" if every > 1 else "")
        return cheapest_fitting(budget, [(steps, sim, how)], options)
