"""stack: one block's keep patterns, laid over a stack of repeated blocks by dynamic
programming. :mod:`.pattern` finds a block's Pareto front of kept bytes against recompute cost,
:mod:`.solver` measures and combines the patterns."""

from remat_cli.solvers.stack.solver import StackSolver

__all__ = ["StackSolver"]
