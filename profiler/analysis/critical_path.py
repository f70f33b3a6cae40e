"""Critical path across ranks (see the package docstring for the returned columns)."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class CriticalPath:
    segments: pd.DataFrame
    slack: pd.DataFrame
    total_ns: pd.DataFrame
    pacing_rank: int
    path_ns: pd.DataFrame


def critical_path(events: pd.DataFrame, *, iteration=None, registry=None) -> CriticalPath:
    """Longest dependency chain to the end of each iteration (columns: package docstring)."""
    raise NotImplementedError("critical_path: implementation landing next")
