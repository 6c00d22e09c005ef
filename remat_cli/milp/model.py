"""The engine-neutral MILP: :class:`LinearModel` (numpy arrays, a COO matrix built block by block),
:class:`EngineSettings` and :class:`MilpResult`; the API is described in :mod:`remat_cli.milp.engine`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

Status = Literal["optimal", "feasible", "infeasible", "unknown"]
BACKENDS: tuple[str, ...] = ("highs", "scip", "cpsat", "gurobi")
#: engines for LP relaxations only (``relax=True``): OR-Tools' PDLP, a first-order primal-dual
#: method whose cost per iteration is two sparse matrix-vector products, so it scales to the
#: 10⁶-row relaxations that simplex and barrier do not finish in minutes
LP_BACKENDS: tuple[str, ...] = ("pdlp",)
DEFAULT_AUTO_ORDER: tuple[str, ...] = ("gurobi", "highs", "scip", "cpsat")


class EngineError(RuntimeError):
    """A backend could not run the model (missing, licence, unsupported model)."""


# ----------------------------------------------------------------------------------------------
# The model


class LinearModel:
    """min c·x + offset  s.t.  lb_row ≤ A x ≤ ub_row,  lb ≤ x ≤ ub,  x_j ∈ ℤ for integer j."""

    def __init__(self, name: str = "model") -> None:
        self.name = name
        self._lb: list[np.ndarray] = []
        self._ub: list[np.ndarray] = []
        self._int: list[np.ndarray] = []
        self._cost: list[np.ndarray] = []
        self._rows: list[np.ndarray] = []
        self._cols: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []
        self._rlb: list[np.ndarray] = []
        self._rub: list[np.ndarray] = []
        self.num_vars = 0
        self.num_constraints = 0
        self.objective_offset = 0.0
        self._cache: dict[str, Any] = {}

    def add_vars(
        self,
        n: int,
        lb: float | np.ndarray = 0.0,
        ub: float | np.ndarray = 1.0,
        integer: bool = True,
        cost: float | np.ndarray = 0.0,
    ) -> np.ndarray:
        idx = np.arange(self.num_vars, self.num_vars + n, dtype=np.int64)
        self._lb.append(np.broadcast_to(np.asarray(lb, dtype=float), (n,)).copy())
        self._ub.append(np.broadcast_to(np.asarray(ub, dtype=float), (n,)).copy())
        self._int.append(np.full(n, integer, dtype=bool))
        self._cost.append(np.broadcast_to(np.asarray(cost, dtype=float), (n,)).copy())
        self.num_vars += n
        self._cache.clear()
        return idx

    def add_constraints(
        self,
        rows: np.ndarray | Sequence[int],
        cols: np.ndarray | Sequence[int],
        coefs: np.ndarray | Sequence[float] | float,
        lb: np.ndarray | float,
        ub: np.ndarray | float,
        count: int | None = None,
    ) -> np.ndarray:
        rows = np.asarray(rows, dtype=np.int64)
        cols = np.asarray(cols, dtype=np.int64)
        vals = np.broadcast_to(np.asarray(coefs, dtype=float), rows.shape).copy()
        if count is None:
            count = len(lb) if np.ndim(lb) else len(ub) if np.ndim(ub) else int(rows.max(initial=-1)) + 1
        lbs = np.broadcast_to(np.asarray(lb, dtype=float), (count,)).copy()
        ubs = np.broadcast_to(np.asarray(ub, dtype=float), (count,)).copy()
        if rows.size and (rows.min() < 0 or rows.max() >= count):
            raise ValueError("constraint row index outside the block")
        if cols.size and (cols.min() < 0 or cols.max() >= self.num_vars):
            raise ValueError("constraint names a variable that does not exist")
        first = self.num_constraints
        self._rows.append(rows + first)
        self._cols.append(cols)
        self._vals.append(vals)
        self._rlb.append(lbs)
        self._rub.append(ubs)
        self.num_constraints += count
        self._cache.clear()
        return np.arange(first, first + count, dtype=np.int64)

    # ---- assembled arrays (cached until the next add) ----
    def _cat(self, parts: list[np.ndarray], dtype: Any) -> np.ndarray:
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    @property
    def lb(self) -> np.ndarray:
        return self._cat(self._lb, float)

    @property
    def ub(self) -> np.ndarray:
        return self._cat(self._ub, float)

    @property
    def integer(self) -> np.ndarray:
        return self._cat(self._int, bool)

    @property
    def cost(self) -> np.ndarray:
        return self._cat(self._cost, float)

    @property
    def row_lb(self) -> np.ndarray:
        return self._cat(self._rlb, float)

    @property
    def row_ub(self) -> np.ndarray:
        return self._cat(self._rub, float)

    def matrix(self) -> sp.csr_matrix:
        if "A" not in self._cache:
            A = sp.csr_matrix(
                (
                    self._cat(self._vals, float),
                    (self._cat(self._rows, np.int64), self._cat(self._cols, np.int64)),
                ),
                shape=(self.num_constraints, self.num_vars),
            )
            A.sum_duplicates()
            A.eliminate_zeros()
            A.sort_indices()
            self._cache["A"] = A
        return self._cache["A"]

    def objective(self, x: np.ndarray) -> float:
        return float(self.cost @ x) + self.objective_offset

    def restricted(self, free: np.ndarray, x: np.ndarray) -> LinearModel:
        """The model with every column outside the boolean mask `free` fixed at its value in `x`:
        only the free columns (in their order), and only the rows that read one of them, with
        the fixed columns' part moved into the row bounds. A large-neighbourhood step: the
        engine sees a model of the window's size, not the whole one with most columns fixed."""
        cols = np.flatnonzero(free)
        A = self.matrix()
        sub_cols = A.tocsc()[:, cols]
        rows = np.unique(sub_cols.indices)
        shift = A[rows] @ np.where(free, 0.0, x)
        out = LinearModel(f"{self.name} (restricted)")
        out.add_vars(len(cols), lb=self.lb[cols], ub=self.ub[cols], integer=False, cost=self.cost[cols])
        out._int = [self.integer[cols]]
        block = sub_cols.tocsr()[rows].tocoo()
        out.add_constraints(
            block.row,
            block.col,
            block.data,
            self.row_lb[rows] - shift,
            self.row_ub[rows] - shift,
            count=len(rows),
        )
        return out

    def violation(self, x: np.ndarray) -> float:
        """Largest bound or row violation of `x` (0 when feasible), for checking hints."""
        ax = self.matrix() @ x
        worst = max(
            float(np.max(self.row_lb - ax, initial=0.0)),
            float(np.max(ax - self.row_ub, initial=0.0)),
            float(np.max(self.lb - x, initial=0.0)),
            float(np.max(x - self.ub, initial=0.0)),
        )
        frac = np.abs(x - np.round(x))[self.integer]
        return max(worst, float(frac.max(initial=0.0)))

    def integral(self) -> str | None:
        """None when CP-SAT can take the model as is, else why not."""
        if not self.integer.all():
            return f"{int((~self.integer).sum())} continuous variables"
        A = self.matrix()
        if not np.all(A.data == np.round(A.data)):
            return "fractional constraint coefficients"
        for b in (self.row_lb, self.row_ub, self.lb, self.ub):
            fin = b[np.isfinite(b)]
            if not np.all(fin == np.round(fin)):
                return "fractional bounds"
        return None


# ----------------------------------------------------------------------------------------------
# Settings and result


@dataclass
class EngineSettings:
    backend: str = "auto"
    auto_order: tuple[str, ...] = DEFAULT_AUTO_ORDER
    time_limit: float | None = None
    threads: int = 1
    seed: int = 0
    rel_gap: float = 1e-6
    hint: np.ndarray | None = None
    relax: bool = False
    deterministic: bool = False
    #: LP algorithm for relax=True: "" (engine default), "primal", "dual", "barrier", "first_order"
    lp_algorithm: str = ""
    on_solution: Callable[[np.ndarray, float], None] | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    #: engine-specific options, e.g. {"highs": {"mip_heuristic_effort": 0.3}} (HiGHS option
    #: names; CP-SAT: SatParameters fields; gurobi: parameter names)
    engine_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: extra engine log lines go here (None: dropped)
    on_log: Callable[[str], None] | None = None
    #: time.monotonic() by which the solve returns whatever happens: the engine then runs in a
    #: forked process that is killed there (HiGHS can spend a minute in native code past its own
    #: limit), the result being "unknown" with no solution. Ignored with callbacks or without fork
    hard_deadline: float | None = None


@dataclass
class MilpResult:
    status: Status
    objective: float | None = None
    bound: float | None = None
    gap: float | None = None
    x: np.ndarray | None = None
    backend: str = ""
    message: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
