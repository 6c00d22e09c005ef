"""Running a deployed schedule inside its memory plan: one preallocated arena, every tensor at its
planned offset.

MODeL (Steiner et al., ICML 2023) §4.5: the tensors of a schedule live in one buffer B sized to
the plan, tensor e at B + A_e, and deallocations are no-ops. Here B is one numpy buffer of the
plan's arena bytes, allocated once; the model is `remat apply`'s (whose ``remat.memory_plan``
names each buffer by the rewritten model's tensor names). Every planned tensor is made a graph
output of the session and bound through IOBinding at B + its offset, so onnxruntime's kernels
write each one in place; tensors the plan gives no bytes (views) and the kernels' own scratch
are onnxruntime's. The session runs the file's order with no optimizer (the deployed settings of
:mod:`remat_cli.runtime.deploy`), so the plan's offsets are valid: a buffer is reused only after
the last reader of the tensor before it ran. Since no tensor is allocated or freed during a run,
the arena's pages are touched once and stay, which is what makes this as fast as onnxruntime's
own arena while the peak stays the plan's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper as oh

from remat_cli.runtime.deploy import PLAN_KEY, read_metadata
from remat_cli.runtime.ort import RunFailed, open_session, session_options


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
        _expose(model, [*self.buffers, *views])
        so = session_options(threads, settings="deployed")
        try:
            self.session = open_session(
                model.SerializeToString(), so, list(providers or ["CPUExecutionProvider"]), "deployed"
            )
        except Exception as e:  # onnxruntime's own exception types
            raise RunFailed(f"onnxruntime cannot load {Path(path).name} with its plan: {e}") from None
        self.arena_bytes = int(plan["arena"])
        # 64-byte aligned base, so that the plan's alignment is the tensors' real alignment
        self._raw = np.empty(self.arena_bytes + 64, dtype=np.uint8)
        base = (-self._raw.ctypes.data) % 64
        self.arena = self._raw[base : base + self.arena_bytes]
        self.binding = self.session.io_binding()
        self._views: dict[str, np.ndarray] = {}
        self._bound: list[str] = []  #: bound output names, in binding order
        for b in self.buffers:
            dt = np.dtype(b["dtype"])
            n = int(np.prod(b["shape"], dtype=np.int64)) * dt.itemsize
            if b["offset"] + n > self.arena_bytes:
                raise ValueError(f"{b['tensor']!r} ends past the arena ({b['offset']} + {n} B)")
            view = self.arena[b["offset"] : b["offset"] + n].view(dt).reshape(b["shape"])
            self._views[b["tensor"]] = view
            self._bound.append(b["tensor"])
            self.binding.bind_output(b["tensor"], "cpu", 0, dt, list(b["shape"]), view.ctypes.data)
        self._bind_views(views)
        self._unplanned = [o for o in self.outputs if o not in self._views]
        for o in self._unplanned:
            self.binding.bind_output(o, "cpu")

    def _bind_views(self, views: Sequence[Mapping[str, Any]]) -> None:
        """Each view at its base's address with its own shape (a view of a view at the first
        base's), so that onnxruntime's Reshape, Squeeze, ... find their output where their input
        is and copy nothing."""
        for v in views:
            dt = np.dtype(v["dtype"])
            view = self._views[v["alias_of"]].reshape(v["shape"])
            self._bound.append(v["tensor"])
            self._views[v["tensor"]] = view
            self.binding.bind_output(v["tensor"], "cpu", 0, dt, list(v["shape"]), view.ctypes.data)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One run on `feeds` (arrays by input name); the graph outputs, copied out of the arena."""
        self.run_in_place(feeds)
        return self.current_outputs()

    def current_outputs(self) -> dict[str, np.ndarray]:
        """The graph outputs of the last run, copied (the next run overwrites the arena)."""
        out = {o: np.array(self._views[o]) for o in self.outputs if o in self._views}
        if self._unplanned:
            for name, v in zip([*self._bound, *self._unplanned], self.binding.get_outputs(), strict=True):
                if name in self._unplanned:
                    out[name] = v.numpy()
        return {o: out[o] for o in self.outputs}

    def run_in_place(self, feeds: Mapping[str, np.ndarray]) -> None:
        """One run whose outputs stay in the arena (nothing copied): what a timed run does."""
        for k, v in feeds.items():
            self.binding.bind_cpu_input(k, v)
        try:
            self.session.run_with_iobinding(self.binding)
        except Exception as e:  # onnxruntime's own errors
            raise RunFailed(f"onnxruntime failed while running inside the plan: {e}") from None


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


def _expose(model: onnx.ModelProto, buffers: Sequence[Mapping[str, Any]]) -> None:
    """Make every planned tensor a graph output (typed and shaped from the plan), so that
    IOBinding can place it."""
    have = {o.name for o in model.graph.output}
    for b in buffers:
        if b["tensor"] in have:
            continue
        elem = oh.np_dtype_to_tensor_dtype(np.dtype(b["dtype"]))
        model.graph.output.append(oh.make_tensor_value_info(b["tensor"], elem, list(b["shape"])))
        have.add(b["tensor"])
