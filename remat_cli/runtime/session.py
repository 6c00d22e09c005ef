"""Session mode: run a whole (rewritten) ONNX model in one InferenceSession and measure it.

Each measurement runs in a fresh Python subprocess (:func:`measure`), so nothing the parent
allocated earlier pollutes the high-water mark, and glibc's mmap threshold is lowered from
the start (``MALLOC_MMAP_THRESHOLD_``) so every tensor-sized block is its own mapping that
returns to the OS when freed. With onnxruntime's CPU arena and memory pattern off, the
process's resident high-water mark then follows the live tensors.

CPU memory: ``/proc/self/clear_refs`` ← 5 resets VmHWM to the current VmRSS; after one run,
VmHWM − VmRSS-before is the peak above what was resident before the run (inputs, weights,
the session itself). CUDA memory: inputs are placed on the device before the baseline is
read; the CUDA arena grows by exactly what is requested (``kSameAsRequested``) and never
shrinks during a run, so device memory used after one run minus before is what the arena
reserved at its peak: the live tensors plus what its regions could not reuse. The arena is not
capped: measured on an H200, ``gpu_mem_limit = budget - resident`` refused every schedule of
the shipped graphs, program order included, since freed regions are not merged.
"""

from __future__ import annotations

import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from remat_cli.runtime.ort import (
    RunFailed,
    RuntimeUnavailable,
    Settings,
    check_cuda_session,
    cuda_providers,
    open_session,
    session_options,
)

#: glibc: allocations from this size up are mmapped, so freeing them returns the pages
MMAP_THRESHOLD = 64 * 1024
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


@dataclass
class Measurement:
    """What one session-mode measurement found."""

    seconds: float  #: median wall time of one run after warm-up
    peak_above_baseline: int  #: bytes above what was resident before the run
    times: list[float] = field(default_factory=list)
    #: CPU seconds of the process per run: with one thread, far steadier than wall time when
    #: other processes share the cores
    cpu_times: list[float] = field(default_factory=list)
    peaks: list[int] = field(default_factory=list)
    executed: list[str] | None = None  #: node names in the order onnxruntime ran them
    #: inside a memory plan: the high-water mark of the first run above the resident bytes
    #: before it, which also holds onnxruntime's machine code paged in on first use
    first_run_peak: int | None = None
    provider: str = "cpu"


# ---------------------------------------------------------------- memory probes
def _status_kib(field_name: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    raise RuntimeUnavailable(f"/proc/self/status has no {field_name}: session-mode memory needs Linux")


def reset_hwm() -> int:
    """Reset the resident high-water mark; returns the resident bytes now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS") * 1024


def hwm() -> int:
    return _status_kib("VmHWM") * 1024


def lower_mmap_threshold() -> None:
    """Also set through mallopt, for a process started without the environment variables."""
    set_malloc_thresholds(MMAP_THRESHOLD, 0)


def set_malloc_thresholds(mmap_threshold: int, trim_threshold: int) -> None:
    """glibc's mmap and trim thresholds for this process (mallopt); a no-op without glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, mmap_threshold)
        libc.mallopt(_M_TRIM_THRESHOLD, trim_threshold)
    except OSError:
        pass


def device_used_bytes() -> int:
    """Device memory in use on GPU 0."""
    free, total = device_memory(0)
    return total - free


def device_memory(device_id: int) -> tuple[int, int]:
    """(free, total) bytes of GPU `device_id`: cudaMemGetInfo of the CUDA runtime onnxruntime
    loaded, else NVML."""
    for lib in ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"):
        try:
            cudart = ctypes.CDLL(lib)
        except OSError:
            continue
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        if (
            cudart.cudaSetDevice(device_id) == 0
            and cudart.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) == 0
        ):
            return int(free.value), int(total.value)
    try:
        import pynvml

        pynvml.nvmlInit()
        info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(device_id))
        return int(info.free), int(info.total)
    except Exception as e:  # no NVML either: nothing can read the device
        raise RuntimeUnavailable(f"cannot read GPU memory (no libcudart, no NVML): {e}") from None


# ---------------------------------------------------------------- the worker
def _load_feeds(path: str) -> dict:
    import numpy as np

    with np.load(path, allow_pickle=False) as z:
        return {k: np.require(z[k], requirements="C") for k in z.files}


def _session(job: dict, model: str, feeds: dict, settings: Settings = "replay"):
    """(run, fetch, release, output names) for `model`: ``run(shrink=False)`` one run,
    ``fetch()`` its outputs as numpy arrays, ``release()`` drops them."""
    import onnxruntime as ort

    cuda = job["provider"] == "cuda"
    if settings == "plan" and not cuda:
        return _plan_session(job, model, feeds)
    providers = cuda_providers() if cuda else ["CPUExecutionProvider"]
    so = session_options(job["threads"], settings=settings)
    if job.get("optimized"):  # what onnxruntime made of the model, for counting what it kept
        so.optimized_model_filepath = job["optimized"]
    try:
        sess = open_session(model, so, providers, settings)
    except Exception as e:  # onnxruntime raises its own exception types for bad models
        raise RunFailed(f"onnxruntime could not load the model: {e}") from None
    out_names = [o.name for o in sess.get_outputs()]
    if cuda:
        check_cuda_session(sess)
        run, fetch = _cuda_runner(sess, feeds, out_names)
        return run, fetch, lambda: None, out_names
    # On the CPU these wrap the numpy buffers without a copy.
    ort_feeds = {k: ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
    last: list = []

    def run(shrink: bool = False) -> None:
        last[:] = []  # the previous outputs go before the next run starts
        last.extend(sess.run_with_ort_values(out_names, ort_feeds))

    def fetch() -> list:
        return [v.numpy() for v in last]

    def release() -> None:
        last[:] = []

    return run, fetch, release, out_names


def _plan_session(job: dict, model: str, feeds: dict):
    """:func:`_session`'s four for a run inside the model's memory plan."""
    from remat_cli.runtime.plan_executor import PlanExecutor

    pe = PlanExecutor(model, threads=job["threads"])
    job["arena_view"] = pe.arena

    def fetch() -> list:
        return list(pe.current_outputs().values())

    return lambda shrink=False: pe.run_in_place(feeds), fetch, lambda: None, pe.outputs


def _memory_worker(job: dict) -> dict:
    """Warm up, then one run per repeat between a baseline and a peak reading; outputs saved.

    Where memory is kept between runs — onnxruntime's arena (``defaults``), glibc's heap when
    the mmap threshold is left as it is (``plan`` included) — the baseline is read before the
    first run and the peak is what the runs held at most. Inside a memory plan with the mmap
    threshold lowered (the settings ``remat apply`` carries), :func:`_plan_peaks`."""
    import numpy as np

    if job.get("mmap", True):
        lower_mmap_threshold()
    feeds = _load_feeds(job["inputs"])
    cuda = job["provider"] == "cuda"
    settings = job.get("settings", "replay")
    run, fetch, release, out_names = _session(job, job["model"], feeds, settings)
    peaks: list[int] = []
    if settings == "plan" and job.get("mmap", True) and not cuda:
        return _plan_peaks(job, run, fetch, out_names)
    if (settings in ("defaults", "plan") or not job.get("mmap", True)) and not cuda:
        peaks = _held_peaks(run, release, job["warmup"] + max(job["repeat"], 1))
        np.savez(job["outputs"], **dict(zip(out_names, fetch(), strict=True)))
        return {"peaks": peaks, "executed": None}
    try:
        # On CUDA the first run also creates library handles and loads kernels: never measure it.
        for _ in range(max(job["warmup"], 1 if cuda else 0)):
            run(shrink=cuda)
        for _ in range(max(job["repeat"], 1)):
            if cuda:
                base = device_used_bytes()
                run()
                peaks.append(device_used_bytes() - base)
                run(shrink=True)  # gives the arena back for the next repeat
            else:
                release()  # the last outputs must not sit in the baseline
                base = reset_hwm()
                run()
                peaks.append(hwm() - base)
    except RuntimeUnavailable:
        raise
    except Exception as e:  # onnxruntime's own errors, e.g. device memory out
        raise RunFailed(f"onnxruntime failed while running: {e}") from None
    np.savez(job["outputs"], **dict(zip(out_names, fetch(), strict=True)))
    executed = _executed_order(job) if job.get("check_order") else None
    return {"peaks": peaks, "executed": executed}


def _plan_peaks(job: dict, run, fetch, out_names: list[str]) -> dict:
    """Inside a memory plan: after the warm-up (at least one run, which pages onnxruntime's
    machine code in and touches the arena), each run's high-water mark above the resident bytes
    before it, less the arena's resident pages then (``mincore``), plus the arena: the arena
    counts whole, and workspace slots handed back before the run and written again in it are
    not counted twice. The first run's own high-water mark is kept apart."""
    import numpy as np

    try:
        base = reset_hwm()
        run()
        first = hwm() - base
        for _ in range(max(job["warmup"], 1) - 1):
            run()
        peaks = []
        for _ in range(max(job["repeat"], 1)):
            base = reset_hwm() - resident_bytes(job["arena_view"])
            run()
            peaks.append(hwm() - base)
    except Exception as e:  # onnxruntime's own errors
        raise RunFailed(f"onnxruntime failed while running: {e}") from None
    np.savez(job["outputs"], **dict(zip(out_names, fetch(), strict=True)))
    return {"peaks": peaks, "executed": None, "first_run": first}


def resident_bytes(arr) -> int:
    """The bytes of the pages of numpy array `arr` that are resident now (``mincore``)."""
    import mmap

    import numpy as np

    page = mmap.PAGESIZE
    lo = arr.ctypes.data // page * page
    hi = -(-(arr.ctypes.data + arr.nbytes) // page) * page
    vec = (ctypes.c_ubyte * ((hi - lo) // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mincore(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), vec) != 0:
        raise RuntimeUnavailable(
            f"mincore failed (errno {ctypes.get_errno()}): session-mode memory needs Linux"
        )
    return int((np.frombuffer(vec, np.uint8) & 1).sum()) * page


def _held_peaks(run, release, runs: int) -> list[int]:
    """The high-water mark over `runs` runs above the resident bytes before the first: what an
    arena took and keeps (one figure, as a list like the other peaks)."""
    try:
        base = reset_hwm()
        for _ in range(runs):
            release()
            run()
    except Exception as e:  # onnxruntime's own errors
        raise RunFailed(f"onnxruntime failed while running: {e}") from None
    return [hwm() - base]


def _timing_worker(job: dict) -> dict:
    """Every model warmed up, then their runs alternate, so load on a shared machine hits
    all of them alike."""
    if job.get("mmap", True):
        lower_mmap_threshold()
    feeds = _load_feeds(job["inputs"])
    runs = [_session(job, m, feeds, settings)[0] for m, settings in job["models"]]
    times: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    try:
        for run in runs:
            for _ in range(job["warmup"]):
                run()
        for _ in range(max(job["repeat"], 1)):
            for k, run in enumerate(runs):
                t0, c0 = time.perf_counter(), time.process_time()
                run()
                times[k].append(time.perf_counter() - t0)
                cpu[k].append(time.process_time() - c0)
    except Exception as e:
        raise RunFailed(f"onnxruntime failed while running: {e}") from None
    return {"times": times, "cpu_times": cpu}


def _cuda_runner(sess, feeds: dict, out_names: list[str]):
    """IOBinding with the inputs already on the device (outside the session's arena, before
    the baseline is read); outputs are copied to host memory, so their device buffers live
    in the arena only during the run and count in its peak.

    ``run(shrink=True)`` asks the arena to give its free chunks back when the run ends, so a
    following plain run starts from an empty arena."""
    import onnxruntime as ort

    on_device = {k: ort.OrtValue.ortvalue_from_numpy(v, "cuda", 0) for k, v in feeds.items()}
    binding = sess.io_binding()
    for k, v in on_device.items():
        binding.bind_ortvalue_input(k, v)
    plain = ort.RunOptions()
    shrinking = ort.RunOptions()
    shrinking.add_run_config_entry("memory.enable_memory_arena_shrinkage", "gpu:0")

    def run(shrink: bool = False) -> None:
        binding.clear_binding_outputs()
        for name in out_names:
            binding.bind_output(name, "cpu")
        sess.run_with_iobinding(binding, shrinking if shrink else plain)
        binding.synchronize_outputs()

    def fetch() -> list:
        return [v.numpy() for v in binding.get_outputs()]

    return run, fetch


def _executed_order(job: dict) -> list[str]:
    import numpy as np

    with np.load(job["inputs"], allow_pickle=False) as z:
        feeds = {k: z[k] for k in z.files}
    prefix = str(Path(job["outputs"]).with_suffix("")) + "_profile"
    settings = job.get("settings", "replay")
    so = session_options(job["threads"], profile_prefix=prefix, settings=settings)
    return executed_order(job["model"], feeds, so, settings)


def executed_order(model: str | bytes, feeds: dict, so, settings: Settings = "replay") -> list[str]:
    """The node names onnxruntime runs, in order, read from its profiler (one run with `so`,
    which must have profiling on)."""
    sess = open_session(model, so, ["CPUExecutionProvider"], settings)
    sess.run(None, feeds)
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())
    os.unlink(path)
    return [
        e["name"].removesuffix("_kernel_time")
        for e in events
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time")
    ]


def _spawn(job: dict) -> dict:
    env = dict(os.environ)
    if job.get("mmap", True):
        env["MALLOC_MMAP_THRESHOLD_"] = str(MMAP_THRESHOLD)
        env["MALLOC_TRIM_THRESHOLD_"] = "0"
    env["OMP_NUM_THREADS"] = str(job["threads"])
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "remat_cli.runtime.session", json.dumps(job)],
        env=env,
        capture_output=True,
        text=True,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        raise RunFailed(f"session-mode worker failed: {proc.stderr.strip()[-2000:] or 'no output'}")
    reply = json.loads(lines[-1])
    if "error" in reply:
        cls = RuntimeUnavailable if reply["kind"] == "RuntimeUnavailable" else RunFailed
        raise cls(reply["error"])
    return reply


def measure(
    models: list[tuple[str | Path, str | Path]],
    inputs_path: str | Path,
    *,
    provider: str = "cpu",
    threads: int = 1,
    warmup: int = 1,
    repeat: int = 5,
    memory_repeat: int = 1,
    check_order: list[bool] | None = None,
    settings: list[Settings] | None = None,
    optimized: list[str | Path | None] | None = None,
    mmap: bool = True,
) -> list[Measurement]:
    """Measure session-mode runs of `models` ((model path, outputs .npz path) pairs) on the
    same inputs, each under its `settings` (default ``replay``): each model's peak memory in a
    fresh subprocess of its own (outputs saved; where `optimized` names a path, onnxruntime's
    optimized model is written there), then the times of all of them, alternating, in one more
    subprocess. `mmap` False leaves glibc's allocator as a deployment has it (freed memory it
    may keep for reuse, where the lowered mmap threshold gives every tensor back)."""
    common = {
        "inputs": str(inputs_path),
        "provider": provider,
        "threads": threads,
        "warmup": warmup,
        "mmap": mmap,
    }
    checks = check_order or [False] * len(models)
    kinds = settings or ["replay"] * len(models)
    written = optimized or [None] * len(models)
    memory = [
        _spawn(
            common
            | {
                "kind": "memory",
                "model": str(m),
                "outputs": str(o),
                "repeat": memory_repeat,
                "check_order": chk,
                "settings": kind,
                "optimized": str(opt) if opt else None,
            }
        )
        for (m, o), chk, kind, opt in zip(models, checks, kinds, written, strict=True)
    ]
    pairs = [[str(m), kind] for (m, _), kind in zip(models, kinds, strict=True)]
    timing = _spawn(common | {"kind": "timing", "models": pairs, "repeat": repeat})
    return [
        Measurement(
            seconds=statistics.median(timing["times"][k]),
            peak_above_baseline=int(statistics.median(mem["peaks"])),
            times=timing["times"][k],
            cpu_times=timing["cpu_times"][k],
            peaks=mem["peaks"],
            executed=mem["executed"],
            first_run_peak=mem.get("first_run"),
            provider=provider,
        )
        for k, mem in enumerate(memory)
    ]


def main() -> None:
    job = json.loads(sys.argv[1])
    try:
        reply = _memory_worker(job) if job["kind"] == "memory" else _timing_worker(job)
    except (RuntimeUnavailable, RunFailed) as e:
        reply = {"error": str(e), "kind": type(e).__name__}
    sys.stdout.write(json.dumps(reply) + "\n")


if __name__ == "__main__":
    main()
