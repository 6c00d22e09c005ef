"""Make the small ONNX *training* graphs shipped in graphs/ (forward + loss + backward).

Needs the optional extra ``remat-cli[torch]`` (a CPU build of torch is enough, plus onnxscript).

Route: ``make_fx`` (real tracing) of ``torch.func.grad_and_value`` over ``functional_call``,
decomposed with ``core_aten_decompositions()`` plus two decompositions ONNX export lacks —
``aten.convolution_backward`` into a convolution and a transposed convolution, and
``max_pool2d_with_indices_backward`` into ``scatter_add`` — then
``torch.onnx.export(gm, ..., dynamo=True)``. Attention is traced under
``sdpa_kernel(SDPBackend.MATH)`` and BatchNorm runs in training mode with
``track_running_stats=False``, so every op is a plain standard ONNX op. Parameters are graph
inputs; the loss and every gradient are graph outputs. Local functions are inlined and every
node gets a unique name (the remat importer uses ONNX node names as node ids).

    python3 graphs/make_training_graphs.py            # writes graphs/torch_*_train.onnx
    python3 graphs/make_training_graphs.py --only mlp
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path

import onnx
import onnx.inliner
import torch
import torch.nn.functional as F
from torch import nn
from torch._decomp import core_aten_decompositions
from torch.fx.experimental.proxy_tensor import make_fx
from torch.nn.attention import SDPBackend, sdpa_kernel

HERE = Path(__file__).resolve().parent
aten = torch.ops.aten


# ---------------------------------------------------------------- extra decompositions
def _conv_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    bias_sizes: list[int] | None,
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    transposed: bool,
    output_padding: list[int],
    groups: int,
    output_mask: list[bool],
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """aten.convolution_backward for 2-D convolutions and transposed convolutions (groups=1,
    dilation=1), each gradient itself a (transposed) convolution.

    Convolution y = x ⋆ w: grad_x is the transposed convolution of grad_y with w, and grad_w
    the convolution of x with grad_y with batch and channels swapped (stride becomes dilation).
    Transposed convolution: the roles of x and grad_y swap in both."""
    if groups != 1 or any(d != 1 for d in dilation):
        raise NotImplementedError("only groups=1, dilation=1 convolutions are decomposed")
    grad_x = grad_w = grad_b = None
    kh, kw = weight.shape[2], weight.shape[3]
    if output_mask[0]:
        if transposed:
            grad_x = aten.convolution(grad_out, weight, None, stride, padding, dilation, False, [0, 0], 1)
        elif all(s == 1 for s in stride):
            # Stride 1: a plain convolution with the flipped kernel. onnxruntime's ConvTranspose
            # keeps a column buffer as large as a whole image's input gradient; Conv does not.
            flipped = weight.flip(2, 3).transpose(0, 1)
            pad = [kh - 1 - padding[0], kw - 1 - padding[1]]
            grad_x = aten.convolution(grad_out, flipped, None, [1, 1], pad, dilation, False, [0, 0], 1)
        else:
            # output_padding recovers the input size lost to integer division by the stride.
            h = (grad_out.shape[2] - 1) * stride[0] - 2 * padding[0] + kh
            w = (grad_out.shape[3] - 1) * stride[1] - 2 * padding[1] + kw
            op = [x.shape[2] - h, x.shape[3] - w]
            grad_x = aten.convolution(grad_out, weight, None, stride, padding, dilation, True, op, 1)
    if output_mask[1]:
        a, b = (grad_out, x) if transposed else (x, grad_out)
        # (N,C,H,W) -> (C,N,H,W): correlate every channel of `a` with every channel of `b`.
        gw = aten.convolution(
            a.transpose(0, 1), b.transpose(0, 1), None, dilation, padding, stride, False, [0, 0], 1
        ).transpose(0, 1)
        grad_w = gw[:, :, :kh, :kw]
    if output_mask[2]:
        grad_b = grad_out.sum(dim=(0, 2, 3))
    return grad_x, grad_w, grad_b


def _max_pool_backward(
    grad_out: torch.Tensor,
    x: torch.Tensor,
    kernel_size: list[int],
    stride: list[int],
    padding: list[int],
    dilation: list[int],
    ceil_mode: bool,
    indices: torch.Tensor,
) -> torch.Tensor:
    """max_pool2d_with_indices_backward as a scatter_add of the gradient at the argmax indices."""
    n, c = x.shape[0], x.shape[1]
    flat = grad_out.new_zeros((n, c, x.shape[2] * x.shape[3]))
    flat = flat.scatter_add(2, indices.flatten(2), grad_out.flatten(2))
    return flat.view(x.shape)


def _threshold_backward(grad_out: torch.Tensor, x: torch.Tensor, threshold: float) -> torch.Tensor:
    """ReLU's backward as grad * (x > threshold): onnxruntime's Where (the default
    decomposition) keeps two hidden output-sized temporaries; here every tensor is visible."""
    return grad_out * (x > threshold).to(grad_out.dtype)


def decompositions() -> dict:
    table = dict(core_aten_decompositions())
    table[aten.threshold_backward.default] = _threshold_backward
    table[aten.convolution_backward.default] = _conv_backward
    table[aten.max_pool2d_with_indices_backward.default] = _max_pool_backward
    return table


# ---------------------------------------------------------------- models
class MLP(nn.Module):
    def __init__(self, d_in: int = 256, width: int = 256, depth: int = 8, classes: int = 10):
        super().__init__()
        dims = [d_in] + [width] * depth
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:], strict=True))
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = F.relu(layer(x))
        return self.head(x)


class ResBlock(nn.Module):
    def __init__(self, c: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c, track_running_stats=False)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c, track_running_stats=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(x + self.bn2(self.conv2(y)))


class ResCNN(nn.Module):
    def __init__(self, c: int = 16, blocks: int = 3, classes: int = 10):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c, track_running_stats=False)
        self.stage1 = nn.Sequential(*(ResBlock(c) for _ in range(blocks)))
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False)
        self.stage2 = nn.Sequential(*(ResBlock(2 * c) for _ in range(blocks)))
        self.fc = nn.Linear(2 * c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.bn(self.stem(x)))
        x = self.stage1(x)
        x = F.max_pool2d(F.relu(self.down(x)), 2)
        x = self.stage2(x)
        return self.fc(x.mean(dim=(2, 3)))


class EncoderLayer(nn.Module):
    def __init__(self, d: int, heads: int, ff: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.ff1 = nn.Linear(d, ff)
        self.ff2 = nn.Linear(ff, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class Transformer(nn.Module):
    def __init__(
        self, vocab: int = 512, d: int = 128, heads: int = 4, ff: int = 512, layers: int = 2, t: int = 128
    ):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.randn(t, d) / math.sqrt(d))
        self.layers = nn.ModuleList(EncoderLayer(d, heads, ff) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln(x)).flatten(0, 1)


class UNet(nn.Module):
    def __init__(self, c: int = 16, levels: int = 3):
        super().__init__()
        chans = [c * 2**i for i in range(levels)]
        self.inc = nn.Conv2d(1, chans[0], 3, padding=1)
        pairs = list(zip(chans[:-1], chans[1:], strict=True))
        self.downs = nn.ModuleList(nn.Conv2d(a, b, 3, padding=1) for a, b in pairs)
        self.ups = nn.ModuleList(nn.ConvTranspose2d(b, a, 2, stride=2) for a, b in pairs)
        self.merges = nn.ModuleList(nn.Conv2d(2 * a, a, 3, padding=1) for a in chans[:-1])
        self.out = nn.Conv2d(chans[0], 1, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.inc(x))
        skips = []
        for down in self.downs:
            skips.append(x)
            x = F.relu(down(F.max_pool2d(x, 2)))
        for up, merge, skip in zip(reversed(self.ups), reversed(self.merges), reversed(skips), strict=True):
            x = F.relu(merge(torch.cat([up(x), skip], dim=1)))
        return self.out(x)


# ---------------------------------------------------------------- tracing and export
Batch = tuple[torch.Tensor, torch.Tensor]
Spec = tuple[nn.Module, Batch, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def specs() -> dict[str, Spec]:
    g = torch.Generator().manual_seed(0)
    ce = F.cross_entropy
    return {
        "mlp": (MLP(), (torch.randn(4096, 256, generator=g), torch.randint(0, 10, (4096,), generator=g)), ce),
        "resnet": (
            ResCNN(),
            (torch.randn(32, 3, 32, 32, generator=g), torch.randint(0, 10, (32,), generator=g)),
            ce,
        ),
        "transformer": (
            Transformer(),
            (torch.randint(0, 512, (16, 128), generator=g), torch.randint(0, 512, (16 * 128,), generator=g)),
            ce,
        ),
        "unet": (
            UNet(),
            (torch.randn(16, 1, 64, 64, generator=g), torch.randn(16, 1, 64, 64, generator=g)),
            F.mse_loss,
        ),
    }


def training_step(model: nn.Module, loss_fn: Callable) -> tuple[Callable, list[str]]:
    """A function (params..., x, y) -> (loss, grads...) with parameters as plain arguments."""
    names = [n for n, _ in model.named_parameters()]

    def loss_of(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return loss_fn(torch.func.functional_call(model, params, (x,)), y)

    grad_and_value = torch.func.grad_and_value(loss_of)

    def step(*args: torch.Tensor) -> tuple[torch.Tensor, ...]:
        params = dict(zip(names, args[: len(names)], strict=True))
        grads, loss = grad_and_value(params, *args[len(names) :])
        return (loss, *(grads[n] for n in names))

    return step, names


def export(name: str, spec: Spec, out_dir: Path) -> Path:
    model, (x, y), loss_fn = spec
    model.train()
    step, names = training_step(model, loss_fn)
    params = [p.detach() for p in model.parameters()]
    with sdpa_kernel(SDPBackend.MATH):
        gm = make_fx(step, decomposition_table=decompositions(), tracing_mode="real")(*params, x, y)
    safe = [n.replace(".", "_") for n in names]
    program = torch.onnx.export(
        gm,
        (*params, x, y),
        dynamo=True,
        input_names=[*safe, "x", "y"],
        output_names=["loss", *(f"grad_{n}" for n in safe)],
        optimize=True,
        external_data=False,
    )
    proto = onnx.inliner.inline_local_functions(program.model_proto)
    proto = _unique_names(proto)
    proto.graph.name = f"{name}-train"
    onnx.checker.check_model(proto, full_check=True)
    path = out_dir / f"torch_{name}_train.onnx"
    onnx.save(proto, path)
    _check_against_autograd(path, model, loss_fn, params, x, y)
    return path


def _check_against_autograd(
    path: Path,
    model: nn.Module,
    loss_fn: Callable,
    params: list[torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
) -> None:
    """The exported graph must give torch autograd's loss and gradients (one intra-op thread:
    onnxruntime's ScatterND/ScatterElements with reduction=add loses updates on more)."""
    import numpy as np
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), [*params, x, y], strict=True)}
    got = sess.run(None, feeds)
    model.zero_grad()
    with sdpa_kernel(SDPBackend.MATH):
        loss = loss_fn(model(x), y)
    loss.backward()
    want = [loss.detach().numpy(), *(p.grad.numpy() for p in model.parameters())]
    for o, g, w in zip(sess.get_outputs(), got, want, strict=True):
        scale = max(float(np.abs(w).max()), 1e-6)
        err = float(np.abs(g - w).max()) / scale
        if g.shape != w.shape or err > 1e-3:
            raise AssertionError(f"{path.name}: output {o.name} differs from autograd (rel. error {err:.2e})")


def _unique_names(proto: onnx.ModelProto) -> onnx.ModelProto:
    seen: set[str] = set()
    for i, node in enumerate(proto.graph.node):
        name = node.name or f"{node.op_type}_{i}"
        if name in seen:
            name = f"{name}_{i}"
        seen.add(name)
        node.name = name
    return proto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="names among mlp, resnet, transformer, unet")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    torch.manual_seed(0)
    for name, spec in specs().items():
        if args.only and name not in args.only:
            continue
        path = export(name, spec, args.out)
        m = onnx.load(path)
        print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB, {len(m.graph.node)} nodes")


if __name__ == "__main__":
    main()
