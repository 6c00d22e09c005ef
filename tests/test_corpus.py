"""The bad-input corpus (tests/corpus, made by make_corpus.py) through every command that reads it.

Each file must end in its expected exit (2 = bad input unless MANIFEST.json says otherwise),
exactly one line on stderr containing the manifest's fragment, no traceback, nothing on stdout,
and an existing output file left byte-for-byte as it was.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from remat_cli.cli import main

CORPUS = Path(__file__).resolve().parent / "corpus"
MANIFEST: list[dict[str, Any]] = json.loads((CORPUS / "MANIFEST.json").read_text())
GOOD_ONNX = CORPUS / "good.onnx"
GOOD_SCHEDULE = CORPUS / "good_schedule.json"
SENTINEL = "the user's old file\n"


def commands(entry: dict[str, Any], path: Path, out: Path) -> dict[str, list[str]]:
    """Every command that reads this kind of file, with an output file where it writes one."""
    p, extra = str(path), entry.get("args", [])
    if entry["kind"] == "graph":
        return {
            "info": ["info", p, *extra],
            "convert": ["convert", p, "-o", str(out), *extra],
            "validate": ["validate", p, str(GOOD_SCHEDULE), *extra],
            "solve": ["solve", p, "--budget", "100%", "--solver", "greedy", "-o", str(out), *extra],
        }
    if entry["kind"] == "schedule":
        g = str(GOOD_ONNX)
        return {
            "validate": ["validate", g, p],
            "solve": ["solve", g, "--budget", "100%", "--solver", "greedy", "--hint", p, "-o", str(out)],
            "run": ["run", g, p, "--repeat", "1", "--warmup", "0"],
        }
    if entry["kind"] == "budget":
        budget = path.read_text() if path.is_file() else ""
        return {
            "solve": ["solve", str(GOOD_ONNX), "--budget", budget, "--solver", "greedy", "-o", str(out)],
        }
    if entry["kind"] == "onnx-run":
        return {"run": ["run", p, str(GOOD_SCHEDULE), "--repeat", "1", "--warmup", "0"]}
    raise AssertionError(entry["kind"])


def cases() -> list[Any]:
    out = []
    for e in MANIFEST:
        for cmd in commands(e, CORPUS / "x", CORPUS / "o"):
            # a documented success of `run` measures the model in worker processes: slow
            slow = cmd == "run" and e.get("exit", {}).get(cmd, 2) == 0
            out.append(pytest.param(e, cmd, id=f"{e['file']}-{cmd}", marks=[pytest.mark.slow] * slow))
    return out


def test_corpus_is_large_and_every_file_is_listed() -> None:
    files = {p.name for p in CORPUS.iterdir()} - {"make_corpus.py", "MANIFEST.json", "__pycache__"}
    listed = {e["file"] for e in MANIFEST}
    helpers = {"good.onnx", "good_schedule.json", "extdata_link.data"}
    assert files - helpers == listed - {"@deep50MB"}
    assert len(MANIFEST) >= 60


@pytest.mark.parametrize(("entry", "command"), cases())
def test_bad_input(
    entry: dict[str, Any], command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # nothing may appear in the working directory either
    if entry["file"].startswith("@"):  # generated at test time (too big to commit)
        from tests.corpus.make_corpus import deep_nesting_file

        path = deep_nesting_file(tmp_path / "deep.json", entry["generated_mb"])
    else:
        path = tmp_path / entry["file"]
        shutil.copy(CORPUS / entry["file"], path)  # ONNX external data is resolved in the corpus folder
        if entry["kind"] in ("graph", "onnx-run") and entry["file"].endswith(".onnx"):
            path = CORPUS / entry["file"]
    out = tmp_path / "out.json"
    out.write_text(SENTINEL)
    args = commands(entry, path, out)[command]
    before = sorted(p.name for p in tmp_path.iterdir())
    result = CliRunner().invoke(main, args, catch_exceptions=True)
    expected = entry.get("exit", {}).get(command, 2)
    stderr = result.stderr
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == expected, f"{args}: exit {result.exit_code}\n{stderr}"
    assert "Traceback" not in stderr
    if expected == 0:  # a documented success (e.g. a hint made for another import of the graph)
        return
    assert out.read_text() == SENTINEL, "the output file was changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == before, "a file was left behind"
    lines = stderr.strip().splitlines()
    if expected == 2:
        assert len(lines) == 1, stderr
        assert result.stdout == ""
    assert entry["expect"] in stderr, stderr
