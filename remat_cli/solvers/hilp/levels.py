"""The H-ILP solver's hierarchy (Gusak et al., *HiREmate*, §3.2 and App. C.1): the H-Partition's
levels solved bottom-up, each subgraph for its options (one representative per class of identical
subgraphs), and the options split over the units (§3.2.2).
"""

from __future__ import annotations

from typing import Any

from remat_cli.solvers.hilp.context import Ctx
from remat_cli.solvers.hilp.flatstart import FLAT_SHARE, WholeGraph, solver_names
from remat_cli.solvers.hilp.hpartition import LevelGraph, h_partition
from remat_cli.solvers.hilp.subgraphs import Job, run_jobs
from remat_cli.solvers.hilp.units import Opt, Unit, atomic, canonical, measure, pareto, spread

#: options kept per top-level unit at least (§3.2.2's N_o split gives the rest)
TOP_OPTIONS = 6


class Levels(WholeGraph):
    """The hierarchy part of one H-ILP solve (see HilpRun)."""

    def span(self) -> float:
        """The time limit the hierarchy's nominal shares are taken of: what the flat start
        (when one ran) leaves of it."""
        assert self.limit is not None
        return (
            self.limit * (1 - FLAT_SHARE)
            if self.flat_seq is not None and self.p.get("flat_start")
            else self.limit
        )

    def hierarchy(self, ctx: Ctx) -> list[Unit]:
        g = self.g
        needed = [n for n in g.topo_order if n in ctx.needed]
        training = bool(ctx.forward)
        base_nodes = [n for n in needed if n in ctx.forward] if training else needed
        idx = {n: i for i, n in enumerate(base_nodes)}
        preds = [
            sorted({idx[ctx.producer[v]] for v in ctx.nodes[n].inputs if ctx.producer.get(v) in idx})
            for n in base_nodes
        ]
        values = []
        for n in base_nodes:
            for v in ctx.nodes[n].outputs:
                cons = tuple(sorted({idx[c] for c in ctx.consumers[v] if c in idx}))
                values.append((ctx.size(v), idx[n], cons, v in ctx.outputs))
        lg = LevelGraph(preds, values, [1] * len(base_nodes))
        levels = h_partition(lg, int(self.p["max_subgraph"]), int(self.p["max_top"]), float(self.p["alpha"]))
        # level-0 units
        if training:
            units: list[Unit] = []
            for n in base_nodes:
                if ctx.grads.get(n):
                    units.append(
                        Unit(fwd=(n,), bwd=tuple(sorted(ctx.grads[n], key=ctx.pos.__getitem__)), layer=True)
                    )
                else:
                    units.append(Unit(fwd=(n,), bwd=(), layer=False))
        else:
            units = [Unit(fwd=(n,), bwd=(), layer=False) for n in base_nodes]
        atoms: dict[str, Unit] = {}

        def atom(n: str) -> Unit:
            if n not in atoms:
                atoms[n] = atomic(ctx, n)
            return atoms[n]

        # level 0: a layer of one forward operator and several backward ones (ONNX training
        # graphs, paired by structural_pairs) is a subgraph of its own, solved for its options;
        # split into atoms it would leave its backward operators one by one to the top H-ILP
        solve0 = [ui for ui, u in enumerate(units) if u.layer and len(u.bwd) > 1]
        for ui in solve0:
            units[ui].children = [atom(n) for n in units[ui].fwd + units[ui].bwd]
        n_levels = len(levels) + (1 if solve0 else 0)
        if solve0:
            self.solve_level(ctx, units, 0, n_levels, leaf=True)
            self.opt.progress(stage="level 0", subgraphs=len(solve0))
        for li, groups in enumerate(levels):
            new_units: list[Unit] = []
            for grp in groups:
                members = [units[i] for i in grp]
                if len(grp) == 1:
                    new_units.append(members[0])
                    continue
                fwd = tuple(sorted((n for u in members for n in u.fwd), key=ctx.pos.__getitem__))
                bwd = tuple(sorted((n for u in members for n in u.bwd), key=ctx.pos.__getitem__))
                u = Unit(fwd=fwd, bwd=bwd, layer=bool(bwd))
                u.children = [c for m in members for c in self.expand(m, atom)]
                self.select(u.children)
                new_units.append(u)
            li_all = li + (1 if solve0 else 0)
            solved = self.solve_level(ctx, new_units, li_all, n_levels, leaf=li == 0)
            units = new_units
            self.opt.progress(stage=f"level {li + 1}", subgraphs=len(groups), solved=solved)
        # top units: solved subgraphs keep their options; the others stand for their operators
        top = [c for u in units for c in self.expand(u, atom)]
        done = {n for u in top for n in u.owned}
        top += [atom(n) for n in needed if n not in done]
        self.select(top, TOP_OPTIONS)
        return top

    def solve_level(self, ctx: Ctx, new_units: list[Unit], li: int, n_levels: int, leaf: bool) -> int:
        """Options of every unit of one level that has children and none yet (one
        representative per class of identical subgraphs, App. C.1.1); returns how many were
        solved."""
        owners: list[int] = []
        jobs: list[Job] = []
        classes: dict[tuple[Any, ...], int] = {}
        translate: list[tuple[int, int, list[str]]] = []
        reps: dict[int, list[str]] = {}
        for ui, u in enumerate(new_units):
            if u.children is None or u.options:
                continue
            key, order = canonical(ctx, u)
            if key in classes:
                translate.append((ui, classes[key], order))
                continue
            classes[key] = ui
            reps[ui] = order
            owners.append(ui)
        share = None
        if self.limit is not None:
            left = max(0.1, self.span() * 0.5 - (0 if self.deterministic else self.elapsed()))
            if self.deterministic:
                left = self.span() * 0.5 / max(1, n_levels)
            else:
                left = left / max(1, n_levels - li)
            # building and measuring take time too: the ILPs get 70% of the share
            share = 0.7 * left / max(1, len(owners) / max(1, int(self.p["jobs"])))
        fr = _fractions(int(self.p["levels"]))
        names = tuple(solver_names(self.p, "leaf_solvers")) if leaf else ()
        for ui in owners:
            jobs.append(
                Job(
                    new_units[ui],
                    fr,
                    share,
                    self.backend,
                    self.opt.seed,
                    self.deterministic,
                    names,
                    self.deadline,
                )
            )
        results = self.run_jobs(ctx, jobs)
        for ui, (opts, failures) in zip(owners, results, strict=True):
            new_units[ui].options = opts
            self.leaf_failures.extend(failures)
        for ui, rep, order in translate:
            mapping = dict(zip(reps[rep], order, strict=True))
            u = new_units[ui]
            u.options = pareto(
                [
                    measure(ctx, u.owned, tuple(mapping[n] for n in o.fwd), tuple(mapping[n] for n in o.bwd))
                    for o in new_units[rep].options
                ]
            )
        return len(owners)

    @staticmethod
    def expand(u: Unit, atom: Any) -> list[Unit]:
        """A unit without options (never grouped) stands for its atomic operators."""
        if u.options:
            return [u]
        return [atom(n) for n in u.fwd + u.bwd]

    def select(self, units: list[Unit], floor: int = 3) -> None:
        """§3.2.2: split N_o over the compute nodes in proportion to their basic operations,
        each keeping at least `floor` (the top level, solved once and warm-started, affords
        more: with 3 options a 25-unit top has only "keep all", "keep some", "keep nothing")."""
        n_o = int(self.p["options"])
        total = sum(u.ops for u in units if len(u.options) > 1) or 1
        for u in units:
            if len(u.options) > 1:
                u.options = spread(u.options, max(floor, round(n_o * u.ops / total)))

    def run_jobs(self, ctx: Ctx, jobs: list[Job]) -> list[tuple[list[Opt], list[tuple[str, str]]]]:
        return run_jobs(ctx, jobs, int(self.p["jobs"]))


def _fractions(levels: int) -> tuple[float, ...]:
    if levels <= 1:
        return (1.0,)
    return tuple(1.0 - i / (levels - 1) for i in range(levels))
