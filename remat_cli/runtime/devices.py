"""Replay of a multi-device schedule (XEngine, Schuler et al., TACO 2023, §3.1; issue 17 item 5).

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

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from pydantic import BaseModel

from remat_cli.graph import Graph
from remat_cli.runtime.interpret import Interpreter
from remat_cli.runtime.model import ModelMismatch, make_inputs
from remat_cli.runtime.replay import Predicted, RunReport, _compare, _mb, _measured
from remat_cli.runtime.session import RunFailed, RuntimeUnavailable
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
            f"available here (providers: {', '.join(available)}); for CUDA install onnxruntime-gpu "
            "(pip install 'remat-cli[gpu]') and run on a machine with an NVIDIA GPU"
        )
    index = int(suffix) if kind == "cuda" and suffix.isdigit() else 0
    return Placement(device, kind, index)


def transfer(value, source: Placement, target: Placement):
    """A copy of the OrtValue `value` (on `source`) as a new buffer on `target`, through the
    host: onnxruntime's Python API has no device-to-device copy."""
    import onnxruntime as ort

    arr = value.numpy()  # from a GPU a new host array; on the CPU a view of the same buffer
    if source.kind == "cpu" and target.kind == "cpu":
        arr = np.array(arr, copy=True)
    return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), target.kind, target.index)


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

    def transfer(self, value, source: str, target: str):
        """A copy of the OrtValue `value` (on `source`) as a new buffer on `target`."""
        return transfer(value, self.place[source], self.place[target])

    def replay(
        self, steps: Sequence[Step], feeds: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, int], float, float, dict, int]:
        """One replay: (peak live bytes per device, wall s, CPU s, live OrtValues of the graph
        outputs, bytes of copied views counted above the graph's 0)."""
        ids = list(self.place)
        live: dict[str, dict[str, object]] = {d: {} for d in ids}
        size: dict[str, dict[str, int]] = {d: {} for d in ids}
        home = self.engine(self.home)
        for v in self.graph.values:
            if not v.resident:
                continue
            arr = feeds.get(v.id)
            if arr is None:
                arr = home.initializers.get(v.id)
            if arr is None:
                raise RunFailed(f"no data for graph input {v.id!r}")
            live[self.home][v.id] = home._ortvalue(arr)
            size[self.home][v.id] = home._bytes(v.id, live[self.home][v.id])
        mem = {d: sum(size[d].values()) for d in ids}
        peak = dict(mem)
        view_copies = 0
        nodes = self.graph.node_map
        t0, c0 = time.perf_counter(), time.process_time()
        for k, step in enumerate(steps):
            if step.op == "compute":
                d = step.device or self.home
                eng = self.engine(d)
                sess, ins, outs = eng.sessions[step.node]
                try:
                    produced = sess.run_with_ort_values(outs, {i: live[d][i] for i in ins})
                except KeyError as e:
                    raise RunFailed(
                        f"step {k}: {step.node!r} on {d!r} reads {e.args[0]!r}, which is not live there"
                    ) from None
                except Exception as e:  # onnxruntime's own exception types
                    raise RunFailed(f"step {k}: onnxruntime failed on {step.node!r} on {d!r}: {e}") from None
                out_bytes = 0
                for name, val in zip(outs, produced, strict=True):
                    live[d][name] = val
                    size[d][name] = eng._bytes(name, val)
                    out_bytes += size[d][name]
                peak[d] = max(peak[d], mem[d] + out_bytes + nodes[step.node].workspace)
                mem[d] += out_bytes
            elif step.op == "copy":
                a, b, name = step.source or self.home, step.target or self.home, step.value or ""
                if name not in live[a]:
                    raise RunFailed(f"step {k}: copying {name!r} from {a!r}, where it is not live")
                val = self.transfer(live[a][name], a, b)
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
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        outputs = {v: next(live[d][v] for d in ids if v in live[d]) for v in self.graph.outputs}
        return peak, wall, cpu, outputs, view_copies


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
            budget = f" / {_mb(d.budget)}" if d.budget is not None else ""
            err = "" if d.memory_error is None else f" ({d.memory_error:+.1%})"
            rows.insert(
                len(rows) - 1,
                (
                    f"peak on {d.id} ({d.kind})",
                    _mb(d.predicted_peak) + budget,
                    _mb(d.measured_peak) + err,
                    _mb(d.unscheduled_peak),
                ),
            )
        rows.insert(len(rows) - 1, ("copies", f"{self.copies} costing {self.copy_cost:.4g}", "", ""))
        return rows


def run_on_devices(
    model_path: str | Path,
    graph: Graph,
    schedule: Schedule,
    *,
    provider: str = "cpu",
    mode: str = "interpret",
    repeat: int = 5,
    warmup: int = 1,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    threads: int = 1,
) -> DeviceRunReport:
    """:func:`remat_cli.runtime.replay.run_schedule` for a graph with devices (interpret mode)."""
    if mode != "interpret":
        raise ValueError(
            "a schedule on several devices replays in interpret mode only (--mode interpret): "
            "one session per node is what lets each node run on its own device"
        )
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
    model = onnx.load(str(model_path))
    feeds = make_inputs(model, seed=seed, given=inputs, graph=graph)
    engine = DeviceInterpreter(model, graph, [schedule.steps, base_steps], threads=threads)
    lists = [schedule.steps, base_steps]
    for steps in lists:
        for _ in range(warmup):
            engine.replay(steps, feeds)
    times: list[list[float]] = [[], []]
    cpu_times: list[list[float]] = [[], []]
    peaks: list[dict[str, int]] = [{}, {}]
    outs: list[dict[str, np.ndarray]] = [{}, {}]
    view_bytes = 0
    for r in range(max(repeat, 1)):
        for k, steps in enumerate(lists):
            peaks[k], wall, cpu, live, vb = engine.replay(steps, feeds)
            times[k].append(wall)
            cpu_times[k].append(cpu)
            if k == 0:
                view_bytes = vb
            if r == max(repeat, 1) - 1:
                outs[k] = {v: np.asarray(x.numpy()) for v, x in live.items()}
            del live
    resident = graph.resident_bytes
    measured = _measured(max(peaks[0].values()), times[0], cpu_times[0], resident, exact=True)
    unscheduled = _measured(max(peaks[1].values()), times[1], cpu_times[1], resident, exact=True)
    budgets = schedule.budgets or {}
    predicted_by = sim.peak_by_device or {}
    devices = [
        DeviceMeasure(
            id=d,
            kind=p.kind,
            provider=p.provider + (f" (GPU {p.index})" if p.kind == "cuda" else ""),
            budget=budgets.get(d),
            predicted_peak=predicted_by.get(d, 0),
            measured_peak=peaks[0][d],
            unscheduled_peak=peaks[1][d],
            memory_error=_error(peaks[0][d], predicted_by.get(d, 0)),
        )
        for d, p in engine.place.items()
    ]
    any_cuda = any(p.kind == "cuda" for p in engine.place.values())
    names = [o.name for o in model.graph.output]
    match, diff, bad = _compare(outs[0], outs[1], names, exact=not any_cuda)
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
    return DeviceRunReport(
        model=str(model_path),
        graph=graph.name,
        solver=schedule.solver.name,
        budget=schedule.budget,
        provider="cuda" if any_cuda else "cpu",
        mode="interpret",
        threads=threads,
        seed=seed,
        repeat=repeat,
        warmup=warmup,
        outputs_match=match,
        max_abs_diff=diff,
        mismatched_outputs=bad,
        predicted=Predicted(
            peak_memory=sim.peak_memory,
            cost=sim.cost,
            baseline_peak_memory=base_sim.peak_memory,
            baseline_cost=base_sim.cost,
            overhead=sim.cost / base_sim.cost - 1 if base_sim.cost > 0 else 0.0,
        ),
        measured=measured,
        unscheduled=unscheduled,
        memory_error=measured.peak_memory / sim.peak_memory - 1 if sim.peak_memory else 0.0,
        time_overhead=measured.seconds / unscheduled.seconds - 1 if unscheduled.seconds > 0 else 0.0,
        cpu_time_overhead=(
            measured.cpu_seconds / unscheduled.cpu_seconds - 1 if unscheduled.cpu_seconds > 0 else 0.0
        ),
        notes=notes,
        devices=devices,
        copies=sim.copies,
        copy_cost=sim.copy_cost,
    )


def _error(measured: int, predicted: int) -> float | None:
    if predicted == 0:
        return 0.0 if measured == 0 else None
    return measured / predicted - 1
