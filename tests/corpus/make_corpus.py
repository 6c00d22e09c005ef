"""Generate the bad-input corpus (issue 20): every file here is something a user, a script or an
attacker might hand `remat`, and every one must end in exit 2 (bad input), one line on stderr
naming the problem, no traceback and no output file created or changed.

Run from the repository root: ``python tests/corpus/make_corpus.py``. It rewrites the files and
``MANIFEST.json``, which lists per file its kind (graph, schedule, budget, onnx-run), the
fragment the one-line message must contain, and, where a command's documented answer is not
exit 2 (``validate`` judges schedules: an invalid one is exit 1), the expected exit code.

The 50 MB nesting file is not committed: ``deep_nesting_file(path, megabytes)`` writes it at
test time; ``graph_deep_nesting.json`` is the small-but-deep committed version.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper as oh
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
FLOAT = T.FLOAT

# ---------------------------------------------------------------------------------------------
# the good inputs the bad ones are mutated from


def base_graph() -> dict[str, Any]:
    """A small remat-graph: x (input), w (parameter), a chain a -> b -> c with a two-output node."""
    return {
        "format": "remat-graph",
        "version": 1,
        "name": "base",
        "values": [
            {"id": "x", "size": 16, "role": "input"},
            {"id": "w", "size": 8, "role": "parameter"},
            {"id": "a", "size": 32},
            {"id": "b1", "size": 16},
            {"id": "b2", "size": 0},
            {"id": "c", "size": 8},
        ],
        "nodes": [
            {"id": "A", "inputs": ["x", "w"], "outputs": ["a"], "cost": 1.0},
            {"id": "B", "inputs": ["a"], "outputs": ["b1", "b2"], "cost": 2.0},
            {"id": "C", "inputs": ["b1", "b2", "a"], "outputs": ["c"], "cost": 1.5},
        ],
        "outputs": ["c"],
    }


def good_model() -> onnx.ModelProto:
    """x[2,4] -> MatMul W0[4,8] -> Relu -> MatMul W1[8,3] -> out: node ids mm0, relu0, mm1."""
    rng = np.random.default_rng(0)
    w0 = numpy_helper.from_array(rng.random((4, 8), dtype=np.float32), "W0")
    w1 = numpy_helper.from_array(rng.random((8, 3), dtype=np.float32), "W1")
    nodes = [
        oh.make_node("MatMul", ["x", "W0"], ["m0"], name="mm0"),
        oh.make_node("Relu", ["m0"], ["r0"], name="relu0"),
        oh.make_node("MatMul", ["r0", "W1"], ["out"], name="mm1"),
    ]
    g = oh.make_graph(
        nodes,
        "good",
        [oh.make_tensor_value_info("x", FLOAT, [2, 4])],
        [oh.make_tensor_value_info("out", FLOAT, [2, 3])],
        initializer=[w0, w1],
    )
    return oh.make_model(g, ir_version=10, opset_imports=[oh.make_opsetid("", 17)])


def good_steps() -> list[dict[str, Any]]:
    """The baseline schedule of good.onnx."""
    return [
        {"op": "compute", "node": "mm0"},
        {"op": "compute", "node": "relu0"},
        {"op": "free", "value": "m0"},
        {"op": "compute", "node": "mm1"},
        {"op": "free", "value": "r0"},
    ]


def schedule_doc(steps: list[dict[str, Any]], sha256: str) -> dict[str, Any]:
    return {
        "format": "remat-schedule",
        "version": 1,
        "graph": {"name": "good", "sha256": sha256},
        "budget": None,
        "solver": {"name": "hand", "status": "feasible"},
        "steps": steps,
        "summary": {
            "peak_memory": 0,
            "cost": 0.0,
            "baseline_peak_memory": 0,
            "baseline_cost": 0.0,
            "overhead": 0.0,
            "recomputations": 0,
        },
    }


def deep_nesting_file(path: Path, megabytes: float) -> Path:
    """`megabytes` of ``[[[[...]]]]``: a JSON document nested far deeper than any parser's stack."""
    half = int(megabytes * 1e6) // 2
    with open(path, "w") as f:
        f.write("[" * half)
        f.write("]" * half)
    return path


# ---------------------------------------------------------------------------------------------


class Corpus:
    def __init__(self, root: Path):
        self.root = root
        self.entries: list[dict[str, Any]] = []

    def add(self, name: str, kind: str, expect: str, data: bytes | str, **extra: Any) -> None:
        p = self.root / name
        p.write_bytes(data.encode() if isinstance(data, str) else data)
        self.entries.append({"file": name, "kind": kind, "expect": expect, **extra})

    def graph(self, name: str, expect: str, doc: Any, **extra: Any) -> None:
        self.add(name, "graph", expect, json.dumps(doc, allow_nan=True), **extra)

    def onnx(self, name: str, expect: str, model: onnx.ModelProto, kind: str = "graph", **extra: Any) -> None:
        self.add(name, kind, expect, model.SerializeToString(), **extra)


def mutate(fn) -> dict[str, Any]:  # noqa: ANN001
    g = copy.deepcopy(base_graph())
    fn(g)
    return g


def graph_rules(c: Corpus) -> None:
    def node(g: dict, i: str) -> dict:
        return next(n for n in g["nodes"] if n["id"] == i)

    def value(g: dict, i: str) -> dict:
        return next(v for v in g["values"] if v["id"] == i)

    cases: list[tuple[str, str, Any]] = [
        ("cycle", "cycle", lambda g: node(g, "A")["inputs"].append("c")),
        ("dangling_input", "unknown value 'ghost'", lambda g: node(g, "B")["inputs"].append("ghost")),
        ("dangling_output", "unknown value 'ghost'", lambda g: node(g, "C")["outputs"].append("ghost")),
        ("duplicate_value", "duplicate value id 'a'", lambda g: g["values"].append({"id": "a", "size": 1})),
        (
            "duplicate_node",
            "duplicate node id 'B'",
            lambda g: (
                g["nodes"].append({"id": "B", "inputs": [], "outputs": ["z"]})
                or g["values"].append({"id": "z", "size": 1})
            ),
        ),
        ("two_producers", "produced by both", lambda g: node(g, "C")["outputs"].append("b1")),
        ("negative_size", "values.2.size", lambda g: value(g, "a").update(size=-4)),
        ("float_size", "values.2.size", lambda g: value(g, "a").update(size=1.5)),
        ("huge_size", "overflows int64", lambda g: value(g, "a").update(size=2**70)),
        ("sum_overflows_int64", "overflow", lambda g: [v.update(size=2**62) for v in g["values"]]),
        ("nan_cost", "nodes.1.cost", lambda g: node(g, "B").update(cost=float("nan"))),
        ("inf_cost", "nodes.1.cost", lambda g: node(g, "B").update(cost=float("inf"))),
        ("negative_cost", "nodes.1.cost", lambda g: node(g, "B").update(cost=-1.0)),
        ("negative_workspace", "nodes.1.workspace", lambda g: node(g, "B").update(workspace=-1)),
        ("unknown_role", "values.0.role", lambda g: value(g, "x").update(role="weights")),
        ("output_not_a_value", "graph output 'ghost' is not a value", lambda g: g["outputs"].append("ghost")),
        ("no_outputs", "no graph outputs", lambda g: g.update(outputs=[])),
        (
            "output_not_produced",
            "intermediate value 'lonely' has no producer",
            lambda g: g["values"].append({"id": "lonely", "size": 4}) or g["outputs"].append("lonely"),
        ),
        ("order_not_topological", "order is not topological", lambda g: g.update(order=["B", "A", "C"])),
        ("order_missing_node", "order misses node 'C'", lambda g: g.update(order=["A", "B"])),
        (
            "order_unknown_node",
            "order names unknown node 'Z'",
            lambda g: g.update(order=["A", "B", "C", "Z"]),
        ),
        ("order_duplicate", "duplicate order entry id 'A'", lambda g: g.update(order=["A", "A", "B", "C"])),
        ("empty_graph", "graph has no nodes", lambda g: g.update(values=[], nodes=[], outputs=[])),
        ("node_without_outputs", "nodes.0.outputs", lambda g: node(g, "A").update(outputs=[])),
        ("reads_own_output", "reads its own output", lambda g: node(g, "B")["inputs"].append("b1")),
        (
            "produces_parameter",
            "is a parameter but node 'B' produces it",
            lambda g: node(g, "B")["outputs"].append("w"),
        ),
        ("wrong_version", "version", lambda g: g.update(version=2)),
        ("unknown_key", "colour", lambda g: g.update(colour="blue")),
        ("values_not_a_list", "values", lambda g: g.update(values={"x": 1})),
        ("id_not_a_string", "values.0.id", lambda g: value(g, "x").update(id=["x"])),
    ]
    for name, expect, fn in cases:
        c.graph(f"graph_{name}.json", expect, mutate(fn))

    # files that are not JSON graphs at all
    text = json.dumps(base_graph())
    c.add("graph_truncated.json", "graph", "not valid JSON", text[: len(text) // 2])
    c.add("graph_non_utf8.json", "graph", "not valid JSON", b'{"format": "remat-graph", "name": "\xff\xfe"}')
    c.add("graph_empty_file.json", "graph", "is empty", b"")
    c.add("graph_whitespace.json", "graph", "is empty", b"  \n\t ")
    c.add("graph_json_list.json", "graph", "neither remat-graph", "[1, 2, 3]")
    c.add("graph_json_null.json", "graph", "not an ONNX model", "null")
    c.add("graph_object_nesting.json", "graph", "nested too deeply", '{"a":' * 100_000 + "1" + "}" * 100_000)
    deep_nesting_file(c.root / "graph_deep_nesting.json", 0.2)
    c.entries.append({"file": "graph_deep_nesting.json", "kind": "graph", "expect": "nested too deeply"})
    c.entries.append(
        {"file": "@deep50MB", "kind": "graph", "expect": "nested too deeply", "generated_mb": 50}
    )  # made at test time by deep_nesting_file


def node_link(c: Corpus) -> None:
    ok = {
        "directed": True,
        "graph": {},
        "nodes": [{"id": 0, "out_cost": 4, "duration": 1.0}, {"id": 1, "out_cost": 8, "duration": 2.0}],
        "links": [{"source": 0, "target": 1}],
    }

    def nl(fn) -> dict[str, Any]:  # noqa: ANN001
        d = copy.deepcopy(ok)
        fn(d)
        return d

    cases: list[tuple[str, str, Any]] = [
        ("cycle", "cycle", lambda d: d["links"].append({"source": 1, "target": 0})),
        ("unknown_link_end", "unknown node '7'", lambda d: d["links"].append({"source": 0, "target": 7})),
        ("link_without_ends", "link without source/target", lambda d: d["links"].append({"from": 0})),
        ("node_without_id", "without 'id'", lambda d: d["nodes"].append({"out_cost": 3})),
        ("negative_size", "invalid size", lambda d: d["nodes"][0].update(out_cost=-3)),
        ("nan_size", "invalid size", lambda d: d["nodes"][0].update(out_cost=float("nan"))),
        ("inf_size", "invalid size", lambda d: d["nodes"][0].update(out_cost=float("inf"))),
        ("text_size", "invalid size", lambda d: d["nodes"][0].update(out_cost="big")),
        ("nan_duration", "finite number", lambda d: d["nodes"][0].update(duration=float("nan"))),
        ("nodes_not_a_list", "node-link", lambda d: d.update(nodes=5)),
        ("links_not_a_list", "node-link", lambda d: d.update(links="0->1")),
        ("order_not_a_literal", "order", lambda d: d["graph"].update(order="__import__('os')")),
        ("order_unknown_node", "order names unknown node '9'", lambda d: d["graph"].update(order=[0, 1, 9])),
        ("duplicate_node", "duplicate", lambda d: d["nodes"].append({"id": 1, "out_cost": 2})),
        ("empty", "graph has no nodes", lambda d: d.update(nodes=[], links=[])),
    ]
    for name, expect, fn in cases:
        c.graph(f"nodelink_{name}.json", expect, nl(fn))


def onnx_files(c: Corpus) -> None:
    good = good_model()
    raw = good.SerializeToString()
    c.add("onnx_truncated.onnx", "graph", "not an ONNX model", raw[: len(raw) // 3])
    c.add(
        "onnx_corrupt.onnx",
        "graph",
        "not an ONNX model",
        bytes(np.random.default_rng(7).integers(0, 256, 600, dtype=np.uint8)),
    )
    c.add("onnx_empty.onnx", "graph", "is empty", b"")
    c.add("onnx_text_garbage.onnx", "graph", "not an ONNX model", "this is not a model\n")

    m = good_model()
    del m.opset_import[:]
    c.onnx("onnx_no_opset.onnx", "not an ONNX model", m)

    m = good_model()
    m.graph.node[1].op_type = "FrobnicateRelu"
    c.onnx("onnx_unknown_op.onnx", "unknown operator 'FrobnicateRelu'", m)

    m = good_model()
    m.graph.node[1].domain = "com.example.private"
    m.opset_import.append(oh.make_opsetid("com.example.private", 1))
    c.onnx("onnx_unknown_domain_op.onnx", "unknown operator 'com.example.private.Relu'", m)

    # a symbolic batch nobody fixes: the message names the tensor and the flag
    m = good_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "N"
    c.onnx("onnx_unresolved_shape.onnx", "--input-shape", m)

    # NonZero: an output whose size depends on the data, which no shape inference can know
    m = good_model()
    m.graph.node.append(oh.make_node("NonZero", ["out"], ["nz"], name="nonzero"))
    m.graph.output[0].CopyFrom(oh.make_tensor_value_info("nz", T.INT64, None))
    c.onnx("onnx_data_dependent_shape.onnx", "tensor 'nz'", m)

    m = good_model()
    m.graph.node.append(oh.make_node("Relu", ["out"], ["x2"], name="loop"))
    m.graph.node[0].input[0] = "x2"
    c.onnx("onnx_cycle.onnx", "cycle", m)

    m = good_model()
    m.graph.node[2].input[0] = "nowhere"
    c.onnx("onnx_dangling_input.onnx", "'nowhere'", m)

    m = good_model()
    m.graph.output[0].name = "nothing"
    c.onnx("onnx_output_not_produced.onnx", "'nothing'", m)

    # sizes that overflow int64 when summed: four 2^31 x 2^31 float inputs
    m = good_model()
    huge = [2**31, 2**31]
    m.graph.input.append(oh.make_tensor_value_info("h", FLOAT, huge))
    c.onnx("onnx_sizes_overflow.onnx", "overflow", m)

    # a "billion nodes" claim in a few bytes: a tensor of 10^9 x 10^9 elements in a 100-byte file
    m = good_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 10**18
    c.onnx("onnx_giant_dims.onnx", "overflow", m)

    # a negative dimension: was pydantic's "size: Input should be greater than or equal to 0"
    m = good_model()
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -3
    c.onnx("onnx_negative_dim.onnx", "tensor 'x' has a negative dimension", m)

    m = good_model()
    c.onnx("onnx_bad_input_shape_flag.onnx", "--input-shape 'x=2xabc'", m, args=["--input-shape", "x=2xabc"])
    c.onnx("onnx_input_shape_unknown_name.onnx", "not a graph input", m, args=["--input-shape", "y=2x4"])


def external_data(c: Corpus) -> None:
    """External data: missing (only `run` needs weights), and hostile locations (refused by all)."""

    def with_location(location: str) -> onnx.ModelProto:
        m = good_model()
        for t in m.graph.initializer:
            raw = numpy_helper.to_array(t).tobytes()
            t.data_location = T.EXTERNAL
            t.ClearField("float_data")
            t.ClearField("raw_data")
            del t.external_data[:]
            for k, v in (("location", location), ("offset", "0"), ("length", str(len(raw)))):
                e = t.external_data.add()
                e.key, e.value = k, v
        return m

    c.onnx("extdata_missing.onnx", "missing.data", with_location("missing.data"), kind="onnx-run")
    hostile = "outside the model's folder"
    c.onnx("extdata_dotdot.onnx", hostile, with_location("../../../../../../etc/passwd"))
    c.onnx("extdata_absolute.onnx", hostile, with_location("/etc/passwd"))
    link = c.root / "extdata_link.data"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink("/etc/passwd", link)
    c.onnx("extdata_symlink.onnx", hostile, with_location("extdata_link.data"))
    c.onnx("extdata_dir.onnx", "is not a file", with_location("."))


def schedules(c: Corpus) -> None:
    """Schedules against good.onnx. `validate` answers exit 1 for a well-formed but invalid
    schedule (its documented job is to judge it); everything else is exit 2."""
    from remat_cli.importers import load_graph

    (c.root / "good.onnx").write_bytes(good_model().SerializeToString())
    sha = load_graph(c.root / "good.onnx").sha256()
    (c.root / "good_schedule.json").write_text(json.dumps(schedule_doc(good_steps(), sha), indent=1))
    invalid = {"validate": 1}

    def sched(name: str, expect: str, steps: list[dict[str, Any]], **extra: Any) -> None:
        c.add(f"schedule_{name}.json", "schedule", expect, json.dumps(schedule_doc(steps, sha)), **extra)

    s = good_steps()
    sched("unknown_node", "unknown node 'mm9'", [{"op": "compute", "node": "mm9"}] + s, exit=invalid)
    sched("free_input", "freeing 'x', which is a input", s + [{"op": "free", "value": "x"}], exit=invalid)
    sched(
        "free_parameter",
        "freeing 'W0', which is a parameter",
        s + [{"op": "free", "value": "W0"}],
        exit=invalid,
    )
    sched(
        "double_free",
        "freeing 'm0', which is not live",
        s[:3] + [{"op": "free", "value": "m0"}] + s[3:],
        exit=invalid,
    )
    sched("missing_input", "needs 'r0', which is not live", [s[0], s[3]], exit=invalid)
    sched("compute_twice_live", "its output 'm0' is live", [s[0]] + s, exit=invalid)
    sched(
        "steps_after_outputs_freed",
        "graph output 'out' is not live",
        s + [{"op": "free", "value": "out"}],
        exit=invalid,
    )
    sched("unknown_value", "unknown value 'zz'", s + [{"op": "free", "value": "zz"}], exit=invalid)
    doc = schedule_doc(s, "0" * 64)
    c.add(
        "schedule_wrong_sha256.json",
        "schedule",
        "another graph",
        json.dumps(doc),
        exit={"validate": 1, "run": 0, "solve": 0},
    )
    c.add(
        "schedule_bad_op.json",
        "schedule",
        "steps.0.op",
        json.dumps(schedule_doc([{"op": "launch", "node": "mm0"}], sha)),
    )
    c.add(
        "schedule_compute_without_node.json",
        "schedule",
        "needs 'node'",
        json.dumps(schedule_doc([{"op": "compute"}], sha)),
    )
    c.add(
        "schedule_not_a_schedule.json", "schedule", "is not a remat-schedule file", json.dumps(base_graph())
    )
    doc = schedule_doc(s, sha)
    del doc["steps"]
    c.add("schedule_missing_steps.json", "schedule", "steps", json.dumps(doc))
    text = json.dumps(schedule_doc(s, sha))
    c.add("schedule_truncated.json", "schedule", "cannot read schedule", text[: len(text) // 2])
    c.add("schedule_non_utf8.json", "schedule", "cannot read schedule", b'{"format": "remat-schedule\xff"}')
    c.add("schedule_deep_nesting.json", "schedule", "nested too deeply", "[" * 100_000 + "]" * 100_000)
    c.add(
        "schedule_steps_not_a_list.json", "schedule", "steps", json.dumps(schedule_doc(s, sha) | {"steps": 3})
    )


def budgets(c: Corpus) -> None:
    """Budgets as typed on the command line, checked against good.onnx by `solve`."""
    for name, text, expect in [
        ("negative", "-5GB", "cannot parse budget '-5GB'"),
        ("zero", "0", "below what any schedule can reach"),
        ("bare_80", "80", "below what any schedule can reach"),
        ("over_100_percent", "150%", "150%"),
        ("zero_percent", "0%", "0%"),
        ("overflow", "1e400", "1e400"),
        ("overflow_percent", "1e400%", "1e400%"),
        ("huge", "1e30TB", "1e30TB"),
        ("unknown_unit", "4GX", "unknown unit 'GX'"),
        ("nan", "nan", "cannot parse budget 'nan'"),
        ("inf", "inf", "cannot parse budget 'inf'"),
        ("empty", "", "cannot parse budget ''"),
        ("percent_only", "%", "cannot parse budget '%'"),
        ("two_numbers", "4 5GB", "cannot parse budget '4 5GB'"),
    ]:
        c.add(f"budget_{name}.txt", "budget", expect, text)


def main() -> None:
    root = HERE
    for p in root.iterdir():
        if p.name not in ("make_corpus.py", "__pycache__") and (p.is_file() or p.is_symlink()):
            p.unlink()
        elif p.is_dir() and p.name != "__pycache__":
            shutil.rmtree(p)
    c = Corpus(root)
    schedules(c)
    graph_rules(c)
    node_link(c)
    onnx_files(c)
    external_data(c)
    budgets(c)
    (root / "MANIFEST.json").write_text(json.dumps(c.entries, indent=1) + "\n")
    print(f"{len(c.entries)} corpus entries in {root}")


if __name__ == "__main__":
    main()
