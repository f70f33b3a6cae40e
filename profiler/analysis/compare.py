"""Compare two runs or two groups of runs (A vs B)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class Comparison:
    per_phase: pd.DataFrame
    end_to_end: pd.DataFrame
    critical_path_changes: pd.DataFrame
    verdict: str


def compare(a, b, *, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, registry=None) -> Comparison:
    """Per phase and end-to-end medians, bootstrap CI of B - A, verdicts (columns: package docstring)."""
    raise NotImplementedError("compare: implementation landing next")
