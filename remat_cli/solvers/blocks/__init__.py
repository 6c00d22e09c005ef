"""blocks: per-block checkpointing (torch.utils.checkpoint per layer), the baseline users run.
:mod:`.structure` finds the blocks from the nodes' module scopes, :mod:`.solver` builds the
schedule."""

from remat_cli.solvers.blocks.solver import Blocks

__all__ = ["Blocks"]
