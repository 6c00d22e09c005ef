"""hilp: HiREmate's hierarchical solver — H-Partition, per-subgraph options, the H-ILP.

Gusak et al., *HiREmate: Hierarchical Approach for Efficient Re-materialization of Large Neural
Networks*: §3 (H-Partition §3.1, H-Solver §3.2, option selection §3.2.2), Appendix A
(Algorithm 2, in :mod:`remat_cli.solvers.hilp.hpartition`), Appendix B.2-B.3 (the H-ILP,
eqs. 2 and 5-10) and Appendix C.1.1 (identical subgraphs).

How the pieces fit:

- **Units.** A unit is a piece of the graph solved as one compute node one level up. An atomic
  unit is one operator. On training graphs (nodes carry ``phase`` and ``grad_of``) a
  subgraph of forward operators and the backward operators that differentiate them form a
  *layer* (App. B.1.1): compute nodes F_j and B_j sharing their options, with a *phantom node*
  holding what option o keeps between F_j and B_j. ONNX exports of ``remat export-torch`` carry
  ``grad_of`` from autograd (node metadata ``remat.grad_of``); where it is missing (other
  exporters' ONNX training graphs carry ``phase`` only) the pairing comes from the dataflow
  (:func:`structural_pairs`),
  and a forward operator with several backward operators is a level-0 layer solved for its
  own options. Elsewhere (inference graphs, networkx data without phases) a subgraph is one
  plain compute node with options (§3.2.2).
- **Bottom-up solving (§3.2.1).** H-Partition groups the (forward) graph level by level. For each
  subgraph, an H-ILP instance is built over its children units (plus a virtual *loss* node for
  layers, App. B.2: it stands for "the rest of the graph" between forward and backward), and
  solved under several budgets (``levels``); each schedule, flattened to operator sequences,
  becomes an *option* of the subgraph: (forward sequence, backward sequence, time, peak, phantom
  size). Leaves are H-ILPs over atomic units, i.e. RK-Checkmate; other registered solvers
  that apply (``leaf_solvers``, e.g. ``checkmate``) add their schedules of the same subgraph as
  more options — HiREmate's "framework of solvers".
- **Option metrics** are measured by replaying each option's sequences on the operators (never
  taken from an ILP): time, the overhead m_{k,o} of eq. (10) (peak above what stays after), the
  phantom size p_{j,o} and the option-specific dependencies d →o k (App. B.1.2).
- **Top level.** The H-ILP over the top units under the user's budget (minus the resident
  inputs and parameters); its schedule is flattened into one operator sequence, decoded by
  :func:`remat_cli.schedule.steps_from_sequence` and simulated. When the simulated peak exceeds
  the budget (the ILP's memory model is an approximation, App. B.3), the ILP budget is lowered
  and the top solved again.
- **Warm start.** Every H-ILP (units and top) starts from the *sequential* schedule over its
  compute nodes (each once, in order) with one option per unit, chosen greedily from the
  phantom minimum towards faster options while the H-ILP's own memory rows hold
  (:func:`sequential_hint`). HiGHS alone often found no incumbent at all in its limits on a
  25-unit top (the 2000-node transformer at 50%: "unknown"); started, it proves optimality
  over the options there, and a cut-short run still returns a schedule made of options.
  Where no sequential choice fits, a greedy schedule that recomputes plain compute nodes
  (evicting the data node read farthest ahead) is the start (:func:`recompute_hint`).
- **Refined top.** A unit holds all its outputs together, so a fixed grouping can rule out
  every schedule within a tight budget (on ONNX training graphs the backward block paired with
  one forward operator holds gradients that other blocks consume much later). A second top
  instance goes one level down where the memory is (:func:`refine`: the units with the
  largest smallest-peak option replaced by their :func:`pieces`, up to ``FINER_TOP`` x M^t
  compute nodes) is solved after the top, with half the top's nominal time (the overall
  deadline still holds), and the cheaper schedule counts.
- **Flat start.** Whole-graph solvers (``flat_start``: fastsa, run as it runs alone
  with the whole limit and one chain per core the fallbacks' process leaves, see
  :mod:`remat_cli.solvers.fastsa.chains`; then moccasin with a tenth of it) run first; the
  cheapest schedule within budget of theirs and the hint's is the flat start (auto's lane hands
  hilp fastsa's schedule as the hint and leaves fastsa out of ``flat_start``). The refined top is cut
  along it instead of where the memory is (:func:`follow`): a unit that schedule runs in
  separate stretches, or in whose stretch it recomputes something, is replaced by its pieces,
  pieces are cut around what it recomputes, and neighbouring pieces it runs once merge back
  down to the cap. That instance reads the schedule phase by phase, so the schedule translates
  into the H-ILP's variables (:func:`flat_hint`) and is its start; where the memory rows
  (App. B.3's sub-step bounds) are stricter than the simulator on it, the instance is posed
  under the budget the start needs and every result is checked by the simulator against the
  real one. The refined top then goes first with the top's share of the time. On ONNX
  training exports, where the hierarchy's own grouping holds the H-ILP well above fastsa's
  overhead, its own schedule is no worse than that start. Where no
  H-ILP schedule is cheaper than the flat start, the H-ILP's own schedule is the flat start's
  and the message ("used: fastsa's schedule, the flat start") and the result's
  ``produced_by`` say so, instead of "used: H-ILP".
  A start is an H-ILP schedule, so it is the refined top's result when that top's model cannot
  be built or solved in time, or when following the schedule needs more than twice its cap
  (then the old refined top is solved instead), as a MIP engine returns its start.
- **Windows** (:mod:`remat_cli.solvers.hilp.windows`). With half the ILP time the flat start
  leaves, Checkmate's model (the RK-Checkmate of the H-ILP's leaves) in the flat schedule's own
  order is re-solved a window of ``windows`` stages at a time, the rest of the schedule fixed,
  where it recomputes most first; a cheaper schedule within budget is the H-ILP's. The whole
  model in that order is too large to improve on the flat start in time; windows are not. As
  fastsa fills the limit with its rounds, at the default limits the windows run only where the
  flat start leaves time: auto's lane, which hands hilp fastsa's schedule as the hint, or a
  flat start that ends early.
- **When the hierarchy finds nothing (or little).** Whole-graph solvers run in a fixed order
  (``FALLBACK``: greedy, then fastsa with the time left): with two workers or more in a forked
  process beside the H-ILPs over the whole time limit (:class:`solver.Portfolio`), with one
  (deterministic) after them with the 15% of the limit kept for them, fastsa then hinted with
  the cheapest schedule so far. The cheapest schedule within budget is used: "infeasible" is
  only reported when none of them finds one; the message says which produced the result.
  ``--fallback none`` turns them off, to measure the H-ILP's own schedule.
- **Determinism.** With one worker every H-ILP stops on work (HiGHS node limits, CP-SAT
  deterministic time), never on the clock; a HiGHS run the overall deadline cuts short is
  dropped, so the deterministic fallbacks stand in for it (:func:`solve_instance`).
"""

from remat_cli.solvers.hilp.context import Ctx, grad_pairs, structural_pairs
from remat_cli.solvers.hilp.instance import build_instance
from remat_cli.solvers.hilp.model import decode, flatten, hilp_model, trivial
from remat_cli.solvers.hilp.solver import DEFAULT_TIME_LIMIT, HILP, HilpRun
from remat_cli.solvers.hilp.subgraphs import solve_instance, unit_options
from remat_cli.solvers.hilp.units import Unit, atomic, canonical, follow, measure, refine
from remat_cli.solvers.hilp.warmstart import flat_hint, recompute_hint, sequential_hint, sequential_x
from remat_cli.solvers.hilp.windows import Windows, in_order, sweep

__all__ = [
    "DEFAULT_TIME_LIMIT",
    "HILP",
    "Ctx",
    "Unit",
    "HilpRun",
    "atomic",
    "build_instance",
    "canonical",
    "decode",
    "flat_hint",
    "flatten",
    "follow",
    "grad_pairs",
    "hilp_model",
    "measure",
    "recompute_hint",
    "refine",
    "sequential_hint",
    "sequential_x",
    "solve_instance",
    "structural_pairs",
    "trivial",
    "unit_options",
    "Windows",
    "in_order",
    "sweep",
]
