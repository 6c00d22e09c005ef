"""Each operator of a joint graph run once on made-up values: its scratch memory, its
outputs' real storage and its time.

A kernel may allocate more than its outputs while it runs: oneDNN's convolutions reorder the
input, the weights and the output between plain and blocked layouts (each a temporary copy),
dropout draws its mask as floats before it keeps the bytes, ``mse_loss`` holds the difference.
The simulator adds a node's ``workspace`` to the peak at the instant it runs (DESIGN.md §2), so
a workspace missing there is a peak the schedule does not see, and one guessed too high is
memory the solver gives up for nothing. No formula follows oneDNN's choice of layouts, so each
distinct call (operator, argument shapes, strides, dtypes and constants) of a CPU graph runs
once on tensors of those shapes, under the profiler's memory events: its workspace is the most
bytes PyTorch's allocator held during the call above what it held at its end (the outputs).

The same run gives each output's real storage, which the fake tensors of ``meta["val"]`` do
not always predict: ``mse_loss`` returns its mean as a 0-d view of the whole squared
difference, which it keeps alive.

The time of a call is the least of :data:`REPEATS` runs: what recomputing it costs, Python's
dispatch included, where FLOPs miss by several times in both directions (a GELU or a
LayerNorm is memory- and instruction-bound, a small matrix product is dominated by its call).

Calls are run once first (which builds oneDNN's primitives and caches) and then measured;
the random-number generator's state is restored afterwards, so probing changes no dropout
mask. A call that cannot run on made-up values gets the analytic estimate (:func:`estimate`)
and no time.
"""

from __future__ import annotations

import bisect
import operator
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.fx as fx

#: the profiler's name of a probed call: a prefix and the call's index
_MARK = "remat.probe."
#: timed runs of each call, the least kept
REPEATS = 5


@dataclass(frozen=True)
class Probe:
    """What one run of a call showed."""

    #: bytes held during the call above its outputs
    workspace: int
    #: the storage bytes of each tensor the call returned, in order
    storages: tuple[int, ...]
    #: seconds of one call (None: not run)
    seconds: float | None = None


def estimate(node: fx.Node) -> int:
    """Bytes a 2-D convolution (forward or backward) unfolds one sample into (im2col: input
    channels per group x kernel x the larger of the input and output planes), none for a
    pointwise convolution or another operator."""
    if node.target not in (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default):
        return 0
    args = node.args
    forward = node.target is torch.ops.aten.convolution.default
    x, w = (args[0], args[1]) if forward else (args[1], args[2])
    out = node.meta["val"]
    out = out if isinstance(out, torch.Tensor) else args[0].meta["val"]
    xv, wv = x.meta["val"], w.meta["val"]
    if wv.dim() != 4 or xv.dim() != 4:
        return 0
    stride, padding = args[3 if forward else 4 : None][:2]
    if wv.shape[2] * wv.shape[3] == 1 and all(s == 1 for s in stride) and not any(padding):
        return 0
    plane = max(xv.shape[2] * xv.shape[3], out.shape[2] * out.shape[3])
    return int(wv.shape[1] * wv.shape[2] * wv.shape[3] * plane * xv.element_size())


def _signature(node: fx.Node) -> tuple[object, ...] | None:
    """What a call's scratch can depend on, or None for a call not probed (not all on the CPU)."""
    parts: list[object] = [node.target]

    def part(a: object) -> object:
        if isinstance(a, fx.Node):
            v = a.meta.get("val")
            if not isinstance(v, torch.Tensor) or v.device.type != "cpu":
                raise LookupError
            return (tuple(v.shape), v.stride(), v.dtype)
        return a

    try:
        parts += [fx.node.map_aggregate(node.args, part), fx.node.map_aggregate(node.kwargs, part)]
    except LookupError:
        return None
    return tuple(repr(p) for p in parts)


def made_up(v: torch.Tensor) -> torch.Tensor:
    """A CPU tensor of `v`'s shape, strides and dtype with harmless values (integers are 0,
    valid as indices and class targets). A mask is False in its first half and True in the
    second, as the masks an operator meets in a step are (causal, padding): a random one
    would make a branching kernel mispredict at every element (``masked_fill`` on a causal
    mask's shape: 1.04 ms for 0.27 ms on 256 Ki elements)."""
    t = torch.empty_strided(tuple(v.shape), v.stride(), dtype=v.dtype, device="cpu")
    if t.is_floating_point():
        t.normal_()
    elif t.dtype == torch.bool:
        t.copy_((torch.arange(t.numel()) >= t.numel() // 2).reshape(t.shape))
    else:
        t.zero_()
    return t


def _call(node: fx.Node) -> Callable[[], object]:
    def real(a: fx.Node) -> torch.Tensor:
        return made_up(a.meta["val"])

    args = fx.node.map_arg(node.args, real)
    kwargs = fx.node.map_arg(node.kwargs, real)
    return lambda: node.target(*args, **kwargs)


def _scratch(events: Iterable[object]) -> dict[int, int]:
    """Call index -> bytes held during the call above those held at its end."""
    events = list(events)
    memory = sorted((e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]")
    times = [t for t, _ in memory]
    out: dict[int, int] = {}
    for e in events:
        if not e.name().startswith(_MARK):
            continue
        first = bisect.bisect_left(times, e.start_ns())
        last = bisect.bisect_right(times, e.start_ns() + e.duration_ns())
        live = peak = 0
        for _, nbytes in memory[first:last]:
            live += nbytes
            peak = max(peak, live)
        out[int(e.name()[len(_MARK) :])] = max(0, peak - live)
    return out


def _timed(run: Callable[[], object]) -> float:
    """The thread's CPU seconds of one run: what other processes take from the core is left
    out, which a shared machine would otherwise add at random."""
    start = time.thread_time()
    out = run()
    seconds = time.thread_time() - start
    del out
    return seconds


def _storages(out: object) -> tuple[int, ...]:
    leaves = out if isinstance(out, (tuple, list)) else [out]
    return tuple(t.untyped_storage().nbytes() for t in leaves if isinstance(t, torch.Tensor))


@contextmanager
def _quiet() -> Iterator[None]:
    """Standard error closed at the C level: the profiler's start and stop print a line each."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def measure(nodes: list[fx.Node]) -> dict[str, Probe]:
    """Node name -> what running it showed, for the `nodes` that could be probed."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    from torch.profiler import ProfilerActivity, profile, record_function

    calls: dict[tuple[object, ...], list[fx.Node]] = {}
    for node in nodes:
        key = _signature(node)
        if key is not None:
            calls.setdefault(key, []).append(node)
    groups = list(calls.values())
    done: dict[int, tuple[tuple[int, ...], float]] = {}
    prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    with unset_fake_temporarily(), torch.no_grad(), torch.random.fork_rng(devices=[]):
        with _quiet():
            prof.start()
        try:
            for i, group in enumerate(groups):
                try:
                    run = _call(group[0])
                    run()
                    seconds = min(_timed(run) for _ in range(REPEATS))
                    with record_function(f"{_MARK}{i}"):
                        out = run()
                    done[i] = (_storages(out), seconds)
                    del out
                except Exception:  # a call made-up values cannot run: left to the estimate
                    continue
        finally:
            with _quiet():
                prof.stop()
    scratch = _scratch(prof.profiler.kineto_results.events())
    return {n.name: Probe(scratch[i], *done[i]) for i in done if i in scratch for n in groups[i]}


def probe(gm: fx.GraphModule, skip: Callable[[fx.Node], bool]) -> dict[str, Probe]:
    """Node name -> its :class:`Probe` for every operator call of `gm` not `skip`ped: measured
    where it can run (:func:`measure`), else :func:`estimate`d with no storages."""
    nodes = [
        n
        for n in gm.graph.nodes
        if n.op == "call_function" and n.target is not operator.getitem and not skip(n)
    ]
    # the profiler is in use (a profiled compile): estimates only, the user's session untouched
    found = {} if torch.autograd._profiler_enabled() else measure(nodes)
    return {n.name: found.get(n.name) or Probe(estimate(n), ()) for n in nodes}
