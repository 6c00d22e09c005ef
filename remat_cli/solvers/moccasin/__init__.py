"""MOCCASIN (Bartan, Li, Teague, Lott, Dilkina, "MOCCASIN: Efficient Tensor Rematerialization for
Neural Networks", ICML 2023, arXiv:2304.14463): the retention-interval constraint program, solved
with OR-Tools CP-SAT.

Modules: ``model`` (§2.1–2.3, eqs. 1–11, and the conventions of this implementation), ``starts``
(the starting points of phase 2), ``decode`` (solutions to steps) and ``solver`` (the two phases
of §2.4, eqs. 12–13). Imports point one way: solver → decode → starts → model.
"""

from remat_cli.solvers.moccasin.solver import Moccasin

__all__ = ["Moccasin"]
