"""The compiled hot loop of FastSA (Imanishi et al., NeurIPS'23, ``papers/fastsa.txt``).

Everything here is numba-compiled; :mod:`remat_cli.solvers.fastsa.solver` does the set-up, node
grouping, stopping and decoding in Python and calls :func:`~.anneal.sa_chunk` for fixed-size chunks
of iterations. The modules, by role: :mod:`.structures` (the state's layout, random numbers, the
segment trees, sorted small arrays), :mod:`.mutations` (the mutations of §2.2 on the lifetime
intervals, and their validity conditions) and :mod:`.anneal` (the SA loop, its objective, polish
and rebuilding a state). The kernels call each other across these files, so they are cached with
:func:`remat_cli.util.numba_cache.package_njit`, whose stamp covers every file of this package: with
numba's own ``cache=True`` an edit of one file would leave its callers' cached code stale.

State (§2.2). The sequence ``seq[0..T)`` holds a node index or ``NOP`` (-1) at every time step.
For every node ``n`` we keep the sorted production times ``P_n`` (the times ``t`` with
``seq[t] == n``) and the sorted use times ``U_n`` (the times a consumer of ``n`` runs). Memory is
folded to one block per node (``NodeView``): the block of ``n`` is live over one interval per
production ``p_k`` (Fig. 2, the function L_S of §2.1), which with the simulator's rule "free after
the last use before the next production" is

    [p_k, e_k],  e_k = max(p_k, last use u with p_k < u < p_{k+1})

and ``e_k = T - 1`` for the last production of a graph output (it stays live to the end). The
memory at time ``t`` is the sum of the blocks whose interval contains ``t`` plus the node
intermediate memory (workspace) of ``seq[t]`` (App. B.1). It lives in a range-add / range-max
segment tree (§2.1.1) so that M(S) is the root, and every add / remove of a node changes O(deg)
intervals by the four cases of §2.2.1 (no update, extend/shrink, split, merge), each one
``seg_add`` in O(log T).

The optional range-add / range-logaddexp tree (App. C.2) runs beside the max tree: leaves start at
a large negative constant, a node added at ``t`` adds the constant back at ``t``, sizes are
rescaled so that the largest block is 10, and the base is 2, all as in App. C.2. It then gives the
"soft" peak used in the objective; feasibility is always judged on the exact max tree.
"""

from remat_cli.solvers.fastsa.kernel.anneal import apply_log, objective, polish, rebuild, sa_chunk, spread
from remat_cli.solvers.fastsa.kernel.mutations import can_move, do_add, do_move, do_remove
from remat_cli.solvers.fastsa.kernel.structures import (
    ADD,
    ADDREM,
    F_BEST_FEAS_COST,
    F_BEST_FEAS_PEAK,
    F_BEST_PEAK,
    F_BEST_PEAK_COST,
    F_COST,
    F_LEN,
    F_OBJ,
    F_TEMP,
    FL,
    I_ACCEPTED,
    I_LEN,
    I_LOG_LEN,
    I_MARK_FEAS,
    I_MARK_PEAK,
    I_MET,
    I_NOCC,
    I_VALID,
    KEEP,
    LSE_BIG,
    MEM,
    NOP,
    NP,
    NU,
    OBJ_ELU,
    OBJ_MAX,
    OBJ_MEMORY,
    PB,
    PCAP,
    PE,
    PS,
    REMOVE,
    ROTATE,
    UB,
    WS,
    seg_add,
)

__all__ = [
    "ADD",
    "ADDREM",
    "FL",
    "F_BEST_FEAS_COST",
    "F_BEST_FEAS_PEAK",
    "F_BEST_PEAK",
    "F_BEST_PEAK_COST",
    "F_COST",
    "F_LEN",
    "F_OBJ",
    "F_TEMP",
    "I_ACCEPTED",
    "I_LEN",
    "I_LOG_LEN",
    "I_MARK_FEAS",
    "I_MARK_PEAK",
    "I_MET",
    "I_NOCC",
    "I_VALID",
    "KEEP",
    "LSE_BIG",
    "MEM",
    "NOP",
    "NP",
    "NU",
    "OBJ_ELU",
    "OBJ_MAX",
    "OBJ_MEMORY",
    "PB",
    "PCAP",
    "PE",
    "PS",
    "REMOVE",
    "ROTATE",
    "UB",
    "WS",
    "apply_log",
    "can_move",
    "do_add",
    "do_move",
    "do_remove",
    "objective",
    "polish",
    "rebuild",
    "sa_chunk",
    "seg_add",
    "spread",
]
