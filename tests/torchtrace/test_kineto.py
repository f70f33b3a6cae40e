"""The streaming Kineto reader on hand-made traces: layout, gzip, rank, precision, damage."""
from __future__ import annotations

import gzip
import json

import pytest

from profiler.torchtrace import kineto as K

from .fake import BASE, Trace


def _events():
    t = Trace()
    t.x("cpu_op", "aten::mm", 1, 1, 1_000, 9_000, **{"External id": 5, "Call stack": "a.py(3): f"})
    t.launch(2_000, 10_001, 20_003, "gemm")
    t.x("python_function", "a.py(3): f", 1, 1, 500, 9_500)
    t.events.append({"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}})
    t.events.append({"ph": "i", "cat": "cpu_instant_event", "name": "x", "pid": 1, "tid": 1, "ts": BASE + 3})
    t.events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
                     "ts": BASE, "dur": 5})
    return t.events


@pytest.mark.parametrize("name", ["t.json", "t.json.gz", "t.pt.trace.json"])
def test_kept_events_columns_and_exact_ns(tmp_path, name):
    p = K.write_kineto(tmp_path / name, _events(), base_ns=BASE, rank=3, world_size=4, gz=name.endswith(".gz"))
    k = K.read_kineto(p)
    assert (k.rank, k.world_size, k.base_ns, k.read) == (3, 4, BASE, 8)
    ev = k.events
    assert list(ev.columns) == K.COLUMNS
    assert sorted(ev["kind"].astype(str)) == ["cpu_op", "kernel", "python_function", "runtime"]
    kern = ev[ev["kind"] == K.KERNEL].iloc[0]
    # ns survive the microsecond text: 10_001 and 20_003 are not whole microseconds
    assert (kern["ts_ns"] - BASE, kern["dur_ns"], kern["stream"]) == (10_001, 10_002, 7)
    call = ev[ev["kind"] == K.RUNTIME].iloc[0]
    assert call["correlation"] == kern["correlation"] > 0
    op = ev[ev["kind"] == K.CPU_OP].iloc[0]
    assert (op["external_id"], op["stack"]) == (5, "a.py(3): f")


def test_gzip_is_found_by_its_bytes_not_its_name(tmp_path):
    p = K.write_kineto(tmp_path / "plain.json", _events(), base_ns=BASE)
    gz = tmp_path / "named-plain.json"
    gz.write_bytes(gzip.compress(p.read_bytes()))
    assert len(K.read_kineto(gz).events) == len(K.read_kineto(p).events) == 4
    assert len(K.read_kineto(p.read_bytes()).events) == 4


def test_rank_from_distributed_info_written_after_the_events(tmp_path):
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": BASE, "traceEvents": [],
           "distributedInfo": {"backend": "nccl", "rank": 5, "world_size": 8}, "traceName": "x"}
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    k = K.read_kineto(p)
    assert (k.rank, k.world_size, len(k.events)) == (5, 8, 0)


def test_no_distributed_info_no_base(tmp_path):
    # torch before Kineto's relative times: absolute microseconds, no base; still read
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7,
                                              "ts": 1700000000000000.5, "dur": 2.0, "args": {"correlation": 3}}]}))
    k = K.read_kineto(p)
    assert k.rank is None and k.base_ns == 0
    assert abs(int(k.events["ts_ns"].iloc[0]) - 1_700_000_000_000_000_500) < 512   # what a double holds


@pytest.mark.parametrize("text,msg", [
    (b"not json at all", "not JSON"),
    (b"[1, 2, 3]", "not a JSON object"),
    (b'{"schemaVersion": 1}', "no traceEvents"),
    (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1.0, "dur": 2', "broken JSON"),
])
def test_what_is_not_a_kineto_trace_is_refused_with_its_name(tmp_path, text, msg):
    p = tmp_path / "bad.json"
    p.write_bytes(text)
    with pytest.raises(K.KinetoError, match=msg) as e:
        K.read_kineto(p)
    assert "bad.json" in str(e.value)


def test_truncated_gzip_is_refused(tmp_path):
    p = K.write_kineto(tmp_path / "t.json.gz", _events() * 50, base_ns=BASE)
    p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2])
    with pytest.raises(K.KinetoError):
        K.read_kineto(p)
