"""The ijson reader of Kineto traces as it was before msgspec (commit d0b2663), kept verbatim as the reference that the fast reader is held equal to (test_kineto_differential.py).

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
from pathlib import Path

import numpy as np
import pandas as pd

from profiler.errors import EpscopeError

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
_NO_ARGS: dict = {}


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


def _header(src) -> tuple[dict, bool]:
    """The top-level members before `traceEvents` (Kineto writes its metadata there), read token
    by token until the event array opens; and whether it opened (False: no traceEvents at all)."""
    import ijson

    out: dict = {}
    key, builder, depth = None, None, 0
    with _open(src) as f:
        try:
            for prefix, event, value in ijson.parse(f, use_float=True):
                if builder is not None:
                    builder.event(event, value)
                    depth += (event in ("start_map", "start_array")) - (event in ("end_map", "end_array"))
                    if depth == 0:
                        out[key], builder = builder.value, None
                elif prefix == "" and event == "map_key":
                    key = value
                elif prefix == key and key is not None:
                    if key == "traceEvents":
                        return out, True
                    if event in ("start_map", "start_array"):
                        builder, depth = ijson.ObjectBuilder(), 1
                        builder.event(event, value)
                    else:
                        out[key] = value
                elif prefix == "" and event not in ("start_map", "end_map"):
                    raise KinetoError(f"{_name(src)}: not a JSON object: not a PyTorch profiler (Kineto) trace")
        except ijson.JSONError as e:
            raise KinetoError(f"{_name(src)}: not JSON ({e})") from None
        except (EOFError, OSError) as e:
            raise KinetoError(f"{_name(src)}: unreadable ({e})") from None
    return out, False


def _trailer_info(src) -> dict | None:
    """distributedInfo written after traceEvents (Kineto's on-demand traces): one more pass."""
    import ijson

    with _open(src) as f:
        for v in ijson.items(f, "distributedInfo", use_float=True):
            return v
    return None


def _name(src) -> str:
    return "<bytes>" if isinstance(src, (bytes, bytearray)) else str(src)


def _int(v, default: int = -1) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return default


class _Columns:
    """The kept events' columns, appended one event at a time into typed arrays (8 bytes a number,
    4 a name code): what the reader holds is bounded by the events kept, not by the JSON's objects."""

    def __init__(self):
        self.kind, self.name, self.stack = array("b"), array("i"), array("i")
        self.pid, self.tid, self.ts, self.dur = array("q"), array("q"), array("q"), array("q")
        self.corr, self.ext, self.stream = array("q"), array("q"), array("q")
        self.names: dict = {}
        self.stacks: dict = {"": 0}

    def consume(self, items, keep_cat: dict) -> int:
        """Append the complete events of the kept categories from `items`; returns how many events
        were seen. One loop with bound appends: this is the reader's per-event cost."""
        kind, name, stack = self.kind.append, self.name.append, self.stack.append
        pid, tid, ts, dur = self.pid.append, self.tid.append, self.ts.append, self.dur.append
        corr, ext, stream = self.corr.append, self.ext.append, self.stream.append
        names, stacks = self.names, self.stacks
        kinds = {k: i for i, k in enumerate(KINDS)}
        keep = {c: kinds[k] for c, k in keep_cat.items()}
        seen = 0
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
            for col, v in ((pid, e.get("pid", -1)), (tid, e.get("tid", -1)), (corr, a.get("correlation", -1)),
                           (ext, a.get("External id", -1)), (stream, a.get("stream", -1))):
                try:
                    col(v)
                except (TypeError, OverflowError):   # Kineto writes pid "Spans", a string tid: not a number
                    col(_int(v))
        return seen

    def frame(self, base_ns: int) -> pd.DataFrame:
        def cat(codes, table):
            cats = [str(x) for x in table]          # codes were given in insertion order
            return pd.Categorical.from_codes(np.frombuffer(codes, np.int32), categories=pd.unique(np.array(
                cats, dtype=object))) if len(set(cats)) == len(cats) else pd.Categorical(
                np.array(cats, dtype=object)[np.frombuffer(codes, np.int32)])

        q = lambda a: np.frombuffer(a, np.int64).copy() if len(a) else np.zeros(0, np.int64)  # noqa: E731
        return pd.DataFrame({
            "kind": pd.Categorical.from_codes(np.frombuffer(self.kind, np.int8).astype(np.int16), categories=KINDS),
            "name": cat(self.name, self.names), "pid": q(self.pid), "tid": q(self.tid),
            "ts_ns": q(self.ts) + np.int64(base_ns), "dur_ns": q(self.dur), "correlation": q(self.corr),
            "external_id": q(self.ext), "stream": q(self.stream), "stack": cat(self.stack, self.stacks)},
            columns=COLUMNS)


def read_kineto(src, *, keep=KINDS) -> KinetoTrace:
    """Read a Kineto trace (path or bytes; JSON or gzipped JSON) streaming; keep the complete
    events of the kinds `keep`. Raises KinetoError when the file is not a Kineto trace."""
    import ijson

    head, has_events = _header(src)
    if not has_events:
        raise KinetoError(f"{_name(src)}: no traceEvents array: not a PyTorch profiler (Kineto) trace")
    base = _int(head.get("baseTimeNanoseconds"), 0)
    keep_cat = {c: k for c, k in _CAT.items() if k in keep}
    cols = _Columns()
    with _open(src) as f:
        try:
            seen = cols.consume(ijson.items(f, "traceEvents.item", use_float=True), keep_cat)
        except ijson.JSONError as err:
            raise KinetoError(f"{_name(src)}: broken JSON after {len(cols.kind):,} kept events ({err})") from None
        except (EOFError, OSError) as err:   # a truncated gzip stream
            raise KinetoError(f"{_name(src)}: truncated or unreadable after {len(cols.kind):,} kept events "
                              f"({err})") from None
        except (TypeError, KeyError) as err:   # an event whose ts/dur is not a number
            raise KinetoError(f"{_name(src)}: an event with a malformed field after {len(cols.kind):,} kept "
                              f"events ({type(err).__name__}: {err})") from None
    info = head.get("distributedInfo")
    if not isinstance(info, dict):
        info = _trailer_info(src)
    rank = _int(info.get("rank"), -1) if isinstance(info, dict) else -1
    ws = _int(info.get("world_size"), -1) if isinstance(info, dict) else -1
    return KinetoTrace(_name(src), cols.frame(base), base, rank if rank >= 0 else None, ws if ws > 0 else None, seen)


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
