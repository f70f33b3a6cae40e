"""Hook mode's host side (ep_core.Buffer with return_recv_hook=True) on the CPU over the one-rank
fake extension (fake_ext.py): the send half returns at once with outputs the receive fills
(the fake poisons them until its receive runs), the plans are hook plans (senders only, staging
regions after the receive regions, the host rank_prefix), the hook runs the receive on the
caller's stream, and the rules (one pending hook, called once, no async_finish) raise
ValueError before anything launches. The size hint and the region split are checked at 2 and 8
ranks. The kernels and the copy engines are tested on GPUs (tests/gpu/test_ep_hook.py)."""
from __future__ import annotations

import pytest
import torch

from ep_core import buffer as B
from ep_core import reference as ref
from ep_core.config import Config, Problem
from tests.ep_core.fake_ext import POISON, fake_buffer, fresh_dispatch, one_rank_dispatch

P = Problem(96, 256, 4, 16, 1)


@pytest.fixture
def setup(monkeypatch):
    return one_rank_dispatch(P, 5, monkeypatch)


_fresh = fresh_dispatch


def _want(ins):
    return ref.dispatch([ins.x], topk_idx=[ins.topk_idx], topk_weights=[ins.topk_weights], num_experts=P.experts)[0]


def test_hook_dispatch_sends_then_the_hook_receives(setup):
    buf, exts, ins, idx, layout = setup
    want = _want(ins)
    out = _fresh(buf, ins, idx, layout, return_recv_hook=True)
    assert len(out) == 7
    recv, recv_idx, recv_w, per_expert, handle, event, hook = out
    assert event.event is None and per_expert == want.num_recv_tokens_per_expert_list
    assert bool((recv.float() == POISON).all()), "the send half must not complete the outputs"
    calls = buf._build(False).launcher.calls
    assert [c[0] for c in calls[-2:]] == ["notify", "dispatch"]
    plan = calls[-1][1]
    assert plan.hook and plan.num_sender_blocks == plan.num_blocks
    assert plan.rank_prefix == [recv.size(0)] and plan.stage.x >= plan.rows.topk_weights
    assert calls[-1][2] == (False, False, True, False), "notify forked; the send neither forks again nor joins"
    assert repr(hook) == "RecvHook(dispatch, pending)"
    hook()
    assert calls[-1][0] == "dispatch_receive" and calls[-1][1] is plan and calls[-1][2] == 0x4000  # current stream
    assert torch.equal(recv, want.recv_x) and torch.equal(recv_idx, want.recv_topk_idx)
    assert torch.equal(recv_w, want.recv_topk_weights)
    assert repr(hook) == "RecvHook(dispatch, called)"


def test_hook_combine_and_cached_fp8_dispatch_equal_the_reference(setup):
    buf, exts, ins, idx, layout = setup
    want = _want(ins)
    recv, _, recv_w, _, handle, _ = _fresh(buf, ins, idx, layout)
    q, s = ins.x_fp8
    c8, *_, hook = buf.dispatch((q, s), handle=handle, return_recv_hook=True)
    assert bool((c8[1] == POISON).all())
    hook()
    keep = handle.is_token_in_rank[:, 0]
    assert torch.equal(c8[0].view(torch.uint8), q[keep].view(torch.uint8)) and torch.equal(c8[1], s[keep])
    bias = torch.randn(P.tokens, P.hidden).to(torch.bfloat16)
    combined, cw, event, chook = buf.combine(recv, handle, topk_weights=recv_w, bias=bias, return_recv_hook=True)
    plan = buf._build(False).launcher.calls[-1][1]
    assert plan.hook and plan.rank_prefix == [recv.size(0)] and plan.num_tma_buffers == 3
    assert bool((combined.float() == POISON).all())
    chook()
    wc = ref.combine([want.recv_x], [want.handle], topk_weights=[want.recv_topk_weights], bias=[bias])[0]
    assert torch.equal(combined, wc[0]) and torch.equal(cw, wc[1])


def test_hook_and_normal_calls_get_their_own_plans(setup):
    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    cfg = Config(24, 24, 256, path="direct", num_tma_buffers=2)
    buf.dispatch(ins.x, handle=handle, config=cfg)
    buf.dispatch(ins.x, handle=handle, config=cfg, return_recv_hook=True)[-1]()
    buf.dispatch(ins.x, handle=handle, config=cfg, return_recv_hook=True)[-1]()
    plans = [c[1] for c in buf._build(False).launcher.calls if c[0] == "dispatch"][1:]
    assert not plans[0].hook and plans[0].num_tma_buffers == 0, "the direct path without a hook"
    # hook mode runs the bulk-copy kernels with the config's buffer count whatever the path says
    assert plans[1].hook and plans[1].num_tma_buffers == 2 and plans[2] is plans[1]
    # the host rank_prefix came from the fresh dispatch's read-back: no second read
    assert handle.cache.rank_prefix == [handle.num_recv_rows]


def test_hook_rules_raise_before_anything_launches(setup):
    buf, exts, ins, idx, layout = setup
    recv, _, _, _, handle, _ = _fresh(buf, ins, idx, layout)
    launcher = buf._build(False).launcher
    with pytest.raises(ValueError, match="async_finish and return_recv_hook"):
        buf.dispatch(ins.x, handle=handle, async_finish=True, return_recv_hook=True)
    hook = buf.dispatch(ins.x, handle=handle, return_recv_hook=True)[-1]
    n = len(launcher.calls)
    with pytest.raises(ValueError, match="call the recv hook of the pending dispatch"):
        buf.dispatch(ins.x, handle=handle)
    with pytest.raises(ValueError, match="call the recv hook of the pending dispatch"):
        buf.combine(recv, handle, return_recv_hook=True)
    assert len(launcher.calls) == n, "a refused call launches nothing"
    buf.get_dispatch_layout(idx, P.experts)  # the layout does not touch the buffer: allowed
    hook()
    with pytest.raises(ValueError, match="already called"):
        hook()
    chook = buf.combine(recv, handle, return_recv_hook=True)[-1]
    with pytest.raises(ValueError, match="pending combine"):
        _fresh(buf, ins, idx, layout, return_recv_hook=True)
    chook()
    _fresh(buf, ins, idx, layout)  # nothing pending: a normal call runs


def test_hook_after_a_device_error_raises_it(setup):
    from tests.ep_core.fake_ext import ErrorReport

    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    hook = buf.dispatch(ins.x, handle=handle, return_recv_hook=True)[-1]
    buf._err.record = ErrorReport(flag=1, rank=0, kernel=6, phase=13, channel=0, peer=1, epoch=4)
    with pytest.raises(B.EPTimeoutError, match="hook_signal timed out"):
        hook()
    assert buf._build(False).launcher.calls[-1][0] == "dispatch", "no receive after the error"


def test_num_worst_tokens_hook_dispatch_reads_the_counts_back(setup, monkeypatch):
    buf, exts, ins, idx, layout = setup
    reads = []
    launcher = buf._build(False).launcher
    real = launcher.read_back
    monkeypatch.setattr(launcher, "read_back", lambda n, h: (reads.append(1), real(n, h)))
    buf.dispatch(ins.x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3], num_tokens_per_expert=layout[2],
                 topk_idx=idx, topk_weights=ins.topk_weights, num_worst_tokens=P.tokens)
    assert reads == [], "the normal num_worst_tokens dispatch does not synchronise"
    out = buf.dispatch(ins.x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                       num_tokens_per_expert=layout[2], topk_idx=idx, topk_weights=ins.topk_weights,
                       num_worst_tokens=P.tokens, return_recv_hook=True)
    assert reads == [1] and out[3] == [] and out[0].size(0) == P.tokens
    out[-1]()
    want = _want(ins)
    n = want.recv_x.size(0)
    assert torch.equal(out[0][:n], want.recv_x) and bool((out[1][n:] == -1).all())


def test_profiled_hook_calls_record_send_signal_and_receive(setup, tmp_path):
    from profiler.record.session import Session

    buf, exts, ins, idx, layout = setup
    s = Session(tmp_path, name="r", description="d", device="cpu", capacity=64, host_pairs=0)
    with buf.profile(s):
        out = _fresh(buf, ins, idx, layout, profile=True, return_recv_hook=True)
        out[-1]()
        buf.combine(out[0], out[4], topk_weights=out[2], profile=True, return_recv_hook=True)[-1]()
    calls = exts[True].launchers[0].calls
    assert [c[0] for c in calls] == ["notify", "dispatch", "dispatch_receive", "combine", "combine_receive"]
    send = calls[1][3]
    assert len(send) == 3 and send[0] == 0 and all(a > 0 for a in send[1:]), "no barrier; pack and signal slots"
    csend = calls[3][3]
    assert csend[0] > 0 and csend[1] == 0 and csend[2] > 0, "combine's send: barrier and signal, no kernel"
    assert calls[2][3][0] > 0 and calls[4][3][0] > 0, "each receive has its slot"
    assert len({a for c in calls for a in c[3] if a}) == 7, "every launch its own profile buffer"
    # every launch of a hook-mode op is profiled as its kernel (phases tell send, signal, receive)
    pools = sorted((sl.pool.kernel, sl.pool.grid, sl.pool.warps) for sl in s._slabs)
    grid = calls[1][1].num_blocks
    assert pools == [("barrier", 1, 1), ("combine", 1, 1), ("combine", grid, 16), ("dispatch", 1, 1),
                     ("dispatch", grid, 16), ("notify", 1, 32)]


@pytest.mark.parametrize("ranks", [2, 8])
def test_hook_size_hint_fits_the_split_regions(monkeypatch, ranks):
    T, H, K = 4096, 7168, 8
    buf, _ = fake_buffer(monkeypatch=monkeypatch)  # the fake extension's limits from here on
    buf.num_nvl_bytes = B.Buffer.get_hook_buffer_size_hint(T, H, ranks, K)
    buf.group_size = ranks  # the region split depends on the rank count only
    recv, stage = buf._hook_regions(H * 2, H // 128, K, K)
    assert recv[4] >= T * ranks and stage[4] >= T * (ranks - 1)
    row = H * 2 + H // 128 * 4 + K * 12
    assert stage[0] >= recv[3] + recv[4] * K * 4 and stage[3] + stage[4] * K * 4 <= buf.num_nvl_bytes
    assert all(off % B.REGION_ALIGN == 0 for off in recv[:4] + stage[:4])
    assert B.Buffer.get_hook_buffer_size_hint(T, H, ranks, K) - B.Buffer.get_buffer_size_hint(T, H, ranks, K) \
        == T * (ranks - 1) * row
    # rows received / packed / sent back beyond the regions raise for every rank alike
    per = [T] * ranks
    full = [v for i in range(ranks) for v in [per[0] * (i + 1)] * ranks]  # everyone sends T rows to everyone
    buf._check_hook_capacity(full, recv[4], stage[4])
    with pytest.raises(B.EPCapacityError, match="get_hook_buffer_size_hint"):
        buf._check_hook_capacity(full, recv[4], T * (ranks - 1) - 1)
    with pytest.raises(B.EPCapacityError, match="hook-mode combine sends back"):
        buf._check_hook_capacity(full, T * (ranks - 1) - 1, None)
