"""auto: the default solver, a portfolio run within the time limit (algorithm portfolios: Huberman,
Lukose & Hogg, "An Economics Approach to Hard Computational Problems", Science 275, 1997 — run
complementary methods side by side and keep the best answer; Gomes & Selman, "Algorithm
portfolios", AIJ 126, 2001, §3: on few processors, interleaving in parallel beats sequential
splitting when run times are heavy-tailed).

0. The constructions run first, in this process, before the lane processes start, until one
   fits: on a stack of repeated blocks stack (remat_cli/solvers/stack), elsewhere (or when it
   finds nothing within the budget) ratio (remat_cli/solvers/ratio). Both report their first
   schedule early: a schedule within budget in seconds on deep stacks, where greedy may find
   none within its share; their time counts in greedy's.
1. greedy runs next, in this process: it is fast (milliseconds to a few seconds), always returns
   a schedule, and its schedule is the warm start (`hint`) of the exact solvers.
2. The rest of the time goes to *lanes*, each a separate process with the whole remaining time
   (`--lanes 1`, or one worker, runs the same solvers one after the other in this process,
   fastsa first, splitting the time: `one_lane`). A lane runs its solvers one after the other;
   one that stops early leaves its time to the next. The lanes (`portfolio`):
   - fastsa, which may reorder the computations and so often beats the fixed-order optima, then
     hilp with what remains (it keeps greedy's or fastsa's whole-graph schedule when cheaper
     than its own);
   - beside it, checkmate (warm-started from greedy, then its local search), then moccasin when
     checkmate stops early without a proof.
3. The cheapest schedule within the budget wins; when none fits, the lowest peak. Every schedule
   a lane returns is simulated here before it is compared (and again by `run_solver`).

`solver.message` names the winner and lists what else ran with its result.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from remat_cli import registry
from remat_cli.graph import Graph
from remat_cli.schedule import ScheduleError, Step, baseline, simulate
from remat_cli.solver import Param, SolveOptions, Solver, SolverResult

#: `remat solve --solver auto` without --time-limit
DEFAULT_TIME_LIMIT = 60.0
#: below this time limit (seconds) the lanes run in this process, one after the other: starting a
#: process and importing the solvers there costs about a second
PARALLEL_MIN_SECONDS = 8.0
#: share of the time limit greedy may use (it runs every strategy when it has one worker)
GREEDY_SHARE = 0.2
#: from this many nodes, a graph whose stack construction fitted gets the stacked portfolio (and
#: greedy's short share): checkmate's model of the 12-layer decoder (1,886 nodes) was not built in
#: 120 s, where on graphs of a few hundred nodes it may prove the fixed-order optimum
STACKED_MIN_NODES = 1500
#: greedy's share after the stack construction fitted (the 12-layer decoder at 50%, 120 s: greedy
#: took 8.9 s for 6.14% after stack's 4.96%, while the lanes waited)
STACKED_GREEDY_SHARE = 0.03
#: share of the time limit (and least seconds) of the ratio construction before greedy: its first
#: schedule comes whatever the limit, the rest refines it (a few tenths of a point) while the lanes wait
FIRST_SHARE = 0.02
FIRST_MIN_SECONDS = 2.0
#: a solver is not started with less than this many seconds left
MIN_RUN_SECONDS = 0.5
#: the lanes' solvers are told to stop this share of the time limit early: model building and
#: decoding run outside their engines' limits (hilp measured up to ~4 s over 60 s on a loaded
#: machine; cut at the deadline, it loses its whole-graph fallback, its best schedule)
MARGIN_SHARE = 0.08
#: a lane still running at the deadline is stopped then (its last incumbent is kept): it has had
#: MARGIN_SHARE of the limit past its own deadline, and the CLI's watchdog kills this solve 30% of
#: max(10%, 2 s) after the limit (1.8 s at 60 s). With 2 s more here, a lane overrunning its
#: deadline (checkmate's model building on densenet_b16 at 50%, 60 s) held auto until 62.5 s:
#: killed, it returned its last incumbent without its message


@dataclass(eq=False)  # compared by identity
class _Run:
    """One sub-solver's outcome, as simulated here."""

    name: str
    status: str  # the solver's status, "error", "skipped" or "cut" (stopped at the deadline)
    seconds: float = 0.0
    steps: list[Step] | None = None
    peak: int | None = None
    cost: float | None = None
    result: SolverResult | None = None
    note: str = ""


class _Board:
    """The sub-solvers' outcomes as they arrive: every schedule simulated here before it is
    compared, and the winner (the cheapest within the budget, else the lowest peak) reported as
    the incumbent when it changes."""

    def __init__(self, graph: Graph, budget: int, options: SolveOptions) -> None:
        self.graph = graph
        self.budget = budget
        self.options = options
        self.runs: list[_Run] = []
        self.cands: list[_Run] = []  # every schedule seen, simulated
        self.best: list[_Run] = []  # the current winner, if any
        self.pending: dict[str, _Run] = {}  # each lane solver's last incumbent
        self.reported: set[str] = set()
        self.t_lanes = time.monotonic()

    def key(self, r: _Run) -> tuple:
        assert r.peak is not None and r.cost is not None
        return (0, r.cost, 0) if r.peak <= self.budget else (1, r.peak, r.cost)

    def offer(self, r: _Run, replaces: _Run | None = None) -> None:
        """Simulate r's steps; r joins the candidates (instead of `replaces`, its own last
        incumbent, unless r is worse or has no steps) and the winner is updated."""
        cands, best, key = self.cands, self.best, self.key
        if r.steps is not None:
            sim = simulate(self.graph, r.steps)
            r.peak, r.cost = sim.peak_memory, sim.cost
        if replaces is not None and replaces in cands:
            if r.steps is None or key(r) > key(replaces):
                return
            cands.remove(replaces)
        if r.steps is None:
            return
        cands.append(r)
        top = min(cands, key=key)  # min keeps the first of equals: greedy, then lane order
        if not best or top is not best[0]:
            changed = not best or key(top) < key(best[0])
            best[:] = [top]
            if changed and top.peak is not None and top.peak <= self.budget:
                # the producer first: the watchdog names it with the incumbent it keeps
                self.options.progress(incumbent=top.cost, method=top.name)
                self.options.incumbent(top.steps)  # type: ignore[arg-type]

    def receive(self, msg: tuple) -> None:
        """A lane's message: an incumbent, a skipped or failed solver, or its result."""
        kind, name = msg[0], msg[1]
        self.reported.add(name)
        if kind == "incumbent":
            r = _Run(name, "cut", max(0.0, time.monotonic() - self.t_lanes), list(msg[2]))
            self.offer(r, replaces=self.pending.get(name))
            self.pending[name] = r
        elif kind == "skipped":
            self.runs.append(_Run(name, "skipped", note=msg[2]))
        elif kind == "error":
            self.pending.pop(name, None)
            self.runs.append(_Run(name, "error", msg[3], note=msg[2]))
        elif kind == "done":
            cut = self.pending.pop(name, None)
            res: SolverResult = msg[2]
            r = _Run(name, res.status, msg[3], res.steps, result=res)
            self.runs.append(r)
            self.offer(r, replaces=cut)


#: the constructions run before greedy, in this order, until one fits: stack (on a stack of
#: repeated blocks; refused elsewhere) is both quicker to its first schedule and cheaper there,
#: ratio the first schedule of every other graph
FIRST = ("stack", "ratio")
#: each construction's share of the time limit and least seconds (what is left of the limit at
#: most). ratio's first schedule comes whatever the limit, the rest refines it (a few tenths of a
#: point) while the lanes wait; stack's measuring and search grow with the depth, and on a short
#: limit its schedule is worth more than the lanes' first seconds on a deep stack
FIRST_TIME = {"ratio": (FIRST_SHARE, FIRST_MIN_SECONDS), "stack": (0.1, 4.0)}


def first_schedule(
    graph: Graph, budget: int, options: SolveOptions, limit: float, name: str = "ratio"
) -> _Run | None:
    """The schedule of construction `name` (remat_cli/solvers/ratio: values dropped by bytes per
    recompute cost; remat_cli/solvers/stack: one block's patterns laid over a stack of repeated
    blocks), given its FIRST_TIME of the limit: the lanes' warm start where greedy has none
    within the budget or a dearer one. None when the construction is not installed, does not
    support the graph (stack: no repeated blocks) or finds nothing within the budget."""
    if name not in registry.names():
        return None
    solver = registry.get(name)
    if solver.availability()[0] != "available" or solver.supports(graph) is not None:
        return None
    t0 = time.monotonic()

    def first(steps: list[Step]) -> None:  # to the watchdog at once: the answer if time runs out
        options.progress(method=name)
        options.incumbent(steps)

    share, least = FIRST_TIME.get(name, (FIRST_SHARE, FIRST_MIN_SECONDS))
    left = options.remaining()
    seconds = max(share * limit, least) if left is None else min(max(share * limit, least), left)
    opts = SolveOptions(time_limit=seconds, seed=options.seed, params=solver.defaults(), on_incumbent=first)
    try:
        res = solver.solve(graph, budget, opts)
    except Exception:  # a construction that fails leaves greedy as before
        return None
    if res.steps is None or res.status == "infeasible":
        return None
    return _Run(name, res.status, time.monotonic() - t0, res.steps, result=res)


def _greedy_first(
    graph: Graph,
    budget: int,
    options: SolveOptions,
    limit: float,
    board: _Board,
    spent: float = 0.0,
    stacked: bool = False,
) -> tuple[list[Step] | None, bool]:
    """Greedy in this process, the warm start: the hint for the lanes (the cheapest schedule
    within budget of greedy's, the constructions' before it and the caller's) and whether the
    baseline fits. After the stack construction fitted (`stacked`), greedy is neither the answer
    of last resort nor the lanes' warm start (on the decoders it costs more), so it gets
    STACKED_GREEDY_SHARE of the limit."""
    greedy = registry.get("greedy")
    t0 = time.monotonic()
    share = max(GREEDY_SHARE * limit, min(5.0, 0.5 * limit))
    if stacked:
        share = min(share, STACKED_GREEDY_SHARE * limit)
    g_opts = SolveOptions(
        # at least a few seconds (half of a short limit): it is the answer of last resort; the
        # constructions' time (`spent`) counts in its share
        time_limit=max(MIN_RUN_SECONDS, share - spent),
        seed=options.seed,
        workers=options.workers,
        params=greedy.defaults(),
    )
    g_res = greedy.solve(graph, budget, g_opts)
    g_run = _Run("greedy", g_res.status, time.monotonic() - t0, g_res.steps, result=g_res)
    board.runs.append(g_run)
    board.offer(g_run)
    top = board.best[0] if board.best else None  # greedy's or the ratio construction's
    hint = top.steps if top is not None and top.peak is not None and top.peak <= budget else None
    if options.hint:
        h_run = _Run("hint", "given", steps=list(options.hint))
        board.offer(h_run)
        if h_run.peak is not None and h_run.peak <= budget and (hint is None or h_run is board.best[0]):
            hint = h_run.steps
    return hint, g_run.peak is not None and g_run.peak <= budget and g_res.message == "baseline fits"


def portfolio(graph: Graph, stacked: bool = False) -> list[list[str]]:
    """The lanes for `graph` (see the module docstring; one portfolio measured best on every size
    so far). On a deep stack (`stacked`: the stack construction's schedule fits, and the graph
    has STACKED_MIN_NODES or more) two fastsa lanes, seeds apart, warm-started from it:
    checkmate's and moccasin's models of thousands of nodes are not built within the limit, and
    a second annealing chain is the better use of that core (the 12-layer decoder at 50%, 120 s: checkmate ended with greedy's schedule and
    moccasin never started)."""
    if stacked:
        return [["fastsa", "hilp"], ["fastsa"]]
    return [["checkmate", "moccasin"], ["fastsa", "hilp"]]


def lane_seeds(lanes: list[list[str]], seed: int) -> list[int]:
    """Each lane's seed: `seed`, plus one for each earlier lane that starts with the same solver
    (two fastsa lanes would otherwise run the same chain)."""
    return [seed + sum(1 for other in lanes[:k] if other[:1] == lane[:1]) for k, lane in enumerate(lanes)]


def one_lane(lanes: list[list[str]]) -> list[str]:
    """The lanes' solvers in the order one process runs them: the lanes' first solvers, then
    their second ones, with fastsa first of all. fastsa keeps to its share of the time, where
    checkmate's and moccasin's model building is not clocked and what they overrun is lost to the
    solvers after them (one core, mobilenet_v2_b1 at 50%, 60 s: checkmate took 44 s of a 13.5 s
    share, fastsa got 1.1 s and nothing fit; fastsa first found 9.57% in 7 s)."""
    order = [n for k in range(max(map(len, lanes), default=0)) for lane in lanes for n in lane[k : k + 1]]
    return sorted(dict.fromkeys(order), key=lambda n: n != "fastsa")  # a solver in two lanes runs once


def _run_lane(
    names: list[str],
    graph: Graph,
    budget: int,
    deadline: float,
    seed: int,
    workers: int,
    hint: list[Step] | None,
    send: Callable[[tuple], None],
    share: bool = False,
    full_limit: float | None = None,
) -> None:
    """Run `names` one after the other until `deadline` (time.monotonic(), which every process of
    the machine shares); report each outcome through `send`. With `share`, each solver gets an
    equal part of the time left rather than all of it (one process running every lane)."""
    proven = False
    ran: list[str] = []  # solvers of this lane that returned
    for k, name in enumerate(names):
        left = deadline - time.monotonic()
        try:
            solver = registry.get(name)
        except registry.UnknownSolver as e:
            send(("skipped", name, str(e)))
            continue
        why = None
        if left < MIN_RUN_SECONDS:
            why = "no time left"
        elif solver.availability()[0] != "available":
            why = solver.availability()[1] or "unavailable"
        elif solver.supports(graph) is not None:
            why = solver.supports(graph)
        elif proven and solver.exact:
            why = "an exact solver already proved the fixed-order optimum"
        if why is not None:
            send(("skipped", name, why))
            continue
        limit = left / (len(names) - k) if share else left
        params = solver.defaults()
        if hint is None and "greedy_start" in params:
            # greedy ran first here and found nothing within the budget: running it again inside
            # fastsa (its rescue start) costs its whole run (RL n500 at 70%: 13 s of 60)
            params["greedy_start"] = False
        if "rate" in params and full_limit is not None and limit < full_limit:
            # a solver that sizes its work from the time limit (fastsa: iterations = rate x
            # limit) does the work of a run alone with the user's limit: the lane's share would
            # depend on how long greedy took, and fastsa finishes well before it anyway (RL n500
            # at 70%: 15M iterations in 18 s gave 5.5%, the 18M of a run alone 4.4%)
            params["rate"] = float(params["rate"]) * full_limit / limit
        if "flat_start" in params and ran:
            # hilp after fastsa: its flat start would be fastsa again with the time left, where the
            # hint (the lane's best schedule) already is fastsa's (mixer_b16 at 50%, 60 s: fastsa
            # 28 s, then hilp's own fastsa 22 s and the same 4.24%)
            params["flat_start"] = ",".join(n for n in str(params["flat_start"]).split(",") if n not in ran)
        options = SolveOptions(
            time_limit=limit,
            seed=seed,
            workers=workers,
            hint=hint,
            params=params,
            on_incumbent=lambda steps, name=name: send(("incumbent", name, steps)),
        )
        t0 = time.monotonic()
        try:
            result = solver.solve(graph, budget, options)
        except Exception as e:  # one failing method must not cost the portfolio its answer
            send(("error", name, f"{type(e).__name__}: {e}", time.monotonic() - t0))
            continue
        send(("done", name, result, time.monotonic() - t0))
        ran.append(name)
        proven = proven or (solver.exact and result.status == "optimal")
        if result.steps is not None:
            try:
                sim = simulate(graph, result.steps)
            except ScheduleError:
                continue
            if sim.peak_memory <= budget and (hint is None or sim.cost < simulate(graph, hint).cost):
                hint = list(result.steps)  # the next solver of this lane starts from it


def _lane_process(names: list[str], graph: Graph, budget: int, deadline: float, seed: int, workers: int,
                  hints: Connection, conn: Connection, full_limit: float) -> None:  # fmt: skip
    try:
        for name in names:  # import the solvers while the parent runs greedy
            if name in registry.names():
                registry.get(name)
        # the warm start, once greedy is done (None: none within budget; "stop": nothing to do)
        hint = hints.recv() if hints.poll(max(0.0, deadline - time.monotonic())) else None
        if hint == "stop":
            return
        _run_lane(names, graph, budget, deadline, seed, workers, hint, conn.send, full_limit=full_limit)
    finally:
        conn.send(("end",))
        conn.close()


class Auto(Solver):
    name = "auto"
    method = "portfolio: greedy warm start, then fastsa/hilp beside checkmate/moccasin"
    paper = "Huberman, Lukose & Hogg, An Economics Approach to Hard Computational Problems, Science 1997"
    params = (
        Param(
            "lanes",
            int,
            2,
            "processes running solvers side by side (1: one after the other here)",
            low=1,
            high=16,
        ),
        Param(
            "portfolio",
            str,
            "",
            "lanes to run instead of the default ones: solvers joined by ',' within a lane, "
            "lanes by '/', e.g. 'moccasin/fastsa,hilp'",
        ),
        Param(
            "first",
            str,
            ",".join(FIRST),
            "constructions run before greedy until one fits, joined by ',' ('' for none)",
        ),
    )

    def prepare(self) -> None:
        """fastsa's kernels, compiled here rather than in a lane under the time limit, and the
        constructions loaded (stack's CP-SAT: over half a second of imports before its first
        schedule, longer than its measuring on a 12-layer decoder)."""
        for name in ("fastsa", *FIRST):
            if name in registry.names():
                registry.get(name).prepare()

    def notes(self) -> str:
        return (
            f"default time limit {DEFAULT_TIME_LIMIT:g} s; fastsa then hilp beside checkmate then "
            "moccasin; greedy first as the "
            f"warm start; under {PARALLEL_MIN_SECONDS:g} s or with one worker the lanes share one process"
        )

    def solve(self, graph: Graph, budget: int, options: SolveOptions) -> SolverResult:
        limit = options.time_limit if options.time_limit is not None else DEFAULT_TIME_LIMIT
        deadline = options.started + limit
        lane_deadline = deadline - MARGIN_SHARE * limit
        board = _Board(graph, budget, options)
        # 0. the constructions, alone on the machine: a schedule within budget in seconds,
        # whatever greedy finds
        firsts = []
        for name in (n for n in str(options.params["first"]).split(",") if n):
            if firsts:
                break  # one fits: the next would be the lanes' warm start only where it is cheaper
            if (r := first_schedule(graph, budget, options, limit, name)) is not None:
                firsts.append(r)
        stacked = any(r.name == "stack" for r in firsts) and len(graph.nodes) >= STACKED_MIN_NODES
        spec = str(options.params["portfolio"] or "")
        lanes = (
            [[n for n in lane.split(",") if n] for lane in spec.split("/")]
            if spec
            else portfolio(graph, stacked)
        )
        lanes = [lane for lane in lanes if lane]
        n_lanes = int(options.params["lanes"])
        parallel = n_lanes > 1 and options.workers > 1 and limit >= PARALLEL_MIN_SECONDS and len(lanes) > 1
        # then the lane processes: their imports overlap greedy's run
        lane_procs = self._start(lanes, graph, budget, lane_deadline, options) if parallel else None
        try:
            for first in firsts:
                board.runs.append(first)
                board.offer(first)
            # 1. greedy, the warm start
            spent = sum(r.seconds for r in firsts)
            hint, baseline_fits = _greedy_first(graph, budget, options, limit, board, spent, stacked)
            if baseline_fits:
                lanes = []  # the baseline is the cheapest schedule: nothing to search
            # 2. the lanes
            board.t_lanes = time.monotonic()
            if lane_procs is not None:
                self._collect(lane_procs, hint if lanes else "stop", deadline, board.receive)
            else:
                _run_lane(one_lane(lanes), graph, budget, lane_deadline, options.seed, options.workers, hint,
                          board.receive, share=True)  # fmt: skip
        finally:
            if lane_procs is not None:
                self._stop(lane_procs)
        runs = board.runs
        for name in sum(lanes, []):
            if name not in board.reported:
                runs.append(_Run(name, "skipped", note="no answer before the time limit"))
        runs.extend(board.pending.values())  # lanes stopped at the deadline: their last incumbents
        # 3. the cheapest schedule within the budget wins; when none fits, the lowest peak
        assert board.best, "greedy always returns steps"
        win = board.best[0]
        assert win.peak is not None and win.cost is not None
        ok = win.peak <= budget
        wres = win.result
        status = (
            (wres.status if wres is not None and wres.status == "optimal" else "feasible")
            if ok
            else "infeasible"
        )
        return SolverResult(
            steps=win.steps,
            status=status,  # type: ignore[arg-type]
            backend=wres.backend if wres is not None else None,
            objective=win.cost,
            lower_bound=wres.lower_bound if wres is not None and status == "optimal" else None,
            params={"winner": win.name, "lanes": lanes if parallel else [one_lane(lanes)]},
            message=self._message(win, runs, baseline(graph).cost, budget, parallel),
            best_peak=None if ok else win.peak,
        )

    @staticmethod
    def _start(
        lanes: list[list[str]], graph: Graph, budget: int, lane_deadline: float, options: SolveOptions
    ) -> list[tuple[Any, Connection, Connection]]:
        """Start one process per lane; each waits for its warm start (see `_collect`)."""
        # spawn, not fork: the parent may hold solver thread pools (HiGHS, numba) a fork would copy
        # without their threads
        ctx = mp.get_context("spawn")
        workers = max(1, options.workers // len(lanes))
        full_limit = options.time_limit if options.time_limit is not None else DEFAULT_TIME_LIMIT
        procs = []
        for names, seed in zip(lanes, lane_seeds(lanes, options.seed), strict=True):
            results, results_child = ctx.Pipe(duplex=False)
            hints_child, hints = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_lane_process,
                args=(
                    names,
                    graph,
                    budget,
                    lane_deadline,
                    seed,
                    workers,
                    hints_child,
                    results_child,
                    full_limit,
                ),  # fmt: skip
                daemon=True,
            )
            with main_hidden():
                p.start()
            results_child.close()
            hints_child.close()
            procs.append((p, results, hints))
        return procs

    @staticmethod
    def _collect(
        procs: list[tuple[Any, Connection, Connection]],
        hint: list[Step] | str | None,
        deadline: float,
        receive: Callable[[tuple], None],
    ) -> None:
        """Send the warm start to every lane, then pass on what they report until they end or the
        deadline passes."""
        for _, _, hints in procs:
            try:
                hints.send(hint)
            except (BrokenPipeError, OSError):
                pass  # that lane already died: its pipe reports EOF below
        open_ = [results for _, results, _ in procs]
        while open_:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for c in wait(open_, timeout=left):
                try:
                    msg = c.recv()
                except EOFError:
                    open_.remove(c)  # the lane died (killed, out of memory): keep what it sent
                    continue
                if msg[0] == "end":
                    open_.remove(c)
                else:
                    receive(msg)

    @staticmethod
    def _stop(procs: list[tuple[Any, Connection, Connection]]) -> None:
        for p, _, _ in procs:
            if p.is_alive():
                p.terminate()
        for p, _, _ in procs:
            p.join(timeout=2.0)
            if p.is_alive():
                p.kill()
                p.join()

    @staticmethod
    def _message(win: _Run, runs: list[_Run], base_cost: float, budget: int, parallel: bool) -> str:
        def describe(r: _Run) -> str:
            if r.status in ("skipped", "error"):
                return f"{r.name} {r.status} ({r.note})"
            if r.peak is None or r.cost is None:
                return f"{r.name} {r.status}, no schedule ({r.seconds:.1f} s)"
            over = f"+{(r.cost / base_cost - 1) * 100:.2f}%" if base_cost > 0 else ""
            fit = "" if r.peak <= budget else f", peak {r.peak:,} over the budget"
            status = "stopped at the time limit" if r.status == "cut" else r.status
            return f"{r.name} {status} {over}{fit} ({r.seconds:.1f} s)"

        how = "2 lanes in parallel" if parallel else "one after the other"
        others = "; ".join(describe(r) for r in runs if r is not win)
        return f"auto: {describe(win)} won; also ran ({how}): {others or 'nothing'}"


@contextmanager
def main_hidden() -> Iterator[None]:
    """Start spawned processes without the caller's ``__main__``: spawn re-imports the main
    script in each child, so a script calling ``auto`` at its top level (no ``if __name__ ==
    "__main__"`` guard, as training scripts often are) would run again in every lane and stall.
    The lanes need nothing from ``__main__``."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main
