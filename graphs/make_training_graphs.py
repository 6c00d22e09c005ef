"""Make the small ONNX *training* graphs shipped in graphs/ (forward + loss + backward):
an MLP, a small residual CNN, a small transformer encoder and a small U-Net, defined here
(torchvision does not import beside the CPU torch build). The export route is
:mod:`remat_cli.importers.torch_export` (needs the optional extra ``remat-cli[torch]``); each
graph is checked against torch autograd.

    python3 graphs/make_training_graphs.py            # writes graphs/torch_*_train.onnx
    python3 graphs/make_training_graphs.py --only mlp
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import onnx
import torch
import torch.nn.functional as F
from torch import nn

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # run from a checkout without installing

from remat_cli.importers.torch_export import Spec, export_training_graph  # noqa: E402


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


# ---------------------------------------------------------------- the shipped specs
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", nargs="*", help="names among mlp, resnet, transformer, unet")
    ap.add_argument("--out", type=Path, default=HERE)
    args = ap.parse_args()
    torch.manual_seed(0)
    for name, spec in specs().items():
        if args.only and name not in args.only:
            continue
        path = export_training_graph(spec, args.out / f"torch_{name}_train.onnx", name=name)
        m = onnx.load(path)
        print(f"{path.name}: {path.stat().st_size / 1e6:.2f} MB, {len(m.graph.node)} nodes")


if __name__ == "__main__":
    main()
