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
    scheduled_model,
    seed_random_ops,
)
from remat_cli.runtime.report import (
    Mode,
    Provider,
    RunReport,
    build_report,
    compare_outputs,
    measured_figures,
    predicted_figures,
)
from remat_cli.runtime.session import ModelRejected, RunFailed, RuntimeUnavailable
from remat_cli.schedule import Schedule, ScheduleError, baseline, baseline_steps, simulate

__all__ = ["ModelMismatch", "ModelRejected", "RunFailed", "RunReport", "RuntimeUnavailable", "run_schedule"]


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
) -> RunReport:
    """Replay `schedule` (made for `graph`, the import of `model_path`) and the unscheduled
    model the same way; measure both; compare their outputs.

    `inputs` overrides the seeded random data for some or all graph inputs. `threads` is the
    intra-op thread count: 1 by default because onnxruntime's ScatterND/ScatterElements with
    ``reduction=add`` (embedding and max-pool gradients) lose updates with more threads.
    Raises RuntimeUnavailable (no GPU / onnxruntime-gpu, not Linux), ModelMismatch (the
    schedule's steps do not fit the graph, or the graph's nodes are not the model's), RunFailed
    (onnxruntime failed, e.g. a kernel it lacks), ModelRejected (the model itself does not load
    in onnxruntime).
    """
    if provider not in ("cpu", "cuda"):
        raise ValueError(f"unknown provider {provider!r} (cpu or cuda)")
    if mode not in ("session", "interpret"):
        raise ValueError(f"unknown mode {mode!r} (session or interpret)")
    if graph.devices:  # several devices (XEngine): each node on its device's provider
        if mode != "interpret":
            raise ValueError(
                "a schedule on several devices replays in interpret mode only (--mode interpret): "
                "one session per node is what lets each node run on its own device"
            )
        from remat_cli.runtime.devices import run_on_devices

        kw = {"repeat": repeat, "warmup": warmup, "inputs": inputs, "seed": seed, "threads": threads}
        return run_on_devices(model_path, graph, schedule, provider=provider, **kw)
    notes: list[str] = []
    original: dict[str, np.ndarray] | None = None
    if schedule.graph.sha256 != graph.sha256():
        # Costs enter the hash, and measured (profile) costs differ between imports; the
        # steps must still be valid for this graph, which simulate() checks.
        notes.append(
            "the graph's hash differs from the schedule's (other import options or cost model?): "
            "predictions are this import's"
        )
    model_path = Path(model_path)
    # A model older than opset 13 is replayed as the importer saw it (upgraded, same node ids);
    # the unscheduled run below stays the original file, so the outputs are compared with it.
    try:
        loaded = onnx.load(str(model_path))
    except Exception as e:  # protobuf's parse errors: e.g. a remat-graph JSON given as the model
        raise ModelMismatch(
            f"{model_path} is not an ONNX model (remat run replays ONNX): {session.first_line(e)}"
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
    try:
        sim = simulate(graph, schedule.steps)
    except ScheduleError as e:
        raise ModelMismatch(f"the schedule does not fit this model's graph: {e}") from None
    predicted = predicted_figures(sim, baseline(graph))
    feeds = make_inputs(model, seed=seed, given=inputs, graph=graph)
    if threads == 1:
        notes.append("one intra-op thread (ScatterND/ScatterElements add-reductions are not exact on more)")
    order_kept: bool | None = None
    arena_report: dict[str, Any] | None = None
    resident = graph.resident_bytes
    if mode == "interpret":
        try:
            engine = interp.Interpreter(model, graph, provider=provider, threads=threads)
            run, ref = interp.interpret(
                engine, [schedule.steps, baseline_steps(graph)], feeds, warmup=warmup, repeat=repeat
            )
        except RunFailed:
            _blame_model(model_path, loaded, threads)
            raise
        measured = measured_figures(run.peak_memory, run.times, run.cpu_times, resident, exact=True)
        unscheduled = measured_figures(ref.peak_memory, ref.times, ref.cpu_times, resident, exact=True)
        out_a, out_b = run.outputs, ref.outputs
        if old_opset is not None:  # the original model too, not only the upgraded baseline
            fitted = fit_ir_version(loaded)
            source = str(model_path) if fitted is loaded else fitted.SerializeToString()
            original = _run_original(source, feeds, threads)
        notes.append("interpret mode: peak is the exact sum of live tensor bytes, views counted as 0")
        if schedule.memory_plan is not None and provider == "cpu":
            arena_report = _arena_check(engine, schedule, feeds, ref.outputs, model)
    else:
        with tempfile.TemporaryDirectory(prefix="remat-run-") as tmp:
            d = Path(tmp)
            np.savez(d / "inputs.npz", **{k: feeds[k] for k in feed_names(model)})
            sched_path = d / "scheduled.onnx"
            onnx.save(scheduled_model(model, graph, schedule.steps), str(sched_path))
            ref_path = model_path
            if seeded or ir_lowered:  # the same seeds, a loadable IR version
                ref_path = d / "unscheduled.onnx"
                onnx.save(model, str(ref_path))
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
                _blame_model(model_path, loaded, threads)
                raise
            out_a = _load(d / "scheduled_out.npz")
            out_b = _load(d / "unscheduled_out.npz")
        measured = measured_figures(
            run_m.peak_above_baseline, run_m.times, run_m.cpu_times, resident, exact=False
        )
        unscheduled = measured_figures(
            ref_m.peak_above_baseline, ref_m.times, ref_m.cpu_times, resident, exact=False
        )
        if run_m.executed is not None:
            expected = _expected_names(model, graph, schedule)
            order_kept = run_m.executed == expected
            if not order_kept:
                notes.append(
                    "onnxruntime did not run the schedule's node order: the measurement is not valid"
                )
        where = (
            "what the CUDA arena reserved on the device" if provider == "cuda" else "process high-water mark"
        )
        notes.append(f"session mode: peak = {where} above the pre-run baseline + resident bytes ({resident})")
    names = [o.name for o in model.graph.output]
    exact = provider == "cpu"
    match, diff, bad = compare_outputs(out_a, out_b, names, exact=exact)
    if original is not None:
        # One-node sessions round differently from the whole model's (e.g. Conv pre-packs its
        # constant weights), so the original is matched within tolerance, the baseline exactly.
        match_o, diff_o, bad_o = compare_outputs(out_a, original, names, exact=False)
        match, diff, bad = match and match_o, max(diff, diff_o), bad + [n for n in bad_o if n not in bad]
        notes.append(
            "outputs also compared with the original model's run: numpy.allclose (rtol 1e-4, atol 1e-5)"
        )
    if not exact:
        notes.append("outputs compared with numpy.allclose (rtol 1e-4, atol 1e-5) on CUDA")
    return build_report(
        RunReport,
        model_path,
        graph,
        schedule,
        predicted,
        measured,
        unscheduled,
        (match, diff, bad),
        notes,
        provider=provider,
        mode=mode,
        threads=threads,
        seed=seed,
        repeat=repeat,
        warmup=warmup,
        order_kept=order_kept,
        arena=arena_report,
    )


def _blame_model(model_path: Path, loaded: onnx.ModelProto, threads: int) -> None:
    """After a failed run: ModelRejected (bad input, exit 2) where the user's own model does not
    load in onnxruntime either (an operator of a custom domain it has no kernel for), so that
    RunFailed (exit 1) stays a failure of the run itself (a kernel failing, memory running out)."""
    if why := session.unloadable(model_path, loaded, threads):
        raise ModelRejected(why)


def _run_original(
    source: str | bytes, feeds: Mapping[str, np.ndarray], threads: int
) -> dict[str, np.ndarray]:
    """The original model's outputs (a path, or the model's bytes), one plain onnxruntime CPU run."""
    import onnxruntime as ort

    try:
        sess = ort.InferenceSession(
            source, session.session_options(threads), providers=["CPUExecutionProvider"]
        )
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
