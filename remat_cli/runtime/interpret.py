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
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from remat_cli.graph import Graph
from remat_cli.runtime.model import elem_types, node_table, single_node_model, view_values
from remat_cli.runtime.session import RunFailed, check_cuda_session, cuda_providers
from remat_cli.schedule import Step


@dataclass
class Interpretation:
    seconds: float  #: median wall time of one replay after warm-up
    peak_memory: int  #: exact peak of live tensor bytes (resident values included)
    outputs: dict[str, np.ndarray]
    times: list[float]
    cpu_times: list[float]


class Interpreter:
    """One session per ONNX node of `graph`, created once and reused by every replay."""

    def __init__(
        self,
        model: onnx.ModelProto,
        graph: Graph,
        *,
        provider: str = "cpu",
        threads: int = 1,
        nodes: Collection[str] | None = None,
        device_id: int = 0,
    ):
        """`nodes`: only these get a session (default all); `device_id`: which GPU for cuda."""
        import onnxruntime as ort

        self.graph = graph
        self.provider = provider
        self.device = "cuda" if provider == "cuda" else "cpu"
        self.device_id = device_id if provider == "cuda" else 0
        table = node_table(model, graph)
        types = elem_types(model)
        providers = cuda_providers(None) if provider == "cuda" else ["CPUExecutionProvider"]
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
        self.sessions: dict[str, tuple] = {}
        for n in graph.nodes:
            if nodes is not None and n.id not in nodes:
                continue
            proto = table[n.id]
            m = single_node_model(model, proto, types)
            try:
                sess = ort.InferenceSession(m.SerializeToString(), so, providers=providers)
            except Exception as e:  # onnxruntime's own exception types
                raise RunFailed(
                    f"onnxruntime cannot run node {n.id!r} ({proto.op_type}) alone: {e}"
                ) from None
            if provider == "cuda":
                check_cuda_session(sess)
            ins = [i.name for i in sess.get_inputs()]
            outs = [t for t in proto.output if t]
            self.sessions[n.id] = (sess, ins, outs)
        self.views = view_values(model)
        self.initializers = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}

    def _ortvalue(self, arr: np.ndarray):
        import onnxruntime as ort

        return ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(arr), self.device, self.device_id)

    def _bytes(self, name: str, v) -> int:
        if name in self.views:
            return 0
        shape = v.shape()
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.element_type())).itemsize
        return int(np.prod(shape, dtype=np.int64)) * itemsize

    def replay(
        self, steps: Sequence[Step], feeds: Mapping[str, np.ndarray]
    ) -> tuple[int, float, float, dict]:
        """One replay: (peak live bytes, wall seconds, CPU seconds, live OrtValues at the end)."""
        live: dict[str, object] = {}
        size: dict[str, int] = {}
        resident = [v.id for v in self.graph.values if v.resident]
        for name in resident:
            arr = feeds.get(name)
            if arr is None:
                arr = self.initializers.get(name)
            if arr is None:
                raise RunFailed(f"no data for graph input {name!r}")
            live[name] = self._ortvalue(arr)
            size[name] = self._bytes(name, live[name])
        mem = sum(size.values())
        peak = mem
        t0, c0 = time.perf_counter(), time.process_time()
        for k, step in enumerate(steps):
            if step.op == "compute":
                sess, ins, outs = self.sessions[step.node]
                try:
                    produced = sess.run_with_ort_values(outs, {i: live[i] for i in ins})
                except KeyError as e:
                    raise RunFailed(
                        f"step {k}: {step.node!r} reads {e.args[0]!r}, which is not live"
                    ) from None
                except Exception as e:  # onnxruntime's own exception types
                    raise RunFailed(f"step {k}: onnxruntime failed on {step.node!r}: {e}") from None
                out_bytes = 0
                for name, v in zip(outs, produced, strict=True):
                    live[name] = v
                    size[name] = self._bytes(name, v)
                    out_bytes += size[name]
                peak = max(peak, mem + out_bytes + self.graph.node_map[step.node].workspace)
                mem += out_bytes
            elif step.value in live:
                # Values the importer added but ONNX never writes (none today) are skipped.
                del live[step.value]
                mem -= size.pop(step.value)
        return peak, time.perf_counter() - t0, time.process_time() - c0, live


def interpret(
    interpreter: Interpreter,
    schedules: Sequence[Sequence[Step]],
    feeds: Mapping[str, np.ndarray],
    *,
    warmup: int = 1,
    repeat: int = 3,
) -> list[Interpretation]:
    """Replay each step list `warmup + repeat` times, the timed replays alternating between
    them (so load on a shared machine hits all alike); per list the median time, the exact
    peak (the same every time) and the graph outputs of its last replay."""
    for steps in schedules:
        for _ in range(warmup):
            interpreter.replay(steps, feeds)
    times: list[list[float]] = [[] for _ in schedules]
    cpu_times: list[list[float]] = [[] for _ in schedules]
    peaks = [0] * len(schedules)
    outputs: list[dict[str, np.ndarray]] = [{} for _ in schedules]
    for r in range(max(repeat, 1)):
        for k, steps in enumerate(schedules):
            peaks[k], seconds, cpu, live = interpreter.replay(steps, feeds)
            times[k].append(seconds)
            cpu_times[k].append(cpu)
            if r == max(repeat, 1) - 1:
                outputs[k] = {v: np.asarray(live[v].numpy()) for v in interpreter.graph.outputs if v in live}
            del live
    return [
        Interpretation(statistics.median(times[k]), peaks[k], outputs[k], times[k], cpu_times[k])
        for k in range(len(schedules))
    ]
