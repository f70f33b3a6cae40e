"""Differential fuzzing: whatever bytes it gets, profiler.decode.decode agrees with the reference decoder
(tests/profiler/reference_decoder.py) on the table, the launches, the warning counts and the
errors, and raises nothing but DecodeError subclasses (tests/profiler/differential.py).

Deterministic: numpy seeds and hypothesis with derandomize=True and no example database, so CI
runs the same inputs every time. A million-input run is benchmarks/fuzz_decode.py.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from profiler.decode.decode import LaunchInfo
from profiler.generated import layout as L

from .bufbuild import random_buffer
from .differential import REG, check, mutated_buffer, random_case, structured_buffer

CORPUS = Path(__file__).parent / "corpus"
INFO = LaunchInfo(0, 0, "fuzz", 0, "selftest")
FIXED = settings(max_examples=120, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow])
SEEDED_CASES = 1200  # ~6 s on the dev VM


@pytest.mark.parametrize("path", sorted(CORPUS.glob("*.bin")), ids=lambda p: p.stem)
def test_corpus(path):
    """Inputs that once gave a wrong result (tests/profiler/corpus/make_corpus.py says which)."""
    buf = path.read_bytes()
    check([(buf, INFO)])
    check([(buf, INFO), (random_buffer(np.random.default_rng(0), REG, n_regions=2, capacity=8),
                         LaunchInfo(1, 1, "other", 1, "selftest"))])


def test_corpus_is_what_make_corpus_writes():
    from .corpus.make_corpus import cases
    want = cases()
    assert {p.stem for p in CORPUS.glob("*.bin")} == set(want)
    for name, buf in want.items():
        assert (CORPUS / f"{name}.bin").read_bytes() == buf, f"{name}.bin is stale: rerun make_corpus"


@pytest.mark.parametrize("seed", range(4))
def test_seeded_random_cases(seed):
    rng = np.random.default_rng(seed)
    for _ in range(SEEDED_CASES // 4):
        check(random_case(rng))


def test_generators_reach_every_path():
    """The seeded inputs reach every warning and error the decoder has (or the test above proves little)."""
    from .differential import fast
    seen = set()
    rng = np.random.default_rng(0)
    for _ in range(SEEDED_CASES // 4):
        r = fast(random_case(rng))
        seen |= set(r[2]) if isinstance(r, tuple) else {r.type}
    want = {"CorruptRecords", "BadTimestamps", "BadRegionClock", "ClockFallback", "UnmatchedBegin", "UnmatchedEnd",
            "ReversedSpans", "UnknownPhase", "DroppedRecords", "UnfinishedRegion",
            "DecodeError", "TruncatedBuffer", "BadMagic", "ClockChange", "BadAnchors", "PayloadSaturated",
            "AmbiguousClock"}
    assert want <= seen, want - seen


@FIXED
@given(st.binary(max_size=2048))
def test_random_bytes(data):
    check([(data, INFO)])


@FIXED
@given(nreg=st.integers(0, 6), cap=st.integers(0, 6), wpb=st.integers(0, 4), flags=st.integers(0, 3),
       body=st.binary(max_size=1200))
def test_valid_header_random_body(nreg, cap, wpb, flags, body):
    h = np.zeros(1, L.BUFFERHEADER_DTYPE)
    h["magic"], h["version"], h["flags"], h["registry_hash"] = L.MAGIC, L.VERSION, flags, REG.hash
    h["num_regions"], h["region_capacity"], h["warps_per_block"] = nreg, cap, wpb
    check([(h.tobytes() + body, INFO)])


@FIXED
@given(seed=st.integers(0, 2**32 - 1), flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=12),
       cut=st.one_of(st.none(), st.integers(0, 10**6)))
def test_mutated_valid_buffers(seed, flips, cut):
    buf = bytearray(random_buffer(np.random.default_rng(seed), REG, n_regions=4, capacity=16))
    check([(bytes(buf), INFO)])  # the unmutated buffer too
    for pos, val in flips:
        buf[pos % len(buf)] = val
    if cut is not None:
        buf = buf[: cut % (len(buf) + 1)]
    check([(bytes(buf), INFO)])


@FIXED
@given(seeds=st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=3))
def test_several_launches_share_one_time_base(seeds):
    items = []
    for i, s in enumerate(seeds):
        rng = np.random.default_rng(s)
        buf = structured_buffer(rng) if s % 2 else mutated_buffer(rng)
        items.append((buf, LaunchInfo(i % 2, i, "k", i, "selftest")))
    check(items)
