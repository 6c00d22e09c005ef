"""JSON Schemas of the two file formats, generated from the pydantic models.

`python -m remat_cli.schemas` (or `make schemas`) rewrites `schemas/`; a test fails when the
checked-in files are stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from remat_cli.graph import Graph
from remat_cli.schedule import Schedule

SCHEMAS = {"graph.schema.json": Graph, "schedule.schema.json": Schedule}


def render() -> dict[str, str]:
    out = {}
    for filename, model in SCHEMAS.items():
        schema = model.model_json_schema(mode="validation")
        schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
        out[filename] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return out


def main(folder: str = "schemas") -> None:
    Path(folder).mkdir(exist_ok=True)
    for filename, text in render().items():
        Path(folder, filename).write_text(text)
        print(f"wrote {folder}/{filename}", file=sys.stderr)


if __name__ == "__main__":
    main(*sys.argv[1:])
