"""profiler.store.schema: coerce_events maps kinds by their codes (any stored category order) and
refuses what a cast would silently change (strings, NaN, fractions, values that would wrap)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from profiler.store.schema import COLUMNS, EVENT_KINDS, SchemaError, coerce_events, empty_events, validate_events


def table(n=6, **over) -> pd.DataFrame:
    rng = np.random.default_rng(3)
    kinds = [EVENT_KINDS[i % len(EVENT_KINDS)] for i in range(n)]
    b = rng.integers(0, 1000, n)
    d = {"rank": np.arange(n) % 2, "launch": np.zeros(n, int), "kernel": ["k"] * n, "iteration": np.zeros(n, int),
         "sm": np.ones(n, int), "block": np.arange(n), "warp": np.zeros(n, int), "role": ["r"] * n,
         "kind": kinds, "phase": ["p"] * n, "begin_ns": b, "end_ns": b + 5, "payload": np.zeros(n, int),
         "open": np.zeros(n, bool)}
    d.update(over)
    return pd.DataFrame(d)


def test_dtypes_and_kind_categories():
    df = coerce_events(table())
    validate_events(df)
    assert [str(t) for t in df.dtypes] == list(COLUMNS.values())
    assert list(df["kind"].cat.categories) == list(EVENT_KINDS)
    assert df["kind"].astype(str).tolist() == table()["kind"].tolist()


@pytest.mark.parametrize("cats", [list(EVENT_KINDS), ["host", "span", "depart", "instant", "arrive"], ["arrive", "span"]])
def test_kind_codes_remapped_from_any_stored_order(cats):
    n = 50
    rng = np.random.default_rng(1)
    codes = rng.integers(0, len(cats), n).astype(np.int8)
    kind = pd.Categorical.from_codes(codes, categories=cats)
    got = coerce_events(table(n, kind=kind))["kind"]
    assert got.astype(str).tolist() == [cats[c] for c in codes]
    assert list(got.cat.categories) == list(EVENT_KINDS)


@pytest.mark.parametrize("kind, words", [
    (pd.Categorical.from_codes([0, 1, 1, 0, 0, 0], ["span", "bogus"]), "outside"),
    (pd.Categorical.from_codes([0, -1, 0, 0, 0, 0], ["span"]), "outside"),     # a missing value
    (["span", "spam", "span", "span", "span", "span"], "'spam'"),
])
def test_unknown_or_missing_kind_is_refused(kind, words):
    with pytest.raises(SchemaError, match="kind") as e:
        coerce_events(table(kind=kind))
    assert words in str(e.value)


@pytest.mark.parametrize("col, values, words", [
    ("begin_ns", ["1", "2", "3", "4", "5", "6"], "'1'"),
    ("begin_ns", [1.0, np.nan, 3.0, 4.0, 5.0, 6.0], "not finite"),
    ("end_ns", [1.5, 2.0, 3.0, 4.0, 5.0, 6.0], "whole numbers"),
    ("rank", [0, 1, 70_000, 0, 1, 0], "do not fit int16"),
    ("begin_ns", pd.array([1, None, 3, 4, 5, 6], dtype="Int64"), "not finite"),
    ("open", ["yes"] * 6, "bool"),
])
def test_values_a_cast_would_change_are_refused(col, values, words):
    with pytest.raises(SchemaError, match=col) as e:
        coerce_events(table(**{col: values}))
    assert words in str(e.value)


def test_whole_floats_and_python_ints_are_accepted():
    df = coerce_events(table(begin_ns=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], end_ns=pd.Series([9, 9, 9, 9, 9, 9], dtype=object)))
    assert df["begin_ns"].tolist() == [1, 2, 3, 4, 5, 6] and df["end_ns"].dtype == "int64"


def test_end_before_begin_names_the_first_row():
    with pytest.raises(SchemaError, match=r"1 rows end before they begin \(first: row 2"):
        validate_events(coerce_events(table(begin_ns=[0, 0, 9, 0, 0, 0], end_ns=[1, 1, 1, 1, 1, 1])))


def test_empty_table():
    df = empty_events()
    assert len(df) == 0 and [str(t) for t in df.dtypes] == list(COLUMNS.values())
