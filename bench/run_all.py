"""Run every benchmark script in bench/ in turn (each prints its table and writes
bench/results/<name>.json with the exact command)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = []
    for script in sorted(HERE.glob("*.py")):
        # refactor_speed.py compares two checkouts: it needs --before, so it is run by hand
        if script.name in ("run_all.py", "common.py", "refactor_speed.py") or script.name.startswith("_"):
            continue
        print(f"== {script.name}", file=sys.stderr)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]]).returncode != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
