"""The event table: epscope's data model (docs/design.md has the column meanings).

Everything downstream (analyses, exports, the viewer) takes a DataFrame with exactly these
columns and dtypes; `empty_events()` and `validate_events()` are the only places that spell them.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from . import checks_fast

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
# Timestamps on the run timeline lie within +-2^62 ns (146 years): the decoder drops records
# outside that window (BadTimestamps), and it keeps every difference of two timestamps, and the
# exporter's shift to a non-negative time base, inside int64 (begin_ns at the int64 minimum
# crashed export, issue 19).
TIME_LIMIT_NS = (1 << 62) - 1
# Smallest value of the id columns: -1 is "none" for the SM, block and warp of host rows (and of
# host rows only: every GPU row of the bundled traces has sm, block and warp >= 0).
MIN_VALUE = {"rank": 0, "launch": 0, "iteration": 0, "sm": -1, "block": -1, "warp": -1}
# Names (kernel, role, phase) and how many a column may hold. The bundled runs' longest name has
# 21 characters and their most names in one column are 17 (phases); a 1 MB kernel name made
# report and analyze ask for 4 GB (issue 32): 256 characters and 4,096 names are >10x real runs.
MAX_NAME_CHARS = 256
MAX_NAMES = 4096

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


KIND_DTYPE = pd.CategoricalDtype(list(EVENT_KINDS))


def _bad_values(s: pd.Series, bad: np.ndarray, limit: int = 3) -> str:
    vals = pd.unique(s[bad])[:limit]
    return ", ".join(repr(v)[:40] for v in vals)


def kind_column(s: pd.Series) -> pd.Categorical:
    """`kind` with the fixed categories EVENT_KINDS. A categorical input (every stored table) is
    remapped through its codes: one lookup per row instead of a string per row (10 M rows: 17 ms
    against 2.16 s through strings, issue 14)."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        s = s.astype("category")
    cats = [str(c) for c in s.cat.categories]
    codes = s.cat.codes.to_numpy()
    if cats != list(EVENT_KINDS):
        # one entry per stored category, then one for code -1 (a missing value): -1 marks both
        # unknown kinds and missing ones
        lut = np.array([EVENT_KINDS.index(c) if c in EVENT_KINDS else -1 for c in cats] + [-1], np.int8)
        codes = lut[codes]
    bad = codes < 0
    if bad.any():
        raise SchemaError(f"column 'kind': {int(bad.sum()):,} rows hold values outside {EVENT_KINDS} "
                          f"(e.g. {_bad_values(s, bad)})")
    return pd.Categorical.from_codes(codes, dtype=KIND_DTYPE)


def category_column(c: str, s: pd.Series) -> pd.Series:
    """s as a categorical of strings with no missing value (kernel, role and phase are names;
    a null one crashed export and two viewer callbacks, issue 19)."""
    if not isinstance(s.dtype, pd.CategoricalDtype):
        inferred = pd.api.types.infer_dtype(s, skipna=False) if len(s) else "empty"
        if inferred not in ("string", "empty"):
            raise SchemaError(f"column {c!r} holds {inferred} values, the schema says names (strings)")
        s = s.astype("category")
    cats = s.cat.categories
    if len(cats) and pd.api.types.infer_dtype(cats, skipna=False) != "string":
        raise SchemaError(f"column {c!r} holds non-string names (e.g. {_bad_values(pd.Series(cats), np.ones(len(cats), bool))})")
    check_names(c, cats)
    missing = int(np.count_nonzero(s.cat.codes.to_numpy() < 0))
    if missing:
        raise SchemaError(f"column {c!r}: {missing:,} rows are missing")
    return s


def check_names(c: str, names) -> None:
    """A column's names within MAX_NAMES names of at most MAX_NAME_CHARS characters each."""
    if len(names) > MAX_NAMES:
        raise SchemaError(f"column {c!r} holds {len(names):,} distinct names, more than {MAX_NAMES:,}")
    longest = max((len(str(x)) for x in names), default=0)
    if longest > MAX_NAME_CHARS:
        raise SchemaError(f"column {c!r} holds a name of {longest:,} characters, more than {MAX_NAME_CHARS}")


def check_range(c: str, v: np.ndarray, lo: int, hi: int) -> None:
    if len(v):
        a, b = int(v.min()), int(v.max())
        if a < lo or b > hi:
            raise SchemaError(f"column {c!r}: values {a}..{b} lie outside {lo}..{hi}")


def integer_column(c: str, s: pd.Series, t: str) -> pd.Series:
    """s cast to the integer dtype t, refusing what a cast would silently change: strings,
    missing or fractional values, values outside t's range (astype would wrap them)."""
    if str(s.dtype) == t:
        return s
    if len(s) == 0:
        return s.astype(t)
    if s.dtype == object:   # Python numbers in an object column are fine; strings are not
        inferred = pd.api.types.infer_dtype(s, skipna=False)
        if inferred == "integer":
            s = s.astype("int64")
        elif inferred in ("floating", "mixed-integer-float"):
            s = s.astype("float64")
    kind = s.dtype.kind
    if kind == "b":
        return s.astype(t)
    if kind not in "iuf":
        raise SchemaError(f"column {c!r} holds {s.dtype} values, the schema says {t} "
                          f"(e.g. {_bad_values(s, np.ones(len(s), bool))})")
    floating = kind == "f" or s.hasnans   # a nullable integer column with NA checks as floats
    v = s.to_numpy(dtype="float64", na_value=np.nan) if floating else s.to_numpy()
    if floating:
        bad = ~np.isfinite(v)
        if bad.any():
            raise SchemaError(f"column {c!r}: {int(bad.sum()):,} rows are missing or not finite")
        bad = v != np.floor(v)
        if bad.any():
            raise SchemaError(f"column {c!r}: {int(bad.sum()):,} rows are not whole numbers "
                              f"(e.g. {_bad_values(s, bad)})")
    if len(v):
        info = np.iinfo(t)
        lo, hi = v.min(), v.max()
        if lo < info.min or hi > info.max:
            raise SchemaError(f"column {c!r}: values {lo}..{hi} do not fit {t}")
    return s.astype(t)


def _bool_column(c: str, s: pd.Series) -> pd.Series:
    if s.dtype == bool:
        return s
    if len(s) == 0 or (s.dtype == object and pd.api.types.infer_dtype(s, skipna=False) == "boolean"):
        return s.astype(bool)
    if s.dtype.kind in "iu" and not s.hasnans and s.isin((0, 1)).all():
        return s.astype(bool)
    raise SchemaError(f"column {c!r} holds {s.dtype} values, the schema says bool")


def coerce_events(df: pd.DataFrame) -> pd.DataFrame:
    """Cast a frame with the event columns to the schema dtypes (kind gets its fixed categories).
    Raises SchemaError naming the column for values a cast would change or cannot represent."""
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise SchemaError(f"event table lacks columns {missing}")
    out = {}
    for c, t in COLUMNS.items():
        s = df[c]
        if c == "kind":
            out[c] = kind_column(s)
        elif t == "category":
            out[c] = category_column(c, s)
        elif t == "bool":
            out[c] = _bool_column(c, s)
        else:
            out[c] = integer_column(c, s, t)
    return pd.DataFrame(out, copy=False)


def validate_events(df: pd.DataFrame) -> None:
    """Raise SchemaError unless df has exactly the schema's columns and dtypes."""
    for c, t in COLUMNS.items():
        if c not in df.columns:
            raise SchemaError(f"event table lacks column {c!r}")
        got = str(df[c].dtype)
        if got != t:
            raise SchemaError(f"column {c!r} has dtype {got}, schema says {t}")
    if list(df["kind"].cat.categories) != list(EVENT_KINDS):
        raise SchemaError(f"column 'kind' has categories {list(df['kind'].cat.categories)}, "
                          f"schema says {list(EVENT_KINDS)}")
    if checks_fast.enabled(len(df)) and checks_fast.rows_ok(df, MIN_VALUE, EVENT_KINDS.index("host"), TIME_LIMIT_NS):
        return   # every row passes the checks below (one compiled pass; they name what fails)
    if (df["kind"].cat.codes.to_numpy() < 0).any():
        raise SchemaError("column 'kind' has missing values")
    for c, lo in MIN_VALUE.items():
        check_range(c, df[c].to_numpy(), lo, np.iinfo(COLUMNS[c]).max)
    gpu = df["kind"].cat.codes.to_numpy() != EVENT_KINDS.index("host")
    for c in ("sm", "block", "warp"):   # -1 ("none") is for host rows only
        n = int(np.count_nonzero((df[c].to_numpy() < 0) & gpu))
        if n:
            raise SchemaError(f"column {c!r}: {n:,} GPU rows (kind other than 'host') hold -1, which only host rows may")
    for c in ("begin_ns", "end_ns"):
        check_range(c, df[c].to_numpy(), -TIME_LIMIT_NS, TIME_LIMIT_NS)
    bad = df["end_ns"].to_numpy() < df["begin_ns"].to_numpy()
    if np.any(bad):
        i = int(np.flatnonzero(bad)[0])
        raise SchemaError(f"{int(bad.sum()):,} rows end before they begin (first: row {i}, "
                          f"begin_ns {int(df['begin_ns'].iat[i])}, end_ns {int(df['end_ns'].iat[i])})")
