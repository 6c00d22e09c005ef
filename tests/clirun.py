"""The `remat` command in a subprocess, as a user runs it, for the tests that need a real process
(exit codes, stderr, signals): the checkout on PYTHONPATH, a minimal environment."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def remat(
    *args: str | Path, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "remat_cli", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "COLUMNS": "200"},
        timeout=timeout,
    )
