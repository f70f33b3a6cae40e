"""Streaming reader of PyTorch profiler (Kineto) traces: JSON or gzipped JSON -> one columnar table.

What a Kineto chrome trace holds (libkineto's output_json.cpp): top-level `baseTimeNanoseconds`
(every `ts` is relative to it since Kineto 0.4: ns written as microseconds with three decimals;
older traces have no base and absolute microseconds, which a double holds to about 0.25 µs),
`distributedInfo` ({"rank", "world_size", ...} when torch.distributed ran; written before or, on
demand, after `traceEvents`), and `traceEvents`: complete events (`ph` "X") with `cat`
cpu_op / user_annotation / python_function on host threads (pid = process, tid = thread),
cuda_runtime / cuda_driver (the launch calls, `args.correlation`), kernel / gpu_memcpy /
gpu_memset / gpu_user_annotation on GPU streams (pid = device, tid = stream, `args.correlation`
equal to the runtime call's), plus flows, instants and metadata, which are skipped.

The file is read with ijson (yajl's C backend), one event at a time: memory holds the kept events'
columns, never the document. A trace of several hundred MB is normal for a real step.
"""
from __future__ import annotations

import gzip
import io
from array import array
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import EpscopeError
from . import kineto_runs as R

# kinds of kept events (the `kind` column), from Kineto's `cat`
CPU_OP, USER, PYTHON, RUNTIME, KERNEL, MEMCPY, MEMSET, GPU_USER = (
    "cpu_op", "user_annotation", "python_function", "runtime", "kernel", "memcpy", "memset", "gpu_user_annotation")
KINDS = (CPU_OP, USER, PYTHON, RUNTIME, KERNEL, MEMCPY, MEMSET, GPU_USER)
_CAT = {"cpu_op": CPU_OP, "user_annotation": USER, "python_function": PYTHON, "cuda_runtime": RUNTIME,
        "cuda_driver": RUNTIME, "kernel": KERNEL, "Kernel": KERNEL, "gpu_memcpy": MEMCPY, "gpu_memset": MEMSET,
        "gpu_user_annotation": GPU_USER}
HOST_KINDS = (CPU_OP, USER, PYTHON, RUNTIME)
GPU_KINDS = (KERNEL, MEMCPY, MEMSET, GPU_USER)
COLUMNS = ["kind", "name", "pid", "tid", "ts_ns", "dur_ns", "correlation", "external_id", "stream", "stack"]
_GZIP_MAGIC = b"\x1f\x8b"
_KEY = b'"traceEvents"'
_NO_ARGS: dict = {}
_Q_MAX = 2.0 ** 63          # a double below it rounds to an int64; at or above, consume's OverflowError


class KinetoError(EpscopeError):
    """A file that is not a readable Kineto trace (the message names the file and what is wrong)."""


@dataclass(frozen=True)
class KinetoTrace:
    """One rank's trace. events: COLUMNS, times in Kineto's host clock (ns, absolute: base added),
    `correlation` / `external_id` / `stream` -1 where absent, `stack` the op's "Call stack" arg
    where the trace has one ('' otherwise); rank / world_size from distributedInfo (None without);
    `read`: events seen in traceEvents (kept or not)."""
    path: str
    events: pd.DataFrame
    base_ns: int
    rank: int | None
    world_size: int | None
    read: int


def _open(src) -> io.BufferedIOBase:
    """A binary stream of the JSON text: a path (gzip detected by its magic, not its name) or bytes."""
    if isinstance(src, (bytes, bytearray)):
        raw = io.BytesIO(bytes(src))
    else:
        raw = open(src, "rb")
    head = raw.peek(2)[:2] if hasattr(raw, "peek") else raw.read(2)
    if not hasattr(raw, "peek"):
        raw.seek(0)
    return gzip.GzipFile(fileobj=raw) if head == _GZIP_MAGIC else raw


class _Trickle:
    """A stream handed to ijson one byte a read, so that when ijson reports the top-level
    `traceEvents` key the stream stands just after it; `last` keeps the last bytes to check that."""

    def __init__(self, f):
        self.f, self.last = f, b""

    def read(self, n: int) -> bytes:
        if n == 0:                 # ijson's probe of the stream's type
            return b""
        b = self.f.read(1)
        self.last = (self.last + b)[-len(_KEY):]
        return b


class _Chain:
    """`head` bytes, then the rest of the stream `f`: the document ijson reads on from a cut."""

    def __init__(self, head: bytes, f):
        self.head, self.f = head, f

    def read(self, n: int = -1) -> bytes:
        if n == 0:
            return b""
        if self.head:
            out, self.head = (self.head, b"") if n < 0 or n >= len(self.head) else (self.head[:n], self.head[n:])
            return out
        return self.f.read(n)


@dataclass(frozen=True)
class _Head:
    """The top-level members before `traceEvents` (Kineto writes its metadata there, last value of
    a repeated key) and the first value of each (`first`); `has_events`: the key was found;
    `at_key`: the stream stands just after the key's closing quote."""
    members: dict
    first: dict
    has_events: bool
    at_key: bool


def _header(f, name: str) -> _Head:
    """Read the top-level members before `traceEvents` token by token from `f`, one byte a read,
    stopping just after the key."""
    import ijson

    out, first = {}, {}
    key, builder, depth = None, None, 0
    src = _Trickle(f)
    try:
        for prefix, event, value in ijson.parse(src, buf_size=1, use_float=True):
            if builder is not None:
                builder.event(event, value)
                depth += (event in ("start_map", "start_array")) - (event in ("end_map", "end_array"))
                if depth == 0:
                    out[key], builder = builder.value, None
                    first.setdefault(key, out[key])
            elif prefix == "" and event == "map_key":
                key = value
                if key == "traceEvents":
                    return _Head(out, first, True, src.last == _KEY)
            elif prefix == key and key is not None:
                if event in ("start_map", "start_array"):
                    builder, depth = ijson.ObjectBuilder(), 1
                    builder.event(event, value)
                else:
                    out[key] = value
                    first.setdefault(key, value)
            elif prefix == "" and event not in ("start_map", "end_map"):
                raise KinetoError(f"{name}: not a JSON object: not a PyTorch profiler (Kineto) trace")
    except ijson.JSONError as e:
        raise KinetoError(f"{name}: not JSON ({e})") from None
    except (EOFError, OSError) as e:
        raise KinetoError(f"{name}: unreadable ({e})") from None
    return _Head(out, first, False, False)


def _catch_info(events, found: dict):
    """Pass ijson's parse events through, keeping the first top-level distributedInfo in `found`."""
    import ijson

    builder, depth = None, 0
    for prefix, event, value in events:
        if builder is not None:
            builder.event(event, value)
            depth += (event in ("start_map", "start_array")) - (event in ("end_map", "end_array"))
            if depth == 0:
                found["info"], builder = builder.value, None
        elif prefix == "distributedInfo" and "info" not in found and event != "map_key":
            if event in ("start_map", "start_array"):
                builder, depth = ijson.ObjectBuilder(), 1
                builder.event(event, value)
            else:
                found["info"] = value
        yield prefix, event, value


def _name(src) -> str:
    return "<bytes>" if isinstance(src, (bytes, bytearray)) else str(src)


def _int(v, default: int = -1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


def _append_q(col: array, v) -> None:
    """consume's conversion of an id (pid, tid, correlation...) for one value."""
    try:
        col.append(v)
    except (TypeError, OverflowError):   # Kineto writes pid "Spans", a string tid: not a number
        col.append(_int(v))


def _ints(objs: list, get) -> np.ndarray:
    """An id column of a run (`get` of each of `objs`) as int64, as consume converts it.
    np.fromiter takes ints and numeric strings (int(), as consume's _int does: "12" -> 12); a string
    that is no number ("Spans") or an int beyond int64 raises, and then each value goes through
    consume's own conversion."""
    try:
        return np.fromiter(map(get, objs), np.int64, len(objs))
    except (TypeError, ValueError, OverflowError):
        col = array("q")
        for v in map(get, objs):
            _append_q(col, v)
        return np.frombuffer(col, np.int64)


def _codes(table: dict, objs: list, get) -> np.ndarray:
    """consume's name coding (codes in order of first appearance) of `get` over `objs`: one C-level
    lookup pass; values not yet in `table` (-1) are coded in order in Python, rare after a trace's
    first runs."""
    codes = np.fromiter(map(table.get, map(get, objs), repeat(-1)), np.int32, len(objs))
    for i in np.flatnonzero(codes < 0).tolist():
        v = get(objs[i])
        c = table.get(v)
        if c is None:
            c = table[v] = len(table)
        codes[i] = c
    return codes


def _kept(events: list, code: dict):
    """The kept events of a run of structs (complete, of a kept category, with a time), their kind
    codes and times (µs). A run of kept events only (most of a real trace) is taken as it is, its
    kinds and times by C-level passes, its `ph` by a set, an event without a time found by
    np.fromiter's refusal of UNSET; other runs by one filtering comprehension."""
    n = len(events)
    kind = np.fromiter(map(code.get, map(_CAT_OF, events), repeat(-1)), np.int8, n)
    if n and kind.min() >= 0 and set(map(_PH_OF, events)) == {"X"}:
        try:
            return events, kind, np.fromiter(map(_TS_OF, events), np.float64, n)
        except (TypeError, ValueError):   # an event without ts (UNSET)
            pass
    unset = R.UNSET
    kept = [e for e in events if e.ph == "X" and e.cat in code and e.ts is not unset]
    k = len(kept)
    return (kept, np.fromiter(map(code.__getitem__, map(_CAT_OF, kept)), np.int8, k),
            np.fromiter(map(_TS_OF, kept), np.float64, k))


_DTYPE = {"b": np.int8, "i": np.int32, "q": np.int64}    # array typecode -> numpy
_PARTS = ("kind", "name", "stack", "pid", "tid", "ts", "dur", "corr", "ext", "stream")
_CAT_OF, _NAME_OF, _ARGS_OF, _PH_OF = attrgetter("cat"), attrgetter("name"), attrgetter("args"), attrgetter("ph")
_TS_OF, _DUR_OF, _PID_OF, _TID_OF = attrgetter("ts"), attrgetter("dur"), attrgetter("pid"), attrgetter("tid")
_STACK_OF, _CORR_OF = attrgetter("stack"), attrgetter("correlation")
_EXT_OF, _STREAM_OF = attrgetter("external_id"), attrgetter("stream")


class _Columns:
    """The kept events' columns, one numpy array a column for each run (8 bytes a number, 4 a name
    code), joined once by `frame`: what the reader holds is bounded by the events kept, not by the
    JSON's objects."""

    def __init__(self):
        self.parts: dict = {p: [] for p in _PARTS}
        self.kept = 0                   # events appended (consume's count, an event cut short by an error included)
        self.names: dict = {}
        self.stacks: dict = {"": 0}

    def _push(self, cols: dict, n: int) -> None:
        for p in _PARTS:
            self.parts[p].append(cols[p])
        self.kept += n

    def consume(self, items, keep_cat: dict) -> int:
        """Append the complete events of the kept categories from `items` (dicts) one at a time;
        returns how many events were seen. The arrays are pushed as one run at the end, also when
        `items` raises (the error's message counts them)."""
        cols = {p: array("b" if p == "kind" else "i" if p in ("name", "stack") else "q") for p in _PARTS}
        kind, name, stack = cols["kind"].append, cols["name"].append, cols["stack"].append
        ts, dur = cols["ts"].append, cols["dur"].append
        qs = [cols[p].append for p in ("pid", "tid", "corr", "ext", "stream")]
        names, stacks = self.names, self.stacks
        kinds = {k: i for i, k in enumerate(KINDS)}
        keep = {c: kinds[k] for c, k in keep_cat.items()}
        seen = 0
        try:
            for e in items:
                seen += 1
                k = keep.get(e.get("cat"))
                if k is None or e.get("ph") != "X" or "ts" not in e:
                    continue
                a = e.get("args") or _NO_ARGS
                n = e.get("name", "")
                c = names.get(n)
                if c is None:
                    c = names[n] = len(names)
                st = a.get("Call stack", "")
                sc = stacks.get(st)
                if sc is None:
                    sc = stacks[st] = len(stacks)
                kind(k)
                name(c)
                stack(sc)
                ts(round(e["ts"] * 1000.0))
                dur(max(round(e.get("dur", 0.0) * 1000.0), 0))
                for col, v in zip(qs, (e.get("pid", -1), e.get("tid", -1), a.get("correlation", -1),
                                       a.get("External id", -1), a.get("stream", -1))):
                    try:
                        col(v)
                    except (TypeError, OverflowError):   # Kineto writes pid "Spans", a string tid: not a number
                        col(_int(v))
        finally:
            self._push({p: np.frombuffer(a, _DTYPE[a.typecode]) for p, a in cols.items()}, len(cols["kind"]))
        return seen

    def extend(self, events: list, keep: dict) -> bool:
        """Append the kept events of a run of msgspec structs (kineto_runs.Event), column by column:
        what `consume` does one event at a time, in C-level passes (map, np.fromiter). False, with
        nothing appended, where a value needs consume's own handling (a time that is not finite or
        overflows int64)."""
        kept, kind, ts = _kept(events, {c: KINDS.index(k) for c, k in keep.items()})
        n = len(kept)
        ts = ts * 1000.0
        dur = np.fromiter(map(_DUR_OF, kept), np.float64, n) * 1000.0
        if n and not (np.abs(ts).max() < _Q_MAX and np.abs(dur).max() < _Q_MAX):   # also NaN, inf
            return False
        args = list(map(_ARGS_OF, kept))
        if None in args:               # "args": null
            args = [a or R.NO_ARGS for a in args]
        self._push({"kind": kind,
                    "name": _codes(self.names, kept, _NAME_OF), "stack": _codes(self.stacks, args, _STACK_OF),
                    "ts": np.rint(ts).astype(np.int64),          # round() of a float: half to even, as np.rint
                    "dur": np.maximum(np.rint(dur), 0).astype(np.int64),
                    "pid": _ints(kept, _PID_OF), "tid": _ints(kept, _TID_OF),
                    "corr": _ints(args, _CORR_OF), "ext": _ints(args, _EXT_OF),
                    "stream": _ints(args, _STREAM_OF)}, n)
        return True

    def _joined(self, part: str, dtype) -> np.ndarray:
        """One column's runs joined (the runs are dropped as they are joined: one column's copy at a time)."""
        runs = self.parts[part]
        out = np.concatenate(runs).astype(dtype, copy=False) if runs else np.zeros(0, dtype)
        runs.clear()
        return out

    def frame(self, base_ns: int) -> pd.DataFrame:
        def cat(codes, table):
            cats = [str(x) for x in table]          # codes were given in insertion order
            return pd.Categorical.from_codes(codes, categories=pd.unique(np.array(cats, dtype=object))) if len(
                set(cats)) == len(cats) else pd.Categorical(np.array(cats, dtype=object)[codes])

        cols = {"kind": pd.Categorical.from_codes(self._joined("kind", np.int8).astype(np.int16), categories=KINDS),
                "name": cat(self._joined("name", np.int32), self.names)}
        for col, part in (("pid", "pid"), ("tid", "tid"), ("ts_ns", "ts"), ("dur_ns", "dur"), ("correlation", "corr"),
                          ("external_id", "ext"), ("stream", "stream")):
            cols[col] = self._joined(part, np.int64)
        cols["ts_ns"] += np.int64(base_ns)               # the joined array is the frame's own
        cols["stack"] = cat(self._joined("stack", np.int32), self.stacks)
        # copy=False: the joined arrays become the frame's columns as they are (a dict's columns are
        # otherwise copied into one 2-D block: ~0.05-0.1 s a million events here)
        return pd.DataFrame(cols, columns=COLUMNS, copy=False)


def _token(f) -> bytes:
    """The bytes up to and including the next non-space byte ('' at the end)."""
    out = f.read(1)
    while out[-1:].isspace():
        out += f.read(1)
    return out


def _read_events(f, head: _Head, cols: _Columns, keep_cat: dict, block: int, lead: bytes = b'{"traceEvents"'):
    """The events after the `traceEvents` key: runs of complete events through msgspec while they
    decode (kineto_runs), then the rest (at least the array's end and the members after it) by ijson,
    read as `lead` + what follows; ijson also finds a distributedInfo written after the events.
    Returns (events seen, that info)."""
    import ijson

    seen, read = 0, b""
    if R.available() and block > 0:
        read = _token(f)
        if read.endswith(b":"):
            read += _token(f)
        if read.endswith(b"["):
            runs = R.EventRuns(f, block)
            for run in runs:
                seen += len(run.events if run.events is not None else run.items)
                if run.events is None or not cols.extend(run.events, keep_cat):
                    cols.consume(run.items if run.items is not None else _items(run.text), keep_cat)
                # freed before the next run is decoded, whose structs then take this run's memory, still
                # in cache (held until the loop rebinds it, each run's structs landed in cold memory)
                del run
            read += runs.rest
    found: dict = {}
    rest = _Chain(lead + read, f)
    if "distributedInfo" in head.first:   # ijson's C items; the parse events pass through Python otherwise
        items = ijson.items(rest, "traceEvents.item", use_float=True)
    else:
        items = ijson.items(_catch_info(ijson.parse(rest, use_float=True), found), "traceEvents.item")
    seen += cols.consume(items, keep_cat)
    return seen, found.get("info")


def _items(text: bytes) -> list:
    import ijson

    return list(ijson.items(io.BytesIO(b"[" + text + b"]"), "item", use_float=True))


def read_kineto(src, *, keep=KINDS, block: int = R.BLOCK) -> KinetoTrace:
    """Read a Kineto trace (path or bytes; JSON or gzipped JSON) streaming, in one pass; keep the
    complete events of the kinds `keep`. Raises KinetoError when the file is not a Kineto trace.
    `block`: bytes decoded at a time by msgspec (0: ijson reads every event, as without msgspec)."""
    import ijson

    name = _name(src)
    keep_cat = {c: k for c, k in _CAT.items() if k in keep}
    cols = _Columns()
    with _open(src) as f:
        head = _header(f, name)
        if not head.has_events:
            raise KinetoError(f"{name}: no traceEvents array: not a PyTorch profiler (Kineto) trace")
        try:
            if head.at_key:
                seen, late_info = _read_events(f, head, cols, keep_cat, block)
            else:   # the key written with escapes: where its value starts is unknown; ijson reads it all
                f.close()
                with _open(src) as g:
                    seen, late_info = _read_events(g, _Head({}, {}, True, True), cols, keep_cat, 0, b"")
        except ijson.JSONError as err:
            raise KinetoError(f"{name}: broken JSON after {cols.kept:,} kept events ({err})") from None
        except (EOFError, OSError) as err:   # a truncated gzip stream
            raise KinetoError(f"{name}: truncated or unreadable after {cols.kept:,} kept events "
                              f"({err})") from None
        except (TypeError, KeyError) as err:   # an event whose ts/dur is not a number
            raise KinetoError(f"{name}: an event with a malformed field after {cols.kept:,} kept "
                              f"events ({type(err).__name__}: {err})") from None
    base = _int(head.members.get("baseTimeNanoseconds"), 0)
    info = head.members.get("distributedInfo")
    if not isinstance(info, dict):   # the old reader's third pass: the first distributedInfo anywhere
        info = head.first.get("distributedInfo", late_info)
    rank = _int(info.get("rank"), -1) if isinstance(info, dict) else -1
    ws = _int(info.get("world_size"), -1) if isinstance(info, dict) else -1
    return KinetoTrace(name, cols.frame(base), base, rank if rank >= 0 else None, ws if ws > 0 else None, seen)


def write_kineto(path, events: list[dict], *, base_ns: int = 0, rank: int | None = None,
                 world_size: int | None = None, gz: bool | None = None) -> Path:
    """Write a Kineto-shaped trace (tests and benchmarks: hand-made traces; `ts`/`dur` in events
    are ns here and written as Kineto writes them, microseconds with three decimals relative to
    the base)."""
    import json

    path = Path(path)
    doc = {"schemaVersion": 1, "deviceProperties": []}
    if rank is not None:
        doc["distributedInfo"] = {"backend": "nccl", "rank": int(rank), "world_size": int(world_size or rank + 1)}
    doc["baseTimeNanoseconds"] = int(base_ns)
    out = []
    for e in events:
        e = dict(e)
        for k in ("ts", "dur"):
            if k in e:
                v = int(e[k]) - (int(base_ns) if k == "ts" else 0)
                e[k] = float(f"{'-' if v < 0 else ''}{abs(v) // 1000}.{abs(v) % 1000:03d}")
        out.append(e)
    doc["traceEvents"] = out
    doc["traceName"] = str(path)
    text = json.dumps(doc).encode()
    if gz if gz is not None else path.suffix == ".gz":
        text = gzip.compress(text)
    path.write_bytes(text)
    return path
