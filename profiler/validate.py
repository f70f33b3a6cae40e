"""What a run may contain, checked in one place: `epscope report`, `epscope export`, `load_run`
and the viewer all go through these functions, so a malformed run gives the same typed error,
in one line, wherever it is opened.

- `manifest_text(text, where)`: parse manifest.json (size and nesting bounded) and check it;
- `manifest(m, where)`: every field the readers use has the type they use it as;
- `events(df, where)` / `launches(df, where)`: the tables follow the schema (profiler.schema):
  integer timestamps, no end before begin, kinds from EVENT_KINDS.

Errors are InvalidManifest / InvalidEvents (both CorruptRun) and UnsupportedRunVersion, each
message naming the file and the field. Unknown manifest fields are allowed (a newer writer may
add some) but, like every field, nest at most MAX_DEPTH deep.

null stands for absent: `manifest()` returns the manifest with every declared object or list
that is null removed, and every null field inside them (free-form objects such as `config` and
top-level strings such as `"error": null` are kept as written), so a reader's
`m.get("clock", {})` never meets a None (7 manifests that passed with a null clock or warning
field crashed report or export, issue 19). Fields readers index (a clock rank's `rank`, a
warning's `type`) are required where they appear.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from .errors import InvalidEvents, InvalidManifest, UnsupportedRunVersion
from .schema import (LAUNCH_COLUMNS, TIME_LIMIT_NS, SchemaError, category_column, check_range, coerce_events,
                     integer_column, kind_column, validate_events)

FORMAT = "epscope-run"
# 2: the manifest carries `checksums` (required: a manifest that lost them is damaged, not old);
# 1: without them (every run written before issue 19, the bundled traces/ among them).
FORMAT_VERSION = 2
CHECKSUMS_SINCE = 2
# The largest bundled manifest is 7 kB (its registry); 4 MB leaves room for big configs while a
# Runs page of a hundred runs still reads in well under a second.
MAX_MANIFEST_BYTES = 4 << 20
# Deepest nesting in any manifest epscope writes: 5 (clock.sync_samples.<rank>.<window>).
MAX_DEPTH = 32
# The data files a manifest's `checksums` covers, and how: {"events.parquet": "sha256:<64 hex>"}.
DATA_FILES = ("events.parquet", "launches.parquet")
CHECKSUM_ALGO = "sha256"
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")

Check = Callable[[Any, str], None]


def _show(v) -> str:
    """A value as the error shows it: short, one line."""
    s = repr(v) if not isinstance(v, (dict, list)) else type(v).__name__
    return s if len(s) <= 60 else s[:57] + "..."


def _type_name(v) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null",
            int: "an integer", float: "a number"}.get(type(v), type(v).__name__)


class _Where:
    """Builds InvalidManifest errors that name the file and the dotted field."""

    def __init__(self, file: str):
        self.file = file

    def bad(self, field: str, want: str, v) -> InvalidManifest:
        return InvalidManifest(f"{self.file}: field '{field}' must be {want}, got {_type_name(v)} {_show(v)}", field)


# -- field checks -----------------------------------------------------------------------------
def _str(v, f, w):
    if not isinstance(v, str):
        raise w.bad(f, "a string", v)


def _bool(v, f, w):
    if not isinstance(v, bool):
        raise w.bad(f, "true or false", v)


def _int(minimum: int | None = None):
    def check(v, f, w):
        if isinstance(v, bool) or not isinstance(v, int):
            raise w.bad(f, "an integer", v)
        if minimum is not None and v < minimum:
            raise w.bad(f, f"an integer >= {minimum}", v)
    return check


def _num(v, f, w):
    # Infinity is a value writers use: the clock uncertainty of a rank without sync samples
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise w.bad(f, "a number", v)


def _opt(check):
    """null stands for absent (writers put `"error": null` on runs without one)."""
    def c(v, f, w):
        if v is not None:
            check(v, f, w)
    c.inner = check
    return c


def _obj(fields: dict | None = None, required: tuple[str, ...] = ()):
    """An object; `fields` are checked where present (null = absent unless required)."""
    def check(v, f, w):
        if not isinstance(v, dict):
            raise w.bad(f, "an object", v)
        for k in required:
            if v.get(k) is None:
                raise InvalidManifest(f"{w.file}: field '{f}.{k}' is required", f"{f}.{k}")
        for k, sub in (fields or {}).items():
            if k in v:
                sub(v[k], f"{f}.{k}", w)
    check.fields = fields or {}
    return check


def _list(item):
    def check(v, f, w):
        if not isinstance(v, list):
            raise w.bad(f, "a list", v)
        for i, x in enumerate(v):
            item(x, f"{f}[{i}]", w)
    check.item = item
    return check


def _strip_nulls(v, check):
    """v without the nulls of the fields `check` declares (null = absent); other values as they are."""
    check = getattr(check, "inner", check)
    fields = getattr(check, "fields", None)
    if fields and isinstance(v, dict):
        return {k: _strip_nulls(x, fields.get(k)) for k, x in v.items() if not (x is None and k in fields)}
    item = getattr(check, "item", None)
    if item is not None and isinstance(v, list):
        return [_strip_nulls(x, item) for x in v]
    return v


def _is_container(check) -> bool:
    check = getattr(check, "inner", check)
    return hasattr(check, "fields") or hasattr(check, "item") or check in (_registries, _expect, _checksums)


def _checksums(v, f, w):
    _obj()(v, f, w)
    want = set(DATA_FILES)
    if set(v) != want:
        raise InvalidManifest(f"{w.file}: field '{f}' must name exactly {sorted(want)}, got {sorted(map(str, v))[:5]}", f)
    for k, x in v.items():
        if not isinstance(x, str) or not _CHECKSUM.fullmatch(x):
            raise w.bad(f"{f}.{k}", f"'{CHECKSUM_ALGO}:' and 64 hex digits", x)


def _registries(v, f, w):
    from .registry import Registry, RegistryError

    _obj()(v, f, w)
    for fam, reg in v.items():
        _obj()(reg, f"{f}.{fam}", w)
        try:
            Registry.from_dict(reg)
        except (RegistryError, TypeError, ValueError, AttributeError, KeyError) as e:
            raise InvalidManifest(f"{w.file}: field '{f}.{fam}' is not a valid registry: {str(e)[:200]}",
                                  f"{f}.{fam}") from None


def _expect(v, f, w):
    from .expect import Expect, ExpectError

    try:
        Expect.from_json(v)
    except (ExpectError, TypeError, ValueError) as e:
        raise InvalidManifest(f"{w.file}: field '{f}' is not a valid expect block: {str(e)[:200]}", f) from None


_S, _N = _opt(_str), _opt(_num)
MANIFEST_FIELDS: dict[str, Callable] = {
    "format": _str, "version_id": _S, "name": _S, "description": _S, "created": _S, "status": _S,
    "error": _S, "host": _S,
    "num_events": _opt(_int(0)), "world_size": _opt(_int(1)),
    "git": _opt(_obj({"branch": _S, "commit": _S, "dirty": _opt(_bool), "note": _S})),
    "workload": _opt(_obj({"kind": _S})),
    "config": _opt(_obj()), "headline": _opt(_obj()), "synthetic": _opt(_obj()),
    "gpu": _opt(_obj({"name": _S, "count": _opt(_int(0)), "count_used": _opt(_int(0)), "driver": _S})),
    "clock": _opt(_obj({
        "source": _S, "step_ns": _N, "t0_ns": _N, "uncertainty_ns": _N, "host_pairs": _opt(_int(0)),
        "ranks": _opt(_list(_obj({"rank": _int(0), "offset_ns": _N, "drift_ppm": _N, "uncertainty_ns": _N,
                                  "anchor_ns": _N}, required=("rank",)))),
        "host": _opt(_obj({"uncertainty_ns": _N, "slope": _N, "host_anchor": _N, "gpu_anchor": _N})),
        "sync_samples": _opt(_obj()),
    })),
    "registry": _opt(_registries),
    "drops": _opt(_obj({"total": _int(0), "per_rank": _opt(_list(_int(0)))}, required=("total",))),
    "warnings": _opt(_list(_obj({"type": _str, "count": _opt(_int(0)), "detail": _S}, required=("type",)))),
    "expect": _opt(_expect),
    "checksums": _opt(_checksums),
}


def _depth_ok(v, limit: int) -> bool:
    """No container nests deeper than limit (iterative: a deep value must not exhaust the stack)."""
    stack = [(v, 1)]
    while stack:
        x, d = stack.pop()
        if d > limit:
            return False
        if isinstance(x, dict):
            stack.extend((y, d + 1) for y in x.values())
        elif isinstance(x, list):
            stack.extend((y, d + 1) for y in x)
    return True


def format_version(v, file: str) -> int:
    """The run's format version: an integer from 1 up to FORMAT_VERSION (true, 0, -5 refused)."""
    w = _Where(file)
    if isinstance(v, bool) or not isinstance(v, int):
        raise w.bad("format_version", "an integer", v)
    if v < 1:
        raise w.bad("format_version", "an integer >= 1", v)
    if v > FORMAT_VERSION:
        raise UnsupportedRunVersion(f"{file}: run format version {v} is newer than this epscope's "
                                    f"{FORMAT_VERSION}; upgrade epscope to read it")
    return v


def manifest(m, file: str = "manifest.json") -> dict:
    """m, without the nulls of its declared fields, if it is a manifest this epscope can read;
    else the typed error naming the field."""
    w = _Where(file)
    if not isinstance(m, dict):
        raise InvalidManifest(f"{file}: not a JSON object (got {_type_name(m)})")
    if m.get("format") != FORMAT:
        raise InvalidManifest(f"{file}: not an {FORMAT} manifest (format={_show(m.get('format'))})", "format")
    version = format_version(m.get("format_version"), file)
    if version >= CHECKSUMS_SINCE and m.get("checksums") is None:
        raise InvalidManifest(f"{file}: field 'checksums' is required (format version {version} records a "
                              "checksum per data file)", "checksums")
    if not _depth_ok(m, MAX_DEPTH):
        raise InvalidManifest(f"{file}: nested deeper than {MAX_DEPTH} levels")
    for k, check in MANIFEST_FIELDS.items():
        if k in m:
            check(m[k], k, w)
    # top-level scalars stay as written (`"error": null` is how writers say "no error", and
    # readers index it); null objects, lists and nested fields go
    return {k: _strip_nulls(v, MANIFEST_FIELDS.get(k)) for k, v in m.items()
            if not (v is None and _is_container(MANIFEST_FIELDS.get(k)))}


def manifest_text(text: str | bytes, file: str = "manifest.json") -> dict:
    """Parse and check manifest.json's content."""
    if len(text) > MAX_MANIFEST_BYTES:
        raise InvalidManifest(f"{file}: {len(text):,} bytes, more than a manifest may hold ({MAX_MANIFEST_BYTES:,})")
    try:
        m = json.loads(text)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InvalidManifest(f"{file}: not valid JSON ({e})") from None
    except RecursionError:
        raise InvalidManifest(f"{file}: nested deeper than {MAX_DEPTH} levels") from None
    return manifest(m, file)


def manifest_file(path: Path, file: str | None = None) -> dict:
    """Read and check a manifest.json (OSError for a file that cannot be read); `file` is the
    name errors give it (default: path)."""
    with open(path, "rb") as f:
        text = f.read(MAX_MANIFEST_BYTES + 1)
    return manifest_text(text, str(path) if file is None else file)


# -- tables -----------------------------------------------------------------------------------
def events(df: pd.DataFrame, file: str = "events") -> pd.DataFrame:
    """df cast to the event schema and checked (typed InvalidEvents naming the file)."""
    try:
        out = coerce_events(df)
        validate_events(out)
    except SchemaError as e:
        raise InvalidEvents(f"{file}: {e}") from None
    return out


# Launch columns and their smallest value; times are -1 when unknown, else on the run timeline.
_LAUNCH_MIN = {"rank": 0, "launch": 0, "iteration": 0, "regions": 0, "dropped": 0}


def launches(df: pd.DataFrame, file: str = "launches") -> pd.DataFrame:
    """df cast to the launch schema (same integer, name and time rules as the events)."""
    missing = [c for c in LAUNCH_COLUMNS if c not in df.columns]
    if missing:
        raise InvalidEvents(f"{file}: launch table lacks columns {missing}")
    out = {}
    try:
        for c, t in LAUNCH_COLUMNS.items():
            s = df[c]
            if t == "category":
                out[c] = category_column(c, s)
            else:
                out[c] = integer_column(c, s, t)
                v = out[c].to_numpy()
                if c in _LAUNCH_MIN:
                    check_range(c, v, _LAUNCH_MIN[c], int(np.iinfo(t).max))
                else:
                    check_range(c, v, -TIME_LIMIT_NS, TIME_LIMIT_NS)
    except SchemaError as e:
        raise InvalidEvents(f"{file}: {e}") from None
    return pd.DataFrame(out, copy=False)


def event_times(df: pd.DataFrame, file: str = "events") -> None:
    """The columns every reader relies on, in a batch of a streamed table: kind from
    EVENT_KINDS, integer begin_ns/end_ns, no end before begin."""
    try:
        kind_column(df["kind"])
        b = integer_column("begin_ns", df["begin_ns"], "int64").to_numpy()
        e = integer_column("end_ns", df["end_ns"], "int64").to_numpy()
        check_range("begin_ns", b, -TIME_LIMIT_NS, TIME_LIMIT_NS)
        check_range("end_ns", e, -TIME_LIMIT_NS, TIME_LIMIT_NS)
    except SchemaError as ex:
        raise InvalidEvents(f"{file}: {ex}") from None
    bad = e < b
    if bad.any():
        i = int(bad.argmax())
        raise InvalidEvents(f"{file}: {int(bad.sum()):,} rows end before they begin "
                            f"(first: begin_ns {int(b[i])}, end_ns {int(e[i])})")
