"""Build the small ONNX example graphs shipped in graphs/ (deterministic; run from anywhere).

    python3 graphs/make_examples.py

mlp_inference.onnx: an image batch [64, 1, 16, 16] flattened (a view) and sent through three
Gemm layers (256 -> 96 -> 96 -> 10) with Relu in between and a Softmax at the end; opset 17,
IR version 10 so that onnxruntime 1.31 can run it. About 140 KB of float32 weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

HERE = Path(__file__).resolve().parent


def mlp_inference(
    batch: int = 64, widths: tuple[int, ...] = (256, 96, 96, 10), seed: int = 0
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes = [oh.make_node("Flatten", ["image"], ["x"], axis=1, name="flatten")]
    inits = []
    h = "x"
    for k, (n_in, n_out) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
        w = (rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"fc{k}.weight"),
            numpy_helper.from_array(np.zeros(n_out, np.float32), f"fc{k}.bias"),
        ]
        nodes.append(oh.make_node("Gemm", [h, f"fc{k}.weight", f"fc{k}.bias"], [f"fc{k}"], name=f"fc{k}"))
        h = f"fc{k}"
        if k < len(widths) - 2:
            nodes.append(oh.make_node("Relu", [h], [f"relu{k}"], name=f"relu{k}"))
            h = f"relu{k}"
    nodes.append(oh.make_node("Softmax", [h], ["probs"], axis=-1, name="softmax"))
    side = int(round(np.sqrt(widths[0])))
    graph = oh.make_graph(
        nodes,
        "mlp_inference",
        [oh.make_tensor_value_info("image", TensorProto.FLOAT, [batch, 1, side, side])],
        [oh.make_tensor_value_info("probs", TensorProto.FLOAT, [batch, widths[-1]])],
        initializer=inits,
    )
    model = oh.make_model(
        graph, ir_version=10, opset_imports=[oh.make_opsetid("", 17)], producer_name="remat make_examples"
    )
    onnx.checker.check_model(model)
    return model


def main() -> None:
    path = HERE / "mlp_inference.onnx"
    onnx.save_model(mlp_inference(), str(path))
    print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
