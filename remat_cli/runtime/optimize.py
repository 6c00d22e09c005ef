"""`remat optimize`: the graph onnxruntime will run, written out before it is scheduled.

onnxruntime rewrites a model when a session loads it (constant folding, fusions such as
Conv + activation -> FusedConv, MatMul + Transpose -> FusedMatMul, Gelu, LayerNormalization,
SkipLayerNormalization ...). A schedule made for the graph before those rewrites names nodes that
no longer exist once they ran, and a deployment that keeps the rewrites on also merges the
schedule's recomputations back (common subexpression elimination). So the rewrites are made
once, offline (``SessionOptions.optimized_model_filepath``), and the schedule is solved on their
result: the importer reads the contrib ops (onnxruntime's symbolic shape inference gives their
shapes, :func:`remat_cli.importers.onnx.costs.node_flops` their costs), and the deployed session
then runs with every optimizer off, the fusions already in the file.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from remat_cli.runtime.ort import RuntimeUnavailable, cuda_install_hint, first_line

Level = Literal["basic", "extended", "all"]
LEVELS: tuple[Level, ...] = ("basic", "extended", "all")
#: onnxruntime's graph optimization level of each --level
_ORT_LEVEL = {"basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED", "all": "ORT_ENABLE_ALL"}


class OptimizeRefused(ValueError):
    """The model or the options cannot be optimized here (bad input: exit 2)."""


@dataclass
class Optimized:
    path: Path
    level: Level
    provider: str
    nodes_before: int
    nodes_after: int
    contrib_ops: dict[str, int]  #: op type (domain:op) -> count of the ops outside the ONNX domain


def providers_for(provider: str) -> list[str]:
    """onnxruntime's provider list for `provider`; RuntimeUnavailable where it is not here."""
    import onnxruntime as ort

    if provider == "cpu":
        return ["CPUExecutionProvider"]
    if provider == "cuda":
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeUnavailable(
                f"the CUDA provider is not available in onnxruntime {ort.__version__}: {cuda_install_hint()}"
            )
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    raise OptimizeRefused(f"unknown provider {provider!r} (cpu or cuda)")


def optimize_model(
    model_path: str | Path, out_path: str | Path, *, level: Level = "extended", provider: str = "cpu"
) -> Optimized:
    """Write onnxruntime's offline optimization of `model_path` at `level` for `provider` to
    `out_path` (atomically: nothing is written when onnxruntime refuses).

    ``all`` adds layout rewrites specific to the provider (and CPU), so its result runs only
    there. Raises OptimizeRefused (bad model or level), RuntimeUnavailable (the provider)."""
    import onnx
    import onnxruntime as ort

    from remat_cli.graph import GraphError
    from remat_cli.importers.onnx import check_external_data, read_model

    if level not in LEVELS:
        raise OptimizeRefused(f"unknown --level {level!r} ({', '.join(LEVELS)})")
    model_path, out_path = Path(model_path), Path(os.path.realpath(out_path))
    try:
        before = read_model(str(model_path))
        check_external_data(before, model_path.parent, require_files=True)
    except GraphError as e:
        raise OptimizeRefused(str(e)) from None
    providers = providers_for(provider)
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVEL[level])
    so.log_severity_level = 3
    fd, tmp = tempfile.mkstemp(prefix=".remat-opt-", suffix=".onnx", dir=out_path.parent)
    os.close(fd)
    try:
        so.optimized_model_filepath = tmp
        source = _at_least_opset_13(model_path)
        try:
            sess = ort.InferenceSession(source, so, providers=providers)
        except Exception as e:  # onnxruntime's own exception types
            raise OptimizeRefused(
                f"onnxruntime cannot optimize {model_path.name} at --level {level} on {provider}: {first_line(e)}"
            ) from None
        if provider == "cuda" and "CUDAExecutionProvider" not in sess.get_providers():
            raise RuntimeUnavailable("onnxruntime could not start the CUDA provider (no usable NVIDIA GPU)")
        optimized = onnx.load(tmp, load_external_data=False)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    contrib: dict[str, int] = {}
    for n in optimized.graph.node:
        if n.domain not in ("", "ai.onnx"):
            key = f"{n.domain}:{n.op_type}"
            contrib[key] = contrib.get(key, 0) + 1
    return Optimized(out_path, level, provider, len(before.graph.node), len(optimized.graph.node), contrib)


def _at_least_opset_13(model_path: Path) -> str | bytes:
    """The model as onnxruntime should optimize it: its path, or, older than opset 13, the
    importer's upgrade (serialized). Upgraded after onnxruntime's rewrites, the converter
    would stop at the initializers those add without graph inputs."""
    import onnx

    from remat_cli.importers.onnx import upgrade_opset

    loaded = onnx.load(str(model_path))
    upgraded, old = upgrade_opset(loaded)
    return str(model_path) if old is None else upgraded.SerializeToString()
