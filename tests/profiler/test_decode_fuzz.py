"""Property tests: whatever bytes the decoder gets, it raises nothing but DecodeError subclasses."""
from __future__ import annotations

import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler import errors as E
from profiler.decode import LaunchInfo, decode_buffer
from profiler.generated import layout as L
from profiler.registry import load_all
from profiler.schema import COLUMNS

from .bufbuild import random_buffer

REG = load_all()["selftest"]
INFO = LaunchInfo(0, 0, "fuzz", 0, "selftest")
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def check(buf):
    try:
        d = decode_buffer(buf, INFO, REG)
    except E.DecodeError as e:
        assert isinstance(e.offset, int) and e.offset >= 0
        return None
    assert list(d.events.columns) == list(COLUMNS)
    assert [str(t) for t in d.events.dtypes] == list(COLUMNS.values())
    assert (d.events["end_ns"].to_numpy() >= d.events["begin_ns"].to_numpy()).all()
    assert all(isinstance(w, E.DecodeWarning) for w in d.warnings)
    return d


def header(nreg: int, cap: int, wpb: int, flags: int = 0) -> bytes:
    h = np.zeros(1, L.BUFFERHEADER_DTYPE)
    h["magic"], h["version"], h["flags"], h["registry_hash"] = L.MAGIC, L.VERSION, flags, REG.hash
    h["num_regions"], h["region_capacity"], h["warps_per_block"] = nreg, cap, wpb
    return h.tobytes()


@FAST
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    check(data)


@FAST
@given(nreg=st.integers(0, 6), cap=st.integers(0, 6), wpb=st.integers(0, 4), flags=st.integers(0, 3),
       body=st.binary(max_size=1200))
def test_valid_header_random_body(nreg, cap, wpb, flags, body):
    check(header(nreg, cap, wpb, flags) + body)


@FAST
@given(nreg=st.integers(0, 8), cap=st.integers(0, 8), words=st.lists(st.integers(0, 2**64 - 1), max_size=200),
       states=st.lists(st.integers(0, 3), max_size=8), kinds=st.lists(st.integers(0, 6), max_size=64))
def test_structured_random_regions(nreg, cap, words, states, kinds):
    """Random region headers and records with plausible kinds and states (reaches the span code)."""
    stride = L.REGIONHEADER_SIZE + cap * L.RECORD_SIZE
    body = np.zeros(nreg * stride, np.uint8)
    w = np.array(words + [0] * (len(body) // 8 - len(words)), np.uint64)[: len(body) // 8]
    body[: len(w) * 8] = w.view(np.uint8)
    for i in range(nreg):
        rh = body[i * stride: i * stride + L.REGIONHEADER_SIZE].view(L.REGIONHEADER_DTYPE)
        rh["state"] = states[i] if i < len(states) else L.REGION_STATE_FINISHED
        rh["attempted"] = rh["attempted"] % (2 * cap + 2)
        recs = body[i * stride + L.REGIONHEADER_SIZE: (i + 1) * stride].view(L.RECORD_DTYPE)
        for j in range(cap):
            recs[j]["kind"] = kinds[(i * cap + j) % len(kinds)] if kinds else 1
            recs[j]["id"] = recs[j]["id"] % 6
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy overflow / invalid-value warnings would be bugs
        check(header(nreg, cap, 2, 0) + body.tobytes())
        check(header(nreg, cap, 2, L.FLAGS_HIRES) + body.tobytes())


@FAST
@given(seed=st.integers(0, 2**32 - 1), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=12),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_mutated_valid_buffers(seed, flips, cut):
    buf = bytearray(random_buffer(np.random.default_rng(seed), REG, n_regions=4, capacity=16))
    assert check(bytes(buf)) is not None  # the unmutated buffer decodes
    for pos, val in flips:
        buf[pos % len(buf)] = val
    if cut is not None:
        buf = buf[: cut % (len(buf) + 1)]
    check(bytes(buf))
