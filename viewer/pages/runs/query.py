"""The Runs grid's rows on the server (Dash-free): what AG Grid's infinite row model asks for
(rows startRow..endRow under a sort model and a filter model) parsed into a named, checked
request, and answered from the runs table (logic.runs_table) with pandas.

The browser only ever holds the rows in view (a block of BLOCK rows at a time): with 500 runs the
old page sent one 1,957-component answer per 77 runs and spent 7.4 s of 9.2 s in Dash's renderer
(issue 31). The models follow AG Grid's documented shapes (infinite-scrolling datasource; text
and number filters, one condition or `operator` with `conditions`), bounded and checked like every
other value a client sends (viewer.inputs): an unknown column, filter type or a value of the wrong
kind is refused with a sentence.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ...inputs import MAX_TEXT, Invalid, integer, one_of, text

# Rows a block of the infinite row model holds (AG Grid's cacheBlockSize): a screenful and more
# of 44 px rows; a request for more than MAX_ROWS at once is refused.
BLOCK = 100
MAX_ROWS = 1000
MAX_SORT = 8             # columns sorted at once (shift-click adds one)
MAX_CONDITIONS = 4       # AG Grid joins at most maxNumConditions (default 2) conditions per column
TEXT_TYPES = ("contains", "notContains", "equals", "notEqual", "startsWith", "endsWith", "blank", "notBlank")
NUMBER_TYPES = ("equals", "notEqual", "greaterThan", "greaterThanOrEqual", "lessThan", "lessThanOrEqual",
                "inRange", "blank", "notBlank")
NO_VALUE = ("blank", "notBlank")


@dataclass(frozen=True)
class SortKey:
    column: str
    descending: bool


@dataclass(frozen=True)
class Condition:
    type: str                          # one of TEXT_TYPES or NUMBER_TYPES
    value: str | float | None = None   # None for blank / notBlank
    value_to: float | None = None      # inRange's upper bound


@dataclass(frozen=True)
class ColumnFilter:
    column: str
    kind: str                          # "text" | "number": the column's kind
    conditions: tuple                  # Condition, at least one
    any_of: bool = False               # operator OR (default AND)


@dataclass(frozen=True)
class RowsRequest:
    start: int
    end: int
    sort: tuple = ()                   # SortKey, first one first
    filters: tuple = ()                # ColumnFilter

    def __post_init__(self):
        assert 0 <= self.start <= self.end and self.end - self.start <= MAX_ROWS, (self.start, self.end)


def _condition(d, kind: str, where: str) -> Condition:
    if not isinstance(d, dict):
        raise Invalid(f"{where} must be an object")
    ftype = d.get("filterType", kind)
    if ftype != kind:
        raise Invalid(f"{where} is a {ftype!r} filter on a {kind} column")
    t = one_of(*(TEXT_TYPES if kind == "text" else NUMBER_TYPES))(d.get("type"), f"{where} type")
    if t in NO_VALUE:
        return Condition(t)
    if kind == "text":
        return Condition(t, text(MAX_TEXT)(d.get("filter"), f"{where} filter").lower())
    lo = _number(d.get("filter"), f"{where} filter")
    hi = _number(d.get("filterTo"), f"{where} filterTo") if t == "inRange" else None
    return Condition(t, lo, hi)


def _number(v, where: str) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise Invalid(f"{where} must be a number")
    return float(v)


def _filter(column: str, d, kinds: dict) -> ColumnFilter:
    if column not in kinds:
        raise Invalid(f"there is no column {column[:40]!r} to filter")
    kind, where = kinds[column], f"the filter of {column}"
    if isinstance(d, dict) and "conditions" in d:
        conds = d["conditions"]
        if not isinstance(conds, list) or not 1 <= len(conds) <= MAX_CONDITIONS:
            raise Invalid(f"{where} must join 1 to {MAX_CONDITIONS} conditions")
        op = one_of("AND", "OR")(d.get("operator", "AND"), f"{where} operator")
        return ColumnFilter(column, kind, tuple(_condition(c, kind, f"{where}[{i}]") for i, c in enumerate(conds)),
                            any_of=op == "OR")
    return ColumnFilter(column, kind, (_condition(d, kind, where),))


def parse_request(raw, kinds: dict, sortable: set) -> RowsRequest:
    """AG Grid's getRowsRequest as a RowsRequest; Invalid with the sentence the page shows.
    kinds: {column: "text" | "number"} of the filterable columns; sortable: the sortable ones."""
    if not isinstance(raw, dict):
        raise Invalid("the rows request must be an object")
    start = integer(0, 10**9)(raw.get("startRow", 0), "startRow")
    end = integer(0, 10**9)(raw.get("endRow", start + BLOCK), "endRow")
    if not start <= end <= start + MAX_ROWS:
        raise Invalid(f"endRow must be from startRow to startRow + {MAX_ROWS}")
    sort_model = raw.get("sortModel") or []
    if not isinstance(sort_model, list) or len(sort_model) > MAX_SORT:
        raise Invalid(f"sortModel must be a list of at most {MAX_SORT} columns")
    sort = []
    for i, s in enumerate(sort_model):
        col = s.get("colId") if isinstance(s, dict) else None
        if col not in sortable:
            raise Invalid(f"sortModel[{i}] names no sortable column")
        sort.append(SortKey(col, one_of("asc", "desc")(s.get("sort"), f"sortModel[{i}] sort") == "desc"))
    filter_model = raw.get("filterModel") or {}
    if not isinstance(filter_model, dict) or len(filter_model) > len(kinds):
        raise Invalid("filterModel must be an object of column filters")
    filters = tuple(_filter(str(c), d, kinds) for c, d in filter_model.items())
    return RowsRequest(start, end, tuple(sort), filters)


def uses(req: RowsRequest) -> set:
    """The columns a request sorts or filters by."""
    return {k.column for k in req.sort} | {f.column for f in req.filters}


# -- answering ---------------------------------------------------------------------------------
def _text_mask(col: pd.Series, c: Condition) -> np.ndarray:
    s = col.fillna("").astype(str).str.lower()
    blank = (s == "").to_numpy()
    if c.type in NO_VALUE:
        return blank if c.type == "blank" else ~blank
    v = c.value
    op = {"contains": lambda: s.str.contains(v, regex=False), "notContains": lambda: ~s.str.contains(v, regex=False),
          "equals": lambda: s == v, "notEqual": lambda: s != v,
          "startsWith": lambda: s.str.startswith(v), "endsWith": lambda: s.str.endswith(v)}[c.type]
    return op().to_numpy(bool)


def _number_mask(col: pd.Series, c: Condition) -> np.ndarray:
    x = pd.to_numeric(col, errors="coerce").to_numpy(float)
    blank = np.isnan(x)
    if c.type in NO_VALUE:
        return blank if c.type == "blank" else ~blank
    v = c.value
    with np.errstate(invalid="ignore"):
        got = {"equals": lambda: x == v, "notEqual": lambda: x != v, "greaterThan": lambda: x > v,
               "greaterThanOrEqual": lambda: x >= v, "lessThan": lambda: x < v, "lessThanOrEqual": lambda: x <= v,
               "inRange": lambda: (x > v) & (x < c.value_to)}[c.type]()   # AG Grid's default: bounds excluded
    return got & ~blank


def _mask(df: pd.DataFrame, f: ColumnFilter) -> np.ndarray:
    one = _text_mask if f.kind == "text" else _number_mask
    masks = [one(df[f.column], c) for c in f.conditions]
    return np.logical_or.reduce(masks) if f.any_of else np.logical_and.reduce(masks)


def _sort_keys(df: pd.DataFrame, sort, kinds: dict) -> tuple[pd.DataFrame, list[bool]]:
    """One or two key columns per sorted column: a number column by value; a text column by the
    number it spells first (SMs "24" before "128") and then by its lower-cased text."""
    keys, ascending = {}, []
    for i, k in enumerate(sort):
        col = df[k.column]
        keys[f"{i}n"] = pd.to_numeric(col, errors="coerce").to_numpy(float)
        ascending.append(not k.descending)
        if kinds.get(k.column) != "number":
            keys[f"{i}t"] = col.fillna("").astype(str).str.lower().to_numpy(object)
            ascending.append(not k.descending)
    return pd.DataFrame(keys, index=df.index), ascending


def answer(df: pd.DataFrame, req: RowsRequest, kinds: dict) -> tuple[pd.DataFrame, int]:
    """The rows req.start..req.end of df filtered and sorted as asked (missing values last either
    way, ties in df's order), and how many rows pass the filters."""
    m = np.ones(len(df), bool)
    for f in req.filters:
        m &= _mask(df, f)
    out = df[m]
    if req.sort and len(out):
        keys, ascending = _sort_keys(out, req.sort, kinds)
        keys["_pos"] = np.arange(len(out))
        order = keys.sort_values(list(keys.columns), ascending=ascending + [True], na_position="last",
                                 kind="stable").index
        out = out.loc[order]
    return out.iloc[req.start:req.end], int(m.sum())
