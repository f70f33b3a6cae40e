"""CPU tests of ep_core.Buffer's host-side logic: the limits the kernels and Python share, the row
regions of the data area, the block split and chunking, error messages, and the calls that must
refuse (internode, low-latency). The kernels themselves are tested on GPUs (tests/gpu/)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import ep_core.buffer as B
from ep_core import config as C

HEADER = Path(B.__file__).resolve().parent / "csrc" / "buffer_map.h"


def _header_constants() -> dict:
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"constexpr int (k\w+) = (\d+);", HEADER.read_text())}


def test_kernel_limits_match_the_python_limits():
    k = _header_constants()
    assert k["kMaxRanks"] == C.MAX_RANKS
    assert k["kMaxExperts"] == C.MAX_EXPERTS
    assert k["kMaxTopk"] == C.MAX_TOPK
    assert k["kMaxHidden"] == C.MAX_HIDDEN
    assert k["kScaleBlock"] == C.SCALE_BLOCK


def test_the_size_hints_header_size_is_the_compiled_maps():
    """config.DATA_OFFSET (the size hints need no extension) is the number buffer_map.h
    static_asserts for kDataOffset, and the host compiler agrees with the assert."""
    import shutil
    import subprocess

    from tests.needs import needs
    m = re.search(r"static_assert\(kDataOffset == (\d+),", HEADER.read_text())
    assert m and int(m.group(1)) == C.DATA_OFFSET
    gxx = shutil.which("g++")
    needs(gxx is not None, "g++", "apt-get install g++", tool="g++")
    p = subprocess.run([gxx, "-std=c++17", "-fsyntax-only", f"-I{HEADER.parents[2]}", "-x", "c++", "-"],
                       input='#include "ep_core/csrc/buffer_map.h"\n', capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def _bare_buffer(num_nvl_bytes: int, ranks: int = 2, data_offset: int = 1 << 20) -> B.Buffer:
    """A Buffer without a GPU: only the attributes the host-side arithmetic reads."""
    b = B.Buffer.__new__(B.Buffer)
    b.num_nvl_bytes = num_nvl_bytes
    b.group_size = ranks
    b.limits = {"data_offset": data_offset, "max_chunks": _header_constants()["kMaxChunks"],
                "threads": 512, "notify_threads": 1024}
    return b


@settings(max_examples=200, deadline=None)
@given(nbytes=st.integers(1 << 20, 1 << 32), hidden=st.integers(1, 64).map(lambda h: h * 128),
       fp8=st.booleans(), k=st.integers(0, 16), weights=st.booleans())
def test_row_regions_fit_and_do_not_overlap(nbytes, hidden, fp8, k, weights):
    b = _bare_buffer((1 << 20) + nbytes)
    hb = hidden if fp8 else hidden * 2
    ns = hidden // 128 if fp8 else 0
    wk = k if weights else 0
    x, s, i, w, cap = b._regions(hb, ns, k, wk)
    ends = [x + cap * hb, s + cap * ns * 4, i + cap * k * 8, w + cap * wk * 4]
    starts = [x, s, i, w]
    assert x == b.limits["data_offset"]
    assert all(a % 16 == 0 for a in starts), "16-byte vector accesses need aligned regions"
    for lo, hi, nxt in zip(starts, ends, starts[1:] + [b.num_nvl_bytes]):
        assert lo <= hi <= nxt
    # capacity is not wasted: one more row would not fit with the same alignment slack
    per_row = hb + ns * 4 + k * 8 + wk * 4
    assert (cap + 1) * per_row > b.num_nvl_bytes - b.limits["data_offset"] - 4 * B.REGION_ALIGN


def test_size_hint_holds_every_row_of_the_largest_op():
    # hint = what an op of T tokens per rank on R ranks can put on one rank: T*R rows
    b = _bare_buffer(0)
    for T, H, R in ((4096, 7168, 2), (1, 128, 1), (8192, 8192, 8), (3, 256, 3)):
        hidden_bytes = 2 * H
        row = hidden_bytes + (H // 128) * 4 + C.MAX_TOPK * 12
        need = b.limits["data_offset"] + T * R * row
        b.num_nvl_bytes = need + 8 * B.REGION_ALIGN
        for args in ((hidden_bytes, 0, 16, 16), (H, H // 128, 16, 16), (hidden_bytes, 0, 0, 16)):
            assert b._regions(*args)[4] >= T * R, (T, H, R, args)


def test_split_is_the_sweep_rule():
    assert B._split(20, B.DISPATCH_SPLIT) == 0.625 and B._split(24, B.DISPATCH_SPLIT) == 0.625
    assert B._split(64, B.DISPATCH_SPLIT) == 0.5 and B._split(132, B.DISPATCH_SPLIT) == 0.5
    assert B._split(44, B.DISPATCH_SPLIT) == pytest.approx(0.5625)
    assert B._split(24, B.COMBINE_SPLIT) == 0.375 and B._split(64, B.COMBINE_SPLIT) == 0.5


@pytest.mark.parametrize("ranks", [1, 2, 8])
@pytest.mark.parametrize("sms", [2, 4, 24, 64, 132])
def test_block_split_leaves_every_role_with_work_a_block(ranks, sms):
    b = _bare_buffer(1 << 30, ranks)
    cfg = C.Config(sms, 6, 256)
    n, s = b._dispatch_blocks(cfg)
    assert n == sms
    if ranks == 1:
        assert s == n  # all local: no receivers needed
    else:
        assert 1 <= s <= n - 1
    n, s = b._combine_blocks(cfg)
    if ranks == 1:
        assert (n, s) == (sms, 0)  # one rank sends nothing back: every block reduces
    else:
        assert n == sms and 1 <= s <= n - 1  # combine always needs reducers


@settings(max_examples=200, deadline=None)
@given(tokens=st.integers(0, 200_000), senders=st.integers(1, 131), send_chunk=st.integers(1, 64))
def test_chunking_covers_every_token_within_the_chunk_limit(tokens, senders, send_chunk):
    b = _bare_buffer(1 << 30)
    size, n = b._chunking(tokens, senders, C.Config(2, send_chunk, send_chunk + 1))
    if tokens == 0:
        assert n == 0
        return
    assert size >= send_chunk
    assert n == math.ceil(tokens / size) and n * size >= tokens > (n - 1) * size
    assert n <= b.limits["max_chunks"]


def test_device_error_messages_name_rank_phase_chunk_and_peer():
    from tests.ep_core.fake_ext import ErrorRecord, ErrorReport

    b = _bare_buffer(1 << 30)
    b.timeout_s = 2.0
    b._err = ErrorRecord()
    # timeout, rank 0, dispatch, wait_data, chunk 7, peer 1
    b._err.record = ErrorReport(flag=1, rank=0, kernel=3, phase=5, is_barrier=False, channel=7, peer=1, epoch=12)
    msg = b._device_error()
    assert "dispatch" in msg and "rank 0" in msg and "wait_data" in msg and "chunk 7" in msg and "rank 1" in msg
    assert "op 12" in msg
    # timeout at the rank_start barrier of a barrier kernel
    b._err.record = ErrorReport(flag=1, rank=1, kernel=5, phase=1, is_barrier=True, channel=0, peer=0, epoch=13)
    msg = b._device_error()
    assert "barrier rank_start" in msg and "rank 1" in msg and "rank 0" in msg
    b._err.record = ErrorReport(flag=2, rank=0, kernel=4, phase=8, is_barrier=False, channel=3, peer=1, epoch=14)
    msg = b._device_error()
    assert "num_nvl_bytes" in msg and "get_buffer_size_hint" in msg
    # recv_x too small: num_worst_tokens
    b._err.record = ErrorReport(flag=3, rank=1, kernel=3, phase=6, is_barrier=False, channel=2, peer=0, epoch=15)
    msg = b._device_error()
    assert "num_worst_tokens" in msg and "rank 1" in msg
    b._err.record = ErrorReport()
    assert b._device_error() is None


def test_internode_and_low_latency_refuse_before_touching_a_gpu():
    with pytest.raises(NotImplementedError, match="internode"):
        B.Buffer(None, num_nvl_bytes=1 << 30, num_rdma_bytes=1 << 20)
    # low-latency mode (ep_core/low_latency.py) needs its own buffer size, and NVLink
    with pytest.raises(ValueError, match="get_low_latency_rdma_size_hint"):
        B.Buffer(None, num_nvl_bytes=1 << 30, low_latency_mode=True)
    with pytest.raises(NotImplementedError, match="NVLink only"):
        B.Buffer(None, num_rdma_bytes=1 << 20, low_latency_mode=True, allow_nvlink_for_low_latency_mode=False)
    b = _bare_buffer(1 << 30)
    with pytest.raises(NotImplementedError, match="internode"):  # DeepEP's signatures, refused
        b.internode_dispatch(None)
    with pytest.raises(NotImplementedError, match="internode"):
        b.internode_combine(None, None)
    for call in (b.low_latency_dispatch, b.low_latency_combine):  # a Buffer made without low_latency_mode
        with pytest.raises(RuntimeError, match="low_latency_mode=True"):
            call(None, None, None, None)


def test_set_num_sms_validates_and_feeds_the_config_tables():
    old = B.Buffer.num_sms
    try:
        for bad in (0, 3, -2, 2.0, True):
            with pytest.raises(ValueError):
                B.Buffer.set_num_sms(bad)
        B.Buffer.set_num_sms(24)
        assert B.Buffer.get_dispatch_config(2).num_sms == 24
        assert B.Buffer.get_combine_config(8).num_sms == 24
    finally:
        B.Buffer.num_sms = old


def test_event_overlap_without_event_is_a_no_op():
    ev = B.EventOverlap()
    ev.current_stream_wait()
    with ev as e:
        assert e is ev


def test_handle_index_zero_is_the_rank_prefix_matrix():
    assert B.DispatchHandle._fields[0] == "rank_prefix_matrix"
    assert B.topk_idx_t.is_floating_point is False and str(B.topk_idx_t) == "torch.int64"
