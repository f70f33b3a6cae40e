"""The fast reader (msgspec runs) equals the ijson reader it replaced (kineto_ijson_reference.py,
verbatim) on traces with adversarial content, at every block size down to a few bytes, so that
every event is split across block boundaries; and without msgspec (the GPU machines)."""
from __future__ import annotations

import gzip
import json

import pandas as pd
import pytest

from profiler.torchtrace import kineto as K
from profiler.torchtrace import kineto_runs as R

from . import kineto_ijson_reference as REF
from .fake import BASE

_HARD = ['}, {', '"}, {"ph": "X"}', "\\", "\\\\", '\\"', '{"a": [1, {"b": "}"}]}', "[[]]", "é ü 😀", "\u2028",
         "tab\there", "\\u00e9"]


def _events() -> list[dict]:
    out = []
    for i, s in enumerate(_HARD * 3):
        cat = ["cpu_op", "kernel", "cuda_runtime", "python_function", "ac2g", "user_annotation"][i % 6]
        out.append({"ph": "X", "cat": cat, "name": f"op {s} {i}", "pid": 7 if i % 5 else "Spans", "tid": i % 3,
                    "ts": BASE + 1000 * i + 1, "dur": 2001 + i,
                    "args": {"correlation": i, "Call stack": f"a.py({i}): {s}", "nested": {"x": [s, {"y": s}]},
                             "External id": i * 3, "stream": 7, "grid": [1, 2, 3]}})
        out.append({"ph": "M", "name": "thread_name", "pid": 7, "tid": i, "args": {"name": s}})
        out.append({"ph": "X", "cat": "kernel", "name": s, "pid": 0, "tid": 7, "ts": BASE + 5 * i})   # no args/dur
    return out


def _same(a, b):
    assert (a.read, a.base_ns, a.rank, a.world_size) == (b.read, b.base_ns, b.rank, b.world_size)
    pd.testing.assert_frame_equal(a.events, b.events)


def _doc_text(events, *, info_after: bool, indent=None) -> bytes:
    doc = {"schemaVersion": 1, "deviceProperties": [{"name": "}, {\"traceEvents\": ["}]}
    if not info_after:
        doc["distributedInfo"] = {"rank": 2, "world_size": 4}
    doc["baseTimeNanoseconds"] = BASE
    doc["traceEvents"] = [dict(e, ts=(e["ts"] - BASE) / 1000, **({"dur": e["dur"] / 1000} if "dur" in e else {}))
                          if "ts" in e else e for e in events]
    if info_after:
        doc["distributedInfo"] = {"rank": 5, "world_size": 8}
    doc["traceName"] = "x"
    return json.dumps(doc, indent=indent, ensure_ascii=False).encode()


@pytest.mark.parametrize("info_after", [False, True])
@pytest.mark.parametrize("indent", [None, 2])
def test_equal_to_the_ijson_reader_at_every_block_size(tmp_path, info_after, indent):
    text = _doc_text(_events(), info_after=info_after, indent=indent)
    p = tmp_path / "t.json"
    p.write_bytes(text)
    ref = REF.read_kineto(p)
    assert ref.read == len(_HARD) * 9 and ref.rank == (5 if info_after else 2)
    for block in [1, 2, 3, 5, 7, 13, 64, 257, 1000, 4096, R.BLOCK, 0]:
        _same(K.read_kineto(p, block=block), ref)
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(text))
    _same(K.read_kineto(gz, block=11), REF.read_kineto(gz))


def test_ascii_escaped_traces_go_through_msgspec_and_stay_equal(tmp_path):
    # ensure_ascii: every non-ASCII character a \u escape, so msgspec (not ijson) decodes the runs
    p = tmp_path / "t.json"
    p.write_bytes(json.dumps({"baseTimeNanoseconds": BASE, "traceEvents": _doc_and_events()}).encode())
    assert p.read_bytes().isascii()
    for block in [1, 9, 300, R.BLOCK]:
        _same(K.read_kineto(p, block=block), REF.read_kineto(p))


def _doc_and_events():
    return json.loads(_doc_text(_events(), info_after=False))["traceEvents"]


@pytest.mark.parametrize("cut", [0.3, 0.6, 0.95, 0.999])
@pytest.mark.parametrize("gz", [False, True])
def test_truncated_and_broken_files_fail_as_the_ijson_reader_did(tmp_path, cut, gz):
    text = _doc_text(_events() * 20, info_after=True)
    damaged = text[: int(len(text) * cut)]
    broken = text[: int(len(text) * cut)] + b"\x00" + text[int(len(text) * cut):]   # NUL: invalid in and out of strings
    for body in (damaged, broken):
        p = tmp_path / "bad.json"
        p.write_bytes(gzip.compress(body) if gz else body)
        with pytest.raises(REF.KinetoError) as want:
            REF.read_kineto(p)
        for block in (5, 200, R.BLOCK):
            with pytest.raises(K.KinetoError) as got:
                K.read_kineto(p, block=block)
            # the same complaint; the parser's quoted context may differ (the tail is re-framed)
            assert str(got.value).split(" after ")[0] == str(want.value).split(" after ")[0]
            if "broken JSON" in str(want.value):
                assert str(got.value).split(" (")[0] == str(want.value).split(" (")[0]   # same kept count


@pytest.mark.parametrize("text", [b"not json", b"[1, 2]", b'{"a": 1}', b'{"traceEvents": 5, "x": 1}',
                                  b'{"traceEvents": {"item": {"ph": "X"}}}', b'{"trace\\u0045vents": [{"ph": "X", '
                                  b'"cat": "kernel", "ts": 1.5, "dur": 2.0}], "distributedInfo": {"rank": 1}}',
                                  b'{"traceEvents": [], "traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": 3.0}]}',
                                  b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "ts": true, "pid": 1.5}]}',
                                  b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1.0, "pid": "12"}, '
                                  b'{"ph": "X", "cat": "kernel", "ts": 2.0, "pid": 18446744073709551615}]}'])
def test_odd_documents_as_the_ijson_reader(tmp_path, text):
    p = tmp_path / "odd.json"
    p.write_bytes(text)
    try:
        want = REF.read_kineto(p)
    except Exception as e:   # noqa: BLE001 - the reference's own error, whatever it is
        with pytest.raises(Exception) as got:
            K.read_kineto(p, block=3)
        assert type(got.value).__name__ == type(e).__name__ and str(got.value).split(" (")[0] == str(e).split(" (")[0]
        return
    for block in (1, 3, R.BLOCK):
        _same(K.read_kineto(p, block=block), want)


def test_without_msgspec_ijson_reads_it_all(tmp_path, monkeypatch):
    text = _doc_text(_events(), info_after=True)
    p = tmp_path / "t.json"
    p.write_bytes(text)
    monkeypatch.setattr(R, "msgspec", None)
    assert not R.available()
    _same(K.read_kineto(p), REF.read_kineto(p))
