"""`remat export-torch`: a PyTorch training step (forward, loss, backward) as an ONNX graph for
remat, checked against torch autograd. torch is imported when the command runs, so that
`remat --help` does not load it.
"""

from __future__ import annotations

import re

import click


@click.command("export-torch")
@click.argument("spec", metavar="FILE.py:FACTORY")
@click.option(
    "-o", "--output", required=True, type=click.Path(dir_okay=False), help="The .onnx file to write."
)
@click.option("--check/--no-check", default=True, show_default=True, help="Compare with torch autograd.")
def export_torch_command(spec: str, output: str, check: bool) -> None:
    """Export a PyTorch training step (forward + loss + backward) as ONNX for remat.

    FACTORY (in FILE.py or an importable module) takes no arguments and returns
    (model, (x, y), loss_fn) with loss = loss_fn(model(x), y); x may be a tuple of
    tensors, then loss = loss_fn(model(*x), y). Needs remat-cli[torch]."""
    import importlib
    import importlib.util
    from pathlib import Path

    from remat_cli.cli.common import BadInput, err, friendly_errors, notes_on_stderr

    @friendly_errors
    def go() -> None:
        where, sep, attr = spec.rpartition(":")
        if not sep or not where or not attr:
            raise BadInput(f"{spec!r}: expected FILE.py:FACTORY or module:FACTORY")
        try:
            from remat_cli.importers.torch_export import InvalidExport, export_training_graph
        except ImportError as e:
            raise BadInput(
                f"export-torch needs torch and onnxscript (pip install 'remat-cli[torch]'): {e}"
            ) from None
        if where.endswith(".py"):
            path = Path(where)
            if not path.is_file():
                raise BadInput(f"no file {where}")
            module_spec = importlib.util.spec_from_file_location(path.stem, path)
            assert module_spec is not None and module_spec.loader is not None
            module = importlib.util.module_from_spec(module_spec)
            try:
                module_spec.loader.exec_module(module)
            except Exception as e:  # the user's file fails to run: their error, in one line
                raise BadInput(f"{where} failed to load: {type(e).__name__}: {e}") from None
        else:
            try:
                module = importlib.import_module(where)
            except ImportError as e:
                raise BadInput(f"cannot import {where}: {e}") from None
            except Exception as e:  # the module raises while it loads
                raise BadInput(f"{where} failed to load: {type(e).__name__}: {e}") from None
        factory = getattr(module, attr, None)
        if not callable(factory):
            raise BadInput(f"{where} has no function {attr!r}")
        try:
            made = factory()
        except Exception as e:  # the user's factory raised
            raise BadInput(f"{attr}() raised {type(e).__name__}: {e}") from None
        if not (isinstance(made, tuple) and len(made) == 3 and len(made[1]) == 2):
            raise BadInput(f"{attr}() must return (model, (x, y), loss_fn)")
        try:
            with notes_on_stderr():
                out = export_training_graph(made, output, name=Path(output).stem, check=check)
        except AssertionError as e:
            raise BadInput(f"the export does not match torch autograd: {e}") from None
        except InvalidExport as e:
            raise BadInput(
                f"torch.onnx's export of this training step is not a valid ONNX model: {e}"
            ) from None
        except Exception as e:
            if not type(e).__module__.startswith("torch.onnx"):
                raise
            # torch.onnx's conversion errors run to a page; the operator it lacks is the news
            op = re.search(r"No ONNX function found for <OpOverload\(op='([^']+)'", str(e))
            why = f"it has no ONNX function for {op.group(1)}" if op else str(e).strip().splitlines()[0]
            raise BadInput(f"torch.onnx cannot export this training step: {why}") from None
        err.print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")

    go()
