"""Models as users export them, end to end: does remat import, solve and replay them?

Two kinds, none of which the solvers were tuned on:
- inference graphs written by ``torch.onnx.export`` (TorchScript at opsets 11 and 17, dynamo at
  18) with a symbolic batch (and sequence) axis: an LSTM, a bidirectional GRU, a
  TransformerEncoder with an embedding, an upsampling decoder, a CNN with GroupNorm/SiLU/
  Hardswish, and ``torch.jit.script`` control flow (If);
- training steps written by ``remat export-torch``: the same LSTM/GRU/attention/upsampling
  nets, a ConvNeXt block stack (depthwise 7x7, LayerNorm, GELU), EfficientNet MBConv blocks
  (BatchNorm with running statistics, squeeze-excitation, Dropout), a UNet with nearest
  upsampling and a Swin-style patch attention (unfold, roll).

Per model and command: ``remat info`` (symbolic dims fixed with ``--batch``/``--input-shape``),
``remat solve`` (greedy at 100% for inference graphs, fastsa 10 s at 70% and 50% for training
steps) and ``remat run --mode interpret`` and ``--mode session``; the exit code and the last
stderr line. A budget below the lower bound (exit 2 with that message) is a fact about the
model, not a failure; anything else non-zero is.

    python3 bench/export_styles.py        # -> bench/results/export_styles.json

Needs the optional extra (``pip install remat-cli[torch]``).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))


class LSTMNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.head = nn.LSTM(32, 64, num_layers=2, batch_first=True), nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0][:, -1])


class GRUNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(32, 64, batch_first=True, bidirectional=True)
        self.head = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.rnn(x)[0].mean(1))


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(64, 4, 128, batch_first=True, activation="gelu", dropout=0.0)
        self.emb, self.enc, self.head = (
            nn.Embedding(100, 64),
            nn.TransformerEncoder(layer, 2),
            nn.Linear(64, 100),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(x))).flatten(0, 1)


class Upsampling(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.up = nn.Conv2d(3, 8, 3, padding=1), nn.Upsample(scale_factor=2, mode="bilinear")
        self.deconv, self.bn = nn.ConvTranspose2d(8, 4, 2, stride=2), nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.bn(self.deconv(self.up(self.conv(x)))))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, 2, 1), nn.GroupNorm(4, 16), nn.SiLU(),
        nn.Conv2d(16, 16, 3, 1, 1, groups=16), nn.LayerNorm([16, 16, 16]), nn.Hardswish(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16 * 8 * 8, 10),
    )  # fmt: skip


class Control(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(3):
            x = torch.sin(x) + x
        return x.cumsum(0) if x.sum() > 0 else x


class ConvNeXtBlock(nn.Module):
    def __init__(self, d: int = 16) -> None:
        super().__init__()
        self.dw, self.ln = nn.Conv2d(d, d, 7, padding=3, groups=d), nn.LayerNorm(d)
        self.p1, self.p2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
        self.gamma = nn.Parameter(torch.full((d,), 0.1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.p2(F.gelu(self.p1(self.ln(self.dw(x).permute(0, 2, 3, 1))))) * self.gamma
        return x + h.permute(0, 3, 1, 2)


class MBConv(nn.Module):
    def __init__(self, c: int = 16) -> None:
        super().__init__()
        self.expand, self.bn1 = nn.Conv2d(c, 4 * c, 1), nn.BatchNorm2d(4 * c)
        self.dw, self.bn2 = nn.Conv2d(4 * c, 4 * c, 3, padding=1, groups=4 * c), nn.BatchNorm2d(4 * c)
        self.se1, self.se2 = nn.Conv2d(4 * c, c // 4, 1), nn.Conv2d(c // 4, 4 * c, 1)
        self.project, self.bn3, self.drop = nn.Conv2d(4 * c, c, 1), nn.BatchNorm2d(c), nn.Dropout(0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.silu(self.bn2(self.dw(F.silu(self.bn1(self.expand(x))))))
        w = torch.sigmoid(self.se2(F.silu(self.se1(F.adaptive_avg_pool2d(h, 1)))))
        return x + self.drop(self.bn3(self.project(h * w)))


class UNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.d1, self.d2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
        self.up, self.u1, self.out = (
            nn.ConvTranspose2d(16, 8, 2, 2),
            nn.Conv2d(16, 8, 3, padding=1),
            nn.Conv2d(8, 2, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = F.relu(self.d1(x))
        b = F.relu(self.d2(F.max_pool2d(a, 2)))
        c = F.interpolate(F.relu(self.u1(torch.cat([a, self.up(b)], 1))), scale_factor=2, mode="nearest")
        return F.avg_pool2d(self.out(c), 2).flatten(2).mean(2)


class SwinStyle(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.attn = nn.Linear(48, 32), nn.MultiheadAttention(32, 4, batch_first=True)
        self.norm, self.head = nn.LayerNorm(32), nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        patches = x.unfold(2, 4, 4).unfold(3, 4, 4).permute(0, 2, 3, 1, 4, 5).reshape(x.shape[0], 16, 48)
        t = torch.roll(self.embed(patches), 2, 1)
        n = self.norm(t)
        return self.head((t + self.attn(n, n, n, need_weights=False)[0]).mean(1))


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _images(n: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(n, 3, side, side, generator=g), torch.randint(0, 10, (n,), generator=g)


def _seq() -> tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(4, 12, 32, generator=g), torch.randint(0, 10, (4,), generator=g)


def _image_net(stem: nn.Module, *blocks: nn.Module) -> nn.Module:
    return nn.Sequential(stem, *blocks, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _made(make):  # noqa: ANN001, ANN202
    torch.manual_seed(0)
    return make()


# training steps: name -> factory of (model, (x, y), loss_fn)
TRAINING = {
    "lstm": lambda: (_made(LSTMNet), _seq(), F.cross_entropy),
    "gru": lambda: (_made(GRUNet), _seq(), F.cross_entropy),
    "attention": lambda: (
        _made(Attention),
        (torch.randint(0, 100, (2, 16), generator=_gen()), torch.randint(0, 100, (32,), generator=_gen())),
        F.cross_entropy,
    ),
    "upsampling": lambda: (_made(Upsampling), _images(4, 16), F.cross_entropy),
    "cnn": lambda: (_made(small_cnn), _images(4, 32), F.cross_entropy),
    "convnext": lambda: (
        _made(lambda: _image_net(nn.Conv2d(3, 16, 4, 4), ConvNeXtBlock(), ConvNeXtBlock())),
        _images(4, 32),
        F.cross_entropy,
    ),
    "efficientnet": lambda: (
        _made(lambda: _image_net(nn.Conv2d(3, 16, 3, 2, 1), MBConv(), MBConv())),
        _images(4, 32),
        F.cross_entropy,
    ),
    "unet": lambda: (_made(UNet), (_images(2, 16)[0], torch.tensor([0, 1])), F.cross_entropy),
    "swin": lambda: (_made(SwinStyle), _images(2, 16), F.cross_entropy),
}
globals().update(TRAINING)  # `remat export-torch bench/export_styles.py:convnext`

# inference graphs: name -> (model, example input, dynamic axes of x, the shape options remat needs)
INFERENCE = {
    "lstm": (LSTMNet, lambda: _seq()[0], {0: "batch", 1: "seq"}, ["--input-shape", "x=4x12x32"]),
    "gru": (GRUNet, lambda: _seq()[0], {0: "batch"}, ["--batch", "4"]),
    "attention": (Attention, lambda: torch.randint(0, 100, (2, 16)), {0: "batch", 1: "seq"}, ["--input-shape", "x=2x16"]),
    "upsampling": (Upsampling, lambda: _images(2, 16)[0], {0: "batch"}, ["--batch", "4"]),
    "cnn": (small_cnn, lambda: _images(2, 32)[0], {0: "batch"}, ["--batch", "4"]),
    "control": (lambda: torch.jit.script(Control()), lambda: torch.randn(5, 3), None, []),
}  # fmt: skip


def _export_inference(name: str, folder: Path) -> list[tuple[str, Path | str, list[str]]]:
    make, example, axes, shape_options = INFERENCE[name]
    out = []
    for dynamo, opset in ((False, 11), (False, 17), (True, 18)):
        model = _made(make).eval()
        if dynamo and isinstance(model, torch.jit.ScriptModule):
            continue
        path = folder / f"{name}_{'dynamo' if dynamo else 'ts'}{opset}.onnx"
        kw: dict = {"opset_version": opset, "input_names": ["x"], "output_names": ["y"], "dynamo": dynamo}
        if axes and dynamo:
            kw["dynamic_shapes"] = ({k: torch.export.Dim(v, min=2, max=64) for k, v in axes.items()},)
        elif axes:
            kw["dynamic_axes"] = {"x": axes, "y": {0: "batch"}}
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.onnx.export(model, (example(),), str(path), **kw)
        except Exception as e:  # the exporter's own limits (e.g. aten::unflatten at opset 11)
            out.append((path.stem, f"torch.onnx: {type(e).__name__}: {str(e).splitlines()[0][:160]}", []))
            continue
        out.append((path.stem, path, shape_options))
    return out


def _remat(*args: str | Path) -> tuple[int, str, str]:
    p = subprocess.run([sys.executable, "-m", "remat_cli", *map(str, args)], capture_output=True, text=True)
    last = [line for line in p.stderr.splitlines() if line.strip()]
    return p.returncode, p.stdout, last[-1][:240] if last else ""


def _row(model: str, kind: str, command: str, code: int, line: str) -> dict:
    # a budget below the peak lower bound, or torch.onnx's own refusal, is not remat's failure
    below = code == 2 and "below what any schedule can reach" in line
    theirs = line.startswith("torch.onnx: ")
    return {"model": model, "kind": kind, "command": command, "exit": code, "ok": code == 0 or below or theirs,
            "stderr_last": line}  # fmt: skip


def main() -> None:
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="remat-styles-") as tmp:
        folder = Path(tmp)
        for name in INFERENCE:
            for stem, path, shape_options in _export_inference(name, folder):
                if isinstance(path, str):
                    rows.append(_row(stem, "inference", "export", 1, path))
                    continue
                sched = folder / f"{stem}.json"
                for command, args in (
                    ("info", ["info", path, *shape_options]),
                    ("solve greedy 100%", ["solve", path, "-b", "100%", "-s", "greedy", "-o", sched, *shape_options]),
                    ("run interpret", ["run", path, sched, "--mode", "interpret", "--repeat", "1", *shape_options]),
                    ("run session", ["run", path, sched, "--repeat", "1", *shape_options]),
                ):  # fmt: skip
                    code, _, line = _remat(*args)
                    rows.append(_row(stem, "inference", command, code, line))
                    print(f"{stem:22s} {command:18s} exit {code}  {line[:100]}", flush=True)
                    if code != 0:
                        break
        for name in TRAINING:
            path = folder / f"{name}_train.onnx"
            code, _, line = _remat("export-torch", f"{__file__}:{name}", "-o", path)
            rows.append(_row(f"{name}_train", "training", "export-torch", code, line))
            print(f"{name + '_train':22s} {'export-torch':18s} exit {code}  {line[:100]}", flush=True)
            if code != 0:
                continue
            for pct in (70, 50):
                sched = folder / f"{name}_{pct}.json"
                solve = ["solve", path, "-b", f"{pct}%", "-s", "fastsa", "--time-limit", "10", "-o", sched]
                for command, args in (
                    (f"solve fastsa {pct}%", solve),
                    (f"run interpret {pct}%", ["run", path, sched, "--mode", "interpret", "--repeat", "1"]),
                    (f"run session {pct}%", ["run", path, sched, "--repeat", "1"]),
                ):
                    code, _, line = _remat(*args)
                    rows.append(_row(f"{name}_train", "training", command, code, line))
                    print(f"{name + '_train':22s} {command:18s} exit {code}  {line[:100]}", flush=True)
                    if code != 0:
                        break
    from common import write_results

    failed = [r for r in rows if not r["ok"]]
    print(f"{len(rows)} checks, {len(failed)} not ok", flush=True)
    note = ("ok: exit 0, or exit 2 because the budget is below the peak lower bound (a fact about the "
            "model), or torch.onnx refused the export; exit 1 from solve: no schedule found within the budget")  # fmt: skip
    print(f"wrote {write_results('export_styles', rows, note=note, not_ok=len(failed))}")


if __name__ == "__main__":
    main()
