"""`remat apply`: a schedule made into a standalone ONNX model that keeps its savings when deployed.

The model is :func:`remat_cli.runtime.model.scheduled_model`'s rewrite (node list = the
schedule's compute sequence, each recomputation a duplicated node with renamed outputs) with the
session settings it needs carried in the file:

- ``ort_config`` (JSON), the metadata onnxruntime itself reads when the environment variable
  ``ORT_LOAD_CONFIG_FROM_MODEL=1`` is set. onnxruntime reads only ``intra_op_num_threads``,
  ``inter_op_num_threads``, ``execution_mode``, ``graph_optimization_level`` and
  ``enable_profiling`` from it; the level it carries is 0 (``ORT_DISABLE_ALL``), because
  ``ORT_ENABLE_BASIC`` already merges duplicated nodes (common subexpression elimination). The
  fusions a deployment wants are made before scheduling (``remat optimize``) and are in the file.
- ``remat.session_options`` (JSON): what ``ort_config`` cannot say, the execution order
  (``PRIORITY_BASED`` runs the file's order, the default re-sorts it) and the arena, memory
  pattern and reuse (off, so a freed tensor's memory is given back). :func:`deployed_session`
  applies all of it; ``remat apply`` prints the same as ``SessionOptions`` lines.
- ``remat.memory_plan`` (JSON), where the schedule has one: each buffer's offset in one arena,
  keyed by the rewritten model's tensor names, each node's workspace by the name of an output
  of its node (:mod:`remat_cli.runtime.plan_executor` runs it).
- ``remat.schedule`` (JSON): the solver, the budget, the graph's hash and the predicted peak.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx

from remat_cli.graph import Graph
from remat_cli.schedule import MemoryPlan, Schedule

ORT_CONFIG = "ort_config"
SESSION_KEY = "remat.session_options"
PLAN_KEY = "remat.memory_plan"
SCHEDULE_KEY = "remat.schedule"
#: the session config entries of the deployed settings
CONFIG_ENTRIES = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")
#: with onnxruntime's arena off, glibc keeps freed tensors for reuse unless every tensor-sized
#: block is its own mapping: without this the deployed settings' footprint is the allocator's
#: high-water mark, not the schedule's (torch_unet_train at 70%: 106 MB for 33 MB predicted)
MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0"
#: the SessionOptions attributes of the deployed settings, in the order they are printed
OPTIONS = (
    "graph_optimization_level",
    "execution_order",
    "enable_cpu_mem_arena",
    "enable_mem_pattern",
    "enable_mem_reuse",
    "intra_op_num_threads",
    "inter_op_num_threads",
    "execution_mode",
)
#: what ort_config can carry (onnxruntime reads no other key of it)
_ORT_CONFIG_KEYS = (
    "graph_optimization_level",
    "intra_op_num_threads",
    "inter_op_num_threads",
    "execution_mode",
)


class ApplyRefused(ValueError):
    """The schedule, the model or the options cannot make a deployable model (bad input: exit 2)."""


@dataclass
class Applied:
    path: Path
    nodes: int  #: nodes of the written model
    recomputations: int  #: duplicated nodes (recomputations) in it
    outputs_match: bool  #: its outputs equal the original model's on seeded inputs
    max_abs_diff: float
    lines: list[str]  #: the equivalent SessionOptions lines
    metadata: dict[str, str] = field(default_factory=dict)


def _value(v: Any) -> Any:
    """A SessionOptions attribute as JSON: an enum by its name, else as it is."""
    return v.name if hasattr(v, "name") else v


def deployed_options(threads: int = 1) -> dict[str, Any]:
    """The deployed settings (:func:`remat_cli.runtime.ort.session_options`, ``deployed``)
    as JSON: the attributes in :data:`OPTIONS` and the config entries."""
    from remat_cli.runtime.ort import session_options

    so = session_options(threads, settings="deployed")
    opts: dict[str, Any] = {a: _value(getattr(so, a)) for a in OPTIONS}
    opts["config_entries"] = {k: so.get_session_config_entry(k) for k in CONFIG_ENTRIES}
    return opts


def option_lines(threads: int = 1, model: str = "OUT.onnx") -> list[str]:
    """Python lines that make the deployed settings' session for `model`."""
    import onnxruntime as ort

    lines = ["import onnxruntime", "so = onnxruntime.SessionOptions()"]
    for attr, v in deployed_options(threads).items():
        if attr == "config_entries":
            lines += [f"so.add_session_config_entry({k!r}, {e!r})" for k, e in v.items()]
        elif isinstance(v, str):
            kind = type(getattr(ort.SessionOptions(), attr)).__name__
            lines.append(f"so.{attr} = onnxruntime.{kind}.{v}")
        else:
            lines.append(f"so.{attr} = {v!r}")
    lines.append(f"sess = onnxruntime.InferenceSession({model!r}, so)")
    lines.append(
        f"# and in the process's environment (glibc: every freed tensor goes back to the OS): {MALLOC_ENV}"
    )
    return lines


def carried_metadata(
    threads: int, schedule: Schedule, plan: dict[str, Any] | None, peak: int
) -> dict[str, str]:
    """The metadata `remat apply` writes (module docstring)."""
    import onnxruntime as ort

    opts = deployed_options(threads)
    config = {}
    for k in _ORT_CONFIG_KEYS:
        v = opts[k]
        enum = getattr(ort, type(getattr(ort.SessionOptions(), k)).__name__, None)
        config[k] = int(getattr(enum, v)) if isinstance(v, str) and enum is not None else v
    meta = {
        ORT_CONFIG: json.dumps({"session_options": config}),
        SESSION_KEY: json.dumps({k: v for k, v in opts.items() if k not in _ORT_CONFIG_KEYS}),
        SCHEDULE_KEY: json.dumps(
            {
                "solver": schedule.solver.name,
                "budget": schedule.budget,
                "graph_sha256": schedule.graph.sha256,
                "predicted_peak_memory": peak,
            }
        ),
    }
    if plan is not None:
        meta[PLAN_KEY] = json.dumps(plan)
    return meta


def plan_metadata(plan: MemoryPlan, names: Mapping[tuple[int, str], str], graph: Graph) -> dict[str, Any]:
    """`plan` keyed by the rewritten model's tensor names (`names`: (step, value) -> tensor,
    from :func:`scheduled_model`), each buffer with its shape and dtype from the graph. A
    production the rewrite omitted (an optional output nothing reads) is left out."""
    buffers: list[dict[str, Any]] = []
    for b in plan.offsets:
        if b.value is None:
            # the node by the rewritten model's name of an output it makes at that step
            made = [names[(b.step, v)] for v in graph.node_map[b.node].outputs if (b.step, v) in names]
            ws = {"workspace_of": b.node, "step": b.step, "offset": b.offset, "size": b.size}
            buffers.append(ws | ({"output": made[0]} if made else {}))
            continue
        tensor = names.get((b.step, b.value))
        if tensor is None:
            continue
        v = graph.value_map[b.value]
        buffers.append(
            {"tensor": tensor, "offset": b.offset, "size": b.size, "shape": v.shape, "dtype": v.dtype}
        )
    return {"arena": plan.arena, "alignment": plan.alignment, "buffers": buffers}


def view_aliases(
    out: onnx.ModelProto, names: Mapping[tuple[int, str], str], graph: Graph
) -> list[dict[str, Any]]:
    """The views of the written model (Reshape, Squeeze, ...: 0 bytes in the graph, aliases of
    their input in onnxruntime), each with the tensor it aliases and its own shape and dtype, in
    node order: a plan executor binds a view at its base's address, where the kernel's copy of
    its input onto itself is skipped (a view bound elsewhere would be a copy of its own)."""
    from remat_cli.runtime.model import view_values

    value_of = {t: v for (_, v), t in names.items()}
    views = view_values(out)
    found = []
    for n in out.graph.node:
        o = n.output[0] if n.output else ""
        if o in views and o in value_of:
            v = graph.value_map[value_of[o]]
            found.append({"tensor": o, "alias_of": n.input[0], "shape": v.shape, "dtype": v.dtype})
    return found


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The JSON metadata of a model `remat apply` wrote, by key (absent keys left out)."""
    m = onnx.load(str(path), load_external_data=False)
    keys = (ORT_CONFIG, SESSION_KEY, PLAN_KEY, SCHEDULE_KEY)
    return {p.key: json.loads(p.value) for p in m.metadata_props if p.key in keys}


def deployed_session(path: str | Path, providers: Sequence[Any] | None = None):
    """An onnxruntime InferenceSession of `remat apply`'s model at `path` with the settings
    the file carries (``ort_config`` and ``remat.session_options``)."""
    import onnxruntime as ort

    meta = read_metadata(path)
    so = ort.SessionOptions()
    carried = dict(meta.get(ORT_CONFIG, {}).get("session_options", {})) | meta.get(SESSION_KEY, {})
    for k, v in carried.items():
        if k == "config_entries":
            for key, entry in v.items():
                so.add_session_config_entry(key, entry)
            continue
        cur = getattr(so, k)
        if hasattr(cur, "name"):  # an enum: by name, or by number as ort_config has it
            enum = type(cur)
            v = (
                getattr(enum, v)
                if isinstance(v, str)
                else next(e for e in enum.__members__.values() if int(e) == v)
            )
        setattr(so, k, v)
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=list(providers or ["CPUExecutionProvider"]))


def apply_schedule(
    model_path: str | Path,
    graph: Graph,
    schedule: Schedule,
    out_path: str | Path,
    *,
    threads: int = 1,
    provider: str = "cpu",
    seed: int = 0,
) -> Applied:
    """Write `schedule` (made for `graph`, the import of `model_path`) applied to the model as a
    standalone model at `out_path` (module docstring); check it with onnx.checker and that its
    outputs equal the original's on seeded inputs before anything is written. Raises
    ApplyRefused (another graph's schedule, external data outside the model's folder, a model
    the schedule does not fit), RuntimeUnavailable (the provider is not here)."""
    from remat_cli.graph import GraphError
    from remat_cli.importers.onnx import check_external_data, read_model, upgrade_opset
    from remat_cli.runtime.model import ModelMismatch, recomputed_copies, scheduled_model
    from remat_cli.runtime.optimize import providers_for
    from remat_cli.schedule import ScheduleError, simulate

    model_path, out_path = Path(model_path), Path(os.path.realpath(out_path))
    providers = providers_for(provider)
    if schedule.graph.sha256 != graph.sha256():
        raise ApplyRefused(
            f"the schedule is for another graph (sha256 {schedule.graph.sha256[:12]}, "
            f"{model_path.name} imports as {graph.sha256()[:12]}): solve it for this model and import options"
        )
    try:
        check_external_data(read_model(str(model_path)), model_path.parent, require_files=True)
        sim = simulate(graph, schedule.steps)
    except (GraphError, ScheduleError) as e:
        raise ApplyRefused(str(e)) from None
    model, _ = upgrade_opset(onnx.load(str(model_path)))
    names: dict[tuple[int, str], str] = {}
    try:
        out = scheduled_model(model, graph, schedule.steps, names)
    except ModelMismatch as e:
        raise ApplyRefused(str(e)) from None
    made = {t for n in out.graph.node for t in n.output if t}  # an omitted optional output is no tensor
    names = {k: t for k, t in names.items() if t in made}
    plan = None
    if schedule.memory_plan:
        plan = plan_metadata(schedule.memory_plan, names, graph)
        plan["views"] = view_aliases(out, names, graph)
    meta = carried_metadata(threads, schedule, plan, sim.peak_memory)
    keep = [p for p in out.metadata_props if p.key not in meta]
    del out.metadata_props[:]
    out.metadata_props.extend(keep)
    onnx.helper.set_model_props(out, {p.key: p.value for p in keep} | meta)
    onnx.checker.check_model(out, full_check=True)
    match, diff = _outputs_agree(model, out, graph, seed, threads, providers)
    _write(out, out_path, external=any(_uses_external(t) for t in model.graph.initializer))
    copies = recomputed_copies(out)
    return Applied(
        out_path, len(out.graph.node), copies, match, diff, option_lines(threads, out_path.name), meta
    )


def _uses_external(t: onnx.TensorProto) -> bool:
    return t.data_location == onnx.TensorProto.EXTERNAL


def _outputs_agree(
    model: onnx.ModelProto, out: onnx.ModelProto, graph: Graph, seed: int, threads: int, providers: list
) -> tuple[bool, float]:
    """The original model under remat's replay settings against the rewritten one under the
    deployed settings, both with their random ops seeded alike: (bitwise equal on the CPU, within
    numpy.allclose elsewhere; the largest difference)."""
    from remat_cli.runtime.model import make_inputs, seed_random_ops
    from remat_cli.runtime.ort import open_session, session_options
    from remat_cli.runtime.report import compare_outputs

    feeds = make_inputs(model, seed=seed, graph=graph)
    results = []
    for m, settings in ((model, "replay"), (out, "deployed")):
        seeded, _ = seed_random_ops(m)
        sess = open_session(
            seeded.SerializeToString(), session_options(threads, settings=settings), providers
        )
        wanted = {i.name for i in sess.get_inputs()}
        names = [o.name for o in sess.get_outputs()]
        got = sess.run(names, {k: v for k, v in feeds.items() if k in wanted})
        results.append(dict(zip(names, got, strict=True)))
    names = [o.name for o in model.graph.output]
    exact = providers[0] == "CPUExecutionProvider"
    match, diff, _ = compare_outputs(results[1], results[0], names, exact=exact)
    return match, diff


def _write(model: onnx.ModelProto, out_path: Path, *, external: bool) -> None:
    """Save `model` at `out_path` through a temporary file in the same folder, so that a failure
    leaves no half-written file; weights in one external file beside it where the original had
    external data."""
    fd, tmp = tempfile.mkstemp(prefix=".remat-apply-", suffix=".onnx", dir=out_path.parent)
    os.close(fd)
    try:
        if external:
            onnx.save(model, tmp, save_as_external_data=True, location=out_path.name + ".data")
        else:
            onnx.save(model, tmp)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


__all__ = [
    "Applied",
    "ApplyRefused",
    "apply_schedule",
    "deployed_options",
    "deployed_session",
    "option_lines",
    "read_metadata",
]
