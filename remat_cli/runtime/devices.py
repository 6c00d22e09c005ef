"""Replay of a multi-device schedule (XEngine, Schuler et al., TACO 2023, §3.1).

Interpret mode on several devices: every ``compute`` runs the node's own one-node session on
the onnxruntime provider of its device, every ``copy`` moves the tensor between devices, every
``free`` drops it on the device it names. The simulator's rules (:mod:`remat_cli.devices`) are
followed step for step, and each device's live tensors are accounted separately.

Devices map to providers by their ``kind`` (else the prefix of their id): ``cpu`` →
CPUExecutionProvider, ``cuda`` → CUDAExecutionProvider on GPU N for an id ``cuda:N`` (else
0). Several ``cpu`` devices share the CPU provider but keep their own live tensors, so a
machine without a GPU replays copies and per-device peaks too. Any other kind, or CUDA where
onnxruntime has no CUDA provider, is :class:`RuntimeUnavailable` (``remat run`` exits 2).

Measured peak of device d = the largest "live tensor bytes on d + the outputs being written
on d + the node's workspace" over computes on d, and "live bytes on d + the copied tensor"
over copies to d, each byte count taken from the tensor onnxruntime actually holds — the
simulator's definition, so measured and predicted agree exactly when the importer's sizes are
the runtime's (tolerance 0; tests/test_xengine_runtime.py). As in single-device interpret mode
a view (Reshape, Squeeze, ...) counts 0 bytes where it is computed, since it aliases its base;
a *copy* of a view is a buffer of its own on the target, counted at its real size (the graph
says 0, so such a copy shows as measured above predicted and the report notes it).

Time is the wall time of the whole replay, copies included; nothing overlaps (as the cost
model, eq. 1). The unscheduled reference runs the baseline — everything on the home device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from pydantic import BaseModel

from remat_cli.graph import Graph
from remat_cli.importers.onnx import fit_ir_version
from remat_cli.runtime.interpret import Interpreter, alternate
from remat_cli.runtime.model import ModelMismatch, make_inputs
from remat_cli.runtime.node_sessions import ReplayClock
from remat_cli.runtime.ort import RunFailed, RuntimeUnavailable, cuda_install_hint
from remat_cli.runtime.report import (
    RunReport,
    build_report,
    compare_outputs,
    measured_figures,
    megabytes,
    predicted_figures,
)
from remat_cli.schedule import Schedule, ScheduleError, Step, baseline_steps, simulate

#: device kind -> the onnxruntime provider that runs it
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


@dataclass(frozen=True)
class Placement:
    """Where a graph device runs: an onnxruntime provider kind and, for CUDA, the GPU index."""

    device: str
    kind: str
    index: int = 0

    @property
    def key(self) -> tuple[str, int]:
        return (self.kind, self.index)

    @property
    def provider(self) -> str:
        return PROVIDERS[self.kind]


def placements(graph: Graph) -> dict[str, Placement]:
    """Each device of `graph` on its provider; RuntimeUnavailable for an unknown kind or a
    provider this onnxruntime lacks."""
    return {d.id: place(d.id, d.kind) for d in graph.devices or []}


def place(device: str, kind: str | None = None) -> Placement:
    """`device` (kind `kind`, else its id's prefix) on its provider; RuntimeUnavailable for an
    unknown kind or a provider this onnxruntime lacks."""
    import onnxruntime as ort

    prefix, _, suffix = device.partition(":")
    kind = (kind or prefix).lower()
    if kind not in PROVIDERS:
        raise RuntimeUnavailable(
            f"device {device!r} has kind {kind!r}: remat maps kind cpu to CPUExecutionProvider "
            "and cuda to CUDAExecutionProvider (set each device's 'kind' in the graph)"
        )
    available = ort.get_available_providers()
    if PROVIDERS[kind] not in available:
        raise RuntimeUnavailable(
            f"device {device!r} (kind {kind}) needs onnxruntime's {PROVIDERS[kind]}, which is not "
            f"available here (providers: {', '.join(available)}); for CUDA {cuda_install_hint()}"
        )
    index = int(suffix) if kind == "cuda" and suffix.isdigit() else 0
    return Placement(device, kind, index)


def transfer(value, target: Placement):
    """A copy of the OrtValue `value` as a new buffer on `target`, through the host:
    onnxruntime's Python API has no device-to-device copy."""
    import onnxruntime as ort

    # From device memory a new host array; from host memory a view of the same buffer, which
    # dies with `value`. Where the value lives is asked of the value, not of the device it was
    # placed on: on an H200 a CUDA session's plain run returned host OrtValues, and the view of
    # one freed by the next free step turned the output into garbage.
    arr = value.numpy()
    if value.device_name().lower() == "cpu" and target.kind == "cpu":
        arr = np.array(arr, copy=True)
    return ort.OrtValue.ortvalue_from_numpy(np.require(arr, requirements="C"), target.kind, target.index)


class DeviceInterpreter:
    """Per-node sessions on every provider the schedules use, and the replay across devices."""

    def __init__(
        self, model: onnx.ModelProto, graph: Graph, schedules: Sequence[Sequence[Step]], *, threads: int = 1
    ):
        self.graph = graph
        self.home = graph.home_device or ""
        self.place = placements(graph)
        need: dict[tuple[str, int], set[str]] = {self.place[self.home].key: set()}
        for steps in schedules:
            for s in steps:
                if s.op == "compute" and s.node is not None:
                    need.setdefault(self.place[s.device or self.home].key, set()).add(s.node)
        self.engines = {
            key: Interpreter(model, graph, provider=key[0], threads=threads, nodes=nodes, device_id=key[1])
            for key, nodes in need.items()
        }
        self.views = self.engines[self.place[self.home].key].views

    def engine(self, device: str) -> Interpreter:
        return self.engines[self.place[device].key]

    def transfer(self, value, target: str):
        """A copy of the OrtValue `value` as a new buffer on `target`."""
        return transfer(value, self.place[target])

    def replay(
        self, steps: Sequence[Step], feeds: Mapping[str, np.ndarray]
    ) -> tuple[tuple[dict[str, int], int], float, float, dict]:
        """One replay: ((peak live bytes per device, bytes of copied views counted above the
        graph's 0), wall s, CPU s, live OrtValues of the graph outputs)."""
        ids = list(self.place)
        home = self.engine(self.home)
        live: dict[str, dict[str, object]] = {d: {} for d in ids}
        size: dict[str, dict[str, int]] = {d: {} for d in ids}
        live[self.home] = home.resident(feeds)
        size[self.home] = {name: home._bytes(name, v) for name, v in live[self.home].items()}
        mem = {d: sum(size[d].values()) for d in ids}
        peak = dict(mem)
        view_copies = 0
        nodes = self.graph.node_map
        # the engines' sessions made on first use (CUDA) are not the replay's time
        clock = ReplayClock(e.sessions for e in self.engines.values())
        for k, step in enumerate(steps):
            if step.op == "compute":
                d = step.device or self.home
                out_bytes = self.engine(d).compute(k, step.node, live[d], size[d], on=d)
                peak[d] = max(peak[d], mem[d] + out_bytes + nodes[step.node].workspace)
                mem[d] += out_bytes
            elif step.op == "copy":
                a, b, name = step.source or self.home, step.target or self.home, step.value or ""
                if name not in live[a]:
                    raise RunFailed(f"step {k}: copying {name!r} from {a!r}, where it is not live")
                val = self.transfer(live[a][name], b)
                n = self.engine(b)._bytes("", val)  # a real buffer, even for a view
                if name in self.views:
                    view_copies += n
                live[b][name], size[b][name] = val, n
                peak[b] = max(peak[b], mem[b] + n)
                mem[b] += n
            else:
                d = step.device or self.home
                if step.value in live[d]:
                    del live[d][step.value]
                    mem[d] -= size[d].pop(step.value)
        wall, cpu = clock.stop()
        outputs = {v: next(live[d][v] for d in ids if v in live[d]) for v in self.graph.outputs}
        return (peak, view_copies), wall, cpu, outputs


class DeviceMeasure(BaseModel):
    """One device's peak: predicted by the simulator, measured in the scheduled and the
    unscheduled (everything on home) replays."""

    id: str
    kind: str
    provider: str
    budget: int | None
    predicted_peak: int
    measured_peak: int
    unscheduled_peak: int
    #: measured / predicted - 1 (None when nothing was predicted on this device)
    memory_error: float | None


class DeviceRunReport(RunReport):
    """:class:`RunReport` with each device's peaks and the schedule's copies."""

    devices: list[DeviceMeasure]
    copies: int
    copy_cost: float

    def table(self) -> list[tuple[str, str, str, str]]:
        rows = super().table()
        for d in self.devices:
            budget = f" / {megabytes(d.budget)}" if d.budget is not None else ""
            err = "" if d.memory_error is None else f" ({d.memory_error:+.1%})"
            rows.insert(
                len(rows) - 1,
                (
                    f"peak on {d.id} ({d.kind})",
                    megabytes(d.predicted_peak) + budget,
                    megabytes(d.measured_peak) + err,
                    megabytes(d.unscheduled_peak),
                ),
            )
        rows.insert(len(rows) - 1, ("copies", f"{self.copies} costing {self.copy_cost:.4g}", "", ""))
        return rows


def run_on_devices(
    model_path: str | Path,
    graph: Graph,
    schedule: Schedule,
    *,
    provider: str,
    inputs: Mapping[str, np.ndarray] | None,
    **settings: int,
) -> DeviceRunReport:
    """:func:`remat_cli.runtime.replay.run_schedule` for a graph with devices (interpret mode;
    `settings`: its repeat, warmup, seed and threads)."""
    repeat, warmup, seed, threads = (settings[k] for k in ("repeat", "warmup", "seed", "threads"))
    notes: list[str] = []
    if provider != "cpu":
        notes.append(f"--provider {provider} ignored: each device runs on the provider of its kind")
    if schedule.graph.sha256 != graph.sha256():
        notes.append("the graph's hash differs from the schedule's: predictions are this graph's")
    try:
        sim = simulate(graph, schedule.steps)
    except ScheduleError as e:
        raise ModelMismatch(f"the schedule does not fit this graph: {e}") from None
    base_steps = baseline_steps(graph)
    base_sim = simulate(graph, base_steps)
    model = fit_ir_version(onnx.load(str(model_path)))
    feeds = make_inputs(model, seed=seed, given=inputs, graph=graph)
    engine = DeviceInterpreter(model, graph, [schedule.steps, base_steps], threads=threads)
    run, ref = alternate(
        lambda steps: engine.replay(steps, feeds),
        [schedule.steps, base_steps],
        graph.outputs,
        warmup=warmup,
        repeat=repeat,
    )
    (peaks, view_bytes), (ref_peaks, _) = run[0], ref[0]
    resident = graph.resident_bytes
    measured = measured_figures(max(peaks.values()), run[1], run[2], resident, exact=True)
    unscheduled = measured_figures(max(ref_peaks.values()), ref[1], ref[2], resident, exact=True)
    budgets = schedule.budgets or {}
    predicted_by = sim.peak_by_device or {}
    devices = [
        DeviceMeasure(
            id=d,
            kind=p.kind,
            provider=p.provider + (f" (GPU {p.index})" if p.kind == "cuda" else ""),
            budget=budgets.get(d),
            predicted_peak=predicted_by.get(d, 0),
            measured_peak=peaks[d],
            unscheduled_peak=ref_peaks[d],
            memory_error=_error(peaks[d], predicted_by.get(d, 0)),
        )
        for d, p in engine.place.items()
    ]
    any_cuda = any(p.kind == "cuda" for p in engine.place.values())
    names = [o.name for o in model.graph.output]
    compared = compare_outputs(run[3], ref[3], names, exact=not any_cuda)
    notes.append(
        "interpret mode on several devices: per-device peak = exact live tensor bytes on that device "
        "(views 0 where computed), copies included; the unscheduled run is everything on "
        f"{graph.home_device!r}"
    )
    if view_bytes:
        notes.append(f"copies of views hold {view_bytes} bytes the graph counts as 0")
    if any_cuda:
        notes.append(
            "outputs compared with numpy.allclose (rtol 1e-4, atol 1e-5): CUDA and CPU kernels differ"
        )
    if threads == 1:
        notes.append("one intra-op thread (ScatterND/ScatterElements add-reductions are not exact on more)")
    return build_report(
        DeviceRunReport,
        model_path,
        graph,
        schedule,
        predicted_figures(sim, base_sim),
        measured,
        unscheduled,
        compared,
        notes,
        provider="cuda" if any_cuda else "cpu",
        mode="interpret",
        **settings,
        devices=devices,
        copies=sim.copies,
        copy_cost=sim.copy_cost,
    )


def _error(measured: int, predicted: int) -> float | None:
    if predicted == 0:
        return 0.0 if measured == 0 else None
    return measured / predicted - 1
