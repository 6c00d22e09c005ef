"""The per-node sessions of interpret mode, kept within the device's memory.

Every CUDA session holds its own cuBLAS and cuDNN handles and workspaces, on the order of a
hundred MiB of device memory per single-Conv session once it has run. A session per node of a
network with hundreds of nodes then outgrows the card, and the replay stops with cuDNN's
"CUDNN_STATUS_INTERNAL_ERROR" from ``cudnnCreate``. So on CUDA the sessions are made when a step first needs them, and before
one is made while the device has less than ``RESERVE`` of its memory free, the newest one is
dropped (its handles, and its arena with the chunks it kept, go with it). The newest, not the
least recently used: a replay visits the nodes in the same order every time, and on such a cycle
dropping the newest keeps the sessions made first for every later replay, where dropping the
oldest would make a session at every step. The time spent making sessions is counted apart
(``seconds``, ``cpu_seconds``), and ``ReplayClock`` takes it out of a replay's time, single- or
multi-device, so that a replay's time is its nodes' runs. On the CPU a session
costs little and every one is made up front, which also names a node onnxruntime cannot run
before any replay starts.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

#: the share of the device's memory kept free for the tensors a replay allocates
RESERVE = 0.2

#: (session, its input names, its output names)
Entry = tuple[object, list[str], list[str]]


class NodeSessions:
    """A mapping node id -> Entry for `nodes`, made by `make` on first use. While `full()` says
    so, a new session first drops the newest one (module docstring)."""

    def __init__(self, make: Callable[[str], Entry], nodes: Iterable[str], full: Callable[[], bool]):
        self._make = make
        self._nodes = list(nodes)
        self._known = set(self._nodes)
        self._full = full
        self._made: dict[str, Entry] = {}  # in the order made
        self.created = 0  #: sessions made, those made again after being dropped included
        self.seconds = 0.0  #: wall time spent making them
        self.cpu_seconds = 0.0

    def make_all(self) -> None:
        for n in self._nodes:
            self[n]

    def held(self) -> list[str]:
        """The nodes whose sessions are made and not dropped, in the order made."""
        return list(self._made)

    def __getitem__(self, node: str) -> Entry:
        got = self._made.get(node)
        if got is not None:
            return got
        if node not in self._known:
            raise KeyError(node)
        while self._made and self._full():
            self._made.popitem()  # the newest
        t0, c0 = time.perf_counter(), time.process_time()
        got = self._make(node)
        self.seconds += time.perf_counter() - t0
        self.cpu_seconds += time.process_time() - c0
        self.created += 1
        self._made[node] = got
        return got


class ReplayClock:
    """Wall and CPU seconds from its creation to `stop`, less what `pools` spent making
    sessions meanwhile: a replay's time is its nodes' runs (module docstring)."""

    def __init__(self, pools: Iterable[NodeSessions]):
        self.pools = list(pools)
        self.made = self._making()
        self.t0, self.c0 = time.perf_counter(), time.process_time()

    def _making(self) -> tuple[float, float]:
        return sum(p.seconds for p in self.pools), sum(p.cpu_seconds for p in self.pools)

    def stop(self) -> tuple[float, float]:
        wall, cpu = time.perf_counter() - self.t0, time.process_time() - self.c0
        made, made_cpu = self._making()
        return wall - (made - self.made[0]), cpu - (made_cpu - self.made[1])


def device_short(device_id: int, reserve: float = RESERVE) -> Callable[[], bool]:
    """True while GPU `device_id` has less than `reserve` of its memory free; never, where
    neither the CUDA runtime nor NVML can say (every session is kept, as before the pool)."""
    from remat_cli.runtime.ort import RuntimeUnavailable
    from remat_cli.runtime.session import device_memory

    def short() -> bool:
        try:
            free, total = device_memory(device_id)
        except RuntimeUnavailable:
            return False
        return free < reserve * total

    return short
