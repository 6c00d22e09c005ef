"""The checked-in JSON Schemas match the pydantic models, and real files validate against them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema

from remat_cli.execution.runner import run_solver
from remat_cli.importers import generators
from remat_cli.schemas import render
from remat_cli.solver import SolveOptions

ROOT = Path(__file__).resolve().parents[1]


def test_schemas_are_current() -> None:
    for filename, text in render().items():
        on_disk = (ROOT / "schemas" / filename).read_text()
        assert on_disk == text, f"schemas/{filename} is stale: run `make schemas`"


def test_files_validate_against_schemas() -> None:
    g = generators.linear(4)
    schedule, _ = run_solver(g, 10**9, "checkpoint-all", SolveOptions())
    assert schedule is not None
    graph_schema = json.loads((ROOT / "schemas" / "graph.schema.json").read_text())
    schedule_schema = json.loads((ROOT / "schemas" / "schedule.schema.json").read_text())
    jsonschema.validate(json.loads(g.to_json()), graph_schema)
    jsonschema.validate(json.loads(schedule.to_json()), schedule_schema)


def test_a_schedule_without_budget_reads_back() -> None:
    """to_json leaves out None fields, so `budget: None` must be optional when read again."""
    from remat_cli.importers.generators import linear
    from remat_cli.schedule import GraphRef, Schedule, SolverInfo, baseline_steps, evaluate

    g = linear(4)
    steps = baseline_steps(g)
    s = Schedule(
        graph=GraphRef(name=g.name, sha256=g.sha256()),
        budget=None,
        solver=SolverInfo(name="checkpoint-all", status="feasible", seconds=0.0),
        steps=steps,
        summary=evaluate(g, steps, None).summary(),
    )
    text = s.to_json()
    assert '"budget"' not in text
    assert Schedule.model_validate_json(text).budget is None
