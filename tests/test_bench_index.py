"""bench/README.md is the index of bench/: every script and every results file is named there, and
every file it names exists. Reads files only (no solving)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
README = BENCH / "README.md"
RESULT_SUFFIXES = (".json", ".png")
#: a path relative to bench/ as the index writes it: `results/x.json`, `experiments/y.py`, `z.py`
NAMED = re.compile(r"`((?:experiments/)?(?:results/)?[\w.-]+\.(?:json|png|py))`")


def indexed_files() -> set[str]:
    """The files of bench/ that must be in the index: scripts and results, as paths relative to
    bench/ (the experiments' too)."""
    files = {p.relative_to(BENCH).as_posix() for p in BENCH.glob("*.py")}
    files |= {p.relative_to(BENCH).as_posix() for p in BENCH.glob("experiments/*.py")}
    for folder in (BENCH / "results", BENCH / "experiments" / "results"):
        files |= {p.relative_to(BENCH).as_posix() for p in folder.glob("*") if p.suffix in RESULT_SUFFIXES}
    return files


def named_in_index() -> set[str]:
    return set(NAMED.findall(README.read_text(encoding="utf-8")))


def test_every_script_and_results_file_is_in_the_index() -> None:
    missing = sorted(indexed_files() - named_in_index())
    assert not missing, f"not named in bench/README.md (add a row or remove the file): {missing}"


def test_every_file_the_index_names_exists() -> None:
    gone = sorted(name for name in named_in_index() if not (BENCH / name).is_file())
    assert not gone, f"bench/README.md names files that do not exist under bench/: {gone}"


def test_no_results_outside_the_two_results_folders() -> None:
    stray = sorted(
        p.relative_to(BENCH).as_posix()
        for p in BENCH.rglob("*")
        if p.suffix in RESULT_SUFFIXES and p.parent.name != "results" and "__pycache__" not in p.parts
    )
    assert not stray, f"results belong in bench/results or bench/experiments/results: {stray}"


def test_the_index_pattern_sees_what_it_must() -> None:
    """The pattern the two tests above rely on: it finds results and scripts written in backticks,
    with or without the experiments/ prefix, and nothing else."""
    text = "`results/a.json` `experiments/results/b_2.png` `c.py` `experiments/d.py` `python3 e.py` e.json"
    assert NAMED.findall(text) == [
        "results/a.json",
        "experiments/results/b_2.png",
        "c.py",
        "experiments/d.py",
    ]


@pytest.mark.slow  # one interpreter importing ~30 scripts: 6 s of CPU
def test_scripts_import() -> None:
    """Every bench script, the experiments under bench/experiments/ too, still finds
    bench/common.py and every name it imports from the package (one interpreter imports them
    all, as scripts: nothing runs)."""
    scripts = sorted(str(p) for p in [*BENCH.glob("*.py"), *BENCH.glob("experiments/*.py")])
    code = (
        "import runpy, sys\n"
        "for s in sys.argv[1:]:\n"
        "    sys.path.insert(0, s.rsplit('/', 1)[0])  # as `python3 SCRIPT` puts its folder first\n"
        "    runpy.run_path(s, run_name='imported')"
    )
    p = subprocess.run([sys.executable, "-c", code, *scripts], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
