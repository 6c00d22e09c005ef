"""remat as torch.compile's partitioner: gradients equal eager's, the backward carries the
schedule's recomputations, the measured peak follows the prediction, fallbacks keep training."""

import json
import os
import subprocess
import sys
import warnings
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from remat_cli.torch import RematFallback, RematPartitioner, backend  # noqa: E402
from remat_cli.torch.apply import COPY_KEY, SOURCE_KEY  # noqa: E402
from remat_cli.torch.convert import BOUNDARY, RNG_SAVE  # noqa: E402
from remat_cli.torch.measure import allocated_peak, train_step  # noqa: E402
from remat_cli.torch.models import case  # noqa: E402

#: budgets at which greedy finds a schedule that recomputes, for each small model
BUDGETS = {"mlp": "70%", "resnet18": "85%", "unet": "70%", "decoder": "70%"}


def grads(model, step, inputs):
    torch.manual_seed(1)
    model.zero_grad(set_to_none=True)
    loss = step(*inputs)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


def check_equal_to_eager(name: str, inner: str):
    """Compile model `name` with remat under `inner`, check its loss and gradients against
    eager's; returns the case, the compiled step and the backend."""
    c = case(name)
    be = backend(budget=BUDGETS[name], solver="greedy", inner=inner)
    compiled = torch.compile(c.model, backend=be)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematFallback)
        loss, got = grads(c.model, compiled, c.inputs)
    eager_loss, want = grads(c.model, c.model, c.inputs)
    schedule = be.partitioner.last.schedule
    assert schedule.summary.recomputations > 0
    # a dropout run again replays its draw (only the decoder has dropout)
    runs = Counter(s.node for s in schedule.steps if s.op == "compute")
    assert any(k > 1 and n.startswith("native_dropout") for n, k in runs.items()) == (name == "decoder")
    torch.testing.assert_close(loss, eager_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    return c, compiled, be


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize(
    "name",
    [
        "mlp",
        "unet",
        pytest.param("resnet18", marks=pytest.mark.slow),
        pytest.param("decoder", marks=pytest.mark.slow),
    ],
)
def test_aot_eager_gradients_equal_eager_and_allocated_peak_is_predicted(name):
    # the allocator's peak (tensors and kernel scratch) is the simulator's: views are made
    # again from the live owner (a view kept from the forward would hold an owner the
    # schedule freed and recomputed: the decoder's measured peak ignored its budget), measured
    # workspaces (oneDNN's reorders, dropout's float mask), real storages (mse_loss's mean)
    c, compiled, be = check_equal_to_eager(name, "aot_eager")
    predicted = be.partitioner.last.predicted_peak
    assert abs(allocated_peak(c.model, compiled, *c.inputs) - predicted) <= 0.01 * predicted


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlp", "resnet18", "unet", "decoder"])
def test_gradients_equal_eager_under_inductor(name):
    import torch._inductor.config as inductor_config

    # eager's dropout masks; no cache, so the partitioner runs. inductor's own patch restores its
    # config (a monkeypatched config module loses the option on teardown)
    with inductor_config.patch(fallback_random=True, force_disable_caches=True):
        check_equal_to_eager(name, "inductor")


def test_backward_recomputes_the_forward_nodes_the_schedule_recomputes():
    c = case("mlp")
    graphs = []

    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop

    from remat_cli.torch import partitioner

    part = partitioner("70%", solver="greedy")

    def bw(gm, example_inputs):
        graphs.append(gm)
        return boxed_nop(gm, example_inputs)

    be = aot_autograd(fw_compiler=boxed_nop, bw_compiler=bw, partition_fn=part)
    train_step(c.model, torch.compile(c.model, backend=be), *c.inputs)
    schedule = part.last.schedule
    computed = [s.node for s in schedule.steps if s.op == "compute"]
    boundary = computed.index(BOUNDARY)
    assert {n for n in computed[boundary:] if n in computed[:boundary]}  # forward nodes made again
    # every node run again in the backward (a forward one, or a backward one run twice there)
    again = {n for i, n in enumerate(computed) if i > boundary and n in computed[:i]}
    (bw_gm,) = graphs
    copies = [n for n in bw_gm.graph.nodes if n.meta.get(COPY_KEY, 0) > 0]
    assert {n.meta[SOURCE_KEY] for n in copies} == again


class Attention(torch.nn.Module):
    """A softmax, a dropout of it and a linear layer: the dropout's output is read by the
    layer's weight gradient in the backward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(32, 32), torch.nn.Linear(32, 4)

    def forward(self, x):
        return self.b(torch.nn.functional.dropout(self.a(x).softmax(-1), 0.5)).sum()


def test_a_step_draws_from_the_generator_as_eager_does():
    import torch._inductor.config as inductor_config

    # the backward's extraction copies in every forward node whose inputs it holds (a dropout of
    # the saved softmax): one left there although dead (FX keeps random draws under
    # fallback_random) runs again, costing its time and advancing the generator
    model, x = Attention(), torch.randn(64, 32)
    be = backend(budget="100%", solver="greedy")
    compiled = torch.compile(model, backend=be)
    after = []
    with inductor_config.patch(fallback_random=True):
        for step in (model, compiled):
            torch.manual_seed(0)
            train_step(model, step, x)
            after.append(torch.get_rng_state())
    assert be.partitioner.last is not None
    assert torch.equal(after[1], after[0])


@pytest.mark.slow  # dynamo traces the model with symbolic shapes
def test_fallback_on_a_graph_the_converter_refuses():
    c = case("mlp")
    be = backend(budget="70%", solver="greedy")
    compiled = torch.compile(c.model, backend=be, dynamic=True)  # symbolic shapes: refused
    with pytest.warns(RematFallback, match="dynamic shapes|not a tensor") as caught:
        loss, got = grads(c.model, compiled, c.inputs)
    assert len([w for w in caught if issubclass(w.category, RematFallback)]) == 1
    eager_loss, want = grads(c.model, c.model, c.inputs)
    torch.testing.assert_close(loss, eager_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_fallback_on_a_budget_no_schedule_reaches():
    c = case("mlp")
    be = backend(budget="1%", solver="greedy")
    with pytest.warns(RematFallback, match="below what any schedule|no schedule"):
        grads(c.model, torch.compile(c.model, backend=be), c.inputs)
    assert be.partitioner.last is None


def test_a_second_compile_reuses_the_solve():
    RematPartitioner.cache.clear()
    c = case("mlp")
    first = backend(budget="70%", solver="greedy")
    train_step(c.model, torch.compile(c.model, backend=first), *c.inputs)
    torch._dynamo.reset()
    second = backend(budget="70%", solver="greedy")
    train_step(c.model, torch.compile(c.model, backend=second), *c.inputs)
    assert not first.partitioner.last.cached and second.partitioner.last.cached
    assert first.partitioner.uuid() == second.partitioner.uuid()
    assert backend(budget="60%", solver="greedy").partitioner.uuid() != first.partitioner.uuid()


#: one measured step in a fresh process (as `remat run` measures): what earlier tests left on
#: this process's heap would otherwise serve small allocations without raising the high-water mark
MEASURE_STEP = """
import json, sys
import torch
from remat_cli.torch import backend
from remat_cli.torch.measure import lower_mmap_threshold, step_peak
from remat_cli.torch.models import MLP, Decoder

lower_mmap_threshold()  # tensors of 64 KiB and more are their own mappings
torch.set_num_threads(1)
torch.manual_seed(0)
if sys.argv[1] == "mlp":
    model = MLP(256, 4)
    inputs = (torch.randn(512, 256), torch.randint(0, 10, (512,)))
else:  # activations of 256 KiB, attention matrices of 1 MiB
    model = Decoder(vocab=256, d=128, heads=4, layers=2, seq=128)
    inputs = (torch.randint(0, 256, (4, 128)), torch.randint(0, 256, (4, 128)))
be = backend(budget=sys.argv[2], solver="greedy")
compiled = torch.compile(model, backend=be)
for _ in range(2):  # warm-up: compile, first-touch of code pages
    step_peak(model, compiled, *inputs)
peak = step_peak(model, compiled, *inputs)[0]
print(json.dumps([peak, be.partitioner.last.predicted_peak]))
"""


@pytest.mark.slow
@pytest.mark.parametrize(("model", "budget"), [("mlp", "60%"), ("decoder", "60%")])
def test_measured_peak_follows_the_prediction(model, budget):
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    out = subprocess.run(
        [sys.executable, "-c", MEASURE_STEP, model, budget],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    peak, predicted = json.loads(out.stdout.strip().splitlines()[-1])
    assert abs(peak - predicted) <= 0.05 * predicted, (peak, predicted)


class DropoutReplay:
    """A partitioner whose schedule is the joint graph's own order with the first dropout run
    again in the backward, just before its mask is read there (what a solver does to free the
    mask across the boundary); it keeps the backward graphs."""

    def __init__(self):
        self.backward = []

    def __call__(self, gm, joint_inputs, **kwargs):
        from remat_cli.schedule import steps_from_sequence
        from remat_cli.torch.apply import split
        from remat_cli.torch.convert import joint_graph, rng_state_bytes

        joint = joint_graph(gm, num_fwd_outputs=kwargs["num_fwd_outputs"])
        g = joint.graph
        drop, later = [n for n in g.nodes if n.op == "aten.native_dropout.default"]
        assert drop.recomputable and later.recomputable
        # each replays from a state saved once, of the generator state's size, after the draw
        # before it (no draw before the first)
        saves = {n.outputs[0]: n for n in g.nodes if n.op == RNG_SAVE}
        (state,) = set(later.inputs) & set(saves)
        assert g.value_map[state].size == rng_state_bytes("cpu") > 0
        assert not saves[state].recomputable and saves[state].inputs == [f"{drop.id}.rng"]
        seq = list(g.order)
        boundary = seq.index(BOUNDARY)
        reader = next(
            i for i, n in enumerate(seq) if i > boundary and set(drop.outputs) & set(g.node_map[n].inputs)
        )
        seq.insert(reader, drop.id)
        fw, bw = split(gm, joint, steps_from_sequence(g, seq))
        self.backward.append(bw)
        return fw, bw


def dropout_model():
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(32, 32), nn.Dropout(0.5), nn.Tanh(), nn.Linear(32, 32), nn.Dropout(0.5))
    return model, torch.randn(8, 32)


def test_a_dropout_recomputed_in_the_backward_replays_eagers_mask():
    # the loss and gradients equal eager's, and the backward draws through run_with_rng_state
    # (inductor's replay: the decoder's schedules recompute dropouts, check_equal_to_eager)
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._prims.rng_prims import run_with_rng_state

    model, x = dropout_model()
    part = DropoutReplay()
    be = aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=part)
    compiled = torch.compile(model, backend=be)

    def step(fn):
        torch.manual_seed(1)
        model.zero_grad(set_to_none=True)
        loss = fn(x).square().sum()
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss, got = step(compiled)
    eager_loss, want = step(model)
    torch.testing.assert_close(loss, eager_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    (bw,) = part.backward
    assert [n.target for n in bw.graph.nodes].count(run_with_rng_state) == 1


def test_the_joint_graph_carries_module_scopes_and_stack_solves_it():
    # forward and backward nodes know their block (blocks.0.ln1, ...), so the stack solver,
    # which lays one block's keep patterns over the stack, applies to a compiled decoder
    c = case("decoder")
    be = backend(budget="80%", solver="stack", inner="aot_eager")
    compiled = torch.compile(c.model, backend=be)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RematFallback)
        loss, got = grads(c.model, compiled, c.inputs)
    eager_loss, want = grads(c.model, c.model, c.inputs)
    solved = be.partitioner.last
    scopes = {
        n.scope.split(".")[1] for n in solved.joint.graph.nodes if (n.scope or "").startswith("blocks.")
    }
    assert scopes == {str(k) for k in range(len(c.model.blocks))}
    assert {n.phase for n in solved.joint.graph.nodes if n.scope} == {"forward", "backward"}
    assert solved.schedule.summary.recomputations > 0
    assert solved.predicted_peak <= solved.budget
    torch.testing.assert_close(loss, eager_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


def test_made_up_masks_are_in_two_runs_like_a_steps_masks():
    # a random mask would time a branching kernel (masked_fill) at its mispredictions
    from remat_cli.torch.probe import made_up

    m = made_up(torch.empty_strided((4, 4, 128, 128), (65536, 1, 512, 4), dtype=torch.bool))
    assert m.stride() == (65536, 1, 512, 4)
    flat = m.flatten()
    assert int((flat[1:] != flat[:-1]).sum()) == 1 and bool(flat[-1]) and not bool(flat[0])


class ProductReplay:
    """A partitioner whose schedule is the joint graph's order with each dropout's output, a
    product of its mask (remat_cli.torch.dropout), made again just before its first reader in
    the backward; it keeps the forward and backward graphs."""

    def __init__(self):
        self.graphs = []

    def __call__(self, gm, joint_inputs, **kwargs):
        from remat_cli.schedule import steps_from_sequence
        from remat_cli.torch.apply import split
        from remat_cli.torch.convert import joint_graph
        from remat_cli.torch.dropout import PRODUCT_OF, dropout_products

        dropout_products(gm)
        joint = joint_graph(gm, num_fwd_outputs=kwargs["num_fwd_outputs"])
        g = joint.graph
        seq = list(g.order)
        for product in [n.name for n in gm.graph.nodes if PRODUCT_OF in n.meta]:
            boundary = seq.index(BOUNDARY)
            reader = next(i for i, n in enumerate(seq) if i > boundary and product in g.node_map[n].inputs)
            seq.insert(reader, product)
        fw, bw = split(gm, joint, steps_from_sequence(g, seq))
        self.graphs.append((fw, bw))
        return fw, bw


def test_a_dropout_output_made_again_is_a_product_of_its_kept_mask():
    # the output of an attention-like dropout, read by the next layer's weight gradient, made
    # again in the backward: a multiply of the saved mask, no second draw; its first run is
    # the draw's own output (no product in the forward); loss and gradients are eager's
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.backends.debugging import boxed_nop
    from torch._prims.rng_prims import run_with_rng_state

    torch.manual_seed(0)
    model, x = Attention(), torch.randn(64, 32)
    part = ProductReplay()
    compiled = torch.compile(
        model, backend=aot_autograd(fw_compiler=boxed_nop, bw_compiler=boxed_nop, partition_fn=part)
    )
    loss, got = grads(model, compiled, (x,))
    eager_loss, want = grads(model, model, (x,))
    torch.testing.assert_close(loss, eager_loss)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)
    ((fw, bw),) = part.graphs
    product = torch.ops.aten.native_dropout_backward.default
    assert [n.target for n in fw.graph.nodes].count(product) == 0
    again = [n for n in bw.graph.nodes if n.target is product and n.meta.get(COPY_KEY) == 1]
    assert len(again) == 1 and again[0].args[1].op == "placeholder"  # the mask, saved
    assert run_with_rng_state not in [n.target for n in bw.graph.nodes]
