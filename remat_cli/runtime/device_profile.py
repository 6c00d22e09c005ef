"""Device profiles: each node's time on each onnxruntime provider and the copy cost per byte
between devices (XEngine, Schuler et al., TACO 2023, §3.1 takes per-device
operator times and transfer times as the MILP's inputs, measured on the target machine).

Node times come from the per-node sessions interpret mode replays with
(:class:`remat_cli.runtime.interpret.Interpreter`; the importer's ``--cost profile`` runs the
CPU provider only and feeds random data): the nodes run in topological order on real data
(seeded random inputs, the model's initializers, every later input the earlier nodes' real
outputs), each one warm-up run and then the median of `runs` timed runs, with its inputs
already on the device, so a node's time excludes transfers. Devices of the same kind and index
(e.g. ``cpu`` and ``cpu:1``) share one provider and so one measurement.

Copy cost between two devices: the transfer :func:`remat_cli.runtime.devices.transfer` performs
in a replay, timed for float32 tensors of a few sizes (median of `runs` each), fitted by least
squares on relative residuals as ``latency + bytes / bandwidth`` — the graph's ``links`` (docs/FORMATS.md §3).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from remat_cli.graph import Graph
from remat_cli.runtime.devices import Placement, place, transfer
from remat_cli.runtime.interpret import Interpreter
from remat_cli.runtime.model import make_inputs
from remat_cli.runtime.ort import RunFailed, RuntimeUnavailable

#: bytes of the float32 tensors timed per link: latency dominates the first, bandwidth the last
COPY_SIZES = (4 << 10, 256 << 10, 4 << 20, 32 << 20)


@dataclass(frozen=True)
class LinkFit:
    source: str
    target: str
    latency: float  #: seconds per copy
    bandwidth: float  #: bytes per second
    samples: tuple[tuple[int, float], ...]  #: (bytes, median seconds)


@dataclass(frozen=True)
class DeviceProfile:
    graph: Graph  #: the import with devices, device_costs (seconds) and links
    node_seconds: dict[str, float]  #: per device: the sum of its node times
    links: list[LinkFit]
    unavailable: dict[str, str]  #: requested devices left out, with the reason


def parse_devices(text: str) -> list[str]:
    """``cpu,cuda`` -> device ids (``cuda`` alone becomes ``cuda:0``); ValueError when empty or
    repeated."""
    ids = []
    for part in text.split(","):
        d = part.strip()
        if not d:
            raise ValueError(f"--devices {text!r}: an empty device name")
        ids.append("cuda:0" if d == "cuda" else d)
    if len(set(ids)) != len(ids):
        raise ValueError(f"--devices {text!r}: a device is named twice")
    return ids


def node_times(
    model: onnx.ModelProto,
    graph: Graph,
    where: Placement,
    feeds: Mapping[str, np.ndarray],
    *,
    runs: int = 5,
    threads: int = 1,
) -> dict[str, float]:
    """Seconds per node of `graph` on `where`'s provider (the module docstring says how)."""
    engine = Interpreter(model, graph, provider=where.kind, threads=threads, device_id=where.index)
    live = engine.resident(feeds)
    order = graph.topo_order
    last_use = {v: k for k, nid in enumerate(order) for v in graph.node_map[nid].inputs}
    keep = {v.id for v in graph.values if v.resident} | set(graph.outputs)
    out: dict[str, float] = {}
    for k, nid in enumerate(order):
        sess, ins, outs = engine.sessions[nid]
        feed = {i: live[i] for i in ins}
        try:
            produced = sess.run_with_ort_values(outs, feed)  # warm-up
            times = []
            for _ in range(runs):
                t0 = time.perf_counter()
                produced = sess.run_with_ort_values(outs, feed)
                times.append(time.perf_counter() - t0)
        except Exception as e:  # onnxruntime's own exception types
            raise RunFailed(f"onnxruntime failed on {nid!r} on {where.device!r}: {e}") from None
        out[nid] = max(statistics.median(times), 1e-9)
        live.update(zip(outs, produced, strict=True))
        for v in graph.node_map[nid].inputs:
            if last_use.get(v) == k and v not in keep:
                live.pop(v, None)
    return out


def copy_link(
    source: Placement, target: Placement, *, runs: int = 5, sizes: Sequence[int] = COPY_SIZES
) -> LinkFit:
    """Time :func:`transfer` from `source` to `target` for each size and fit latency + bytes /
    bandwidth (least squares on relative residuals; a negative intercept is clipped to 0)."""
    import onnxruntime as ort

    samples = []
    for size in sizes:
        arr = np.random.default_rng(0).random(size // 4, dtype=np.float32)
        value = ort.OrtValue.ortvalue_from_numpy(arr, source.kind, source.index)
        transfer(value, target)  # warm-up
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            copy = transfer(value, target)  # synchronous: a plain host<->device memcpy
            times.append(time.perf_counter() - t0)
            del copy
        samples.append((size, statistics.median(times)))
    latency, bandwidth = fit_link(samples)
    return LinkFit(source.device, target.device, latency, bandwidth, tuple(samples))


def fit_link(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """(latency, bandwidth) of ``seconds = latency + bytes / bandwidth`` through (bytes, seconds)
    samples, by least squares on relative residuals (weights 1/seconds: the small copies fix the
    latency, the large ones the bandwidth); a negative intercept is clipped to 0, and a slope
    that noise made non-positive becomes the largest copy's average rate."""
    x = np.array([b for b, _ in samples], dtype=np.float64)
    y = np.array([t for _, t in samples], dtype=np.float64)
    slope, intercept = np.polyfit(x, y, 1, w=1.0 / np.maximum(y, 1e-12))
    if slope <= 0:
        slope = y[-1] / x[-1]
    return max(float(intercept), 0.0), float(1.0 / slope)


def profile_devices(
    model: onnx.ModelProto,
    graph: Graph,
    devices: Sequence[str],
    *,
    runs: int = 5,
    threads: int = 1,
    seed: int = 0,
) -> DeviceProfile:
    """`graph` (the import of `model`) with `devices`: the first is home; those whose provider is
    missing, or listed but unable to start (onnxruntime-gpu on a machine without a GPU or CUDA
    libraries), are left out and named in ``unavailable``. RuntimeUnavailable when none is left."""
    placed: list[Placement] = []
    unavailable: dict[str, str] = {}
    for d in devices:
        try:
            placed.append(place(d))
        except RuntimeUnavailable as e:
            unavailable[d] = str(e)
    none_left = "no requested device can run here: "
    if not placed:
        raise RuntimeUnavailable(none_left + "; ".join(unavailable.values()))
    feeds = make_inputs(model, seed=seed, graph=graph)
    by_key: dict[tuple[str, int], dict[str, float]] = {}
    for p in placed:
        if p.key in by_key or p.device in unavailable:
            continue
        try:
            by_key[p.key] = node_times(model, graph, p, feeds, runs=runs, threads=threads)
        except RuntimeUnavailable as e:  # listed, but it cannot start (onnxruntime-gpu, no GPU)
            unavailable.update({q.device: str(e) for q in placed if q.key == p.key})
    placed = [p for p in placed if p.key in by_key]
    if not placed:
        raise RuntimeUnavailable(none_left + "; ".join(unavailable.values()))
    # Sizes up to the graph's largest tensor: a fresh buffer of 32 MiB costs page faults a model
    # of small tensors never pays.
    largest = max((v.size for v in graph.values), default=0)
    sizes = [s for s in COPY_SIZES if s <= max(largest, COPY_SIZES[1])]
    links = [copy_link(a, b, runs=runs, sizes=sizes) for a in placed for b in placed if a is not b]
    data = graph.model_dump(exclude_none=True, by_alias=True)
    home = placed[0]
    for n in data["nodes"]:
        n["cost"] = by_key[home.key][n["id"]]
        n["device_costs"] = {p.device: by_key[p.key][n["id"]] for p in placed}
    data["cost_unit"] = "seconds"
    data["devices"] = [{"id": p.device, "kind": p.kind} for p in placed]
    data["home"] = home.device
    data["links"] = [
        {"from": k.source, "to": k.target, "latency": k.latency, "bandwidth": k.bandwidth} for k in links
    ]
    return DeviceProfile(
        graph=Graph(**data),
        node_seconds={p.device: sum(by_key[p.key].values()) for p in placed},
        links=links,
        unavailable=unavailable,
    )
