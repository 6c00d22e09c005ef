"""Trade-off and memory figures (matplotlib, Agg: no display needed).

Trade-off (one panel per graph): each solver's schedules as compute overhead against peak memory,
both relative to the baseline (run the graph's order, free after last use, recompute nothing):
the curve people read to choose a budget. Shaded below it, where known, the region that the
solvers' lower bounds prove empty: no schedule that fits budget b costs less than the best bound
proved at any budget >= b. The memory lower bound (resident bytes plus the largest working set,
`schedule.peak_lower_bound`) is shaded as a band on the left. The baseline is the star at (100%, 0%).

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so they are returned to
the caller, tested by their data, and rendered with the Agg canvas.
"""

from __future__ import annotations

import io
import math
from collections import defaultdict
from typing import Any

from matplotlib.figure import Figure

from remat_cli.graph import Graph
from remat_cli.schedule import Schedule, baseline, simulate
from remat_cli.sweep.cells import record_key

FEASIBLE = ("optimal", "feasible")
BASELINE_LABEL = "baseline (no rematerialization)"
BOUND_LABEL = "{solver}: proven lower bound (its search space)"
MEMORY_BOUND_LABEL = "below the memory lower bound"


def latest(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One record per cell: the last one written (a re-run cell replaces its earlier record)."""
    by_key: dict[Any, dict[str, Any]] = {}
    for r in records:
        by_key[record_key(r)] = r
    return list(by_key.values())


def by_graph(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in latest(records):
        groups[r["graph_sha256"]].append(r)
    return dict(sorted(groups.items(), key=lambda kv: (kv[1][0]["graph"], kv[0])))


def solver_points(records: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per solver: (peak % of baseline, overhead %) of its schedules within budget, loosest budget first."""
    pts: dict[str, list[tuple[float, float, int]]] = defaultdict(list)
    for r in records:
        if r.get("status") in FEASIBLE and r.get("overhead") is not None and r.get("peak") is not None:
            pts[r["solver"]].append(
                (100.0 * r["peak"] / r["baseline_peak"], 100.0 * r["overhead"], r["budget_bytes"])
            )
    return {s: [(x, y) for x, y, _ in sorted(p, key=lambda t: -t[2])] for s, p in sorted(pts.items())}


def bound_curve(records: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """The region `records` (of one solver) prove empty, as its upper edge in (budget %, overhead %)
    steps, ascending budget.

    f(x) = max { LB(b) : b >= x } over the budgets b with a proven bound LB(b) on the overhead
    (a bound at a larger budget holds at every smaller one).
    """
    best: dict[int, float] = {}
    base = records[0]["baseline_peak"] if records else 1
    for r in records:
        b = r.get("bound_overhead")
        if b is not None and math.isfinite(b):
            best[r["budget_bytes"]] = max(best.get(r["budget_bytes"], -math.inf), max(0.0, b))
    budgets = sorted(best)
    running, steps = -math.inf, []
    for b in reversed(budgets):
        running = max(running, best[b])
        steps.append((100.0 * b / base, 100.0 * running))
    return list(reversed(steps))


def tradeoff_figure(records: list[dict[str, Any]], columns: int = 3) -> Figure:
    groups = by_graph(records)
    n = max(1, len(groups))
    cols = min(columns, n)
    rows = math.ceil(n / cols)
    fig = Figure(figsize=(5.2 * cols, 4.2 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False).ravel()
    solvers = sorted({r["solver"] for rs in groups.values() for r in rs})
    colors = {s: f"C{i % 10}" for i, s in enumerate(solvers)}
    for ax, (_, rs) in zip(axes, groups.items(), strict=False):
        _tradeoff_panel(ax, rs, colors)
    for ax in axes[len(groups) :]:
        ax.set_visible(False)
    # one legend for all panels (the solvers keep their colours across panels)
    handles: dict[str, Any] = {}
    for ax in axes[: len(groups)]:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, h)
    if handles:
        fig.legend(
            list(handles.values()),
            list(handles),
            loc="outside lower center",
            ncols=min(4, len(handles)),
            fontsize=8,
        )
    if not groups:
        axes[0].set_visible(True)
        axes[0].text(0.5, 0.5, "no records", ha="center", va="center", transform=axes[0].transAxes)
    return fig


def _tradeoff_panel(ax: Any, rs: list[dict[str, Any]], colors: dict[str, str]) -> None:
    r0 = rs[0]
    xs_all: list[float] = [100.0]
    ys_all: list[float] = [0.0]
    for solver, pts in solver_points(rs).items():
        x, y = zip(*pts, strict=True)
        ax.plot(x, y, marker="o", ms=5, lw=1.4, color=colors[solver], label=solver, gid=f"solver:{solver}")
        xs_all += x
        ys_all += y
    lo_mem = 100.0 * r0["peak_lower_bound"] / r0["baseline_peak"] if r0.get("peak_lower_bound") else None
    for solver in sorted({r["solver"] for r in rs}):
        curve = bound_curve([r for r in rs if r["solver"] == solver])
        if not curve:
            continue
        x0 = lo_mem if lo_mem is not None else min(p[0] for p in curve) - 5
        bx = [x0] + [p[0] for p in curve]
        by = [curve[0][1]] + [p[1] for p in curve]
        ax.fill_between(
            bx,
            0,
            by,
            step="pre",
            color=colors[solver],
            alpha=0.18,
            lw=0,
            label=BOUND_LABEL.format(solver=solver),
            gid=f"bound:{solver}",
        )
        xs_all += bx
        ys_all += by
    budgets = sorted({100.0 * r["budget_bytes"] / r["baseline_peak"] for r in rs})
    xs_all += budgets
    left = min(xs_all) - 4
    if lo_mem is not None and lo_mem > left - 10:
        ax.axvspan(left - 10, lo_mem, color="0.85", hatch="//", alpha=0.5, lw=0, label=MEMORY_BOUND_LABEL)
        left = min(left, lo_mem - 4)
    for b in budgets:
        ax.axvline(b, color="0.8", lw=0.6, ls=":", zorder=0)
    ax.plot(
        [100.0],
        [0.0],
        marker="*",
        ms=16,
        mfc="none",
        mec="black",
        mew=1.3,
        ls="none",
        zorder=5,
        label=BASELINE_LABEL,
        gid="baseline",
    )
    ax.set_xlim(left, 103)
    top = max(ys_all) if ys_all else 1.0
    ax.set_ylim(-0.05 * max(top, 1.0), 1.12 * max(top, 1.0))
    ax.set_xlabel("peak memory (% of baseline peak)")
    ax.set_ylabel("compute overhead (% of baseline cost)")
    ax.set_title(f"{r0['graph']}\nbaseline peak {_human(r0['baseline_peak'])}", fontsize=9)
    ax.grid(True, alpha=0.3)


def memory_figure(
    graph: Graph, schedule: Schedule, budget: int | None = None, budgets: dict[str, int] | None = None
) -> Figure:
    """Live bytes at each step of `schedule` (the simulator's profile) against the budget line;
    on a multi-device graph one line per device against that device's budget (`budgets`, else
    the schedule's, else the graph's)."""
    sim = simulate(graph, schedule.steps, keep_profile=True)
    base = baseline(graph)
    if sim.device_profile is not None:
        limits = budgets or schedule.budgets or {d.id: d.budget for d in graph.devices or [] if d.budget}
        top = max([sim.peak_memory, base.peak_memory, *limits.values()])
    else:
        limit = budget if budget is not None else schedule.budget
        top = max([sim.peak_memory, base.peak_memory, limit or 0])
    unit, scale = _unit(top)
    fig = Figure(figsize=(9, 4), layout="constrained")
    ax = fig.subplots()
    steps = list(range(len(sim.profile)))
    if sim.device_profile is not None:
        # one colour per device: its live bytes solid, its budget dashed
        for i, (d, prof) in enumerate(sim.device_profile.items()):
            color = f"C{i % 10}"
            peak = sim.peak_by_device[d] if sim.peak_by_device else max(prof, default=0)
            ax.plot(
                steps,
                [m / scale for m in prof],
                lw=1.0,
                color=color,
                drawstyle="steps-post",
                label=f"{d}: live memory (peak {_human(peak)})",
                gid=f"live:{d}",
            )
            if d in limits:
                ax.axhline(
                    limits[d] / scale,
                    color=color,
                    lw=1.2,
                    ls="--",
                    label=f"{d}: budget {_human(limits[d])}",
                    gid=f"budget:{d}",
                )
    else:
        ax.plot(
            steps,
            [m / scale for m in sim.profile],
            lw=1.0,
            color="C0",
            drawstyle="steps-post",
            label="live memory",
            gid="live",
        )
        if limit is not None:
            ax.axhline(
                limit / scale, color="C3", lw=1.2, ls="--", label=f"budget {_human(limit)}", gid="budget"
            )
    ax.axhline(
        base.peak_memory / scale,
        color="0.5",
        lw=1.0,
        ls=":",
        label=f"baseline peak {_human(base.peak_memory)}"
        + (f" (all on {graph.home_device})" if sim.device_profile is not None else ""),
    )
    ax.set_xlabel("schedule step")
    ax.set_ylabel(f"live memory ({unit})")
    copies = f", {sim.copies} copies" if sim.device_profile is not None else ""
    ax.set_title(
        f"{graph.name}: {schedule.solver.name}, peak {_human(sim.peak_memory)}, "
        f"overhead {100 * (sim.cost / base.cost - 1 if base.cost else 0):.2f}%{copies}",
        fontsize=9,
    )
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return fig


def figure_bytes(fig: Figure, fmt: str) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=130)
    return buf.getvalue()


def _unit(n: float) -> tuple[str, float]:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return unit, scale
    return "B", 1.0


def _human(n: float) -> str:
    unit, scale = _unit(n)
    return f"{n / scale:,.2f} {unit}" if scale > 1 else f"{n:,.0f} B"
