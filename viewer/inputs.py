"""Every value a callback receives comes from the browser and may be anything a client sends:
`checked` declares what each argument must be and answers a wrong one with an in-page message
(the callback's `invalid(message)` outputs) instead of an HTTP 500 (issue 13 listed 21 such
values, e.g. a what-if percent of "abc", a timeline level "zzz", compare ids [{}]).

    @app.callback(...)
    @checked(lambda msg: C.error_box(msg, title="Invalid input"),
             run_id=RUN_ID, percent=opt(number(-500, 99)), level=one_of("rank", "block", "warp"))
    def project(n, run_id, percent, level): ...

Arguments not named in the declaration are passed as they come (and must be checked by the
callback itself); a declaration naming an argument the callback lacks fails at import time.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

# A run id is a key of the catalog (a slug of a path under a root): far shorter than this.
MAX_ID = 512
MAX_TEXT = 1024
MAX_ITEMS = 4096


class Invalid(ValueError):
    """An argument is not what the callback accepts; str(e) is the sentence the page shows."""


def _show(v) -> str:
    s = repr(v)
    return s if len(s) <= 40 else s[:37] + "..."


def _kind(v) -> str:
    return {str: "text", bool: "true/false", int: "a number", float: "a number", list: "a list",
            dict: "an object", type(None): "nothing"}.get(type(v), type(v).__name__)


# -- checks: each takes (value, name) and returns the value to pass on, or raises Invalid ------
Check = Callable[[Any, str], Any]


def text(max_len: int = MAX_TEXT) -> Check:
    def check(v, name):
        if not isinstance(v, str):
            raise Invalid(f"{name} must be text, got {_kind(v)} {_show(v)}")
        if len(v) > max_len:
            raise Invalid(f"{name} is {len(v):,} characters long; at most {max_len:,} are accepted")
        return v
    return check


def one_of(*choices) -> Check:
    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, (str, int, float)) or v not in choices:
            raise Invalid(f"{name} must be one of {', '.join(map(repr, choices))}, got {_show(v)}")
        return v
    return check


def integer(lo: int | None = None, hi: int | None = None) -> Check:
    """An integer (a whole float such as 3.0 from a number input counts) within [lo, hi]."""
    def check(v, name):
        if isinstance(v, float) and math.isfinite(v) and v == int(v):
            v = int(v)
        if isinstance(v, bool) or not isinstance(v, int):
            raise Invalid(f"{name} must be a whole number, got {_kind(v)} {_show(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise Invalid(f"{name} must be between {lo} and {hi}, got {v}")
        return v
    return check


def number(lo: float | None = None, hi: float | None = None) -> Check:
    def check(v, name):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise Invalid(f"{name} must be a number, got {_kind(v)} {_show(v)}")
        if (lo is not None and v < lo) or (hi is not None and v > hi):
            raise Invalid(f"{name} must be between {lo:g} and {hi:g}, got {v:g}")
        return v
    return check


def list_of(item: Check, max_len: int = MAX_ITEMS) -> Check:
    def check(v, name):
        if not isinstance(v, list):
            raise Invalid(f"{name} must be a list, got {_kind(v)} {_show(v)}")
        if len(v) > max_len:
            raise Invalid(f"{name} has {len(v):,} items; at most {max_len:,} are accepted")
        return [item(x, f"{name}[{i}]") for i, x in enumerate(v)]
    return check


def mapping(**fields: Check) -> Check:
    """A JSON object (plotly event data, a figure; its size is bounded by the request limit)
    whose named fields, where present, pass their checks (keys with dots as plotly spells them
    are passed as mapping(**{"xaxis.range[0]": number()}))."""
    def check(v, name):
        if not isinstance(v, dict):
            raise Invalid(f"{name} must be an object, got {_kind(v)} {_show(v)}")
        for k, c in fields.items():
            if k in v:
                c(v[k], f"{name} {k}")
        return v
    return check


def opt(inner: Check) -> Check:
    """None passes through (an input nobody has touched yet)."""
    def check(v, name):
        return None if v is None else inner(v, name)
    return check


def either(*checks: Check) -> Check:
    def check(v, name):
        errors = []
        for c in checks:
            try:
                return c(v, name)
            except Invalid as e:
                errors.append(str(e))
        raise Invalid(" or ".join(errors))
    return check


RUN_ID = text(MAX_ID)
CLICKS = opt(integer(0))
RANK = integer(0, 2**15 - 1)     # int16 in the event schema
BLOCK = integer(0, 2**31 - 1)    # int32
NAME = text(200)                 # a phase or kernel name
X_RANGE = list_of(number(), 2)   # a plotly axis range in the timeline's µs


def figure_message(message: str) -> dict:
    """An empty plotly figure that shows `message`: what a figure output holds on bad input."""
    return {"data": [], "layout": {"xaxis": {"visible": False}, "yaxis": {"visible": False}, "height": 160,
                                   "annotations": [{"text": message, "showarrow": False, "xref": "paper",
                                                    "yref": "paper", "x": 0.5, "y": 0.5}]}}


def checked(invalid: Callable[[str], Any], **spec: Check):
    """Decorator: check the named arguments; on the first wrong one return invalid(message)."""
    def wrap(fn):
        params = list(inspect.signature(fn).parameters)
        unknown = sorted(set(spec) - set(params))
        if unknown:
            raise TypeError(f"checked({', '.join(unknown)}): {fn.__name__} has no such argument")

        @functools.wraps(fn)
        def run(*args, **kwargs):
            bound = dict(zip(params, args), **kwargs)
            try:
                for name, check in spec.items():
                    if name in bound:
                        bound[name] = check(bound[name], name.replace("_", " "))
            except Invalid as e:
                return invalid(f"Invalid input: {e}.")
            return fn(**bound)
        return run
    return wrap
