"""Checkmate (Jain et al., "Checkmate: Breaking the Memory Wall with Optimal Tensor
Rematerialization", MLSys 2020, arXiv:1910.02653): the exact MILP over frontier-advancing stages
(`checkmate`) and its LP relaxation with rounding (`checkmate-lp`, the paper's §5).

Modules, in the order they are used:
  model       the stages of a graph and the MILP (R, S, FREE, U), eqs. (1)–(16), and its cuts
  warm_start  the candidate schedules handed to the engine as an incumbent
  decode      (S, R) ⇄ steps, and the local searches on S (repair, improve)
  solver      the `checkmate` solver: engine choice, warm start, solve, decode
  lp          the `checkmate-lp` solver: LP relaxation, two-phase rounding, repair
Imports point one way: solver → warm_start → lp → decode → model.
"""

from remat_cli.solvers.checkmate.decode import (
    S_from_steps,
    greedy_repair_S,
    hint_vector,
    improve_S,
    minimal_R,
    repair_S,
    steps_from_S,
)
from remat_cli.solvers.checkmate.lp import CheckmateLP, best_rounding
from remat_cli.solvers.checkmate.model import PAPER, CheckmateModel, Stages, build_model, stages_of
from remat_cli.solvers.checkmate.solver import Checkmate, run_checkmate
from remat_cli.solvers.checkmate.warm_start import warm_start_steps

__all__ = [
    "PAPER",
    "Checkmate",
    "CheckmateLP",
    "CheckmateModel",
    "S_from_steps",
    "Stages",
    "best_rounding",
    "build_model",
    "greedy_repair_S",
    "hint_vector",
    "improve_S",
    "minimal_R",
    "repair_S",
    "run_checkmate",
    "stages_of",
    "steps_from_S",
    "warm_start_steps",
]
