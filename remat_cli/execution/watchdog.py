"""Run a solver under a watchdog: the time limit holds and SIGINT/SIGTERM keep the best schedule.

A solver's own stopping rule is not enough: model building, presolve or decoding can run long
past `--time-limit` inside native code (HiGHS, CP-SAT) that neither checks the clock nor sees a
Python signal. So the solver runs in a forked child process, in its own process group, that
reports every incumbent (``SolveOptions.on_incumbent``, which the solvers already call) and its
final result through a pipe. The parent keeps the latest incumbent and

- returns the solver's own result when it finishes in time;
- at the deadline kills the child's process group and returns the best incumbent with status
  ``feasible`` and message "time limit reached: best schedule so far" (or no schedule);
- on SIGINT or SIGTERM does the same with message "interrupted (SIGINT)": the caller writes the
  schedule atomically and exits 128 + the signal number (130, 143).

The deadline counts from the start of the command (what a user timing it sees): the solver is
told the time left, and killed 30% of the tolerance max(10% T, 2 s) after T, the rest being
for the simulator, the atomic write and the interpreter's exit under load. Without ``os.fork`` the solve runs in-process.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import time
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

from remat_cli import registry
from remat_cli.execution.runner import build_schedule, run_solver
from remat_cli.execution.trace import TraceRecorder
from remat_cli.graph import Graph
from remat_cli.schedule import Schedule, ScheduleError, Step, simulate
from remat_cli.solver import SolveOptions, SolverResult
from remat_cli.util.files import to_devnull


def _process_started() -> float:
    """When this process started, on the time.monotonic() clock (Linux: from /proc, so Python's
    own start-up counts; elsewhere: now, when the CLI imports this module)."""
    now = time.monotonic()
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        ticks = int(fields[19])  # field 22 of proc(5), counted after the command name
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return now - max(0.0, age) if age < 3600 else now
    except (OSError, ValueError, IndexError, AttributeError):
        return now


#: when the process started: a `remat` command's time limit counts from here
COMMAND_STARTED = _process_started()
#: set by the `remat` entry point (:func:`remat_cli.cli.run`): this process is one command
_PROCESS_IS_COMMAND = False


def process_is_command() -> None:
    """Count --time-limit from the process's start: called by the `remat` executable only."""
    global _PROCESS_IS_COMMAND
    _PROCESS_IS_COMMAND = True


def command_started(now: float) -> float:
    """Where --time-limit counts from for a command beginning at `now`: the process's start when
    the process is this command (its start-up and imports count, as a user timing it sees), else
    `now` (the CLI called in a long-lived process: a test runner, a notebook)."""
    return COMMAND_STARTED if _PROCESS_IS_COMMAND else now


_PROGRESS_EVERY = 0.25  # seconds between progress messages from the child


def exit_on_sigterm() -> None:
    """Until the watchdog takes over, SIGTERM ends the command like Ctrl-C does: exit 143, no
    traceback, and no half-written file (write_atomic removes its temp file on the way out)."""

    def stop(signum: int, frame: Any) -> None:
        print("remat: interrupted (SIGTERM)", file=sys.stderr)
        raise SystemExit(128 + signum)

    if sys.stdout is sys.__stdout__:  # not under a test runner, whose own handler stays
        signal.signal(signal.SIGTERM, stop)


def exit_fast(code: int) -> None:
    """Exit now, skipping the interpreter's teardown of numba, OR-Tools and the graph (seconds
    under load, past the time limit) once everything is written and flushed.
    Under a test runner that swapped the standard streams, a plain sys.exit."""
    sys.stdout.flush()
    sys.stderr.flush()
    if sys.stdout is sys.__stdout__ and sys.stderr is sys.__stderr__:
        os._exit(code)
    sys.exit(code)


def tolerance(time_limit: float) -> float:
    """How far past the limit a command may end: max(10%, 2 s)."""
    return max(0.1 * time_limit, 2.0)


@dataclass
class Outcome:
    schedule: Schedule | None
    result: SolverResult
    #: the signal that interrupted the solve (SIGINT, SIGTERM), else None
    signal: int | None = None


Packed = list[tuple[str, str | None, str | None, str | None, str | None, str | None]]


def pack_steps(steps: list[Step]) -> Packed:
    return [(s.op, s.node, s.value, s.device, s.source, s.target) for s in steps]


def unpack_steps(packed: Packed) -> list[Step]:
    # The steps come from our own solver and go through the simulator next: no re-validation.
    return [
        Step.model_construct(op=o, node=n, value=v, device=d, source=a, target=b)
        for o, n, v, d, a, b in packed
    ]


def _rank(graph: Graph, budget: int, steps: list[Step]) -> tuple[tuple[int, float], int, float] | None:
    """Sort key of an incumbent (within budget first, then by cost; over budget: by peak), its
    peak and its cost."""
    try:
        sim = simulate(graph, steps)
    except ScheduleError:
        return None  # run_solver would call it a SolverBug; here it is just not kept
    key = (0, sim.cost) if sim.peak_memory <= budget else (1, float(sim.peak_memory))
    return key, sim.peak_memory, sim.cost


def die_with_parent(parent: int) -> None:
    """Have the kernel SIGKILL this process when `parent` dies (Linux ``PR_SET_PDEATHSIG``): a
    child in a process group of its own outlives a SIGKILLed parent otherwise, and would solve on
    to its time limit with nobody to read it. Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request took hold
        os._exit(1)


def _child(
    conn: Connection, graph: Graph, budget: int, name: str, options: SolveOptions, parent: int
) -> None:
    os.setpgrp()  # the parent kills the whole group: the solver's own worker processes too
    die_with_parent(parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides what an interrupt means
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Locks of the inherited stdio objects may be held by a parent thread (the spinner): fresh ones.
    # stdout carries the schedule JSON: nothing of the solver's (native engines' logs included)
    to_devnull(1)
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    sys.stderr = open(os.dup(2), "w")  # noqa: SIM115
    last_progress = [0.0]
    method = [""]  # the producer a portfolio names in its progress (auto: before each incumbent)

    def incumbent(steps: list[Step]) -> None:
        conn.send(("incumbent", (pack_steps(steps), method[0])))

    def progress(facts: dict[str, Any]) -> None:
        method[0] = str(facts.get("method", method[0]))
        now = time.monotonic()
        if now - last_progress[0] >= _PROGRESS_EVERY:
            last_progress[0] = now
            conn.send(("progress", facts))

    options.on_incumbent = incumbent
    options.on_progress = progress
    try:
        result = registry.get(name).solve(graph, budget, options)
        steps = result.steps
        result.steps = None
        conn.send(("result", (result, pack_steps(steps) if steps is not None else None)))
    except BaseException as e:  # noqa: BLE001 - the parent re-raises it
        try:
            conn.send(("error", e))
        except Exception:  # an exception that does not pickle
            conn.send(("error", RuntimeError(f"{type(e).__name__}: {e}")))
    finally:
        conn.close()


@dataclass
class _Watch:
    """What the parent has heard from the solver's process: the best incumbent so far (within
    budget, then cheapest: warm starts may come late), its producer, and how the watch ended."""

    graph: Graph
    budget: int
    name: str
    options: SolveOptions
    trace: TraceRecorder | None
    incumbent: Packed | None = None
    made_by: str = ""  # the incumbent's producer, where the solver is a portfolio that names it
    best_rank: tuple[int, float] | None = None
    final: tuple[SolverResult, Packed | None] | None = None
    error: BaseException | None = None
    why_stopped: str | None = None

    def take(self, kind: str, payload: Any) -> bool:
        """One message from the child; True when it was the last (its result or its error)."""
        if kind == "incumbent":
            packed, by = payload
            steps = unpack_steps(packed)
            ranked = _rank(self.graph, self.budget, steps)
            if ranked is not None and (self.best_rank is None or ranked[0] < self.best_rank):
                self.incumbent, self.best_rank, self.made_by = packed, ranked[0], by
                if self.trace is not None:
                    self.trace.offer(ranked[1], ranked[2], by or self.name)
                if self.options.on_incumbent is not None:
                    self.options.on_incumbent(steps)
        elif kind == "progress":
            self.options.progress(**payload)
        elif kind == "result":
            self.final = payload
            return True
        elif kind == "error":
            self.error = payload
            return True
        return False

    def listen(self, receive: Connection, deadline: float | None, caught: list[int]) -> None:
        """Take the child's messages until its result, its end, a signal or the deadline."""
        while True:
            if caught:
                self.why_stopped = f"interrupted ({signal.Signals(caught[0]).name})"
                return
            wait = 0.1 if deadline is None else max(0.0, min(0.1, deadline - time.monotonic()))
            if deadline is not None and wait <= 0:
                self.why_stopped = "time limit reached"
                return
            try:
                if not receive.poll(wait):
                    continue
                kind, payload = receive.recv()
            except (EOFError, OSError):
                return  # the child ended without a result: died, or was killed
            if self.take(kind, payload):
                return

    def result(self, exitcode: int | None) -> SolverResult:
        """The solver's own result, else the best incumbent (status feasible) or none."""
        if self.error is not None:
            raise self.error
        if self.final is not None:
            result, packed = self.final
            result.steps = unpack_steps(packed) if packed is not None else None
            return result
        why = self.why_stopped
        if why is None:
            why = f"the solver process died (exit {exitcode})"
            if self.incumbent is None:
                raise RuntimeError(f"solver {self.name!r}: {why} before finding a schedule")
        if self.incumbent is None:
            return SolverResult(steps=None, status="unknown", message=f"{why} before any schedule was found")
        by = f", {self.made_by}'s" if self.made_by else ""
        return SolverResult(
            steps=unpack_steps(self.incumbent), status="feasible", message=f"{why}: best schedule so far{by}"
        )


def _stop(child: multiprocessing.process.BaseProcess) -> None:
    """Kill the child's process group, and the child itself in case the signal came before it
    made that group (an orphan would keep running and hold our stderr open); then reap it."""
    if child.pid is not None and child.is_alive():
        for kill in (os.killpg, os.kill):
            try:
                kill(child.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    if child.pid is not None:
        child.join(5)


def run_guarded(
    graph: Graph,
    budget: int,
    name: str,
    options: SolveOptions,
    command_started: float | None = None,
    trace: TraceRecorder | None = None,
) -> Outcome:
    """`run_solver` under the watchdog (module docstring); callbacks in `options` still fire.

    The time limit counts from `command_started` (the CLI passes COMMAND_STARTED), else from now.
    With `trace`, every improving incumbent is recorded there (timed from where the limit counts)
    and the schedule's `solver.trace` holds them.
    """
    if not hasattr(os, "fork"):
        schedule, result = run_solver(graph, budget, name, options)
        return Outcome(schedule, result)
    solver = registry.get(name)
    params = solver.defaults() | options.params
    t_prepare = time.monotonic()
    solver.prepare()  # e.g. numba compiling on the first run after install: not part of T
    prepared = time.monotonic() - t_prepare
    started = time.monotonic()
    t0 = started if command_started is None else command_started + prepared
    if trace is not None:
        trace.started, trace.solving = t0, True
        trace.trace.solver_started = round(started - t0, 3)
    deadline = None
    child_options = replace(options, params=params, on_incumbent=None, on_progress=None, started=started)
    if options.time_limit is not None:
        limit = options.time_limit
        deadline = t0 + limit + 0.3 * tolerance(limit)
        # the solver is told what is left of T after start-up and loading
        child_options.time_limit = max(0.05 * limit, limit - (started - t0))
        child_options.nominal_limit = limit if options.nominal_limit is None else options.nominal_limit

    caught: list[int] = []
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def on_signal(signum: int, frame: Any) -> None:
        caught.append(signum)

    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    for s in previous:
        signal.signal(s, on_signal)
    child = ctx.Process(
        target=_child, args=(send, graph, budget, name, child_options, os.getpid()), daemon=False
    )
    watch = _Watch(graph, budget, name, options, trace)
    try:
        child.start()
        send.close()
        watch.listen(receive, deadline, caught)
    finally:
        # with or without a result: the child has nothing more to give, and its own teardown
        # (thread pools, JIT caches) should not count against the time limit
        _stop(child)
        receive.close()
        for s, h in previous.items():
            signal.signal(s, h)
    seconds = time.monotonic() - started
    result = watch.result(child.exitcode)
    result.params = params | result.params
    schedule = None
    if result.steps is not None:
        schedule = build_schedule(graph, budget, name, result, seconds, budgets=options.budgets)
        if trace is not None:  # the result itself, where no incumbent reported it
            sim = schedule.summary
            trace.offer(sim.peak_memory, sim.cost, str(result.params.get("winner") or name))
            schedule.solver.trace = trace.snapshot()
    return Outcome(schedule, result, caught[0] if caught else None)
