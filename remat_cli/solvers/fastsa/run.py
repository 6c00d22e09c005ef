"""FastSA's chunked driver: one annealing stage at a time, in kernel calls of CHUNK iterations,
with the stopping, the tight part of the first stage, incumbents and progress between them
(Imanishi et al., NeurIPS'23, §2.2.2, §3.1 and App. D.4).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from remat_cli.graph import Graph, NodeView
from remat_cli.schedule import Step, simulate, steps_from_sequence
from remat_cli.solver import SolveOptions
from remat_cli.solvers.fastsa import kernel as K
from remat_cli.solvers.fastsa.config import EXACT_SPEED, RESCUE_OVER, SOFT_SPEED, SOFT_WORK, RunConfig
from remat_cli.solvers.fastsa.problem import CHUNK, Best, Problem, State, expand, to_base


@dataclass
class StageBest:
    feas: Best
    low: Best


@dataclass
class Cooling:
    """The geometric temperature schedule of one stage, over its work: an iteration of the soft
    peak's kernel counts ``weight`` (SOFT_WORK), every other one 1. It goes from ``h0`` at work
    ``w0`` (where it last restarted) to ``hf`` at ``n_iter``; ``w_rate`` and ``t_rate`` are the
    work and the clock when the kernel last changed, from which the measured rate is taken."""

    h0: float
    hf: float
    n_iter: int
    t_rate: float
    work: float = 0.0
    weight: float = 1.0
    w0: float = 0.0
    w_rate: float = 0.0
    ratio: float = 1.0

    def cool(self) -> None:
        """The kernel's factor per iteration: from h0 at w0 to hf when the work reaches n_iter."""
        self.ratio = (
            (self.hf / self.h0) ** (self.weight / (self.n_iter - self.w0))
            if self.h0 > 0 and self.n_iter > self.w0
            else 1.0
        )

    def temperature(self) -> float:
        h0 = self.h0
        return h0 * (self.hf / h0) ** ((self.work - self.w0) / (self.n_iter - self.w0)) if h0 > 0 else 0.0


class Run:
    """Chunked driver of one solve: stages, stopping, incumbents and progress. Its configuration
    is fixed (``cfg``); what changes while it runs is the state below."""

    def __init__(
        self,
        graph: Graph,
        nv: NodeView,
        cfg: RunConfig,
        options: SolveOptions,
        greedy: dict[str, Any] | None = None,
    ) -> None:
        self.graph = graph
        self.nv = nv
        self.cfg = cfg
        self.options = options
        self.over = cfg.over  # the slope above the budget now (see stage and kicks.py)
        self.over_base = cfg.over  # the slope above the budget when the tight part of stage 1 began
        self.chain = 0  # the chain length the kernel runs with now (see stage)
        self.tight_from: int | None = None  # run iterations when the tight part of stage 1 began
        self.given = 0  # iterations stage 1 gave back to the kicks (see stage)
        self.on_tight: Callable[[], None] | None = None  # called when stage 1's tight part begins
        self.fallback: list[int] | None = None  # greedy's schedule taken then (see _chain)
        self.greedy: dict[str, Any] = (
            {} if greedy is None else greedy
        )  # greedy's uncut schedule, shared by a solve's rounds
        self.iterations = 0
        self.soft_iterations = 0  # of them, on the soft peak's kernel
        self.wall_stopped = False
        self.best_cost = math.inf
        self.last_report = time.monotonic()
        self.unreported: tuple[Problem, np.ndarray] | None = None

    @property
    def budget(self) -> float:
        return self.cfg.budget

    @property
    def resident(self) -> float:
        return self.cfg.resident

    @property
    def log_cap(self) -> int:
        return self.cfg.log_cap

    def work_seconds(self, rate: float) -> float:
        """The iterations run so far in seconds of the assumed kernel speeds (deterministic)."""
        exact = self.iterations - self.soft_iterations
        return (exact / EXACT_SPEED + self.soft_iterations / SOFT_SPEED) / rate

    def objective(self, s: State) -> float:
        cfg = self.cfg
        m = float(s.peak) + cfg.resident
        return K.objective(m, s.cost + cfg.c_floor, cfg.budget, cfg.mode, cfg.sharp, self.over)

    def stage(self, stage: int, s: State, n_iter: int, h0: float, hf: float, stop_at_budget: bool,
              no_rec: bool, mode: int | None = None, share: float = 1.0, give: int = 0) -> StageBest:  # fmt: skip
        """One annealing stage; with a time limit it stops by the wall clock when `share` of the
        limit has passed (the safety net when the machine is slower than the assumed rate). A
        first stage that meets the budget before its tight part would begin (--tight-after)
        ends `give` iterations early (``given``), for the kicks after the second stage."""
        cfg = self.cfg
        mode = cfg.mode if mode is None else mode
        feas, low = Best(), Best()
        m0 = float(s.peak) + cfg.resident
        if m0 <= cfg.budget:
            feas = Best(s.order(), s.cost, m0)
        low = Best(s.order(), s.cost, m0)
        if stop_at_budget and m0 <= cfg.budget:
            return StageBest(feas, low)
        p_add = p_rem = 0.0 if no_rec else (1.0 - cfg.p_rotate) / 2.0
        # `n_iter` is work: the temperature and the slope above the budget follow the work done
        c = Cooling(h0, hf, n_iter, time.monotonic())
        c.cool()
        it = since_better = 0
        tight_at = int(cfg.tight_after * n_iter) if stage == 1 and cfg.chain_max > 0 else n_iter + 1
        give_at = int(cfg.tight_after * n_iter) if stage == 1 else n_iter + 1
        while c.work < c.n_iter:
            if (
                c.work >= tight_at
                and feas.order is None
                and not self.chain
                and c.n_iter - c.work >= 2 * CHUNK
            ):
                self._begin_tight(s, low, c)
            if self.tight_from is not None and stage == 1 and feas.order is None:
                self._steepen(c)
            if give and c.work >= give_at and feas.order is not None and not self.chain:
                # met early: the rest of the stage anneals on a shorter schedule (as a wall-clock
                # shortening does) and the kicks get what it leaves (see kicks.py)
                shorter = int(max(c.work + CHUNK, c.n_iter - give))
                self.given, c.n_iter, give = c.n_iter - shorter, shorter, 0
                c.cool()
            n = max(1, min(CHUNK, math.ceil((c.n_iter - c.work) / c.weight)))
            h = c.temperature()
            done, met, feas, low, improved = self._chunk(s, n, mode, h, c.ratio, p_add, p_rem, stop_at_budget,
                                                         feas, low)  # fmt: skip
            it += done
            c.work += done * c.weight
            since_better = 0 if improved else since_better + done
            self._report(stage, it, s, feas, low, h, improved)
            if met:
                break
            # converged: only in the cold second stage, so that the first keeps its whole schedule
            if stage == 2 and cfg.patience and feas.order is not None and since_better >= cfg.patience:
                break
            if self._out_of_time(c, share):
                break
            # the soft peak of a first stage that anneals it only until the budget is met (see
            # _begin_tight) gives way to the exact peak once a schedule fits
            if stage == 1 and s.lse and not cfg.lse and feas.order is not None:
                s.set_lse(False)
                c.weight = 1.0
                c.cool()
                c.w_rate, c.t_rate = c.work, time.monotonic()
            # re-spread so that every gap has nops again, which also recomputes C and the trees
            # exactly (no drift from millions of incremental updates)
            s.respread(s.order())
        return StageBest(feas, low)

    def _begin_tight(self, s: State, low: Best, c: Cooling) -> None:
        """The tight part of the first stage: a share of it (--tight-after) has passed and no state
        was within the budget. On ONNX training graphs at tight budgets the SA of §2.2 sits on a
        plateau far above it: every time step near the peak has to lose a block at once (the max
        of M(S) sees none of them alone), and each block leaves only through a whole
        recomputation chain of small ops, which single adds only build through states of equal
        memory and higher cost. The rest of the stage anneals afresh from the least peak found,
        with the chain mutations (kernel ``plan_chain``) and the logaddexp soft peak of App. C.2,
        which counts every time step near the max, until the budget is met (then the exact peak,
        see stage). Graphs that meet their budget earlier run the paper's mutations only."""
        self.chain = self.cfg.chain_max
        self.tight_from = self.iterations
        self.over_base = self.over
        if self.on_tight is not None:
            self.on_tight()
        s.set_lse(True)
        s.respread(low.order if low.order is not None else s.order())
        c.weight = SOFT_WORK
        c.w0, c.w_rate, c.t_rate = c.work, c.work, time.monotonic()
        c.cool()

    def _steepen(self, c: Cooling) -> None:
        """An adaptive penalty: from the middle of the tight part on, the slope above the budget
        grows from --over-budget-weight to RESCUE_OVER at its end, and stays where it is once a
        schedule fits. A budget the mild slope meets in the first half keeps its cheap schedules;
        one it does not is met by the steeper slope."""
        frac = min(1.0, max(0.0, 2.0 * (c.work - c.w0) / max(1.0, c.n_iter - c.w0) - 1.0))
        self.over = self.over_base * (max(self.over_base, RESCUE_OVER) / self.over_base) ** frac

    def _chunk(self, s: State, n: int, mode: int, h: float, ratio: float, p_add: float, p_rem: float,
               stop_at_budget: bool, feas: Best, low: Best) -> tuple[int, bool, Best, Best, bool]:  # fmt: skip
        """One kernel call of `n` iterations (Fig. 3) from the bests so far: the iterations done,
        whether the budget was met (``stop_at_budget``), the new bests (decoded from the chunk's
        journal) and whether the feasible one improved."""
        cfg = self.cfg
        base = s.seq.copy()
        fs, ist = s.fstate, s.istate
        fs[K.F_BEST_FEAS_COST] = feas.cost
        fs[K.F_BEST_FEAS_PEAK] = feas.peak
        fs[K.F_BEST_PEAK] = low.peak
        fs[K.F_BEST_PEAK_COST] = low.cost
        ist[K.I_LOG_LEN] = 0
        ist[K.I_MARK_FEAS] = -1
        ist[K.I_MARK_PEAK] = -1
        ist[K.I_MET] = 0
        done = K.sa_chunk(s.kt, s.st, n, cfg.budget, cfg.resident, cfg.c_floor, mode, h, ratio,
                          p_add, p_rem, stop_at_budget, cfg.local, cfg.sharp,
                          self.over, self.chain)  # fmt: skip
        self.soft_iterations += done if s.lse else 0
        self.iterations += done
        improved = False
        if ist[K.I_MARK_FEAS] >= 0:
            snap = base.copy()
            K.apply_log(snap, s.log_t, s.log_n, int(ist[K.I_MARK_FEAS]))
            feas = Best(snap[snap >= 0].copy(), float(fs[K.F_BEST_FEAS_COST]), float(fs[K.F_BEST_FEAS_PEAK]))
            improved = True
        if ist[K.I_MARK_PEAK] >= 0:
            snap = base.copy()
            K.apply_log(snap, s.log_t, s.log_n, int(ist[K.I_MARK_PEAK]))
            low = Best(snap[snap >= 0].copy(), float(fs[K.F_BEST_PEAK_COST]), float(fs[K.F_BEST_PEAK]))
        return done, bool(ist[K.I_MET]), feas, low, improved

    def _out_of_time(self, c: Cooling, share: float) -> bool:
        """With a time limit: True once `share` of it has passed. Slower than the assumed rate (cores
        shared with other work), the stage is shortened to what the measured rate reaches by its end, so
        that it still cools down to hf instead of being cut off hot; never triggered where the
        rate holds, so seeded runs repeat. The rate is measured from the last switch of kernel:
        the soft peak's, while a first stage anneals it until the budget is met, is about 3
        times slower than the exact one that follows."""
        remaining = self.options.remaining()
        if remaining is None:
            return False
        left = remaining - (1.0 - share) * (self.options.time_limit or 0.0)
        if left <= 0.0:
            self.wall_stopped = True
            return True
        rate = (c.work - c.w_rate) / max(1e-9, time.monotonic() - c.t_rate)
        reach = c.work + 0.9 * rate * left
        if reach < c.n_iter and c.work - c.w_rate >= 2 * CHUNK * c.weight:
            c.n_iter = int(max(c.work + CHUNK * c.weight, reach))
            c.cool()
            self.wall_stopped = True
        return False

    def _report(self, stage: int, it: int, s: State, feas: Best, low: Best, h: float, improved: bool) -> None:
        now = time.monotonic()
        if improved and feas.order is not None and feas.cost < self.best_cost:
            self.best_cost = feas.cost
            self.unreported = (s.prob, feas.order)
        if now - self.last_report < 1.0:
            return
        self.last_report = now
        if self.unreported is not None:  # decoding costs milliseconds: at most once a second
            prob, order = self.unreported
            self.unreported = None
            ids = self.nv.ids
            self.options.incumbent(steps_from_sequence(self.graph, [ids[i] for i in expand(prob, order)]))
        self.options.progress(
            stage=stage,
            iteration=it,
            elapsed=now - self.options.started,
            incumbent=None if feas.order is None else feas.cost,
            peak=low.peak,
            temperature=h,
            current_peak=float(s.peak) + self.cfg.resident,
            current_cost=s.cost,
        )

    def polish(self, base_prob: Problem, cand: list[int]) -> list[int]:
        """``cand`` (NodeView indices) without its redundant computations (kernel ``polish``):
        the peak may rise up to the budget, or not at all when the candidate is already above it."""
        s = State(base_prob, np.array(to_base(base_prob, cand), dtype=np.int64), 0, 4, False)
        limit = max(self.cfg.budget, float(s.peak) + self.cfg.resident) - self.cfg.resident
        K.polish(s.kt, s.st, limit)
        return expand(base_prob, s.order())

    def choose(self, candidates: list[list[int]]) -> tuple[list[Step], int, float]:
        """The candidate the simulator finds within budget at least cost, else the lowest peak."""
        best: tuple[tuple[int, float, float], list[Step], int, float] | None = None
        ids = self.nv.ids
        for cand in candidates:
            steps = steps_from_sequence(self.graph, [ids[i] for i in cand])
            sim = simulate(self.graph, steps)
            over = sim.peak_memory > self.cfg.budget
            key = (int(over), float(sim.peak_memory) if over else sim.cost, float(sim.peak_memory))
            if best is None or key < best[0]:
                best = (key, steps, sim.peak_memory, sim.cost)
        assert best is not None
        self.options.incumbent(best[1])
        return best[1], best[2], best[3]
