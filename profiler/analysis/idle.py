"""Idle warps and starvation."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd


@dataclass
class IdleReport:
    per_warp: pd.DataFrame
    per_block: pd.DataFrame
    imbalance: pd.DataFrame
    verdict: str
    evidence: pd.DataFrame


def idle_warps(events: pd.DataFrame, *, registry=None) -> IdleReport:
    """Busy/idle time per warp and block, imbalance, and a named verdict (columns: package docstring)."""
    raise NotImplementedError("idle_warps: implementation landing next")
