"""The event table: epscope's data model (docs/design.md has the column meanings).

Everything downstream (analyses, exports, the viewer) takes a DataFrame with exactly these
columns and dtypes; `empty_events()` and `validate_events()` are the only places that spell them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

EVENT_KINDS = ("span", "instant", "arrive", "depart", "host")

# column -> dtype; categorical columns are listed in CATEGORICAL and stored as pandas categories
COLUMNS: dict[str, str] = {
    "rank": "int16",
    "launch": "int32",
    "kernel": "category",
    "iteration": "int32",
    "sm": "int16",
    "block": "int32",
    "warp": "int16",
    "role": "category",
    "kind": "category",
    "phase": "category",
    "begin_ns": "int64",
    "end_ns": "int64",
    "payload": "int64",
    "open": "bool",
}
CATEGORICAL = tuple(c for c, t in COLUMNS.items() if t == "category")

LAUNCH_COLUMNS: dict[str, str] = {
    "rank": "int16",
    "launch": "int32",
    "kernel": "category",
    "iteration": "int32",
    "host_begin_ns": "int64",   # host enqueue start on the run timeline (NA-free: -1 if unknown)
    "host_end_ns": "int64",
    "gpu_begin_ns": "int64",    # first warp start / last warp finish of the launch
    "gpu_end_ns": "int64",
    "regions": "int32",
    "dropped": "int64",
}


class SchemaError(ValueError):
    """A table does not follow the event schema; the message names the column."""


def empty_events() -> pd.DataFrame:
    return coerce_events(pd.DataFrame({c: pd.Series([], dtype="object") for c in COLUMNS}))


def coerce_events(df: pd.DataFrame) -> pd.DataFrame:
    """Cast a frame with the event columns to the schema dtypes (kind gets its fixed categories)."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"event table lacks columns {missing}")
    out = {}
    for c, t in COLUMNS.items():
        s = df[c]
        if c == "kind":
            s = pd.Categorical(s.astype(str) if s.dtype != "category" else s.astype(str), categories=EVENT_KINDS)
            if pd.isna(s).any():
                raise SchemaError(f"column kind has values outside {EVENT_KINDS}")
            out[c] = s
        elif t == "category":
            out[c] = s.astype("category") if s.dtype != "category" else s
        else:
            out[c] = s.astype(t)
    return pd.DataFrame(out)


def validate_events(df: pd.DataFrame) -> None:
    """Raise SchemaError unless df has exactly the schema's columns and dtypes."""
    for c, t in COLUMNS.items():
        if c not in df.columns:
            raise SchemaError(f"event table lacks column {c!r}")
        got = str(df[c].dtype)
        if got != t:
            raise SchemaError(f"column {c!r} has dtype {got}, schema says {t}")
    bad = df["end_ns"].to_numpy() < df["begin_ns"].to_numpy()
    if np.any(bad):
        raise SchemaError(f"{int(bad.sum())} rows end before they begin")
