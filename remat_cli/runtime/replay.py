"""`remat run`: replay a schedule through ONNX Runtime and measure real memory and time.

:func:`run_schedule` runs the model twice the same way — once following the schedule, once
unscheduled (the original model in session mode, the baseline steps in interpret mode) — and
reports the simulator's prediction next to both measurements and whether the outputs match.

Memory is reported like the simulator counts it: resident values (graph inputs, weights)
plus the intermediates. Session mode measures the peak above what was resident before the
run and adds the resident bytes of the graph; interpret mode counts live tensors exactly.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from remat_cli.graph import Graph
from remat_cli.importers.onnx import MIN_OPSET, fit_ir_version, upgrade_opset
from remat_cli.runtime import interpret as interp
from remat_cli.runtime import session
from remat_cli.runtime.model import (
    ModelMismatch,
    feed_names,
    make_inputs,
    recomputed_copies,
    scheduled_model,
    seed_random_ops,
)
from remat_cli.runtime.ort import (
    ModelRejected,
    RunFailed,
    RuntimeUnavailable,
    first_line,
    session_options,
    unloadable,
)
from remat_cli.runtime.report import (
    Measured,
    Mode,
    Provider,
    RunReport,
    build_report,
    compare_outputs,
    measured_figures,
    predicted_figures,
)
from remat_cli.schedule import Schedule, ScheduleError, baseline, baseline_steps, simulate

__all__ = ["ModelMismatch", "ModelRejected", "RunFailed", "RunReport", "RuntimeUnavailable", "run_schedule"]


@dataclass
class Prepared:
    """The model as the replay runs it: upgraded to opset 13, at an IR version this onnxruntime
    loads, random ops seeded; `loaded` is the file as read."""

    path: Path
    loaded: onnx.ModelProto
    model: onnx.ModelProto
    old_opset: int | None
    ir_lowered: bool
    seeded: int


def prepare_model(model_path: str | Path, notes: list[str]) -> Prepared:
    """Read `model_path` for a replay (:class:`Prepared`), saying in `notes` what was changed.

    A model older than opset 13 is replayed as the importer saw it (upgraded, same node ids);
    the unscheduled run stays the original file, so the outputs are compared with it.
    Raises ModelMismatch where the file is not an ONNX model."""
    model_path = Path(model_path)
    try:
        loaded = onnx.load(str(model_path))
    except Exception as e:  # protobuf's parse errors: e.g. a remat-graph JSON given as the model
        raise ModelMismatch(
            f"{model_path} is not an ONNX model (remat run replays ONNX): {first_line(e)}"
        ) from None
    model, old_opset = upgrade_opset(loaded)
    model = fit_ir_version(model)
    ir_lowered = model.ir_version < loaded.ir_version
    if ir_lowered:
        notes.append(
            f"the model's IR version {loaded.ir_version} lowered to {model.ir_version}, the newest "
            "this onnxruntime loads"
        )
    if old_opset is not None:
        notes.append(
            f"the scheduled run is the model upgraded from opset {old_opset} to {MIN_OPSET}; "
            "the unscheduled run is the original"
        )
    model, seeded = seed_random_ops(model)
    if seeded:
        notes.append(
            f"{seeded} random op(s) (e.g. Dropout) seeded from their names in both runs, so that "
            "they draw the same numbers"
        )
    return Prepared(model_path, loaded, model, old_opset, ir_lowered, seeded)


@dataclass
class Job:
    """One replay's inputs: the model, its graph and schedule, the feeds, the run's settings;
    `notes` collects what the report says about them."""

    prep: Prepared
    graph: Graph
    schedule: Schedule
    feeds: dict[str, np.ndarray]
    notes: list[str]
    provider: Provider
    threads: int
    warmup: int
    repeat: int


@dataclass
class Replayed:
    """What one mode's replay measured: the schedule's run, the unscheduled one, their outputs."""

    measured: Measured
    unscheduled: Measured
    outputs: dict[str, np.ndarray]
    reference: dict[str, np.ndarray]
    original: dict[str, np.ndarray] | None = None
    order_kept: bool | None = None
    arena: dict[str, Any] | None = None
    defaults: tuple[Measured, Measured] | None = None
    recomputations: tuple[int, int] | None = None  #: (copies in the file, copies onnxruntime kept)


def run_schedule(
    model_path: str | Path,
    graph: Graph,
    schedule: Schedule,
    *,
    provider: Provider = "cpu",
    mode: Mode = "session",
    repeat: int = 5,
    warmup: int = 1,
    inputs: Mapping[str, np.ndarray] | None = None,
    seed: int = 0,
    threads: int = 1,
    check_order: bool = True,
    ort_defaults: bool | None = None,
) -> RunReport:
    """Replay `schedule` (made for `graph`, the import of `model_path`) and the unscheduled
    model the same way; measure both; compare their outputs.

    `inputs` overrides the seeded random data for some or all graph inputs. `threads` is the
    intra-op thread count: 1 by default because onnxruntime's ScatterND/ScatterElements with
    ``reduction=add`` (embedding and max-pool gradients) lose updates with more threads.
    `ort_defaults` also measures the rewritten and the unscheduled model under onnxruntime's
    default session settings, common subexpression elimination off (default: in session mode
    on the CPU). Raises RuntimeUnavailable (no GPU / onnxruntime-gpu, not Linux), ModelMismatch
    (the schedule's steps do not fit the graph, or the graph's nodes are not the model's),
    RunFailed (onnxruntime failed, e.g. a kernel it lacks), ModelRejected (the model itself
    does not load in onnxruntime).
    """
    if provider not in ("cpu", "cuda"):
        raise ValueError(f"unknown provider {provider!r} (cpu or cuda)")
    if mode not in ("session", "interpret"):
        raise ValueError(f"unknown mode {mode!r} (session or interpret)")
    kw = {"repeat": repeat, "warmup": warmup, "inputs": inputs, "seed": seed, "threads": threads}
    if graph.devices:  # several devices (XEngine): each node on its device's provider
        if mode != "interpret":
            raise ValueError(
                "a schedule on several devices replays in interpret mode only (--mode interpret): "
                "one session per node is what lets each node run on its own device"
            )
        from remat_cli.runtime.devices import run_on_devices

        return run_on_devices(model_path, graph, schedule, provider=provider, **kw)
    notes: list[str] = []
    if schedule.graph.sha256 != graph.sha256():
        # Costs enter the hash, and measured (profile) costs differ between imports; the
        # steps must still be valid for this graph, which simulate() checks.
        notes.append(
            "the graph's hash differs from the schedule's (other import options or cost model?): "
            "predictions are this import's"
        )
    prep = prepare_model(model_path, notes)
    try:
        sim = simulate(graph, schedule.steps)
    except ScheduleError as e:
        raise ModelMismatch(f"the schedule does not fit this model's graph: {e}") from None
    predicted = predicted_figures(sim, baseline(graph))
    feeds = make_inputs(prep.model, seed=seed, given=inputs, graph=graph)
    if threads == 1:
        notes.append("one intra-op thread (ScatterND/ScatterElements add-reductions are not exact on more)")
    if ort_defaults is None:
        ort_defaults = mode == "session" and provider == "cpu"
    job = Job(prep, graph, schedule, feeds, notes, provider, threads, warmup, repeat)
    got = _interpret_mode(job) if mode == "interpret" else _session_mode(job, check_order)
    if ort_defaults:
        got.defaults, got.recomputations = _defaults(job)
    compared = _match_outputs(got, prep.model, provider, notes)
    fields = dict(provider=provider, mode=mode, threads=threads, seed=seed, repeat=repeat, warmup=warmup)
    report = build_report(
        RunReport,
        prep.path,
        graph,
        schedule,
        predicted,
        got.measured,
        got.unscheduled,
        compared,
        notes,
        order_kept=got.order_kept,
        arena=got.arena,
        **fields,
    )
    if got.defaults is not None and got.recomputations is not None:
        report.ort_defaults, report.ort_defaults_unscheduled = got.defaults
        report.recomputations, report.recomputations_kept = got.recomputations
    return report


def _interpret_mode(job: Job) -> Replayed:
    """One session per node: the schedule and the baseline steps, alternating; with a memory
    plan on the CPU also the replay inside one arena."""
    prep, graph, schedule, feeds, notes = job.prep, job.graph, job.schedule, job.feeds, job.notes
    provider, threads, warmup, repeat = job.provider, job.threads, job.warmup, job.repeat
    resident = graph.resident_bytes
    try:
        engine = interp.Interpreter(prep.model, graph, provider=provider, threads=threads)
        run, ref = interp.interpret(
            engine, [schedule.steps, baseline_steps(graph)], feeds, warmup=warmup, repeat=repeat
        )
    except RunFailed:
        _blame_model(prep.path, prep.loaded, threads)
        raise
    got = Replayed(
        measured_figures(run.peak_memory, run.times, run.cpu_times, resident, exact=True),
        measured_figures(ref.peak_memory, ref.times, ref.cpu_times, resident, exact=True),
        run.outputs,
        ref.outputs,
    )
    if prep.old_opset is not None:  # the original model too, not only the upgraded baseline
        fitted = fit_ir_version(prep.loaded)
        source = str(prep.path) if fitted is prep.loaded else fitted.SerializeToString()
        got.original = _run_original(source, feeds, threads)
    notes.append("interpret mode: peak is the exact sum of live tensor bytes, views counted as 0")
    if schedule.memory_plan is not None and provider == "cpu":
        got.arena = _arena_check(engine, schedule, feeds, ref.outputs, prep.model)
    return got


def _session_mode(job: Job, check_order: bool) -> Replayed:
    """The rewritten model and the unscheduled one, each in one session under remat's replay
    settings; a profiled run checks that onnxruntime kept the schedule's node order."""
    prep, graph, schedule, feeds, notes = job.prep, job.graph, job.schedule, job.feeds, job.notes
    provider, threads, warmup, repeat = job.provider, job.threads, job.warmup, job.repeat
    resident = graph.resident_bytes
    with tempfile.TemporaryDirectory(prefix="remat-run-") as tmp:
        d = Path(tmp)
        sched_path, ref_path = _write_models(prep, graph, schedule, feeds, d)
        try:
            run_m, ref_m = session.measure(
                [(sched_path, d / "scheduled_out.npz"), (ref_path, d / "unscheduled_out.npz")],
                d / "inputs.npz",
                provider=provider,
                threads=threads,
                warmup=warmup,
                repeat=repeat,
                check_order=[check_order, False],
            )
        except RunFailed:
            _blame_model(prep.path, prep.loaded, threads)
            raise
        got = Replayed(
            measured_figures(run_m.peak_above_baseline, run_m.times, run_m.cpu_times, resident, exact=False),
            measured_figures(ref_m.peak_above_baseline, ref_m.times, ref_m.cpu_times, resident, exact=False),
            _load(d / "scheduled_out.npz"),
            _load(d / "unscheduled_out.npz"),
        )
    if run_m.executed is not None:
        got.order_kept = run_m.executed == _expected_names(prep.model, graph, schedule)
        if not got.order_kept:
            notes.append("onnxruntime did not run the schedule's node order: the measurement is not valid")
    where = "what the CUDA arena reserved on the device" if provider == "cuda" else "process high-water mark"
    notes.append(f"session mode: peak = {where} above the pre-run baseline + resident bytes ({resident})")
    return got


def _write_models(
    prep: Prepared, graph: Graph, schedule: Schedule, feeds: Mapping[str, np.ndarray], d: Path
) -> tuple[Path, Path]:
    """inputs.npz, the rewritten model and the unscheduled one (the file itself, unless seeds
    or a lowered IR version changed it) in `d`: (rewritten, unscheduled)."""
    np.savez(d / "inputs.npz", **{k: feeds[k] for k in feed_names(prep.model)})
    sched_path = d / "scheduled.onnx"
    onnx.save(scheduled_model(prep.model, graph, schedule.steps), str(sched_path))
    ref_path = prep.path
    if prep.seeded or prep.ir_lowered:  # the same seeds, a loadable IR version
        ref_path = d / "unscheduled.onnx"
        onnx.save(prep.model, str(ref_path))
    return sched_path, ref_path


def _defaults(job: Job) -> tuple[tuple[Measured, Measured], tuple[int, int]]:
    """The rewritten and the unscheduled model under onnxruntime's defaults (CSE off), and
    how many recomputed copies its optimized graph kept."""
    prep, graph, schedule, feeds, notes = job.prep, job.graph, job.schedule, job.feeds, job.notes
    provider, threads, warmup, repeat = job.provider, job.threads, job.warmup, job.repeat
    if provider != "cpu":
        raise RuntimeUnavailable("onnxruntime's defaults are measured on the CPU only")
    resident = graph.resident_bytes
    with tempfile.TemporaryDirectory(prefix="remat-defaults-") as tmp:
        d = Path(tmp)
        sched_path, ref_path = _write_models(prep, graph, schedule, feeds, d)
        opt = d / "scheduled.ort.onnx"
        run_m, ref_m = session.measure(
            [(sched_path, d / "s.npz"), (ref_path, d / "u.npz")],
            d / "inputs.npz",
            threads=threads,
            warmup=warmup,
            repeat=repeat,
            settings=["defaults", "defaults"],
            optimized=[opt, None],
        )
        copies = recomputed_copies(onnx.load(str(sched_path), load_external_data=False))
        kept = recomputed_copies(onnx.load(str(opt), load_external_data=False))
    notes.append(
        "ORT defaults: every graph optimization but common subexpression elimination, arena and "
        "memory pattern on, onnxruntime's own order; peak = high-water mark over all runs above the "
        "resident bytes before the first (the arena keeps what a run took) + resident bytes"
    )
    measured = (
        measured_figures(run_m.peak_above_baseline, run_m.times, run_m.cpu_times, resident, exact=False),
        measured_figures(ref_m.peak_above_baseline, ref_m.times, ref_m.cpu_times, resident, exact=False),
    )
    return measured, (copies, kept)


def _match_outputs(
    got: Replayed, model: onnx.ModelProto, provider: Provider, notes: list[str]
) -> tuple[bool, float, list[str]]:
    """The schedule's outputs against the unscheduled run's (bitwise on the CPU), and against
    the original model's where it was run too."""
    names = [o.name for o in model.graph.output]
    exact = provider == "cpu"
    match, diff, bad = compare_outputs(got.outputs, got.reference, names, exact=exact)
    if got.original is not None:
        # One-node sessions round differently from the whole model's (e.g. Conv pre-packs its
        # constant weights), so the original is matched within tolerance, the baseline exactly.
        match_o, diff_o, bad_o = compare_outputs(got.outputs, got.original, names, exact=False)
        match, diff, bad = match and match_o, max(diff, diff_o), bad + [n for n in bad_o if n not in bad]
        notes.append(
            "outputs also compared with the original model's run: numpy.allclose (rtol 1e-4, atol 1e-5)"
        )
    if not exact:
        notes.append("outputs compared with numpy.allclose (rtol 1e-4, atol 1e-5) on CUDA")
    return match, diff, bad


def _blame_model(model_path: Path, loaded: onnx.ModelProto, threads: int) -> None:
    """After a failed run: ModelRejected (bad input, exit 2) where the user's own model does not
    load in onnxruntime either (an operator of a custom domain it has no kernel for), so that
    RunFailed (exit 1) stays a failure of the run itself (a kernel failing, memory running out)."""
    if why := unloadable(model_path, loaded, threads):
        raise ModelRejected(why)


def _run_original(
    source: str | bytes, feeds: Mapping[str, np.ndarray], threads: int
) -> dict[str, np.ndarray]:
    """The original model's outputs (a path, or the model's bytes), one plain onnxruntime CPU run."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(source, session_options(threads), providers=["CPUExecutionProvider"])
        names = [o.name for o in sess.get_outputs()]
        wanted = {i.name for i in sess.get_inputs()}
        return dict(zip(names, sess.run(names, {k: v for k, v in feeds.items() if k in wanted}), strict=True))
    except Exception as e:  # onnxruntime's own errors (e.g. an op it lacks at this opset)
        raise RunFailed(f"onnxruntime could not run the original model: {e}") from None


def _expected_names(model: onnx.ModelProto, graph: Graph, schedule: Schedule) -> list[str]:
    # onnxruntime turns Constant nodes into initializers when it loads a model (optimizations
    # off or not), so they never run as kernels (e.g. the one version_converter adds for an old
    # Dropout's ratio).
    nodes = scheduled_model(model, graph, schedule.steps).graph.node
    return [n.name for n in nodes if not (n.op_type == "Constant" and n.domain in ("", "ai.onnx"))]


def _load(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def load_schedule(path: str | Path) -> Schedule:
    return Schedule.model_validate(json.loads(Path(path).read_text()))


def _arena_check(
    engine: interp.Interpreter,
    schedule: Schedule,
    feeds: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    model: onnx.ModelProto,
) -> dict[str, Any]:
    """Replay inside one arena at the plan's offsets; outputs must match the unscheduled run bitwise."""
    from remat_cli.runtime.arena import arena_replay

    assert schedule.memory_plan is not None
    a = arena_replay(engine, schedule.steps, schedule.memory_plan, feeds)
    names = [o.name for o in model.graph.output]
    match, diff, bad = compare_outputs(a.outputs, dict(reference), names, exact=True)
    return {
        "planned_arena": a.planned_arena,
        "measured_arena": a.measured_arena,
        "buffers": a.buffers,
        "copied_bytes": a.copied_bytes,
        "outside_arena": a.outside,
        "outputs_match": match,
        "max_abs_diff": diff,
        "how": "inputs: OrtValues on numpy views of one arena; outputs: copied into it at their offsets",
    }
