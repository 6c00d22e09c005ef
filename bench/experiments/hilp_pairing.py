"""Does autograd's pairing help the H-ILP's own schedule? (issue 18, item 2's first lever)

``remat export-torch`` writes, on each backward ONNX node, the forward op it differentiates
(metadata ``remat.grad_of``, autograd's pairing); other exporters' graphs carry phases only,
and hilp then pairs from the dataflow (``structural_pairs``). For each graph and budget this
script runs the H-ILP alone -- no flat start, no windows, no fallbacks: HiREmate's method by
itself -- once on the graph as exported (``autograd``) and once with the metadata stripped
(``structural``), and fastsa for reference, each with one worker and the same limit. A row
records each schedule's overhead (None: none within budget) and the H-ILP's message.

Usage (the exports need the extra ``[torch]``; one core per run):

    python graphs/make_training_graphs.py --out /tmp/exports
    python bench/hilp_pairing.py --graphs /tmp/exports/torch_unet_train.onnx --fractions 0.7,0.5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import onnx

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parent)]  # the checkout, and bench/ for common.py

from common import write_results  # noqa: E402

from remat_cli.budget import parse_budget  # noqa: E402
from remat_cli.execution.runner import run_solver  # noqa: E402
from remat_cli.graph import Graph  # noqa: E402
from remat_cli.importers.onnx import GRAD_OF_KEY, from_onnx_model  # noqa: E402
from remat_cli.schedule import baseline  # noqa: E402
from remat_cli.solver import SolveOptions  # noqa: E402

#: the H-ILP alone
OWN = {"flat_start": "", "windows": 0, "fallback": "none"}


def stripped(model: onnx.ModelProto) -> onnx.ModelProto:
    """`model` as another exporter writes it: no ``remat.grad_of`` metadata."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    for node in out.graph.node:
        keep = [p for p in node.metadata_props if p.key != GRAD_OF_KEY]
        del node.metadata_props[:]
        node.metadata_props.extend(keep)
    return out


def solve(g: Graph, budget: int, name: str, limit: float, params: dict[str, Any]) -> dict[str, Any]:
    opts = SolveOptions(time_limit=limit, seed=0, workers=1, params=params)
    schedule, result = run_solver(g, budget, name, opts)
    fits = schedule is not None and schedule.summary.peak_memory <= budget
    return {
        "overhead": round(schedule.summary.overhead, 6) if fits else None,
        "message": result.message,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--graphs", nargs="+", required=True, help="ONNX exports of remat export-torch")
    ap.add_argument("--fractions", default="0.7,0.5")
    ap.add_argument("--limit", type=float, default=120.0, help="seconds per solve")
    ap.add_argument("--out", default="hilp_pairing")
    args = ap.parse_args()
    rows = []
    for path in args.graphs:
        model = onnx.load(path)
        tagged = sum(any(p.key == GRAD_OF_KEY for p in n.metadata_props) for n in model.graph.node)
        graphs = {"autograd": from_onnx_model(model), "structural": from_onnx_model(stripped(model))}
        g = graphs["autograd"]
        for fraction in (float(f) for f in args.fractions.split(",")):
            budget = parse_budget(f"{fraction:.0%}", baseline(g).peak_memory)
            row: dict[str, Any] = {
                "graph": Path(path).stem,
                "nodes": len(g.nodes),
                "tagged_nodes": tagged,
                "fraction": fraction,
                "budget": budget,
                "limit": args.limit,
            }
            for pairing, graph in graphs.items():
                row[pairing] = solve(graph, budget, "hilp", args.limit, OWN)
            row["fastsa"] = solve(g, budget, "fastsa", args.limit, {})
            rows.append(row)
            cells = [row[k]["overhead"] for k in ("autograd", "structural", "fastsa")]
            print(row["graph"], fraction, *("none" if c is None else f"{c:.2%}" for c in cells), flush=True)
    write_results(
        args.out,
        rows,
        folder=HERE / "results",
        note="H-ILP alone (" + ", ".join(f"{k}={v!r}" for k, v in OWN.items()) + ")",
    )


if __name__ == "__main__":
    main()
