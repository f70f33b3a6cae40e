"""Barrier contention."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class BarrierReport:
    occurrences: pd.DataFrame
    summary: pd.DataFrame
    per_rank: pd.DataFrame


def barrier_contention(events: pd.DataFrame, *, registry=None) -> BarrierReport:
    """Per barrier occurrence: arrivals, useless arrivals, spread, wait, last arriver (columns: package docstring)."""
    raise NotImplementedError("barrier_contention: implementation landing next")
