"""FastSA's run configuration: the resolved options of one annealing chain, fixed before it starts
(Imanishi et al., NeurIPS'23, §3.1 and App. D.4), and the kernels' assumed speeds that turn
iterations into work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from remat_cli.graph import NodeView
from remat_cli.solver import SolveOptions
from remat_cli.solvers.fastsa import kernel as K
from remat_cli.solvers.fastsa.problem import CHUNK

#: slope above the budget of the footnote-2 objective in the stage after a rescue, and the slope
#: the tight part of the first stage grows to (see run.py)
RESCUE_OVER = 20.0
#: work of one iteration of the tight part's soft peak (kernel with logaddexp), in iterations at
#: --rate: that kernel runs below the assumed rate, so counting its iterations as one would let
#: the tight part outrun its share of the limit and the clock cut it differently in each run
SOFT_WORK = 1.15
#: the exact peak's kernel runs at this multiple of --rate, the soft peak's at SOFT_SPEED; a
#: round's iterations at these speeds are its work in seconds (``work_seconds``), from which the
#: rounds after it are planned (see rounds.py). Both sit below the kernels' measured speeds, for
#: a slower machine and for what the kernels' time leaves out (greedy's start, polish)
EXACT_SPEED = 4.6
SOFT_SPEED = 2.0
#: a kick anneals from this multiple of the second stage's initial temperature (see kicks.py): hot
#: enough to leave the basin of the recomputation the kick removed
KICK_HEAT = 3.0


@dataclass(frozen=True)
class RunConfig:
    """The options of one annealing chain, resolved and clamped once (see :meth:`build`)."""

    budget: float  #: the memory budget B (at least 1 byte)
    resident: float  #: memory resident throughout (inputs and parameters)
    mode: int  #: the kernel's objective: eq. (1), footnote 2 of §3.1, or the peak alone (App. B.2)
    lse: bool  #: the logaddexp soft peak of App. C.2 throughout
    patience: int  #: stage 2 ends after this many iterations without a better feasible cost
    local: float  #: share of add/rotate times drawn inside their valid window (§2.2)
    sharp: float  #: L(-sharp) = 0 in footnote 2
    over: float  #: the slope above the budget the chain starts with
    p_rotate: float  #: share of rotations among the mutations
    chain_max: int  #: longest recomputation chain of one mutation (0 with no_recompute)
    tight_after: float  #: share of stage 1 after which its tight part may begin
    reserve: float  #: seconds greedy's start leaves to the second stage (see _greedy_start)
    c_floor: float  #: added to the cost in f(S), informative when every cost is 0
    no_recompute: bool  #: only reorder (App. B.2)
    n1: int  #: first-stage iterations (scaled to the work limit)
    n2: int  #: second-stage iterations (scaled to the work limit)
    n_kick: int  #: iterations given to the kicks after stage 2
    capped: str  #: the message part saying how a work limit scaled n1 and n2
    rate: float  #: assumed iterations per second
    initial_temperature: float  #: initial temperature / initial objective
    final_temperature: float  #: final / initial temperature of a stage
    stop_at_budget: bool  #: a grouped first stage ends once the budget is met (§3.1)
    greedy_start: bool  #: greedy's schedule may start the second stage or the rescue
    rescue: bool  #: a first stage ending above the budget is rescued

    @property
    def n_total(self) -> int:
        return self.n1 + self.n2

    @property
    def each_kick(self) -> int:
        """Iterations per kick: the second stage's."""
        return max(1_000, self.n2)

    @property
    def log_cap(self) -> int:
        """Journal entries a chunk may write: a rotation writes 2, a mutation with its chain chain + 1."""
        return (self.chain_max + 2) * CHUNK + 4

    @classmethod
    def build(cls, p: dict[str, Any], nv: NodeView, budget: int, options: SolveOptions) -> RunConfig:
        """The configuration of the solver's declared parameters `p` (defaults already merged)
        for a graph's node view and budget, with the iterations scaled to the options' work limit
        at the assumed --rate."""
        no_rec = bool(p["no_recompute"])
        n1 = max(0, int(p["iterations"]))
        n2 = max(0, int(p["iterations2"]))
        capped = ""
        work_limit = options.work_limit()
        if work_limit is not None:
            allowed = int(max(0.0, work_limit) * float(p["rate"]))
            if n1 + n2 > allowed:
                scale = allowed / (n1 + n2)
                n1, n2 = int(n1 * scale), int(n2 * scale)
                capped = f" (iterations scaled to {n1}+{n2} for the time limit at {p['rate']:.0f}/s)"
        mode = {"elu": K.OBJ_ELU, "max": K.OBJ_MAX}[p["objective"]]
        if no_rec:
            mode = K.OBJ_MEMORY  # App. B.2: the cost is fixed, minimise the peak
        base_cost = sum(nv.cost[i] for i in range(len(nv)) if nv.needed[i])
        return cls(
            budget=max(float(budget), 1.0),
            resident=float(nv.resident),
            mode=mode,
            lse=bool(p["logaddexp"]),
            patience=int(p["patience"]),
            local=min(1.0, max(0.0, float(p["local"]))),
            sharp=max(1.0, float(p["elu_sharpness"])),
            over=max(1.0, float(p["over_budget_weight"])),
            p_rotate=min(1.0, max(0.0, float(p["rotate_share"]))),
            chain_max=0 if no_rec else int(p["chain"]),
            tight_after=min(1.0, max(0.0, float(p["tight_after"]))),
            # the seconds the second stage needs at the assumed rate, with a margin for polish
            # and a machine slower than the rate: what greedy's start leaves of the time
            reserve=1.5 * n2 / float(p["rate"]),
            c_floor=1e-9 * base_cost if base_cost > 0 else 1.0,
            no_recompute=no_rec,
            n1=n1,
            n2=n2,
            n_kick=0 if no_rec else int(float(p["kicks"]) * (n1 + n2)),
            capped=capped,
            rate=float(p["rate"]),
            initial_temperature=float(p["initial_temperature"]),
            final_temperature=float(p["final_temperature"]),
            stop_at_budget=bool(p["stop_at_budget"]),
            greedy_start=bool(p["greedy_start"]),
            rescue=bool(p["rescue"]),
        )
