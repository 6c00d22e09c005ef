"""A memory plan measured: replay a schedule with every tensor inside one preallocated arena.

MODeL (Steiner et al., ICML 2023) §4.5: tensors live in one buffer B sized to the plan, tensor e
at B + A_e, and deallocations are no-ops. Here B is one numpy uint8 array of `memory_plan.arena`
bytes. Each node runs in the interpreter's one-node onnxruntime session; its inputs are OrtValues
made from numpy *views* of B at the planned offsets (no copy on CPU), and each output is
*copied* into B at its offset right after the kernel returns (onnxruntime's kernels allocate
their outputs themselves; binding outputs in place would need every output shape before the
run). So a value that the plan wrongly overlaps with a live one is overwritten in B before its
reader runs, and the graph outputs (read back from B) stop matching the unscheduled run bitwise.
View outputs (Reshape, Squeeze, ...: 0 bytes in the graph, aliases of their base) stay outside B,
as private copies.

The measured arena is the highest byte any tensor actually occupied (offset + the kernel's
real output bytes), next to the planned arena.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from remat_cli.runtime.interpret import Interpreter
from remat_cli.runtime.ort import RunFailed
from remat_cli.schedule import MemoryPlan, Step


@dataclass
class ArenaRun:
    planned_arena: int
    measured_arena: int  #: max offset + real bytes over all tensors placed in the arena
    buffers: int
    copied_bytes: int  #: bytes copied from onnxruntime's outputs into the arena
    outputs: dict[str, np.ndarray]
    outside: list[str] = field(default_factory=list)  #: view values kept outside the arena


def arena_replay(
    engine: Interpreter, steps: Sequence[Step], plan: MemoryPlan, feeds: Mapping[str, np.ndarray]
) -> ArenaRun:
    import onnxruntime as ort

    if engine.device != "cpu":
        raise RunFailed("the arena replay runs on the CPU provider only")
    # The arena's base is 64-byte aligned, so a plan's alignment is the tensors' real alignment
    # (onnxruntime's SIMD reductions round differently on unaligned data: ReduceSum's bias
    # gradients of torch_unet_train differ by up to 1.2e-7 at alignment 1, none at 64).
    raw = np.zeros(plan.arena + 64, dtype=np.uint8)
    base = (-raw.ctypes.data) % 64
    arena = raw[base : base + plan.arena]
    where = {(b.step, b.value): (b.offset, b.size) for b in plan.offsets if b.value is not None}
    live = engine.resident(feeds)
    placed: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}  # value -> (offset, dtype, shape)
    measured = copied = 0
    outside: set[str] = set()

    def read(name: str):
        if name in placed:
            off, dt, shape = placed[name]
            n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
            view = arena[off : off + n].view(dt).reshape(shape)
            return ort.OrtValue.ortvalue_from_numpy(view, "cpu", 0)
        return live[name]

    for k, step in enumerate(steps):
        if step.op == "compute":
            _, ins, outs = engine.sessions[step.node]
            try:
                produced = engine.run_node(step.node, {i: read(i) for i in ins})
            except KeyError as e:
                raise RunFailed(f"step {k}: {step.node!r} reads {e.args[0]!r}, which is not live") from None
            for name, v in zip(outs, produced, strict=True):
                arr = np.asarray(v.numpy())
                arr = arr if arr.flags.c_contiguous else arr.copy()  # ascontiguousarray makes 0-d 1-d
                slot = where.get((k, name))
                if slot is None or (arr.nbytes > slot[1] and name in engine.views):
                    # A view (0 bytes in the graph): onnxruntime may return it aliasing its input, which
                    # is arena memory the plan can reuse once the base is freed, so keep a copy.
                    live[name] = ort.OrtValue.ortvalue_from_numpy(np.array(v.numpy()), "cpu", 0)
                    outside.add(name)
                    continue
                off, size = slot
                if arr.nbytes > size:
                    raise RunFailed(
                        f"step {k}: {name!r} has {arr.nbytes:,} B but the plan gives it {size:,} B"
                    )
                arena[off : off + arr.nbytes] = arr.reshape(-1).view(np.uint8)
                placed[name] = (off, arr.dtype, arr.shape)
                live.pop(name, None)
                measured = max(measured, off + arr.nbytes)
                copied += arr.nbytes
        else:
            placed.pop(step.value or "", None)  # deallocation is a no-op (§4.5)
            live.pop(step.value or "", None)
    outputs: dict[str, np.ndarray] = {}
    for v in engine.graph.outputs:
        if v in placed or v in live:
            outputs[v] = np.array(read(v).numpy())
    return ArenaRun(plan.arena, measured, len(plan.offsets), copied, outputs, sorted(outside))
