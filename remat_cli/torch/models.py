"""Four reference training steps (an MLP, a ResNet-18-style network, a U-Net and a GPT-style
decoder) whose ``forward`` returns the loss, for checking and measuring the partitioner.

Each model's ``blocks`` are its repeated units; with ``checkpoint_blocks = True`` each runs
under ``torch.utils.checkpoint`` (non-reentrant), as Hugging Face's
``gradient_checkpointing_enable()`` does: the per-block checkpointing baseline.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


class Blocks(nn.Module):
    """Runs ``blocks`` in sequence, each under checkpointing when ``checkpoint_blocks``."""

    def __init__(self) -> None:
        super().__init__()
        self.checkpoint_blocks = False

    def run(self, block: nn.Module, *xs: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_blocks and torch.is_grad_enabled():
            return checkpoint(block, *xs, use_reentrant=False)
        return block(*xs)


class MLP(Blocks):
    def __init__(self, width: int, depth: int, classes: int = 10) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.LayerNorm(width)) for _ in range(depth)
        )
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = self.run(block, x)
        return F.cross_entropy(self.head(x), y)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet18(Blocks):
    """ResNet-18's layout (stem, four stages of two basic blocks, pooling, classifier)."""

    def __init__(self, width: int = 64, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU())
        blocks, cin = [], width
        for stage in range(4):
            cout = width * 2**stage
            for i in range(2):
                blocks.append(BasicBlock(cin, cout, 2 if stage and not i else 1))
                cin = cout
        self.blocks = nn.ModuleList(blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = self.run(block, x)
        return F.cross_entropy(self.fc(x.mean((2, 3))), y)


def _conv_block(cin: int, cout: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(), nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU()
    )


class UNet(Blocks):
    """A U-Net: `depth` down stages (two convolutions, max-pooling), up stages (transposed
    convolution, the skip concatenated, two convolutions), per-pixel MSE loss."""

    def __init__(self, base: int = 16, depth: int = 3, channels: int = 3) -> None:
        super().__init__()
        widths = [base * 2**i for i in range(depth + 1)]
        self.down = nn.ModuleList(
            _conv_block(c, w) for c, w in zip([channels, *widths[:-2]], widths[:-1], strict=True)
        )
        self.mid = _conv_block(widths[-2], widths[-1])
        self.ups = nn.ModuleList(nn.ConvTranspose2d(w, w // 2, 2, 2) for w in reversed(widths[1:]))
        self.up = nn.ModuleList(_conv_block(w, w // 2) for w in reversed(widths[1:]))
        self.out = nn.Conv2d(base, channels, 1)
        self.blocks = [*self.down, self.mid, *self.up]

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        skips = []
        h = x
        for block in self.down:
            h = self.run(block, h)
            skips.append(h)
            h = F.max_pool2d(h, 2)
        h = self.run(self.mid, h)
        for up, block, skip in zip(self.ups, self.up, reversed(skips), strict=True):
            h = self.run(block, torch.cat([up(h), skip], 1))
        return F.mse_loss(self.out(h), y)


class DecoderBlock(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).triu(1)
        att = self.drop(att.masked_fill(mask, float("-inf")).softmax(-1))
        x = x + self.drop(self.proj((att @ v).transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))


class Decoder(Blocks):
    """A GPT-style decoder: token and position embeddings, pre-LayerNorm blocks of causal
    attention and a GELU MLP with dropout, a language-model head and cross-entropy."""

    def __init__(self, vocab: int, d: int, heads: int, layers: int, seq: int, dropout: float = 0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(seq, d)
        self.blocks = nn.ModuleList(DecoderBlock(d, heads, dropout) for _ in range(layers))
        self.ln, self.head = nn.LayerNorm(d), nn.Linear(d, vocab)

    def forward(self, idx: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = self.run(block, x)
        return F.cross_entropy(self.head(self.ln(x)).flatten(0, 1), y.flatten())


@dataclass
class Case:
    """A model and one batch of its inputs."""

    name: str
    model: Blocks
    inputs: tuple[torch.Tensor, ...]


def _mlp(full: bool) -> Case:
    w, depth, batch = (512, 8, 1024) if full else (128, 3, 256)
    return Case("mlp", MLP(w, depth), (torch.randn(batch, w), torch.randint(0, 10, (batch,))))


def _resnet(full: bool) -> Case:
    width, batch, hw = (16, 32, 16) if full else (8, 4, 16)
    x = torch.randn(batch, 3, hw, hw)
    return Case("resnet18", ResNet18(width), (x, torch.randint(0, 10, (batch,))))


def _unet(full: bool) -> Case:
    base, depth, batch, hw = (16, 3, 4, 64) if full else (8, 2, 2, 32)
    x = torch.randn(batch, 3, hw, hw)
    return Case("unet", UNet(base, depth), (x, torch.randn_like(x)))


def _decoder(full: bool) -> Case:
    vocab, d, heads, layers, seq, batch = (512, 128, 4, 12, 128, 4) if full else (128, 64, 4, 2, 64, 2)
    idx = torch.randint(0, vocab, (batch, seq))
    return Case(
        "decoder", Decoder(vocab, d, heads, layers, seq), (idx, torch.randint(0, vocab, (batch, seq)))
    )


CASES: dict[str, Callable[[bool], Case]] = {
    "mlp": _mlp,
    "resnet18": _resnet,
    "unet": _unet,
    "decoder": _decoder,
}


def case(name: str, full: bool = False, seed: int = 0) -> Case:
    """Model `name` (mlp, resnet18, unet, decoder) with seeded weights and inputs: the small
    version for tests, or with `full` the benchmark's sizes."""
    torch.manual_seed(seed)
    return CASES[name](full)
