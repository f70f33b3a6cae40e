"""The column passes of the msgspec path (kineto._Columns.extend) against the ijson reader it replaced
(kineto_ijson_reference.py): runs where few events are kept, names first seen in late runs, ids as
numeric strings, args null, times too large for int64; at block sizes from a few bytes to several
runs of the default block (the tiny blocks: test_kineto_differential.py)."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from profiler.torchtrace import kineto as K
from profiler.torchtrace import kineto_runs as R

from . import kineto_ijson_reference as REF
from .fake import BASE


def _kept(i: int) -> dict:
    # ids as Kineto never writes them but JSON allows: numeric strings ("12", " 3", "1_0": int() reads them),
    # a non-numeric string, ints at int64's edges; names and stacks first seen late in the trace
    pids = [7, "12", " 3", "1_0", "Spans", "", 1 - 2 ** 63, 2 ** 63 - 1]   # yajl refuses -2 ** 63
    return {"ph": "X", "cat": ["cpu_op", "kernel", "cuda_runtime", "python_function"][i % 4],
            "name": f"op {i // 800}", "pid": pids[i % len(pids)], "tid": pids[(i // 3) % len(pids)],
            "ts": (1000 * i + 1) / 1000, "dur": 2.5 if i % 7 else -1.0,
            "args": None if i % 11 == 0 else {"correlation": i, "External id": 2 ** 63 - 1 - i, "stream": 7,
                                              "Call stack": f"m.py({i // 1000}): f", "grid": [1, 2, 3]}}


def _skipped(i: int) -> dict:
    # what a trace holds besides kept events: flows, instants, metadata, other categories, an X without ts
    return [{"ph": "s", "cat": "ac2g", "name": "ac2g", "id": i, "pid": 0, "tid": 7, "ts": i / 1000, "bp": "e"},
            {"ph": "i", "cat": "cpu_op", "name": "instant", "pid": 7, "tid": 7, "ts": i / 1000, "s": "t"},
            {"ph": "M", "name": "thread_name", "pid": 7, "tid": i, "args": {"name": f"thread {i}"}},
            {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
             "ts": i / 1000, "dur": 5.0},
            {"ph": "X", "cat": "kernel", "name": "no ts", "pid": 0, "tid": 7, "dur": 1.0}][i % 5]


def _write(path, events) -> None:
    path.write_bytes(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": BASE, "traceEvents": events,
                                 "traceName": "x"}).encode())


def _same(a, b):
    assert (a.read, a.base_ns, a.rank, a.world_size) == (b.read, b.base_ns, b.rank, b.world_size)
    pd.testing.assert_frame_equal(a.events, b.events)


@pytest.mark.parametrize("every", [1, 4, 25])
def test_few_events_kept_late_names_odd_ids(tmp_path, every, monkeypatch):
    # every `every`-th event kept: from all of them to a few a run; > 2 default blocks of JSON
    n = 5000 * every
    events = [_kept(i // every) if i % every == 0 else _skipped(i) for i in range(n)]
    p = tmp_path / "t.json"
    _write(p, events)
    assert p.stat().st_size > 2 * R.BLOCK
    want = REF.read_kineto(p)
    assert len(want.events) == 5000 and want.read == n and want.events["name"].nunique() == 7
    for block in [301, 4096, 65536, R.BLOCK, 0]:
        _same(K.read_kineto(p, block=block), want)
    # the struct runs, not ijson, made that table (msgspec took these odd ids and null args)
    took = []
    extend = K._Columns.extend
    monkeypatch.setattr(K._Columns, "extend", lambda self, ev, keep: took.append(len(ev)) or extend(self, ev, keep))
    K.read_kineto(p)
    assert sum(took) > 0.9 * n


@pytest.mark.parametrize("ts", [1e16, -1e16, 9.3e15, 9.2e15])
def test_times_beyond_int64_fail_as_the_ijson_reader(tmp_path, ts):
    # ts * 1000 past int64 in a late run: the struct run is refused and consume raises what the reference raises
    events = [_kept(i) for i in range(3000)]
    events[2500] = dict(events[2500], ts=ts)
    p = tmp_path / "t.json"
    _write(p, events)
    try:
        want = REF.read_kineto(p)
    except Exception as e:   # noqa: BLE001 - the reference's own error, whatever it is
        for block in (301, R.BLOCK):
            with pytest.raises(type(e)) as got:
                K.read_kineto(p, block=block)
            assert str(got.value) == str(e)
        return
    for block in (301, R.BLOCK):
        _same(K.read_kineto(p, block=block), want)


@pytest.mark.parametrize("odd", [{"ph": "i"}, {"ph": "B"}, {"cat": "ac2g"}, {"ts": "drop"}])
def test_runs_of_kept_events_but_one(tmp_path, odd):
    # runs of kept events only are taken whole; one event a few runs apart that is not kept (another ph,
    # an unkept category, no ts) must send its run through the filter
    events = [_kept(i) for i in range(6000)]
    for i in (1, 2500, 5999):
        events[i] = {k: v for k, v in dict(events[i], **odd).items() if v != "drop"}
    p = tmp_path / "t.json"
    _write(p, events)
    want = REF.read_kineto(p)
    assert len(want.events) == 6000 - 3
    for block in (4096, R.BLOCK):
        _same(K.read_kineto(p, block=block), want)
