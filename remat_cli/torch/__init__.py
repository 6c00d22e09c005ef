"""remat inside ``torch.compile`` (extra ``remat-cli[torch]``): a partitioner that applies a
remat schedule of the joint forward-backward graph, within a peak-memory budget.

    import torch
    from remat_cli.torch import backend

    step = torch.compile(train_step, backend=backend(budget="60%", inner="aot_eager"))

See ``docs/TORCH.md``: what is converted, what is never recomputed, how the budget is read,
how a fallback to PyTorch's partitioner is reported.
"""

from remat_cli.torch.apply import split
from remat_cli.torch.convert import JointGraph, Unsupported, joint_graph
from remat_cli.torch.partition import RematFallback, RematPartitioner, Solved, backend, partitioner

__all__ = [
    "JointGraph",
    "RematFallback",
    "RematPartitioner",
    "Solved",
    "Unsupported",
    "backend",
    "joint_graph",
    "partitioner",
    "split",
]
