"""The solver registry: built-in solvers plus the python entry-point group ``remat.solvers``.

Listing the registry imports no solver module: the built-ins are described by :data:`BUILTIN`
(dotted path, method, paper, exactness and the engine packages they need), so ``remat solvers``
and ``remat --help`` start fast and a solver whose engine is missing never breaks the others. A
solver class is imported only by :func:`get`. The table restates what each class declares;
``remat_cli.testing.check_registry_entry`` fails when the two drift apart.

An out-of-tree package registers ``name = "package.module:SolverClass"`` in the entry-point
group; its facts come from its class, which :func:`info` then has to import.

Examples
--------
>>> from remat_cli import registry
>>> "greedy" in registry.names()
True
>>> registry.info("checkmate").exact
True
>>> registry.get("greedy").name
'greedy'
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from remat_cli.graph import Graph
    from remat_cli.solver import SolveOptions, Solver, SolverResult


@dataclass(frozen=True)
class Entry:
    """What ``remat solvers`` shows about a solver, known without importing it.

    Parameters
    ----------
    path : str
        Where the class is: ``"package.module:SolverClass"``.
    method : str
        One line: what the method is (the class's ``Solver.method``).
    paper : str
        The paper it implements (``Solver.paper``).
    exact : bool, default False
        Whether "optimal" is a proof (``Solver.exact``).
    requires : tuple of str, default ()
        Top-level packages the solver's engines need; absent ones make it "missing engine".

    Examples
    --------
    >>> entry = BUILTIN["moccasin"]
    >>> entry.path, entry.requires
    ('remat_cli.solvers.moccasin:Moccasin', ('ortools',))
    """

    path: str
    method: str
    paper: str
    exact: bool = False
    requires: tuple[str, ...] = ()


_CHECKMATE = "Jain et al., Checkmate, MLSys 2020 (as restated in XEngine §3.2, Moccasin §1.1, HiREmate B.3)"
_CHEN = "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016 (DAG form as in Checkmate)"

BUILTIN: dict[str, Entry] = {
    "auto": Entry(
        "remat_cli.solvers.auto:Auto",
        "portfolio: greedy warm start, then fastsa/hilp beside checkmate/moccasin",
        "Huberman, Lukose & Hogg, An Economics Approach to Hard Computational Problems, Science 1997",
    ),
    "checkpoint-all": Entry(
        "remat_cli.solvers.checkpoint_all:CheckpointAll", "no rematerialization (baseline)", "—"
    ),
    "greedy": Entry(
        "remat_cli.solvers.greedy:Greedy",
        "greedy rematerialization: peak-reduction splits and DTR-style eviction, best kept",
        "Kirisame et al., Dynamic Tensor Rematerialization, ICLR 2021 (h_DTR and its e* variant)",
    ),
    "ratio": Entry(
        "remat_cli.solvers.ratio:Ratio",
        "drop values by bytes per recompute cost, shortest fitting prefix by bisection",
        "Jain et al., Checkmate (MLSys'20) §5 rounding; Chen et al. 2016 (segments)",
    ),
    "stack": Entry(
        "remat_cli.solvers.stack:StackSolver",
        "one block's keep patterns (Pareto front by ILP), combined over the stack by dynamic programming",
        "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016, §4.2 (segments within a budget); "
        "Gusak et al., HiREmate, §4 (one subgraph's options combined over the graph)",
        requires=("ortools",),
    ),
    "chen-sqrtn": Entry(
        "remat_cli.solvers.chen:ChenSqrtN",
        "Chen sqrt(n) checkpointing at articulation points, segments recomputed in backward",
        _CHEN,
    ),
    "blocks": Entry(
        "remat_cli.solvers.blocks:Blocks",
        "per-block checkpointing: keep each block's input, recompute its forward before its backward",
        "Chen et al., Training Deep Nets with Sublinear Memory Cost, 2016, §4.1, with the model's blocks "
        "as segments (torch.utils.checkpoint per layer)",
    ),
    "chen-greedy": Entry(
        "remat_cli.solvers.chen:ChenGreedy",
        "Chen greedy checkpointing by segment memory b (b swept), segments recomputed in backward",
        _CHEN,
    ),
    "checkmate": Entry(
        "remat_cli.solvers.checkmate:Checkmate",
        "MILP over frontier-advancing stages (R, S, FREE, U) in the fixed `order`",
        _CHECKMATE,
        exact=True,
        requires=("ortools", "scipy"),
    ),
    "checkmate-lp": Entry(
        "remat_cli.solvers.checkmate:CheckmateLP",
        "LP relaxation of the Checkmate MILP + two-phase (threshold / randomized) rounding",
        _CHECKMATE + ", §5 (LP rounding)",
        requires=("ortools", "scipy"),
    ),
    "moccasin": Entry(
        "remat_cli.solvers.moccasin:Moccasin",
        "retention-interval constraint program (CP-SAT), two phases",
        "Bartan et al., MOCCASIN, ICML 2023, §2",
        exact=True,
        requires=("ortools",),
    ),
    "fastsa": Entry(
        "remat_cli.solvers.fastsa:FastSA",
        "simulated annealing over a node sequence (segment tree, node grouping)",
        "Imanishi et al., A fast heuristic to optimize time-space tradeoff for large models (NeurIPS'23)",
        requires=("numba",),
    ),
    "hilp": Entry(
        "remat_cli.solvers.hilp:HILP",
        "hierarchical ILP over H-Partition subgraphs with per-subgraph options (H-ILP)",
        "HiREmate (Gusak et al.), §3 and Appendices A-C",
        requires=("ortools", "scipy"),
    ),
    "model": Entry(
        "remat_cli.solvers.model:Model",
        "operator order + tensor addresses, no recomputation (one arena)",
        "Steiner et al., ICML 2023 (MODeL)",
        exact=True,
        requires=("ortools",),
    ),
    "xengine": Entry(
        "remat_cli.solvers.xengine:XEngine",
        "multi-device rematerialization: per-device MILP over Checkmate's stages + placement search",
        "Schuler, Membarth, Slusallek, XEngine, ACM TACO 20(1) 2023, §3 (MIQP made sound)",
        requires=("ortools", "scipy"),
    ),
}

ENTRY_POINT_GROUP = "remat.solvers"


class UnknownSolver(KeyError):
    """A solver name that is neither built in nor registered by entry point.

    ``e.args[0]`` is the message, which lists the known names (``str(e)`` would quote it, as
    for any KeyError).

    Examples
    --------
    >>> try:
    ...     get("simplex")
    ... except UnknownSolver as e:
    ...     print(e.args[0].partition(" (known")[0])
    unknown solver 'simplex'
    """


def _load(path: str) -> type[Solver]:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)


def _exists(module: str) -> bool:
    """Whether `module` can be imported, importing at most its parent packages."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


@cache
def solver_table() -> dict[str, str]:
    """Every registered solver's name and where its class is, read once.

    The built-ins whose module exists (in :data:`BUILTIN`'s order), then the entry points of
    :data:`ENTRY_POINT_GROUP`; a built-in name is never replaced by an entry point's.

    Returns
    -------
    dict of str to str
        ``{name: "package.module:SolverClass"}``.

    Examples
    --------
    >>> solver_table()["greedy"]
    'remat_cli.solvers.greedy:Greedy'
    """
    table = {}
    for name, entry in BUILTIN.items():
        if _exists(entry.path.partition(":")[0]):  # solvers still being written are absent
            table[name] = entry.path
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        table.setdefault(ep.name, ep.value)
    return table


def names() -> list[str]:
    """The registered solver names: the built-ins present, then those of entry points.

    Imports no solver module.

    Returns
    -------
    list of str
        The names, built-ins in :data:`BUILTIN`'s order.

    Examples
    --------
    >>> {"greedy", "checkmate", "fastsa"} <= set(names())
    True
    """
    return list(solver_table())


def get(name: str) -> Solver:
    """An instance of solver `name`; this is where its module is imported.

    Parameters
    ----------
    name : str
        A registry name (:func:`names`).

    Returns
    -------
    Solver
        A new instance.

    Raises
    ------
    UnknownSolver
        `name` is not registered.

    Examples
    --------
    >>> solver = get("chen-greedy")
    >>> type(solver).__name__, solver.exact
    ('ChenGreedy', False)
    """
    table = solver_table()
    if name not in table:
        raise UnknownSolver(f"unknown solver {name!r} (known: {', '.join(table)})")
    return _load(table[name])()


def info(name: str) -> Entry:
    """The facts ``remat solvers`` lists; imports nothing for a built-in.

    Parameters
    ----------
    name : str
        A registry name (:func:`names`).

    Returns
    -------
    Entry
        The built-in's row of :data:`BUILTIN`, or an entry point's facts read from its class.

    Raises
    ------
    UnknownSolver
        `name` is not registered.

    Examples
    --------
    >>> info("fastsa").requires
    ('numba',)
    """
    table = solver_table()
    if name not in table:
        raise UnknownSolver(f"unknown solver {name!r} (known: {', '.join(table)})")
    entry = BUILTIN.get(name)
    if entry is not None and entry.path == table[name]:
        return entry
    cls = _load(table[name])
    return Entry(table[name], cls.method, cls.paper, cls.exact)


def missing_engines(name: str) -> list[str]:
    """The packages of :attr:`Entry.requires` that are not installed, checked without importing.

    Parameters
    ----------
    name : str
        A registry name (:func:`names`).

    Returns
    -------
    list of str
        The missing packages; empty when every engine is installed.

    Raises
    ------
    UnknownSolver
        `name` is not registered.

    Examples
    --------
    >>> missing_engines("checkpoint-all")
    []
    """
    return [m for m in info(name).requires if not _exists(m)]


def call_solver(
    name: str, graph: Graph, budget: int, options: SolveOptions, notes: list[str]
) -> SolverResult | None:
    """Run solver `name` on behalf of another (a warm start, a leaf of a hierarchy).

    Parameters
    ----------
    name : str
        The helper's registry name.
    graph : Graph
        The graph (or the part of it) the helper solves.
    budget : int
        Bytes.
    options : SolveOptions
        The helper's options; its ``params`` are resolved against the helper's own.
    notes : list of str
        Where a helper's failure is appended, for the caller to put into its result's message,
        so it never disappears silently.

    Returns
    -------
    SolverResult or None
        The helper's result; None when it is not registered, its engine is unavailable or it
        does not apply to `graph` (such helpers are optional and skipped without a word), and
        None when it raised (a bug in the helper, recorded in `notes`).

    Examples
    --------
    >>> from remat_cli.importers import generators
    >>> from remat_cli.solver import SolveOptions
    >>> notes = []
    >>> result = call_solver("chen-greedy", generators.linear(5, seed=1), 28_800, SolveOptions(), notes)
    >>> result.status, notes
    ('feasible', [])
    >>> call_solver("simplex", generators.linear(5, seed=1), 28_800, SolveOptions(), notes) is None
    True
    """
    try:
        solver = get(name)
    except UnknownSolver:
        return None
    if solver.availability()[0] != "available" or solver.supports(graph) is not None:
        return None
    try:
        return solver.solve(graph, budget, solver.resolve(options))
    except Exception as e:  # noqa: BLE001 - reported in the caller's message, see above
        notes.append(f"{name} failed: {type(e).__name__}: {e}")
        return None


def numba_cache_cold(name: str) -> bool:
    """Whether importing solver `name` compiles numba kernels first (about a minute).

    True when the solver needs numba and its modules have no numba cache yet beside them. Known
    without importing the solver, so the CLI can say why the first solve waits.

    Parameters
    ----------
    name : str
        A registry name.

    Returns
    -------
    bool
        False whenever it cannot tell (an entry point, NUMBA_CACHE_DIR set, a read-only
        install).

    Examples
    --------
    >>> numba_cache_cold("checkmate")  # no numba kernels
    False
    """
    entry = BUILTIN.get(name)
    if entry is None or "numba" not in entry.requires or os.environ.get("NUMBA_CACHE_DIR"):
        return False
    try:
        spec = importlib.util.find_spec(entry.path.split(":")[0])
    except (ImportError, ValueError):
        return False
    if spec is None or not spec.origin:
        return False
    origin = Path(spec.origin)
    if not os.access(origin.parent, os.W_OK):
        return False  # numba then caches in the user's cache folder
    if spec.submodule_search_locations:  # a package: a cache of any of its modules
        return not any(_numba_cache_of_a_module(f) for f in origin.parent.rglob("__pycache__/*.nbi"))
    return not any(
        _numba_cache_of_a_module(f) for f in (origin.parent / "__pycache__").glob(f"{origin.stem}*.nbi")
    )


def _numba_cache_of_a_module(index: Path) -> bool:
    """Whether a numba cache index is for this Python and a module that exists now.

    The index is ``<dir>/__pycache__/<module>.<function>-<line>.py<XY>.nbi``; its module is
    ``<dir>/<module>.py`` (not one left behind by a module since moved, e.g. the fastsa kernel
    before it became a package).
    """
    module, _, rest = index.name.partition(".")
    tag = f".py{sys.version_info[0]}{sys.version_info[1]}{getattr(sys, 'abiflags', '')}"
    return rest.endswith(tag + ".nbi") and (index.parent.parent / f"{module}.py").is_file()
