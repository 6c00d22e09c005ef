"""What an importer tells its caller without touching the terminal: warnings.

The CLI turns an :class:`ImportNote` into one ``remat: note:`` line on stderr; Python callers
get an ordinary warning. Kept free of heavy imports so the CLI can name these classes cheaply.
"""

from __future__ import annotations


class ImportNote(UserWarning):
    """Something an importer did to the model that the user should know about."""


class OpsetUpgraded(ImportNote):
    """An ONNX model older than opset 13 was upgraded on import (onnx.version_converter)."""


class NotCompared(ImportNote):
    """export-torch could not compare the exported values with torch autograd (random ops)."""


class Float32Rounding(ImportNote):
    """export-torch's float32 comparison with torch autograd differed beyond its tolerance, and the
    graph in float64 matched: the difference is rounding."""
