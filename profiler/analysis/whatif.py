"""What-if: re-time the dependency graph with one phase made faster."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from .critical_path import CriticalPath


@dataclass
class WhatIf:
    summary: pd.DataFrame
    new_path: CriticalPath
    retimed: pd.DataFrame


def what_if(events: pd.DataFrame, *, phase: str, speedup: float, rank=None, iteration=None,
            registry=None) -> WhatIf:
    """Projected end-to-end change when `phase` gets `speedup` faster (columns: package docstring)."""
    raise NotImplementedError("what_if: implementation landing next")
