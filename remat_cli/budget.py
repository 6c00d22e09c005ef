"""Memory budgets as users write them: plain bytes, KB/MB/GB/TB (powers of 1000),
KiB/MiB/GiB/TiB (powers of 1024), or a percentage of the baseline peak ("80%")."""

from __future__ import annotations

import math
import re

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}  # fmt: skip
_PATTERN = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*|%)\s*$", re.IGNORECASE)

BUDGET_HELP = (
    "Memory budget: bytes (4000000000), KB/MB/GB/TB in powers of 1000 (4GB), "
    "KiB/MiB/GiB/TiB in powers of 1024 (3.5GiB), or a percentage of the baseline peak (80%). "
    "Multi-device graphs: one per device, cpu=16GB,cuda:0=25% (devices not named keep the graph's)."
)


#: budgets are int64 in the engines
MAX_BUDGET = 2**63 - 1


class BudgetError(ValueError):
    pass


def parse_budget(text: str, baseline_peak: int | None = None) -> int:
    """Bytes for `text`; percentages need `baseline_peak` and round down."""
    m = _PATTERN.match(str(text))
    if not m:
        raise BudgetError(f"cannot parse budget {text!r} (examples: 4GB, 3.5GiB, 80%, 1000000)")
    number, unit = float(m.group(1)), m.group(2).lower()
    if not math.isfinite(number):  # "1e400" parses to inf: no byte count
        raise BudgetError(f"budget {text!r} is too large")
    if unit == "%":
        if baseline_peak is None:
            raise BudgetError("a percentage budget needs the graph's baseline peak")
        if not 0 < number <= 100:
            raise BudgetError(
                f"budget {text!r}: a percentage of the baseline peak must be above 0% and at most 100%"
            )
        return int(number / 100.0 * baseline_peak)
    if unit not in _UNITS:
        raise BudgetError(
            f"unknown unit {m.group(2)!r} in budget {text!r} (use B, KB, MB, GB, KiB, MiB, GiB or %)"
        )
    value = number * _UNITS[unit]
    if value > MAX_BUDGET:
        raise BudgetError(f"budget {text!r} is too large (at most {MAX_BUDGET:,} bytes)")
    return int(value)


def parse_device_budgets(text: str, baseline_peak: int | None = None) -> dict[str, int] | None:
    """``cpu=16GB,cuda:0=4GB`` → {device: bytes}; None when `text` is one plain budget."""
    if "=" not in text:
        return None
    out: dict[str, int] = {}
    for part in text.split(","):
        name, sep, amount = part.partition("=")
        name = name.strip()
        if not sep or not name:
            raise BudgetError(f"cannot parse per-device budget {part!r} (example: cpu=16GB,cuda:0=4GB)")
        if name in out:
            raise BudgetError(f"device {name!r} appears twice in --budget")
        out[name] = parse_budget(amount, baseline_peak)
    return out
