"""Shared helpers for the bench scripts: the Moccasin graphs by name, budgets, and writing
results with the exact command that produced them."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from remat_cli.budget import parse_budget  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers import load_graph  # noqa: E402
from remat_cli.schedule import SimResult, baseline  # noqa: E402

MOCCASIN = Path(
    os.environ.get("REMAT_BENCH_GRAPHS", Path(__file__).resolve().parents[2] / "shared/benchmarks/moccasin")
)
RESULTS = Path(__file__).resolve().parent / "results"

GRAPHS = {
    "RL n100": "random_layered_n100_w0.27_nlv0.75_ed0.2_scd0.14.json",
    "RL n250": "random_layered_n250_w0.43_nlv0.75_ed0.2_scd0.14.json",
    "RL n500": "random_layered_n500_w0.36_nlv0.75_ed0.2_scd0.14.json",
    "RL n1000": "random_layered_n1000_w0.31_nlv0.75_ed0.2_scd0.14.json",
    "CM1": "fcn_8_vgg (MLSys)_32_(416, 608, 3)_train_nx.json",
    "CM2": "ResNet50 (MLSys)_256_(224, 224, 3)_train_nx.json",
}


#: the short keys the bench scripts use on the command line
SHORT = {
    "rl100": "RL n100",
    "rl250": "RL n250",
    "rl500": "RL n500",
    "rl1000": "RL n1000",
    "cm1": "CM1",
    "cm2": "CM2",
}


def graph_files(keys: dict[str, str] | None = None) -> dict[str, str]:
    """File names by the caller's keys (default: the paper labels)."""
    return {k: GRAPHS[label] for k, label in (keys or {v: v for v in GRAPHS}).items()}


#: the ONNX training exports shipped in graphs/ (issue 18's table)
EXPORTS = ("torch_mlp_train", "torch_unet_train", "torch_transformer_train", "torch_resnet_train")


def export_path(name: str) -> Path:
    """A shipped export by name (graphs/NAME.onnx), or any graph file by its path (the held-out
    exports of bench/model_nets.py)."""
    if name.endswith((".onnx", ".json")):
        return Path(name)
    return Path(__file__).resolve().parents[1] / "graphs" / f"{name}.onnx"


def export_cells(
    names: Iterable[str], fractions: Iterable[float]
) -> Iterator[tuple[str, Graph, SimResult, float, int]]:
    """(graph name, graph, its baseline, fraction, budget in bytes) for every export of `names`
    (export_path) at every budget fraction, each graph loaded once."""
    fractions = list(fractions)
    for name in names:
        path = export_path(name)
        g = load_graph(path)
        base = baseline(g)
        for frac in fractions:
            yield path.stem, g, base, frac, parse_budget(f"{frac * 100:g}%", base.peak_memory)


def ab_parser(doc: str, out: str, fractions: str) -> argparse.ArgumentParser:
    """The options of a bench that runs one solver two ways on the same cells (fastsa_pins,
    fastsa_repair, fastsa_reach): time limit, fractions, seeds, shipped exports (--only), more
    graph files; a bench adds its own options to it."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0)
    ap.add_argument("--fractions", default=fractions)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--only", nargs="*", help="shipped exports by name (default: all four; none given: none)")
    ap.add_argument("--graphs", nargs="*", default=[], help="more graph files")
    ap.add_argument("--out", default=out)
    ap.add_argument("--note", default="")
    return ap


def ab_args(doc: str, out: str, fractions: str) -> argparse.Namespace:
    """ab_parser's options, parsed."""
    return ab_parser(doc, out, fractions).parse_args()


def ab_cells(args: argparse.Namespace) -> Iterator[tuple[str, Graph, SimResult, float, int, int]]:
    """export_cells of ab_args' graphs and fractions, with each seed: (..., budget, seed)."""
    names = [*(EXPORTS if args.only is None else args.only), *args.graphs]  # --only alone: no export
    for name, g, base, frac, budget in export_cells(names, [float(f) for f in args.fractions.split(",")]):
        for seed in (int(x) for x in args.seeds.split(",")):
            yield name, g, base, frac, budget, seed


def moccasin_graph(label: str) -> Graph:
    """A published benchmark graph by its label in the papers' tables (RL n100, CM1, ...)."""
    return load_graph(MOCCASIN / GRAPHS[label])


def write_results(name: str, rows: list[dict[str, Any]], *, folder: Path = RESULTS, **extra: Any) -> Path:
    """`folder`/NAME.json (bench/results; bench/experiments/results for an experiment) with the
    exact command, the date and the machine; list it in bench/README.md."""
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}.json"
    record = {
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        **extra,
        "rows": rows,
    }
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path
