"""Interpret mode: replay a schedule step by step, one small InferenceSession per ONNX node.

Every tensor is an OrtValue in a dict, added when its node is computed and dropped exactly
at the schedule's ``free`` steps, so the live bytes are known exactly at every step: the
measured peak is the largest "live bytes + bytes of the outputs being written" over compute
steps, with each byte count taken from the tensor onnxruntime actually produced. View
outputs (Reshape, Squeeze, ...) count 0 bytes, as they alias their base in a whole-model
session, and the base stays live as long as the schedule keeps it.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import onnx

from remat_cli.graph import Graph
from remat_cli.importers.onnx import draws_random
from remat_cli.runtime.model import elem_types, node_table, single_node_model, view_values
from remat_cli.runtime.node_sessions import Entry, NodeSessions, ReplayClock, device_short
from remat_cli.runtime.ort import RunFailed, check_cuda_session, cuda_providers
from remat_cli.schedule import Step

#: what one replay reports as its peak: bytes, or per device (runtime/devices.py)
P = TypeVar("P")


@dataclass
class Interpretation:
    seconds: float  #: median wall time of one replay after warm-up
    peak_memory: int  #: exact peak of live tensor bytes (resident values included)
    outputs: dict[str, np.ndarray]
    times: list[float]
    cpu_times: list[float]


class Interpreter:
    """One session per ONNX node of `graph`, made once and reused by every replay (on CUDA as
    many as the device holds, `NodeSessions`)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        graph: Graph,
        *,
        provider: str = "cpu",
        threads: int = 1,
        nodes: Collection[str] | None = None,
        device_id: int = 0,
        full: Callable[[], bool] | None = None,
    ):
        """`nodes`: only these get a session (default all); `device_id`: which GPU for cuda;
        `full`: whether a new session must first drop one (`NodeSessions`; default: on CUDA
        while the GPU has less than node_sessions.RESERVE free, on the CPU never)."""
        import onnxruntime as ort

        self.graph = graph
        self.provider = provider
        self.device = "cuda" if provider == "cuda" else "cpu"
        self.device_id = device_id if provider == "cuda" else 0
        table = node_table(model, graph)
        types = elem_types(model)
        providers = cuda_providers() if provider == "cuda" else ["CPUExecutionProvider"]
        if provider == "cuda":
            providers[0][1]["device_id"] = str(device_id)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.enable_cpu_mem_arena = False
        so.enable_mem_pattern = False
        so.intra_op_num_threads = threads
        so.inter_op_num_threads = 1
        # Idle spinning threads would steal the cores between the many short runs.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        so.log_severity_level = 3

        def make(node: str) -> Entry:
            proto = table[node]
            m = single_node_model(model, proto, types)
            try:
                sess = ort.InferenceSession(m.SerializeToString(), so, providers=providers)
            except Exception as e:  # onnxruntime's own exception types
                raise RunFailed(
                    f"onnxruntime cannot run node {node!r} ({proto.op_type}) alone: {e}"
                ) from None
            if provider == "cuda":
                check_cuda_session(sess)
            return sess, [i.name for i in sess.get_inputs()], [t for t in proto.output if t]

        eager = full is None and provider != "cuda"
        if full is None:
            full = device_short(device_id) if provider == "cuda" else lambda: False
        ids = [n.id for n in graph.nodes if nodes is None or n.id in nodes]
        #: node id -> (session, input names, output names); on CUDA made on first use (node_sessions.py)
        self.sessions = NodeSessions(make, ids, full)
        if eager:
            self.sessions.make_all()
        self.views = view_values(model)
        # a seeded random op's kernel draws on from where its last run ended: its first draw is
        # kept and given to every later replay, as the whole model's one run per replay draws
        self.random = {n for n in ids if draws_random(table[n])}
        self.drawn: dict[str, list] = {}
        self.initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}

    def _ortvalue(self, arr: np.ndarray):
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(
            np.require(arr, requirements="C"), self.device, self.device_id
        )

    def _bytes(self, name: str, v) -> int:
        if name in self.views:
            return 0
        shape = v.shape()
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.element_type())).itemsize
        return int(np.prod(shape, dtype=np.int64)) * itemsize

    def resident(self, feeds: Mapping[str, np.ndarray]) -> dict[str, object]:
        """An OrtValue on this engine's device for each resident value of the graph: its feed,
        else its initializer; RunFailed when it has neither."""
        live: dict[str, object] = {}
        for v in self.graph.values:
            if not v.resident:
                continue
            arr = feeds.get(v.id)
            if arr is None:
                arr = self.initializers.get(v.id)
            if arr is None:
                raise RunFailed(f"no data for graph input {v.id!r}")
            live[v.id] = self._ortvalue(arr)
        return live

    def compute(
        self, k: int, node: str, live: dict[str, object], size: dict[str, int], on: str | None = None
    ) -> int:
        """Run step `k`, computing `node` from `live`; its outputs join `live` and `size`.
        Returns their bytes. `on` names the device in the errors (several-device replays)."""
        _, ins, outs = self.sessions[node]
        where, there = ("", "") if on is None else (f" on {on!r}", " there")
        try:
            produced = self.run_node(node, {i: live[i] for i in ins})
        except KeyError as e:
            raise RunFailed(
                f"step {k}: {node!r}{where} reads {e.args[0]!r}, which is not live{there}"
            ) from None
        except Exception as e:  # onnxruntime's own exception types
            raise RunFailed(f"step {k}: onnxruntime failed on {node!r}{where}: {e}") from None
        out_bytes = 0
        for name, v in zip(outs, produced, strict=True):
            live[name] = v
            size[name] = self._bytes(name, v)
            out_bytes += size[name]
        return out_bytes

    def run_node(self, node: str, feeds: Mapping[str, object]) -> list:
        """`node`'s outputs from `feeds`; a random node's first draw every time (see __init__)."""
        if node in self.drawn:
            return self.drawn[node]
        sess, _, outs = self.sessions[node]
        if self.device == "cuda":
            # A plain run returns host OrtValues even from a CUDA session (seen on an H200):
            # bound outputs stay in device memory, where the next node reads them.
            binding = sess.io_binding()
            for name, v in feeds.items():
                binding.bind_ortvalue_input(name, v)
            for o in outs:
                binding.bind_output(o, "cuda", self.device_id)
            sess.run_with_iobinding(binding)
            produced = binding.get_outputs()
        else:
            produced = sess.run_with_ort_values(outs, dict(feeds))
        if node in self.random:
            self.drawn[node] = produced
        return produced

    def replay(
        self, steps: Sequence[Step], feeds: Mapping[str, np.ndarray]
    ) -> tuple[int, float, float, dict]:
        """One replay: (peak live bytes, wall seconds, CPU seconds, live OrtValues at the end)."""
        live = self.resident(feeds)
        size = {name: self._bytes(name, v) for name, v in live.items()}
        mem = sum(size.values())
        peak = mem
        clock = ReplayClock([self.sessions])
        for k, step in enumerate(steps):
            if step.op == "compute":
                out_bytes = self.compute(k, step.node, live, size)
                peak = max(peak, mem + out_bytes + self.graph.node_map[step.node].workspace)
                mem += out_bytes
            elif step.value in live:
                # Values the importer added but ONNX never writes (none today) are skipped.
                del live[step.value]
                mem -= size.pop(step.value)
        wall, cpu = clock.stop()  # making a session (CUDA, on first use) is not running the schedule
        return peak, wall, cpu, live


def alternate(
    replay: Callable[[Sequence[Step]], tuple[P, float, float, Mapping[str, Any]]],
    schedules: Sequence[Sequence[Step]],
    outputs: Sequence[str],
    *,
    warmup: int = 1,
    repeat: int = 3,
) -> list[tuple[P, list[float], list[float], dict[str, np.ndarray]]]:
    """Call `replay` (one replay of a step list: (peak, wall s, CPU s, live OrtValues)) on each
    step list `warmup + repeat` times, the timed replays alternating between them (so load on a
    shared machine hits all alike); per list the peak of its last replay, the wall and CPU
    times, and the graph `outputs` of its last replay."""
    for steps in schedules:
        for _ in range(warmup):
            replay(steps)
    times: list[list[float]] = [[] for _ in schedules]
    cpu_times: list[list[float]] = [[] for _ in schedules]
    peaks: list[Any] = [None] * len(schedules)
    values: list[dict[str, np.ndarray]] = [{} for _ in schedules]
    for r in range(max(repeat, 1)):
        for k, steps in enumerate(schedules):
            peaks[k], seconds, cpu, live = replay(steps)
            times[k].append(seconds)
            cpu_times[k].append(cpu)
            if r == max(repeat, 1) - 1:
                values[k] = {v: np.asarray(live[v].numpy()) for v in outputs if v in live}
            del live
    return [(peaks[k], times[k], cpu_times[k], values[k]) for k in range(len(schedules))]


def interpret(
    interpreter: Interpreter,
    schedules: Sequence[Sequence[Step]],
    feeds: Mapping[str, np.ndarray],
    *,
    warmup: int = 1,
    repeat: int = 3,
) -> list[Interpretation]:
    """Replay each step list `warmup + repeat` times (:func:`alternate`); per list the median
    time, the exact peak (the same every time) and the graph outputs of its last replay."""
    runs = alternate(
        lambda steps: interpreter.replay(steps, feeds),
        schedules,
        interpreter.graph.outputs,
        warmup=warmup,
        repeat=repeat,
    )
    return [Interpretation(statistics.median(t), peak, out, t, c) for peak, t, c, out in runs]
