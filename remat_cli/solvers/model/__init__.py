"""MODeL (Steiner et al., ICML 2023): operator order and tensor addresses in one arena.

Modules follow the paper: `lifetimes` (§4.1-4.2, App. A.1), `ordering` (§4.2, §5.5),
`addresses` (§4.3), `joint` (§4.4), `solver` (§4.5 and the staged entry point); `cpsat` runs
the three CP-SAT programs alike.
"""

from remat_cli.solvers.model.solver import Model

__all__ = ["Model"]
