"""ONNX Runtime sessions as remat opens them: the settings of each mode (replay, onnxruntime's
defaults, deployed, plan), the providers, and the errors a load or a run ends in."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import onnx


class RuntimeUnavailable(RuntimeError):
    """The requested provider cannot run here (no GPU, no onnxruntime-gpu, not Linux)."""


class RunFailed(RuntimeError):
    """onnxruntime failed while running the model (e.g. a kernel it lacks, device memory out)."""


class ModelRejected(ValueError):
    """onnxruntime cannot load the user's own model (an operator of a custom domain it has no
    kernel for): bad input (exit 2), where RunFailed is a failure of the run (exit 1)."""


def unloadable(path: str | Path, model: onnx.ModelProto, threads: int = 1) -> str | None:
    """Why `model`, read from `path`, does not load in a plain CPU session (naming the file and
    onnxruntime's reason), or None when it loads. Asked after a failed run (`remat run`,
    `remat profile`), to tell a model onnxruntime cannot take at all (bad input) from a run that
    failed. None too where the model's IR version had to be lowered to load: loaded from bytes,
    its external data would not be found, and a failure would not be the model's."""
    import onnxruntime as ort

    from remat_cli.importers.onnx import fit_ir_version

    if fit_ir_version(model) is not model:
        return None
    try:
        ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
    except Exception as e:  # onnxruntime raises its own exception types for bad models
        return f"onnxruntime cannot load {Path(path).name}: {first_line(e)}"
    return None


def first_line(e: Exception) -> str:
    """The first line of an exception's message (onnxruntime's run to many lines), or its type's name."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


#: how a whole-model session is set up: ``replay`` follows the file node for node (remat's
#: measurement), ``defaults`` is what a deployment gets from ``InferenceSession(path)`` with only
#: common subexpression elimination off (it merges every recomputation back), ``deployed`` is
#: ``remat apply``'s model: the file's order and no optimizer (its fusions were made offline by
#: ``remat optimize``), with onnxruntime's arena and memory pattern off.
#: ``plan`` runs ``remat apply``'s model inside its memory plan
#: (:class:`remat_cli.runtime.plan_executor.PlanExecutor`) with the deployed settings.
Settings = Literal["replay", "defaults", "deployed", "plan"]


SETTINGS: tuple[Settings, ...] = ("replay", "defaults", "deployed", "plan")


#: the one optimizer the ``defaults`` settings switch off
CSE = "CommonSubexpressionElimination"


def session_options(
    threads: int = 1, profile_prefix: str | None = None, settings: Settings = "replay"
):  # -> ort.SessionOptions
    """The options of `settings` (see :data:`Settings`).

    ``replay`` and ``deployed``: ``ORT_DISABLE_ALL``, because ``ORT_ENABLE_BASIC`` already
    merges duplicated nodes (common subexpression elimination), undoing every recomputation;
    ``PRIORITY_BASED``, because the default order re-sorts the nodes; arena and memory pattern
    off so freed tensors are really freed. ``defaults``: onnxruntime's own (every optimization,
    arena, memory pattern, its own order), the thread count aside. Intra-op spinning is off in
    all three, because idle spinning threads steal the cores.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    if settings != "defaults":
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        so.enable_cpu_mem_arena = False
        so.enable_mem_pattern = False
        # The planner's reuse hands a dead tensor's buffer to a later tensor of the same size,
        # which keeps the buffer allocated through the gap between them.
        so.enable_mem_reuse = False
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    return so


def open_session(model: str | bytes, so, providers: list, settings: Settings = "replay"):
    """An InferenceSession of `model` with `so` (from :func:`session_options` of the same
    `settings`): ``defaults`` switches common subexpression elimination off."""
    import onnxruntime as ort

    off = [CSE] if settings == "defaults" else []
    return ort.InferenceSession(model, so, providers=providers, disabled_optimizers=off)


#: onnxruntime-gpu ships the same ``onnxruntime`` module as onnxruntime: with both installed the
#: CPU one is imported (seen with pip install of both, onnxruntime 1.32.0 and -gpu 1.31.1)
CUDA_INSTALL = "pip uninstall -y onnxruntime onnxruntime-gpu && pip install onnxruntime-gpu"


def cuda_install_hint() -> str:
    """How to get the CUDA provider here: both packages installed is its own case."""
    from importlib import metadata

    def installed(name: str) -> bool:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            return False
        return True

    if installed("onnxruntime") and installed("onnxruntime-gpu"):
        return (
            f"onnxruntime and onnxruntime-gpu are both installed and the CPU one is imported: {CUDA_INSTALL}"
        )
    return f"install onnxruntime-gpu in place of onnxruntime ({CUDA_INSTALL}) on a machine with an NVIDIA GPU"


def cuda_providers() -> list:
    """The CUDA provider with an arena that grows by exactly what is asked, and float32 matmuls
    and convolutions in float32. Raises RuntimeUnavailable when onnxruntime-gpu or a GPU is missing."""
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise RuntimeUnavailable(
            f"the CUDA provider is not available in onnxruntime {ort.__version__}: {cuda_install_hint()}"
        )
    # cuDNN may otherwise pick algorithms by the largest workspace the arena can give. TF32 (a
    # 10-bit mantissa) is the provider's default; with it off, a two-MatMul chain's outputs were
    # within 1.9e-6 of the CPU's on an H200.
    opts: dict[str, str] = {
        "device_id": "0",
        "arena_extend_strategy": "kSameAsRequested",
        "cudnn_conv_use_max_workspace": "0",
        "use_tf32": "0",
    }
    return [("CUDAExecutionProvider", opts)]


def check_cuda_session(sess) -> None:
    if "CUDAExecutionProvider" not in sess.get_providers():
        raise RuntimeUnavailable(
            "onnxruntime could not start the CUDA provider (no usable NVIDIA GPU or CUDA libraries)"
        )
