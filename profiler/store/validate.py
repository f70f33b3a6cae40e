"""What a run may contain, checked in one place: `epscope report`, `epscope export`, `load_run`
and the viewer all go through these functions, so a malformed run gives the same typed error,
in one line, wherever it is opened.

- `manifest_text(text, where)`: parse manifest.json (size and nesting bounded) and check it;
- `manifest(m, where)`: every field the readers use has the type they use it as;
- `events(df, where)` / `launches(df, where)`: the tables follow the schema (profiler.store.schema):
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

import hashlib
import json
import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from . import atomic, checks_fast
from ..errors import InconsistentRun, InvalidEvents, InvalidManifest, SealMismatch, UnsupportedRunVersion
from .schema import (LAUNCH_COLUMNS, TIME_LIMIT_NS, SchemaError, category_column, check_range, coerce_events,
                     integer_column, kind_column, validate_events)

FORMAT = "epscope-run"
# 3: the manifest carries `seal`, a digest of itself (canonical JSON without the seal), and both
#    data files' footers carry FOOTER_FORMAT_KEY = "3" (what tells a sealed run whose manifest was
#    edited back to an older format from a run written before sealing; see `downgrade`);
# 2: `checksums` (required: a manifest that lost them is damaged, not old), no seal;
# 1: neither (every run written before issue 19, the bundled traces/ among them until resealed).
FORMAT_VERSION = 3
CHECKSUMS_SINCE = 2
SEALED_SINCE = 3
# The largest bundled manifest is 9.8 kB (two ranks: a registry of 3.8 kB, an expect block of
# 1.8 kB); an 8-rank run adds a few hundred bytes of clock per rank. 256 kB is 26x the largest: a
# 4 MB manifest cost 94 MB for the viewer's lifetime (every run's manifest stays listed, issue 32).
MAX_MANIFEST_BYTES = 256 << 10
# Deepest nesting in any manifest epscope writes: 5 (clock.sync_samples.<rank>.<window>).
MAX_DEPTH = 32
# The data files a manifest's `checksums` covers, and how: {"events.parquet": "sha256:<64 hex>"}.
DATA_FILES = ("events.parquet", "launches.parquet")
CHECKSUM_ALGO = "sha256"
_CHECKSUM = re.compile(r"sha256:[0-9a-f]{64}")
SEAL = "seal"
# key of both parquet files' schema metadata naming the format version of the writer (since 3)
FOOTER_FORMAT_KEY = b"epscope.format_version"

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


# -- seals: a digest of a JSON document over itself --------------------------------------------
def canonical(doc) -> bytes:
    """The one byte form of a JSON value a digest is taken over: keys sorted, no spaces, ASCII
    (Python's float repr round-trips exactly, so a document read back gives the same bytes)."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def digest(doc) -> str:
    """`sha256:<hex>` of canonical(doc)."""
    return f"{CHECKSUM_ALGO}:{hashlib.sha256(canonical(doc)).hexdigest()}"


def sealed(doc: dict, key: str = SEAL) -> dict:
    """doc with `key` set to the digest of the rest of it."""
    rest = {k: v for k, v in doc.items() if k != key}
    return {**rest, key: digest(rest)}


def seal_matches(doc: dict, key: str = SEAL) -> bool | None:
    """Whether doc's `key` is the digest of the rest of it; None when doc carries no seal."""
    if doc.get(key) is None:
        return None
    return doc[key] == digest({k: v for k, v in doc.items() if k != key})


def _checksums(v, f, w):
    _obj()(v, f, w)
    want = set(DATA_FILES)
    if set(v) != want:
        raise InvalidManifest(f"{w.file}: field '{f}' must name exactly {sorted(want)}, got {sorted(map(str, v))[:5]}", f)
    for k, x in v.items():
        if not isinstance(x, str) or not _CHECKSUM.fullmatch(x):
            raise w.bad(f"{f}.{k}", f"'{CHECKSUM_ALGO}:' and 64 hex digits", x)


def _seal_field(v, f, w):
    if not isinstance(v, str) or not _CHECKSUM.fullmatch(v):
        raise w.bad(f, f"'{CHECKSUM_ALGO}:' and 64 hex digits", v)


def _registries(v, f, w):
    from ..registry.registry import Registry, RegistryError

    _obj()(v, f, w)
    for fam, reg in v.items():
        _obj()(reg, f"{f}.{fam}", w)
        try:
            Registry.from_dict(reg)
        except (RegistryError, TypeError, ValueError, AttributeError, KeyError) as e:
            raise InvalidManifest(f"{w.file}: field '{f}.{fam}' is not a valid registry: {str(e)[:200]}",
                                  f"{f}.{fam}") from None


def _expect(v, f, w):
    from ..groundtruth.expect import Expect, ExpectError

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
    SEAL: _opt(_seal_field),
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
    if version >= SEALED_SINCE and m.get(SEAL) is None:
        raise InvalidManifest(f"{file}: field '{SEAL}' is required (format version {version} seals its manifest)",
                              SEAL)
    if not _depth_ok(m, MAX_DEPTH):
        raise InvalidManifest(f"{file}: nested deeper than {MAX_DEPTH} levels")
    for k, check in MANIFEST_FIELDS.items():
        if k in m:
            check(m[k], k, w)
    if seal_matches(m) is False:   # a seal is verified whatever the version says (a downgrade keeps none)
        raise SealMismatch(f"{file}: its content does not match its seal (the manifest was edited or damaged "
                           "after the run was written)", file=file)
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


def manifest_file(path: Path, file: str | None = None, *, within=None) -> dict:
    """Read and check a manifest.json (a regular file inside `within`, at most MAX_MANIFEST_BYTES:
    atomic.read_regular; OSError for a file that cannot be read); `file` is the name errors give
    it (default: path)."""
    file = str(path) if file is None else file
    return manifest_text(atomic.read_regular(path, MAX_MANIFEST_BYTES, file, within=within), file)


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
    out = pd.DataFrame(out, copy=False)
    unique_launches(out, file)
    return out


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


# -- across tables (issue 32: 34 of 130 tables rewritten with valid checksums were accepted though
# inconsistent: events of launches that do not exist, duplicated rows giving "147 % warp time";
# duplicate launch keys crashed report and analyze) ----------------------------------------------
def _keys(rank: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """(rank, launch) as one int64 per row (rank and launch are checked >= 0 before)."""
    return (rank.astype(np.int64) << 32) | launch.astype(np.int64)


def unique_launches(df: pd.DataFrame, file: str = "launches") -> None:
    """Each (rank, launch) names one launch: the first row repeating an earlier key is named."""
    k = _keys(df["rank"].to_numpy(), df["launch"].to_numpy())
    dup = pd.Index(k).duplicated()
    if dup.any():
        i = int(dup.argmax())
        first = int(np.flatnonzero(k == k[i])[0])
        raise InconsistentRun(f"{file}: row {i} repeats the launch key (rank {int(df['rank'].iat[i])}, launch "
                              f"{int(df['launch'].iat[i])}) of row {first} ({int(dup.sum()):,} repeated keys)")


def events_match_launches(ev: pd.DataFrame, la: pd.DataFrame, file: str = "events", rows: np.ndarray | None = None) -> None:
    """Every event belongs to a launch of `la` (its rank and launch), and agrees with it on the
    iteration and the kernel; the first row that does not is named (rows: the frame's row numbers
    in the whole table, when it is a part of it). Rows come in runs of one launch (the writer's
    order), so only the first row of each run of equal (rank, launch, iteration, kernel) is looked
    up: 2 M rows in ~0.02 s."""
    if not len(ev):
        return
    cols = [ev["rank"].to_numpy(), ev["launch"].to_numpy(), ev["iteration"].to_numpy(), ev["kernel"].cat.codes.to_numpy()]
    change = np.zeros(len(ev), bool)
    change[0] = True
    for v in cols:
        change[1:] |= v[1:] != v[:-1]
    first = np.flatnonzero(change)
    rk, ln, it, kc = (v[first] for v in cols)
    lk = _keys(la["rank"].to_numpy(), la["launch"].to_numpy())
    order = np.argsort(lk, kind="stable")
    ls = lk[order]
    ek = _keys(rk, ln)
    at = np.minimum(np.searchsorted(ls, ek), max(len(ls) - 1, 0))
    where = (lambda j: int(rows[first[j]])) if rows is not None else (lambda j: int(first[j]))
    bad = (ls[at] != ek) if len(ls) else np.ones(len(ek), bool)
    if bad.any():
        j = int(bad.argmax())
        raise InconsistentRun(f"{file}: row {where(j)} (rank {int(rk[j])}, launch {int(ln[j])}) belongs to no launch "
                              "of the launch table")
    li = order[at]
    code_of = pd.Index(ev["kernel"].cat.categories).get_indexer(la["kernel"].astype(str).to_numpy())
    for c, got, want in (("iteration", it, la["iteration"].to_numpy()[li]), ("kernel", kc, code_of[li])):
        bad = got != want
        if bad.any():
            j = int(bad.argmax())
            show = int if c == "iteration" else (lambda x: repr(str(x)))
            raise InconsistentRun(f"{file}: row {where(j)} has {c} {show(ev[c].iat[int(first[j])])}, its launch (rank "
                                  f"{int(rk[j])}, launch {int(ln[j])}) has {show(la[c].iat[int(li[j])])}")


_K1, _K2, _K3 = np.int64(0x1E3779B97F4A7C15), np.int64(0x3F58476D1CE4E5B9), np.int64(0x14D049BB133111EB)


def _row_hash(ev: pd.DataFrame) -> np.ndarray:
    """A 64-bit mix of each row's times, rank, block, warp and phase (equal rows, equal values;
    rows that only share them cost an exact comparison): 2 M rows in ~0.04 s of one core."""
    where = (ev["rank"].to_numpy().astype(np.int64) << 48) ^ (ev["block"].to_numpy().astype(np.int64) << 16) \
        ^ ev["warp"].to_numpy().astype(np.int64) ^ (ev["phase"].cat.codes.to_numpy().astype(np.int64) << 36)
    with np.errstate(over="ignore"):
        return ev["begin_ns"].to_numpy() * _K1 ^ ev["end_ns"].to_numpy() * _K2 ^ where * _K3


def no_duplicate_rows(ev: pd.DataFrame, file: str = "events", rows: np.ndarray | None = None) -> None:
    """No two rows of the table are equal in every column (a warp records an event once: a
    duplicated row counts its time twice); names the first repeated row and its twin."""
    if len(ev) < 2:
        return
    if checks_fast.enabled(len(ev)) and checks_fast.no_repeats(ev):   # one pass over the writer's layout
        return
    h = _row_hash(ev)
    s = np.sort(h)
    same = s[1:] == s[:-1]
    if not same.any():
        return
    cand = np.flatnonzero(np.isin(h, s[1:][same]))
    sub = ev.iloc[cand]
    dup = sub.duplicated(keep="first").to_numpy()
    if not dup.any():
        return   # rows that share times, rank, block, warp and phase but differ elsewhere
    j = int(cand[int(dup.argmax())])
    twin = int(cand[int(sub.duplicated(keep=False).to_numpy().argmax())])
    where = (lambda x: int(rows[x])) if rows is not None else int
    raise InconsistentRun(f"{file}: row {where(j)} repeats row {where(twin)} in every column "
                          f"({int(dup.sum()):,} repeated rows)")


def manifest_matches_launches(man: dict, la: pd.DataFrame, file: str = "manifest.json") -> None:
    """What the manifest counts agrees with the launch table: the dropped records (`drops.total`
    and `drops.per_rank`) and `world_size` (every launch's rank below it)."""
    drops = man.get("drops")
    per = la.groupby("rank")["dropped"].sum() if len(la) else pd.Series(dtype="int64")
    if drops is not None:
        total = int(la["dropped"].sum()) if len(la) else 0
        if drops["total"] != total:
            raise InconsistentRun(f"{file}: field 'drops.total' says {drops['total']:,} dropped records, the launch "
                                  f"table counts {total:,}")
        pr = drops.get("per_rank")
        if pr is not None:
            got = [int(per.get(r, 0)) for r in range(max(len(pr), int(per.index.max()) + 1 if len(per) else 0))]
            if list(pr) + [0] * (len(got) - len(pr)) != got:
                raise InconsistentRun(f"{file}: field 'drops.per_rank' says {list(pr)[:16]}, the launch table counts "
                                      f"{got[:16]}")
    ws = man.get("world_size")
    if ws is not None and len(la) and int(la["rank"].max()) >= ws:
        raise InconsistentRun(f"{file}: field 'world_size' says {ws}, the launch table has rank {int(la['rank'].max())}")
