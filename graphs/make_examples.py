"""Build the small ONNX example graphs shipped in graphs/ (deterministic; run from anywhere).

    python3 graphs/make_examples.py

mlp_inference.onnx: an image batch [64, 1, 16, 16] flattened (a view) and sent through three
Gemm layers (256 -> 96 -> 96 -> 10) with Relu in between and a Softmax at the end; opset 17,
IR version 10 so that onnxruntime 1.31 can run it. About 140 KB of float32 weights.

mlp_train.onnx: a training step of a Gemm+Relu MLP (batch 256, widths 64 -> 96 x 4 -> 10) with
loss = mean(out^2) and a hand-written backward pass (Relu grad as Where(a > 0, dh, 0), weight
grads as Gemm with transA, bias grads as ReduceSum); outputs the loss and every parameter's
gradient, so the importer marks forward / loss / backward phases and rematerialization can
trade activations for recomputation. About 140 KB of weights.
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


def mlp_train(
    batch: int = 256, widths: tuple[int, ...] = (64, 96, 96, 96, 96, 10), seed: int = 0
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    f32 = TensorProto.FLOAT
    nodes: list[onnx.NodeProto] = []
    inits = [
        numpy_helper.from_array(np.float32(0.0), "zero"),
        numpy_helper.from_array(np.float32(2.0 / (batch * widths[-1])), "dloss_scale"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    layers = len(widths) - 1
    h = "x"
    acts: list[tuple[str, str]] = []  # (layer input, pre-activation) for the backward pass
    for k in range(layers):
        w = (rng.standard_normal((widths[k], widths[k + 1])) / np.sqrt(widths[k])).astype(np.float32)
        inits += [
            numpy_helper.from_array(w, f"W{k}"),
            numpy_helper.from_array(np.zeros(widths[k + 1], np.float32), f"b{k}"),
        ]
        nodes.append(oh.make_node("Gemm", [h, f"W{k}", f"b{k}"], [f"a{k}"], name=f"fw/gemm{k}"))
        acts.append((h, f"a{k}"))
        h = f"a{k}"
        if k < layers - 1:
            nodes.append(oh.make_node("Relu", [h], [f"h{k}"], name=f"fw/relu{k}"))
            h = f"h{k}"
    nodes.append(oh.make_node("Mul", [h, h], ["sq"], name="fw/square"))
    nodes.append(oh.make_node("ReduceMean", ["sq"], ["loss"], keepdims=0, name="loss"))
    nodes.append(oh.make_node("Mul", [h, "dloss_scale"], [f"d_a{layers - 1}"], name="bw/dloss"))
    grads: list[tuple[str, list[int]]] = []
    for k in reversed(range(layers)):
        inp, _ = acts[k]
        da = f"d_a{k}"
        nodes.append(oh.make_node("Gemm", [inp, da], [f"W{k}_grad"], transA=1, name=f"bw/gemm{k}_dW"))
        nodes.append(
            oh.make_node("ReduceSum", [da, "axis0"], [f"b{k}_grad"], keepdims=0, name=f"bw/gemm{k}_db")
        )
        grads += [(f"W{k}_grad", [widths[k], widths[k + 1]]), (f"b{k}_grad", [widths[k + 1]])]
        if k > 0:
            nodes.append(
                oh.make_node("Gemm", [da, f"W{k}"], [f"d_h{k - 1}"], transB=1, name=f"bw/gemm{k}_dx")
            )
            nodes.append(
                oh.make_node("Greater", [f"a{k - 1}", "zero"], [f"mask{k - 1}"], name=f"bw/relu{k - 1}_mask")
            )
            nodes.append(
                oh.make_node(
                    "Where", [f"mask{k - 1}", f"d_h{k - 1}", "zero"], [f"d_a{k - 1}"], name=f"bw/relu{k - 1}"
                )
            )
    graph = oh.make_graph(
        nodes,
        "mlp_train",
        [oh.make_tensor_value_info("x", f32, [batch, widths[0]])],
        [oh.make_tensor_value_info("loss", f32, [])]
        + [oh.make_tensor_value_info(g, f32, shape) for g, shape in grads],
        initializer=inits,
    )
    model = oh.make_model(
        graph, ir_version=10, opset_imports=[oh.make_opsetid("", 17)], producer_name="remat make_examples"
    )
    onnx.checker.check_model(model, full_check=True)
    return model


def main() -> None:
    for name, build in (("mlp_inference", mlp_inference), ("mlp_train", mlp_train)):
        path = HERE / f"{name}.onnx"
        onnx.save_model(build(), str(path))
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
