"""A static HTML report of a sweep: the trade-off figure (inline SVG), per graph the live-memory
plot of its tightest schedule within budget (base64 PNG, when the graph file is still readable),
and the table of every cell. One self-contained file: no scripts, no external assets."""

from __future__ import annotations

import base64
import html
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from remat_cli.graph import Graph
from remat_cli.schedule import Schedule
from remat_cli.sweep.plot import FEASIBLE, by_graph, figure_bytes, memory_figure, tradeoff_figure

COLUMNS = ("graph", "budget", "solver", "status", "peak %", "overhead %", "bound %", "seconds", "schedule")

STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
table { border-collapse: collapse; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 8px; text-align: right; }
th:nth-child(-n+4), td:nth-child(-n+4) { text-align: left; }
tr.bad td { color: #999; }
figure { margin: 1em 0; } svg { max-width: 100%; height: auto; }
"""


def _pct(v: float | None) -> str:
    return "—" if v is None else f"{100 * v:.2f}"


def report_html(
    records: list[dict[str, Any]],
    results_dir: Path,
    load_graph: Callable[[str], Graph] | None = None,
    title: str = "remat sweep",
) -> str:
    groups = by_graph(records)
    svg = figure_bytes(tradeoff_figure(records), "svg").decode()
    svg = svg[svg.index("<svg") :]  # drop the XML prolog: inline SVG in HTML
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>",
        f"<p>{sum(len(v) for v in groups.values())} cells over {len(groups)} graphs, "
        f"from {html.escape(str(results_dir))}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.</p>",
        "<h2>Trade-off</h2><figure>",
        svg,
        "<figcaption>Compute overhead against peak memory, both relative to the baseline "
        "(no rematerialization, the star). Grey: the region the solvers' lower bounds prove empty. "
        "Hatched: below the memory lower bound.</figcaption></figure>",
    ]
    if load_graph is not None:
        parts.append("<h2>Live memory of the tightest schedule per graph</h2>")
        for rs in groups.values():
            img = _memory_png(rs, results_dir, load_graph)
            if img:
                parts.append(f"<figure><img alt='live memory' src='data:image/png;base64,{img}'></figure>")
    parts.append("<h2>Cells</h2><table><tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + "</tr>")
    for rs in groups.values():
        for r in sorted(rs, key=lambda r: (-r["budget_bytes"], r["solver"])):
            ok = r["status"] in FEASIBLE
            link = (
                f"<a href='{html.escape(r['schedule'])}'>json</a>"
                if r.get("schedule")
                else html.escape(r.get("message") or "")[:80]
            )
            cells = [
                html.escape(r["graph"]),
                html.escape(r["budget"]),
                html.escape(r["solver"]),
                html.escape(r["status"]),
                _pct(r.get("peak_fraction")),
                _pct(r.get("overhead")),
                _pct(r.get("bound_overhead")),
                f"{r.get('seconds') or 0:.1f}",
                link,
            ]
            parts.append(
                f"<tr class='{'' if ok else 'bad'}'>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>"
            )
    parts.append("</table></body></html>")
    return "\n".join(parts)


def _memory_png(
    rs: list[dict[str, Any]], results_dir: Path, load_graph: Callable[[str], Graph]
) -> str | None:
    ok = [r for r in rs if r["status"] in FEASIBLE and r.get("schedule")]
    if not ok:
        return None
    r = min(ok, key=lambda r: (r["budget_bytes"], r["overhead"]))
    try:
        graph = load_graph(r["graph_file"])
        schedule = Schedule.model_validate_json((results_dir / r["schedule"]).read_text())
    except Exception:  # noqa: BLE001 - a moved graph file only drops this picture
        return None
    if graph.sha256() != r["graph_sha256"]:
        return None
    return base64.b64encode(figure_bytes(memory_figure(graph, schedule), "png")).decode()
