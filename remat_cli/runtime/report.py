"""The report of `remat run` (what the simulator predicted, what was measured, whether the
outputs match), built the same way by the single-device replay (:mod:`remat_cli.runtime.replay`)
and the multi-device one (:mod:`remat_cli.runtime.devices`)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import numpy as np
from pydantic import BaseModel

from remat_cli.graph import Graph
from remat_cli.schedule import Schedule, SimResult

Provider = Literal["cpu", "cuda"]
Mode = Literal["session", "interpret"]


class Predicted(BaseModel):
    peak_memory: int
    cost: float
    baseline_peak_memory: int
    baseline_cost: float
    overhead: float  #: cost / baseline_cost - 1


class Measured(BaseModel):
    peak_memory: int  #: bytes, counted like the simulator (resident values included)
    seconds: float  #: median wall time of one run after warm-up
    peak_above_resident: int  #: what the run itself added
    cpu_seconds: float  #: median CPU seconds of one run (steadier than wall time under load)
    times: list[float]


class RunReport(BaseModel):
    """What `remat run` prints (`--json`) and the bench records."""

    model: str
    graph: str
    solver: str | None
    budget: int | None
    provider: Provider
    mode: Mode
    threads: int
    seed: int
    repeat: int
    warmup: int
    outputs_match: bool
    max_abs_diff: float  #: largest difference over all outputs (0 when bitwise equal)
    mismatched_outputs: list[str]
    predicted: Predicted
    measured: Measured
    unscheduled: Measured
    #: measured peak / predicted peak - 1
    memory_error: float
    #: measured seconds / unscheduled seconds - 1, to set beside predicted.overhead
    time_overhead: float
    #: the same from CPU seconds
    cpu_time_overhead: float
    #: session mode: onnxruntime ran exactly the schedule's compute sequence (profiler check)
    order_kept: bool | None = None
    #: interpret mode with a memory_plan: the replay inside one arena (runtime/arena.py)
    arena: dict[str, Any] | None = None
    #: the same rewritten model (and the unscheduled one) under onnxruntime's default session
    #: settings with only common subexpression elimination off: what a plain deployment sees
    ort_defaults: Measured | None = None
    ort_defaults_unscheduled: Measured | None = None
    #: recomputed node copies in the rewritten model, and how many of them onnxruntime's
    #: optimized graph still holds under its defaults (fusions may absorb some)
    recomputations: int | None = None
    recomputations_kept: int | None = None
    notes: list[str]

    def to_json(self) -> str:
        return self.model_dump_json(indent=1)

    def columns(self) -> list[str]:
        """The table's column heads: the replay's, then onnxruntime's defaults where measured."""
        heads = ["", "predicted", "scheduled run", "unscheduled run"]
        if self.ort_defaults is not None:
            heads += ["scheduled, ORT defaults", "unscheduled, ORT defaults"]
        return heads

    def table(self) -> list[tuple[str, ...]]:
        """Rows (quantity, predicted, measured, unscheduled[, the same two under onnxruntime's
        defaults]) for the CLI's table."""
        rows = self._replay_rows()
        d, du = self.ort_defaults, self.ort_defaults_unscheduled
        if d is None or du is None:
            return rows
        p = self.predicted.peak_memory
        extra = {
            "peak memory": (megabytes(d.peak_memory), megabytes(du.peak_memory)),
            "peak vs predicted": (
                (f"{d.peak_memory / p - 1:+.1%}", f"{du.peak_memory / p - 1:+.1%}") if p else ("", "")
            ),
            "time": (f"{d.seconds * 1e3:.1f} ms", f"{du.seconds * 1e3:.1f} ms"),
            "CPU time": (f"{d.cpu_seconds * 1e3:.1f} ms", f"{du.cpu_seconds * 1e3:.1f} ms"),
            "time overhead": (f"{d.seconds / du.seconds - 1:+.1%}" if du.seconds > 0 else "", ""),
            "recomputations kept": (f"{self.recomputations_kept} of {self.recomputations}", ""),
        }
        out = [(*r, *extra.get(r[0], ("", ""))) for r in rows]
        return out + [("recomputations kept", "", "", "", *extra["recomputations kept"])]

    def _replay_rows(self) -> list[tuple[str, ...]]:
        p, m, u = self.predicted, self.measured, self.unscheduled
        return [
            ("peak memory", megabytes(p.peak_memory), megabytes(m.peak_memory), megabytes(u.peak_memory)),
            (
                "peak vs predicted",
                "",
                f"{self.memory_error:+.1%}",
                f"{u.peak_memory / p.peak_memory - 1:+.1%}" if p.peak_memory else "",
            ),
            ("time", "", f"{m.seconds * 1e3:.1f} ms", f"{u.seconds * 1e3:.1f} ms"),
            ("CPU time", "", f"{m.cpu_seconds * 1e3:.1f} ms", f"{u.cpu_seconds * 1e3:.1f} ms"),
            ("time overhead", f"{p.overhead:+.1%}", f"{self.time_overhead:+.1%}", ""),
            ("CPU time overhead", f"{p.overhead:+.1%}", f"{self.cpu_time_overhead:+.1%}", ""),
            ("outputs match", "", "yes" if self.outputs_match else "NO", ""),
        ]


def megabytes(b: int) -> str:
    return f"{b / 1e6:,.2f} MB"  # as the CLI's other tables


def predicted_figures(sim: SimResult, base_sim: SimResult) -> Predicted:
    """The simulator's figures for the schedule (`sim`) and the unscheduled baseline (`base_sim`)."""
    return Predicted(
        peak_memory=sim.peak_memory,
        cost=sim.cost,
        baseline_peak_memory=base_sim.peak_memory,
        baseline_cost=base_sim.cost,
        overhead=sim.cost / base_sim.cost - 1 if base_sim.cost > 0 else 0.0,
    )


R = TypeVar("R", bound=RunReport)


def build_report(
    cls: type[R],
    model_path: str | Path,
    graph: Graph,
    schedule: Schedule,
    predicted: Predicted,
    measured: Measured,
    unscheduled: Measured,
    compared: tuple[bool, float, list[str]],
    notes: list[str],
    **fields: Any,
) -> R:
    """A `cls` report: the fields every replay fills the same way, the ratios between the
    measurements and the prediction, and `fields` (the run's settings, `cls`'s own fields)."""
    match, diff, bad = compared
    return cls(
        model=str(model_path),
        graph=graph.name,
        solver=schedule.solver.name,
        budget=schedule.budget,
        outputs_match=match,
        max_abs_diff=diff,
        mismatched_outputs=bad,
        predicted=predicted,
        measured=measured,
        unscheduled=unscheduled,
        memory_error=measured.peak_memory / predicted.peak_memory - 1 if predicted.peak_memory else 0.0,
        time_overhead=measured.seconds / unscheduled.seconds - 1 if unscheduled.seconds > 0 else 0.0,
        cpu_time_overhead=(
            measured.cpu_seconds / unscheduled.cpu_seconds - 1 if unscheduled.cpu_seconds > 0 else 0.0
        ),
        notes=notes,
        **fields,
    )


def measured_figures(
    peak: int, times: list[float], cpu_times: list[float], resident: int, *, exact: bool
) -> Measured:
    # Interpret mode's peak already includes the resident values; session mode's does not.
    total = peak if exact else peak + resident
    return Measured(
        peak_memory=int(total),
        seconds=statistics.median(times),
        peak_above_resident=int(total - resident),
        cpu_seconds=statistics.median(cpu_times),
        times=[round(t, 6) for t in times],
    )


def compare_outputs(
    a: Mapping[str, np.ndarray], b: Mapping[str, np.ndarray], names: list[str], *, exact: bool
) -> tuple[bool, float, list[str]]:
    bad: list[str] = []
    worst = 0.0
    for n in names:
        x, y = a.get(n), b.get(n)
        if x is None or y is None or x.shape != y.shape or x.dtype != y.dtype:
            bad.append(n)
            continue
        if x.size and np.issubdtype(x.dtype, np.number):
            worst = max(
                worst, float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64)), initial=0.0))
            )
        if exact:
            same = np.array_equal(x, y, equal_nan=np.issubdtype(x.dtype, np.inexact))
        else:
            same = bool(np.allclose(x, y, rtol=1e-4, atol=1e-5, equal_nan=True))
        if not same:
            bad.append(n)
    return not bad, worst, bad
