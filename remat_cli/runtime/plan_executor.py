"""Running a deployed schedule inside its memory plan: one preallocated arena, every tensor at its
planned offset, every kernel's scratch in its planned slot.

MODeL (Steiner et al., ICML 2023) §4.5: the tensors of a schedule live in one buffer B sized to
the plan, tensor e at B + A_e, and deallocations are no-ops. Here B is one numpy buffer of the
plan's arena bytes, allocated once; the model is `remat apply`'s (whose ``remat.memory_plan``
names each buffer by the rewritten model's tensor names). Every planned tensor is made a graph
output of the session and bound through IOBinding at B + its offset, so onnxruntime's kernels
write each one in place; tensors the plan gives no bytes (views) are bound at their base's
address. The sessions run the file's order with no optimizer (the deployed settings of
:mod:`remat_cli.runtime.deploy`), so the plan's offsets are valid: a buffer is reused only after
the last reader of the tensor before it ran. Since no tensor is allocated or freed during a run,
the arena's pages are touched once and stay, which is what makes this as fast as onnxruntime's
own arena while the peak stays the plan's.

Dead pages. A placement can leave the arena above the schedule's live peak (dynamic storage
allocation is rarely packed to its lower bound; 2.6% on a transformer's step), and a page once
touched stays resident, so the run would peak at the arena. Where the touched pages would pass
the live peak, a cut hands back dead pages, those written again latest first
(:func:`page_discards`): the resident set follows the live tensors at the cost of a few page
faults, not the arena. The resident set is held to the live peak plus what the schedule's
budget leaves above it, so a plan whose arena fits the budget hands nothing back
(:func:`remat_cli.execution.fit.fit_plan` solves for one). The model is cut into consecutive
segments, one onnxruntime session each, a segment starting at every node before which pages
are handed back (``madvise(MADV_DONTNEED)``).

Workspaces. A kernel with scratch (the importer's workspace rules,
:mod:`remat_cli.importers.onnx.workspace`) takes it from onnxruntime's allocator, not from B. The
plan gives that scratch a slot of its own at the node's step, free of every tensor live there,
so the plan's peak counts it. The same page accounting holds it: the scratch counts as that
many pages outside the arena while its kernel runs, and where the resident pages with it would
pass the live peak, dead pages (the slot's among them) are handed back before the kernel. Where
the resident set leaves room for it, nothing is handed back and no segment starts there: a
page handed back costs a page fault and its zeroing each run when it is written again.
Weights read by several segments are handed to each session as one shared initializer, so no
segment holds a copy.
"""

from __future__ import annotations

import ctypes
import mmap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper as oh

from remat_cli.runtime.deploy import PLAN_KEY, SCHEDULE_KEY, read_metadata
from remat_cli.runtime.ort import RunFailed, open_session, session_options

PAGE = mmap.PAGESIZE
_MADV_DONTNEED = 4


@dataclass
class Segment:
    """Consecutive nodes of the model in one session, and what its binding needs each run."""

    session: Any
    binding: Any
    feeds: list[str]  #: graph inputs it reads, bound each run
    carried: list[str]  #: unplanned tensors of earlier segments it reads, bound each run
    produced: list[str]  #: its outputs in binding order
    discard: list[tuple[int, int]] = field(default_factory=list)  #: (address, bytes) handed back first
    #: outputs onnxruntime allocates: (name, position among the bound outputs)
    unplanned: list[tuple[str, int]] = field(default_factory=list)


class PlanExecutor:
    """`remat apply`'s model at `path` run inside its memory plan (module docstring).

    ``run(feeds)`` returns the graph outputs (copies, since the arena is overwritten by the next
    run). Raises ValueError where the model carries no memory plan."""

    def __init__(self, path: str | Path, *, threads: int = 1, providers: Sequence[Any] | None = None):
        meta = read_metadata(path)
        plan = meta.get(PLAN_KEY)
        if plan is None:
            raise ValueError(f"{Path(path).name} carries no memory plan (remat plan, then remat apply)")
        model = onnx.load(str(path))
        self.outputs = [o.name for o in model.graph.output]
        self.buffers = [b for b in plan["buffers"] if "tensor" in b and b["size"] > 0]
        views = _bindable(plan.get("views", []), self.buffers)
        self.arena_bytes = int(plan["arena"])
        self.slack = budget_slack(meta.get(SCHEDULE_KEY) or {})
        self._map = base_page_arena(self.arena_bytes)
        self.arena = np.frombuffer(self._map, dtype=np.uint8, count=self.arena_bytes)
        self._views: dict[str, np.ndarray] = {}
        self._dtypes: dict[str, np.dtype] = {}
        for b in self.buffers:
            self._place(b["tensor"], b["offset"], b["shape"], b["dtype"])
        for v in views:
            self._views[v["tensor"]] = self._views[v["alias_of"]].reshape(v["shape"])
            self._dtypes[v["tensor"]] = np.dtype(v["dtype"])
        #: the most bytes of arena pages and kernel scratch a run holds (its peak, less the
        #: resident bytes): the arena's pages and the largest scratch, or the level dead pages
        #: are handed back to keep, whichever is lower
        cuts, self.held_bytes = self._trim(model.graph.node, plan["buffers"])
        self.providers = list(providers or ["CPUExecutionProvider"])
        try:
            self.segments = self._segments(model, cuts, threads)
        except RunFailed:
            raise
        except Exception as e:  # onnxruntime's own exception types
            raise RunFailed(f"onnxruntime cannot load {Path(path).name} with its plan: {e}") from None
        self._carried: dict[str, Any] = {}
        #: graph input -> (array, address, shape, dtype) bound in the run before
        self._fed: dict[str, tuple] = {}

    def _place(self, name: str, offset: int, shape: Sequence[int], dtype: str) -> None:
        dt = np.dtype(dtype)
        n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if offset + n > self.arena_bytes:
            raise ValueError(f"{name!r} ends past the arena ({offset} + {n} B)")
        self._views[name] = self.arena[offset : offset + n].view(dt).reshape(shape)
        self._dtypes[name] = dt

    def _trim(
        self, nodes: Sequence[onnx.NodeProto], buffers: Sequence[Mapping]
    ) -> tuple[dict[int, list], int]:
        """(node index -> [(address, bytes), ...]: the dead arena pages to hand back before that
        node, where the pages a run has touched, with the scratch of the kernel running then,
        would lift the resident set above the plan's live peak, plus the slack its budget leaves
        (:func:`budget_slack`; :func:`page_discards`); the bytes of pages a run then holds).

        A placement can leave the arena above the schedule's live peak (dynamic storage
        allocation is rarely packed to its bound), and every page a run touches stays resident,
        so without this a run's peak would be the arena's, not the schedule's. A workspace
        slot counts in the live peak at its node, and its scratch, which onnxruntime allocates
        outside the arena, as that many pages more at its node."""
        where = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        start = self.arena.ctypes.data
        page0 = -(-start // PAGE) * PAGE  # whole pages inside the arena only
        n_pages = max(0, (start + self.arena_bytes) // PAGE * PAGE - page0) // PAGE
        last = len(nodes) - 1
        spans = [(where.get(t, 0), d, a, z) for t, (a, z, d) in self._occupants(nodes, where).items()]
        slots = [
            (where[b["output"]], where[b["output"]], start + b["offset"], start + b["offset"] + b["size"])
            for b in buffers
            if "workspace_of" in b and b.get("output") in where and b.get("size", 0) > 0
        ]
        scratch: dict[int, int] = {}
        for k, _, a, z in slots:
            scratch[min(k, last)] = scratch.get(min(k, last), 0) + -(-(z - a) // PAGE)

        def pages(spans: list) -> list[tuple[int, int, int, int]]:
            """(writer, last reader, first page, end page), clipped to the arena's pages."""
            clipped = [
                (min(w, last), max(min(w, last), min(d, last + 1)), max(0, (a - page0) // PAGE),
                 min(n_pages, -(-(z - page0) // PAGE)))
                for w, d, a, z in spans
            ]  # fmt: skip
            return [x for x in clipped if x[3] > x[2]]

        peak = live_page_peak(pages(spans + slots), n_pages, len(nodes)) + self.slack // PAGE
        discards = page_discards(pages(spans), n_pages, len(nodes), [0], scratch, peak)
        held = min(n_pages + max(scratch.values(), default=0), hold_limit(peak))
        return {k: _runs(pick, page0) for k, pick in discards.items()}, held * PAGE

    def _occupants(self, nodes: Sequence[onnx.NodeProto], where: Mapping[str, int]) -> dict[str, tuple]:
        """tensor -> (start address, end address, index of the last node that reads it), for
        every tensor in the arena; graph outputs are read at the end."""
        last = {t: len(nodes) for t in self.outputs}
        for k, n in enumerate(nodes):
            for t in _reads(n):
                last[t] = max(last.get(t, -1), k)
        out = {}
        for t, v in self._views.items():
            a = v.ctypes.data
            out[t] = (a, a + v.nbytes, last.get(t, where.get(t, 0)))
        return out

    def _segments(self, model: onnx.ModelProto, cuts: Mapping[int, tuple], threads: int) -> list[Segment]:
        g = model.graph
        starts = sorted({0, *cuts})
        bounds = list(zip(starts, [*starts[1:], len(g.node)], strict=True))
        inits = {t.name: t for t in g.initializer}
        reads = [{t for n in g.node[a:b] for t in _reads(n)} for a, b in bounds]
        shared = {t for t in inits if sum(t in r for r in reads) > 1}
        shared_values = {t: _ortvalue(onnx.numpy_helper.to_array(inits[t])) for t in shared}
        types = _elem_types(model) | {t: oh.np_dtype_to_tensor_dtype(dt) for t, dt in self._dtypes.items()}
        crossing = {t for r in reads for t in r} | set(self.outputs)
        unknown = [t for n in g.node for t in n.output if t and t in crossing and not types.get(t)]
        if unknown:  # contrib ops onnx's shape inference does not know: ask onnxruntime
            types |= _runtime_types(model, unknown, threads, self.providers)
        graph_inputs = {i.name for i in g.input} - set(inits)
        needed_later = [set(self.outputs)]
        for r in reversed(reads[1:]):
            needed_later.insert(0, needed_later[0] | r)
        segments = []
        for (a, b), r, later in zip(bounds, reads, needed_later, strict=True):
            made = [o for n in g.node[a:b] for o in n.output if o]
            outs = [o for o in made if o in self._views or o in later]
            ins = sorted(t for t in r if t not in made)
            sub = _submodel(model, g.node[a:b], ins, outs, inits, shared, types)
            so = session_options(threads, settings="deployed")
            for t in shared & set(ins):
                so.add_initializer(t, shared_values[t])
            sess = open_session(sub.SerializeToString(), so, self.providers, "deployed")
            segments.append(self._bind(sess, ins, outs, graph_inputs, set(inits), cuts.get(a, [])))
        self._shared = shared_values  # the sessions read them: they live as long as this executor
        return segments

    def _bind(self, sess, ins: list[str], outs: list[str], graph_inputs: set, inits: set, cut) -> Segment:
        binding = sess.io_binding()
        feeds, carried = [], []
        for t in ins:
            if t in inits:
                continue
            if t in self._views:
                v = self._views[t]
                binding.bind_input(t, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
            elif t in graph_inputs:
                feeds.append(t)
            else:
                carried.append(t)
        unplanned = []
        for i, t in enumerate(outs):
            if t in self._views:
                v = self._views[t]
                binding.bind_output(t, "cpu", 0, v.dtype, list(v.shape), v.ctypes.data)
            else:
                binding.bind_output(t, "cpu")
                unplanned.append((t, i))
        return Segment(sess, binding, feeds, carried, list(outs), cut, unplanned)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on `feeds` (arrays by input name); the graph outputs, copied out of the arena."""
        self.run_in_place(feeds)
        return self.current_outputs()

    def current_outputs(self) -> dict[str, np.ndarray]:
        """The graph outputs of the last run, copied (the next run overwrites the arena)."""
        return {
            o: np.array(self._views[o]) if o in self._views else self._carried[o].numpy()
            for o in self.outputs
        }

    def run_in_place(self, feeds: Mapping[str, np.ndarray]) -> None:
        """One run whose outputs stay in the arena (nothing copied): what a timed run does."""
        libc = _libc()
        self._carried = {}
        try:
            rebind = self._changed_feeds(feeds)
            for s in self.segments:
                for k in s.feeds:
                    if k in rebind:
                        s.binding.bind_cpu_input(k, feeds[k])
                for k in s.carried:
                    s.binding.bind_ortvalue_input(k, self._carried[k])
                for addr, n in s.discard:
                    libc.madvise(ctypes.c_void_p(addr), ctypes.c_size_t(n), _MADV_DONTNEED)
                s.session.run_with_iobinding(s.binding)
                if s.unplanned:
                    got = s.binding.get_outputs_as_ortvaluevector()
                    self._carried.update({k: _wrap(got[i]) for k, i in s.unplanned})
        except Exception as e:  # onnxruntime's own errors
            raise RunFailed(f"onnxruntime failed while running inside the plan: {e}") from None

    def _changed_feeds(self, feeds: Mapping[str, np.ndarray]) -> set[str]:
        """The graph inputs to bind again: all but those given as the same C-contiguous array,
        at the same address and shape, as in the run before (the bindings still read them)."""
        changed = set()
        for k, v in feeds.items():
            last = self._fed.get(k)
            same = last is not None and last[0] is v and last[1:] == (v.ctypes.data, v.shape, v.dtype)
            if not (same and v.flags.c_contiguous):
                changed.add(k)
                self._fed[k] = (v, v.ctypes.data, v.shape, v.dtype)
        return changed


def budget_slack(schedule: Mapping[str, Any]) -> int:
    """Bytes the resident set may stay above the schedule's live peak: its budget less its
    predicted peak (0 where either is unknown or the budget is below the peak). Dead pages
    are handed back only to keep the budget, not to reach the live peak: a plan whose arena
    fits the budget runs in one session, with no page written again after a hand-back."""
    budget, peak = schedule.get("budget"), schedule.get("predicted_peak_memory")
    return max(0, int(budget) - int(peak)) if budget is not None and peak is not None else 0


def base_page_arena(nbytes: int) -> mmap.mmap:
    """A private anonymous mapping of `nbytes`, page-aligned (so the plan's alignment is the
    tensors' real alignment) and backed by base pages only. Where transparent huge pages are
    on, a write to an unbacked 2 MiB range would fault in the whole huge page: after a
    hand-back the resident set would grow by more than the tensor written, and the page-exact
    accounting of :func:`page_discards` would not hold. The advice is given before any page
    is touched (an allocator's chunk header would already have faulted in a huge page)."""
    arena = mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    arena.madvise(mmap.MADV_NOHUGEPAGE)
    return arena


def hold_limit(peak: int) -> int:
    """The most pages the resident set is let hold for a peak of `peak` pages: 0.25% over it."""
    return peak + max(1, peak // 400)


def page_discards(
    spans: Sequence[tuple[int, int, int, int]],
    n_pages: int,
    n_nodes: int,
    starts: Sequence[int],
    scratch: Mapping[int, int] | None = None,
    peak: int | None = None,
) -> dict[int, np.ndarray]:
    """Segment start -> the arena pages to hand back before it, for tensors at `spans` (writer,
    last reader, first page, end page), segments starting at `starts`, and kernels that take
    `scratch` (node -> pages) outside the arena while they run; `peak`, by default the live
    tensors' (:func:`live_page_peak`), is what the resident set is held to.

    At a segment start, where the resident pages and those the segment writes, with the most
    scratch it takes, would pass the peak by more than 0.25%, the dead resident pages the
    segment does not write are handed back, those written again latest first, 1% of the peak
    beyond the need. A new segment (a session run more) starts only where the resident set with
    its node's scratch would still pass the peak by 1%. So a kernel's scratch is paid for by
    dead pages only where the resident set is near the peak, not at every kernel that takes
    some: a page handed back costs a page fault when it is written again. Simulated for a first
    run and then the steady state, where a run starts with what the run before left resident."""
    written: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes + 1)]
    for w, _, lo, hi in spans:
        written[w].append((lo, hi))
    scratch = scratch or {}
    peak = live_page_peak(spans, n_pages, n_nodes) if peak is None else peak
    limit, cut_limit, headroom = hold_limit(peak), peak + max(1, peak // 100), peak // 100
    if n_pages + max(scratch.values(), default=0) <= limit:
        return {}
    next_write = _next_writes(written, n_pages)
    first = set(starts)
    discards: dict[int, np.ndarray] = {}
    resident = np.zeros(n_pages, dtype=bool)

    def hand_back(k: int, keep: np.ndarray, over: int) -> None:
        idle = resident & ~keep
        for w, d, lo, hi in spans:
            if w < k <= d:
                idle[lo:hi] = False
        pages = np.flatnonzero(idle)
        pages = pages[np.argsort(-next_write(pages, k), kind="stable")][: over + headroom]
        discards.setdefault(k, np.zeros(n_pages, dtype=bool))[pages] = True
        resident[pages] = False

    for _ in range(2):  # the first run, then the steady state
        for k in range(n_nodes):
            if k in discards:
                resident &= ~discards[k]
            if k in first:  # the segment's writes up to the next start stay resident anyway
                end = min((s for s in first if s > k), default=n_nodes)
                wrote = np.zeros(n_pages, dtype=bool)
                for lo, hi in (x for j in range(k, end) for x in written[j]):
                    wrote[lo:hi] = True
                most = max((scratch.get(j, 0) for j in range(k, end)), default=0)
                if (over := int(np.count_nonzero(resident | wrote)) + most - limit) > 0:
                    hand_back(k, wrote, over)
            now = resident.copy()
            for lo, hi in written[k]:
                now[lo:hi] = True
            if (over := int(np.count_nonzero(now)) + scratch.get(k, 0) - cut_limit) > 0:
                first.add(k)
                mine = np.zeros(n_pages, dtype=bool)
                for lo, hi in written[k]:
                    mine[lo:hi] = True
                hand_back(k, mine, over)
            for lo, hi in written[k]:
                resident[lo:hi] = True
    return discards


def live_page_peak(spans: Sequence[tuple[int, int, int, int]], n_pages: int, n_nodes: int) -> int:
    """The most pages that tensors at `spans` (writer, last reader, first page, end page) cover
    at one node: what no hand-back can go below."""
    written: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes + 1)]
    dies: list[list[tuple[int, int]]] = [[] for _ in range(n_nodes + 1)]
    for w, d, lo, hi in spans:
        written[w].append((lo, hi))
        dies[d].append((lo, hi))
    count = np.zeros(n_pages, dtype=np.int32)  # live tensors on each page
    peak = 0
    for k in range(n_nodes):
        for lo, hi in written[k]:
            count[lo:hi] += 1
        peak = max(peak, int(np.count_nonzero(count)))
        for lo, hi in dies[k]:
            count[lo:hi] -= 1
    return peak


def _next_writes(written: Sequence[Sequence[tuple[int, int]]], n_pages: int):
    """f(pages, k): for each page the index of the first node at or after k that writes it,
    the next run's (plus the node count) where none does in this one."""
    n = len(written)
    ev_page = [np.arange(lo, hi) for k in range(n) for lo, hi in written[k]]
    ev_time = [np.full(hi - lo, k) for k in range(n) for lo, hi in written[k]]
    if not ev_page:
        return lambda pages, k: np.zeros(len(pages), dtype=np.int64)
    key = np.concatenate(ev_page).astype(np.int64) * (2 * n) + np.concatenate(ev_time)
    key.sort()
    first = np.full(n_pages, 2 * n - 1, dtype=np.int64)  # never written: last to be needed
    pages_of, times = key // (2 * n), key % (2 * n)
    first[pages_of[::-1]] = times[::-1]

    def after(pages: np.ndarray, k: int) -> np.ndarray:
        i = np.searchsorted(key, pages * (2 * n) + k)
        hit = i < len(key)
        i = np.minimum(i, len(key) - 1)
        same = hit & (pages_of[i] == pages)
        return np.where(same, times[i], first[pages] + n)

    return after


def _runs(pages: np.ndarray, page0: int) -> list[tuple[int, int]]:
    """(address, bytes) of every run of True in `pages`, page k at page0 + k * PAGE."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], pages.view(np.int8), [0]))))
    return [(page0 + int(a) * PAGE, int(b - a) * PAGE) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _wrap(value):
    """onnxruntime's Python OrtValue around one of a binding's outputs (no copy)."""
    import onnxruntime as ort

    return ort.OrtValue(value)


def _ortvalue(arr: np.ndarray):
    import onnxruntime as ort

    return ort.OrtValue.ortvalue_from_numpy(np.require(arr, requirements="C"))


def _runtime_types(model: onnx.ModelProto, names: Sequence[str], threads: int, providers: list) -> dict:
    """The element types onnxruntime gives `names` (made graph outputs of a copy of `model`)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    m.graph.output.extend(oh.make_empty_tensor_value_info(t) for t in names)
    sess = open_session(m.SerializeToString(), session_options(threads, settings="deployed"), providers)
    by_name = {"tensor(" + np.dtype(d).name + ")": oh.np_dtype_to_tensor_dtype(np.dtype(d)) for d in _DTYPES}
    by_name["tensor(float)"], by_name["tensor(double)"] = 1, 11
    return {o.name: by_name.get(o.type, 0) for o in sess.get_outputs() if o.name in set(names)}


_DTYPES = ("float16", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool")


def _reads(n: onnx.NodeProto) -> list[str]:
    from remat_cli.importers.onnx import node_reads

    return [t for t in node_reads(n) if t]


def _elem_types(model: onnx.ModelProto) -> dict[str, int]:
    from remat_cli.runtime.model import elem_types

    return elem_types(model)


def _submodel(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    ins: Sequence[str],
    outs: Sequence[str],
    inits: Mapping[str, onnx.TensorProto],
    shared: set[str],
    types: Mapping[str, int],
) -> onnx.ModelProto:
    """The model of consecutive `nodes`: `ins` are its inputs (the weights among them as
    initializers; the session is given the `shared` ones' values in their place), `outs` its
    outputs."""
    own = [inits[t] for t in ins if t in inits]
    graph = oh.make_graph(
        list(nodes),
        "segment",
        [oh.make_tensor_value_info(t, types.get(t, 0), None) for t in ins if t not in inits],
        [oh.make_tensor_value_info(t, types.get(t, 0), None) for t in outs],
        own,
    )
    m = oh.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)
    m.functions.extend(model.functions)
    return m


def _bindable(
    views: Sequence[Mapping[str, Any]], buffers: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The views that can be bound at their base's address: the base is planned (or such a
    view) with the same dtype and bytes. The others (views of graph inputs or weights) stay
    onnxruntime's own aliases."""

    def nbytes(b: Mapping[str, Any]) -> tuple[str, int]:
        dt = np.dtype(b["dtype"])
        return dt.str, int(np.prod(b["shape"], dtype=np.int64)) * dt.itemsize

    known = {b["tensor"]: nbytes(b) for b in buffers}
    kept = []
    for v in views:
        if v["alias_of"] in known and known[v["alias_of"]] == nbytes(v):
            known[v["tensor"]] = nbytes(v)
            kept.append(v)
    return kept
