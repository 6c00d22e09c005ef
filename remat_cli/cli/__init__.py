"""The `remat` command line: parse, call, print. No algorithms here.

JSON goes to stdout (so commands pipe), people-facing output to stderr. Exit codes:
0 = success / schedule within budget, 1 = no feasible schedule (or an invalid schedule for
`validate`), 2 = bad input (one line on stderr, never a traceback).
"""

from __future__ import annotations

import click

from remat_cli.cli import (
    compare,
    convert,
    deploy,
    export_torch,
    generate,
    info,
    plan,
    profile,
    run_schedule,
    solve,
    solvers,
    sweep,
    validate,
)
from remat_cli.cli.common import OneLineErrors, guard_stderr
from remat_cli.execution import watchdog

__all__ = ["main", "run"]


@click.group(
    cls=OneLineErrors, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100}
)
@click.version_option(package_name="remat-cli")
def main() -> None:
    """remat: tensor rematerialization (activation checkpointing) solvers.

    Graphs: ONNX, remat-graph JSON or networkx node-link JSON (detected from the content).
    JSON goes to stdout, human output to stderr. Exit 0 = success, 1 = no schedule fits the
    budget, 2 = bad input.
    """
    guard_stderr()


for _command in (
    solve.solve,
    info.info,
    validate.validate,
    convert.convert,
    solvers.solvers,
    compare.compare,
    generate.generate,
    run_schedule.run_command,
    deploy.optimize_command,
    deploy.apply_command,
    export_torch.export_torch_command,
    profile.profile_command,
    sweep.sweep_command,
    sweep.plot_command,
    sweep.report_command,
    plan.plan,
):
    main.add_command(_command)


def run() -> None:
    """The `remat` executable: one process, one command, so --time-limit counts from its start."""
    watchdog.process_is_command()
    main()
