"""FastSA: simulated annealing over a node sequence with an add-max segment tree and node grouping.

Imanishi, Xu, Takagi, Wang, Castillo, "A fast heuristic to optimize time-space tradeoff for large
models", NeurIPS 2023 (``papers/fastsa.txt``): §2 (problem, SA, segment tree, grouping), App. B
(node-intermediate memory, memory-minimising ordering), App. C (node grouping, logaddexp tree)
and App. D.4 (initialisation and temperature schedule).

The graph is folded to one memory block per node (``NodeView``). A state is a fixed-length
sequence of nodes and ``nop`` slots (§2.2, App. D.4); mutations add a node at a nop slot, remove
one, or rotate one to another slot, subject to the validity conditions of §2.2; the peak M(S) is
maintained incrementally in a range-add / range-max segment tree (§2.1.1, §2.2.1) by the compiled
kernels of :mod:`remat_cli.solvers.fastsa.kernel`. The objective is eq. (1)
``max(budget, M)·C`` or, by default, the budget-respecting variant of footnote 2 of §3.1.

Two stages (§2.2.2, App. C.1, App. D.4): with ``--grouping`` a first SA on grouped nodes
(Algorithm 1 with the ``do_fuse`` rule) that stops as soon as the budget is met, then a second,
colder SA on the decomposed nodes that removes redundant computations. Without grouping (the
default) the first stage anneals the original nodes over its whole schedule and the second
continues colder. Grouping is off by default because on the Table-1 graphs the grouped pipeline
was worse under the same time (bench/fastsa.py: e.g. RL n500 at 80% 3.2% vs 1.2% cost increase,
CM2 at 80% 0.43% vs 0.36%): their model inputs are tiny or absent, so do_fuse holds from the
sources onwards and Algorithm 1 alone folds each whole graph into one group (``max_group`` caps
that). The best schedules found (least feasible cost, least peak, per stage, and the last state)
are each polished (a deviation: :func:`remat_cli.solvers.fastsa.kernel.anneal.polish` greedily removes
the computations that are not needed to stay within the budget, e.g. the zero-cost copies the
cold stage has no reason to drop: CM1 at 80% keeps its 0.136% with 3 instead of ~30
recomputations), go through ``steps_from_sequence`` (free after last use) and the project
simulator, and the best is returned; each better one is reported through ``options.incumbent``.

Deviations, all switchable: the initial temperature is 0.3% of f(S0) instead of App. D.4's
0.1% (on the Table-1 graphs, whose single moves change f by around 1%, 0.1% is close to greedy:
RL n100 at 80% ended at 1.6% cost increase, at 0.3% at 0.0%); the mutation mix
(``rotate_share``; the paper gives none); ``local`` proposals (times drawn inside the
window where a mutation can be valid, see :func:`remat_cli.solvers.fastsa.kernel.anneal.sa_chunk`; 75%
of the proposals by default: on random_layered_n1000 about 75% of local proposals pass the §2.2
conditions against about 25% of uniform ones, so each iteration does far more; with 11M
iterations RL n500 at 70% ends at 4.8% (uniform, 22M: 5.6%) and RL n250 at 70% near 1.1-1.4%
(uniform: 3.5%), while all-local proposals made the small RL n100 worse (70%: over budget),
which the uniform quarter avoids, bench/fastsa.py); ``over_budget_weight`` (off: 1) steepens the footnote-2
objective above the budget; a dynamic sequence length (T is re-chosen and the sequence re-spread evenly between
chunks, so that a few thousand slots suffice instead of 2^20); and a per-node copy limit per
chunk (a node may gain 4 copies before the next re-spread). ``--no-recompute`` runs rotations
only, on f(S) = M(S) (App. B.2).

Tight budgets: when a third of the first stage (``tight_after``) has passed without a
state within the budget, the rest of it is re-heated from its least peak with two more deviations,
until the budget is met: recomputation chains (``chain``: an add also recomputes, just before it,
the inputs it would otherwise keep alive, recursively, and a remove also drops the input
computations it leaves unused, each as one mutation, see
:func:`remat_cli.solvers.fastsa.kernel.mutations.plan_chain`) and the logaddexp soft peak of
App. C.2 as M in the objective. On PyTorch ONNX exports a backward op's activation is recomputed
through a chain of small ops (Gemm, Relu; Conv, BatchNormalization, Relu), which single adds only
build through states of equal memory and higher cost, and the peak is a plateau of many time
steps that must all lose a block before max M(S) moves: the paper's SA alone can stay far above
a tight budget at any temperature. Graphs that meet their budget within the first third (all of Table 1)
run the paper's mutations only in their first stage. The second stage always has the
recomputation chains: single adds do not leave a basin of recomputations either (two attention
MatMuls recomputed where one MatMul with its cheaper Where/Softmax chain would do).

Determinism: the kernel draws from its own xorshift generator seeded by ``options.seed`` and runs
in fixed-size chunks; every stopping decision depends on iteration counts only. A time limit is
turned into an iteration budget with a fixed assumed rate (``rate`` iterations per second), so
the same seed gives the same schedule whatever the machine's speed; only when the machine is
slower than that rate does the wall-clock safety net stop earlier, and the message then says so.

Chains (a deviation, :mod:`remat_cli.solvers.fastsa.chains`): with more than one worker, one
chain per worker runs side by side, chain k with seed + k and the whole iteration budget, and the
cheapest schedule is kept (``chains``; one worker: the single chain of the paper). The result then
depends on the seed and the worker count.

Rounds (a deviation, :mod:`remat_cli.solvers.fastsa.rounds`): a time limit whose iteration budget
holds several rounds of ``iterations`` + ``iterations2`` runs them in sequence, every other one
with the cheapest schedule so far as its hint (the second stage starts from a hint cheaper than
the first stage's best, and the hint is always a candidate of the result), the others afresh.

Pinned rounds (a deviation, :mod:`remat_cli.solvers.fastsa.pins`): fresh rounds from the third on
anneal a copy of the graph in which a large terminal node (a weight gradient reading two large
values) must run after the last gradient; no single move of the annealing takes such a node
out of the middle of the backward pass, where the rest of it is live beside it
(torch_unet_train at 50%: every unpinned round 7.87-8.3%, pinned 3.71%).

Peak repair (a deviation, :mod:`remat_cli.solvers.fastsa.repair`): the first round that ends
above the budget while nothing fits it yet is repaired at its peak, by moves of many nodes at
once (a value live across the peak made again, with what it needs, before its next use; an
operator that only makes graph outputs deferred past the peak), and the hinted rounds after it
start from the repaired schedule (bert_b8 at 60%: every round of every solver 0.55 MB above the
budget; repaired and polished, 23.9%).
"""

from remat_cli.solvers.fastsa.problem import CHUNK, Problem, State, expand, group_nodes, original_problem
from remat_cli.solvers.fastsa.solver import FastSA

__all__ = ["CHUNK", "FastSA", "Problem", "State", "expand", "group_nodes", "original_problem"]
