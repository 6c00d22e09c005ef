"""`remat solvers`: the solver registry, and one solver's options."""

from __future__ import annotations

import json
from typing import Any

import click
from rich.table import Table

from remat_cli import registry
from remat_cli.cli.common import (
    err,
    friendly_errors,
)


@click.command()
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list to stdout.")
@friendly_errors
def solvers(name: str | None, as_json: bool) -> None:
    """The solver registry; with NAME, that solver's options.

    The plain listing imports no solver (the registry's table describes the built-ins); NAME and
    --json load the solver classes for their options, notes and exact availability.
    """
    rows = [
        _solver_facts(n) if name or as_json else _listed(n) for n in ([name] if name else registry.names())
    ]
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    t = Table(title="remat solvers", title_justify="left")
    for col in ("solver", "method", "paper", "status"):
        t.add_column(col)
    for r in rows:
        status = r["status"] + (f": {r['reason']}" if r["reason"] else "")
        notes = f"\n[dim]{r['notes']}[/]" if r.get("notes") else ""
        t.add_row(r["name"], r["method"] + notes, r["paper"], status)
    err.print(t)
    if name:
        for p in rows[0]["params"]:
            flag = "--" + p["name"].replace("_", "-")
            err.print(f"  {flag} ({p['type']}, default {p['default']!r}): {p['help']}")


def _listed(name: str) -> dict[str, Any]:
    entry = registry.info(name)
    missing = registry.missing_engines(name)
    return {
        "name": name,
        "method": entry.method,
        "paper": entry.paper,
        "status": "missing engine" if missing else "available",
        "reason": f"not installed: {', '.join(missing)}" if missing else "",
        "exact": entry.exact,
    }


def _solver_facts(name: str) -> dict[str, Any]:
    s = registry.get(name)
    state, reason = s.availability()
    return {
        "name": name,
        "method": s.method,
        "paper": s.paper,
        "status": state,
        "reason": reason,
        "exact": s.exact,
        "notes": s.notes(),
        "params": [
            {"name": p.name, "type": p.type.__name__, "default": p.default, "help": p.help} for p in s.params
        ],
    }
