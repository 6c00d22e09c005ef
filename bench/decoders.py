"""Decoder-only transformers of any depth, exported as training graphs (forward + loss + backward)
through remat's exporter, for the deep-model benchmark (bench/deep.py) and the 12-layer decoder
shipped in graphs/.

- ``gpt``: GPT-2 style — token and position embeddings, N pre-LayerNorm blocks (causal scaled
  dot-product attention, GELU MLP of 4d), a final LayerNorm and a linear head; cross entropy.
- ``llama``: Llama style — token embedding, N pre-RMSNorm blocks (causal attention with rotary
  position embeddings, SwiGLU MLP), a final RMSNorm and a linear head without biases.

Both keep their N blocks in an ``nn.ModuleList`` named ``blocks`` (d=256, 4 heads, sequence 256,
batch 8), so the export's module scopes read ``blocks.7.attn`` and ``--solver blocks`` finds them.
Parameters and data are graph inputs, so a file holds no weights (the 12-layer graph is ~1 MB).

    python3 bench/decoders.py gpt --layers 12 --out graphs/torch_decoder12_train.onnx
    python3 bench/decoders.py llama --layers 32          # into the cache (bench/.cache/)
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remat_cli.importers.torch_export import Spec, export_training_graph  # noqa: E402

#: where exported decoders are kept between runs (git-ignored)
CACHE = Path(__file__).resolve().parent / ".cache"
#: the shapes every decoder shares
D, HEADS, SEQ, BATCH, VOCAB = 256, 4, 256, 8, 512


def causal_mask(t: int) -> torch.Tensor:
    """(t, t) booleans, True where a position may attend (itself and before). Made once per
    model and passed to every block: SDPA's own ``is_causal`` builds it in each block, which the
    export folds into one constant per layer (1.2 MB a layer)."""
    return torch.ones(t, t, dtype=torch.bool).tril()


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Causal scaled dot-product attention, (b, heads, t, hd) each, back to (b, t, d)."""
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    b, h, t, hd = a.shape
    return a.transpose(1, 2).reshape(b, t, h * hd)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    b, t, d = x.shape
    return x.reshape(b, t, heads, d // heads).transpose(1, 2)


class GPTAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = (_heads(z, self.heads) for z in self.qkv(x).chunk(3, dim=-1))
        return self.proj(_attention(q, k, v, mask))


class GPTMLP(nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.up = nn.Linear(d, 4 * d)
        self.down = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x)))


class GPTBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = GPTAttention(d, heads)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = GPTMLP(d)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), mask)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, d: int = D, heads: int = HEADS, t: int = SEQ, vocab: int = VOCAB):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(t, d)
        self.blocks = nn.ModuleList(GPTBlock(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens) + self.pos.weight[: tokens.shape[1]]
        mask = causal_mask(tokens.shape[1])
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln(x)).flatten(0, 1)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w (Zhang & Sennrich 2019), as Llama's."""

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) in Llama's half-split form."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(d, d, bias=False)
        self.k = nn.Linear(d, d, bias=False)
        self.v = nn.Linear(d, d, bias=False)
        self.o = nn.Linear(d, d, bias=False)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        q = _rotate(_heads(self.q(x), self.heads), *rope)
        k = _rotate(_heads(self.k(x), self.heads), *rope)
        return self.o(_attention(q, k, _heads(self.v(x), self.heads), mask))


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x)) (Shazeer 2020), hidden 8d/3 rounded to a multiple of 32."""

    def __init__(self, d: int):
        super().__init__()
        hidden = 32 * math.ceil(8 * d / 3 / 32)
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.norm1 = RMSNorm(d)
        self.attn = LlamaAttention(d, heads)
        self.norm2 = RMSNorm(d)
        self.mlp = SwiGLU(d)

    def forward(
        self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], mask: torch.Tensor
    ) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope, mask)
        return x + self.mlp(self.norm2(x))


class Llama(nn.Module):
    def __init__(self, layers: int, d: int = D, heads: int = HEADS, t: int = SEQ, vocab: int = VOCAB):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(LlamaBlock(d, heads) for _ in range(layers))
        self.norm = RMSNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        hd = d // heads
        inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(t, dtype=torch.float32), inv)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.emb(tokens)
        t = tokens.shape[1]
        rope, mask = (self.cos[:t], self.sin[:t]), causal_mask(t)
        for block in self.blocks:
            x = block(x, rope, mask)
        return self.head(self.norm(x)).flatten(0, 1)


KINDS = {"gpt": GPT, "llama": Llama}


def spec(kind: str, layers: int, seed: int = 0) -> Spec:
    """A decoder of `layers` blocks, one batch of random tokens and next-token cross entropy."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    targets = torch.randint(0, VOCAB, (BATCH * SEQ,), generator=g)
    return KINDS[kind](layers), (tokens, targets), F.cross_entropy


def name(kind: str, layers: int) -> str:
    return f"torch_{'decoder' if kind == 'gpt' else kind}{layers}_train"


def export(kind: str, layers: int, folder: Path = CACHE, check: bool = True) -> Path:
    """The exported training graph of decoder `kind` with `layers` blocks, from `folder` when it
    was exported there before (the file's name says kind and depth)."""
    path = folder / f"{name(kind, layers)}.onnx"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        export_training_graph(spec(kind, layers), path, name=name(kind, layers), check=check)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kind", choices=sorted(KINDS))
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--out", type=Path, help="the ONNX file (default: the cache folder)")
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with torch autograd")
    args = ap.parse_args()
    if args.out:
        path = export_training_graph(
            spec(args.kind, args.layers), args.out, name=name(args.kind, args.layers), check=not args.no_check
        )
    else:
        path = export(args.kind, args.layers, check=not args.no_check)
    import onnx

    m = onnx.load(path)
    print(f"{path}: {path.stat().st_size / 1e6:.2f} MB, {len(m.graph.node)} nodes")


if __name__ == "__main__":
    main()
