"""ep_core.Buffer's host path on the CPU over the one-rank fake extension (fake_ext.py): a call's
plan is built once per key and reused, the stream mode says what the call asked for, profiled
calls take pool slots (no allocation per call), errors keep their types, and the outputs equal
ep_core.reference's on one rank. The kernels and the real extension are tested on GPUs."""
from __future__ import annotations

import pytest
import torch

from ep_core import buffer as B
from ep_core import reference as ref
from ep_core.config import Config, Problem
from profiler.workflows.workload import make_rank_inputs
from tests.ep_core.fake_ext import ErrorReport, fake_buffer, fresh_dispatch, one_rank_dispatch

P = Problem(96, 256, 4, 16, 1)


@pytest.fixture
def setup(monkeypatch):
    return one_rank_dispatch(P, 3, monkeypatch)


_fresh = fresh_dispatch


def test_one_rank_flow_equals_the_reference(setup):
    buf, exts, ins, idx, layout = setup
    want = ref.dispatch([ins.x], topk_idx=[ins.topk_idx], topk_weights=[ins.topk_weights], num_experts=P.experts)[0]
    recv, recv_idx, recv_w, per_expert, handle, event = _fresh(buf, ins, idx, layout)
    assert torch.equal(recv, want.recv_x) and torch.equal(recv_idx, want.recv_topk_idx)
    assert torch.equal(recv_w, want.recv_topk_weights) and per_expert == want.num_recv_tokens_per_expert_list
    assert event.event is None and handle[0].tolist() == [[recv.size(0)]]
    cached = buf.dispatch(ins.x, handle=handle)
    assert torch.equal(cached[0], want.recv_x) and cached[1] is None and cached[3] == []
    q, s = ins.x_fp8
    for scales in (s, s.T.contiguous().T):
        c8 = buf.dispatch((q, scales), handle=handle)[0]
        assert torch.equal(c8[0].view(torch.uint8), want_rows(q, handle).view(torch.uint8))
        assert torch.equal(c8[1], want_rows(s, handle))
    combined, cw, _ = buf.combine(recv, handle, topk_weights=recv_w)
    wc = ref.combine([want.recv_x], [want.handle], topk_weights=[want.recv_topk_weights])[0]
    assert torch.equal(combined, wc[0]) and torch.equal(cw, wc[1])


def want_rows(t, handle):
    return t[handle.is_token_in_rank[:, 0]]


def test_a_plan_is_built_once_per_key_and_reused(setup):
    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    launcher = buf._build(False).launcher
    for _ in range(3):
        buf.dispatch(ins.x, handle=handle)
        buf.combine(ins.x[: handle.num_recv_rows], handle)
    plans = [c[1] for c in launcher.calls if c[0] == "dispatch"][1:]  # the first is the fresh dispatch's
    assert len(plans) == 3 and all(p is plans[0] for p in plans)
    cplans = [c[1] for c in launcher.calls if c[0] == "combine"]
    assert all(p is cplans[0] for p in cplans)
    assert plans[0].open_op and plans[0].num_topk == 0 and plans[0].recv_rows == handle.num_recv_rows
    # each new key gets its own plan: FP8, another config object (even an equal one), top-k weights
    buf.dispatch(ins.x_fp8, handle=handle)
    cfg = Config(24, 24, 256)
    buf.dispatch(ins.x, handle=handle, config=cfg)
    buf.dispatch(ins.x, handle=handle, config=Config(24, 24, 256))
    buf.combine(ins.x[: handle.num_recv_rows], handle, topk_weights=torch.ones(handle.num_recv_rows, 4))
    assert len(handle.cache.plans) == 6
    assert all(p.config is not None for p in handle.cache.plans.values())


def test_stream_mode_follows_the_call_options(setup, monkeypatch):
    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    launcher = buf._build(False).launcher
    buf.dispatch(ins.x, handle=handle)
    assert launcher.calls[-1][2] == (True, True, False, False)  # fork, join, not async, default allocation

    class Ev:
        event = object()

    waited = []
    monkeypatch.setattr(buf.comm_stream, "wait_event", lambda e: waited.append(e), raising=False)
    buf.dispatch(ins.x, handle=handle, previous_event=Ev())
    assert launcher.calls[-1][2][0] is False and len(waited) == 1  # ordered by the event, not a fork
    # the fresh dispatch: notify forks, the dispatch after it does not fork again
    _fresh(buf, ins, idx, layout)
    assert [c[0] for c in launcher.calls[-2:]] == ["notify", "dispatch"]
    assert launcher.calls[-2][2][0] is True and launcher.calls[-1][2][0] is False


def test_profiled_calls_take_pool_slots_without_allocating(setup, tmp_path):
    from profiler.record.session import POOL_SLOTS, Session

    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    s = Session(tmp_path, name="r", description="d", device="cpu", capacity=64, host_pairs=0)
    with buf.profile(s):
        for _ in range(3):
            buf.dispatch(ins.x, handle=handle, profile=True)
            buf.combine(ins.x[: handle.num_recv_rows], handle, profile=True)
    calls = [c for c in exts[True].launchers[0].calls]
    assert [c[0] for c in calls] == ["dispatch", "combine"] * 3
    slots = [a for c in calls for a in c[3]]
    assert all(a > 0 for a in slots) and len(set(slots)) == 12, "every launch has its own profile buffer"
    # one slab per geometry: barrier (twice per iteration), dispatch, combine
    assert len(s._slabs) == 3 and {sl.used for sl in s._slabs} == {3, 6}
    assert all(sl.count == POOL_SLOTS for sl in s._slabs)
    assert s.num_launches == 12 and len(s._calls) == 6 * 4  # one (first, end, begin, end) per call
    # unprofiled calls still use the compiled-out build
    buf.dispatch(ins.x, handle=handle)
    assert buf._build(False).launcher.calls[-1][3] == (0, 0)


def test_a_profile_block_with_calls_allocates_nothing_after_each_ops_first_call(setup, tmp_path):
    from profiler.record.session import Session

    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    s = Session(tmp_path, name="r", description="d", device="cpu", capacity=64, host_pairs=0)
    with buf.profile(s, calls=82):
        buf.dispatch(ins.x, handle=handle, profile=True)
        buf.combine(ins.x[: handle.num_recv_rows], handle, profile=True)
        made = [(sl.count, sl.base) for sl in s._slabs]
        for _ in range(40):  # more than one default slab (32) of every geometry
            buf.dispatch(ins.x, handle=handle, profile=True)
            buf.combine(ins.x[: handle.num_recv_rows], handle, profile=True)
        assert [(sl.count, sl.base) for sl in s._slabs] == made, "a profiled call made a slab"
    # barrier (dispatch's and combine's share a geometry: 2 launches per iteration), dispatch, combine
    assert [c for c, _ in made] == [82, 82, 82] and sorted(sl.used for sl in s._slabs) == [41, 41, 82]
    # a second block announcing more than is left: the slabs are made at its entry
    with buf.profile(s, calls=20):
        made = len(s._slabs)
        for _ in range(20):
            buf.dispatch(ins.x, handle=handle, profile=True)
        assert len(s._slabs) == made


def test_a_new_session_gets_the_pools_of_every_geometry_the_buffer_profiled_before(setup, tmp_path):
    """After one profiled warm-up (any session), `profile(new_session, calls=N)` makes every known
    geometry's slab at the block's entry: not even the first call of the block allocates (the
    first H100 ground truth blamed 1-2 ms of iteration 0 on that allocation)."""
    from profiler.record.session import Session

    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    warm = Session(tmp_path, name="warm", description="d", device="cpu", capacity=64, host_pairs=0)
    with buf.profile(warm):
        buf.dispatch(ins.x, handle=handle, profile=True)
        buf.combine(ins.x[: handle.num_recv_rows], handle, profile=True)
    s = Session(tmp_path, name="r", description="d", device="cpu", capacity=64, host_pairs=0)
    with buf.profile(s, calls=4):
        made = [(sl.count, sl.base) for sl in s._slabs]
        for _ in range(2):
            buf.dispatch(ins.x, handle=handle, profile=True)
            buf.combine(ins.x[: handle.num_recv_rows], handle, profile=True)
        assert [(sl.count, sl.base) for sl in s._slabs] == made, "a profiled call made a slab"
    # barrier, dispatch, combine: each made at the entry (POOL_SLOTS slots: the reserve asked fewer)
    assert len(made) == 3 and sorted(sl.used for sl in s._slabs) == [2, 2, 4]


def test_cached_dispatch_errors_keep_their_types(setup):
    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    buf.dispatch(ins.x, handle=handle)  # the plan exists; later calls are checked in the extension
    with pytest.raises(ValueError, match="bfloat16"):
        buf.dispatch(ins.x.float(), handle=handle)
    with pytest.raises(ValueError, match="cached dispatch of 95 tokens"):
        buf.dispatch(ins.x[:95], handle=handle)
    with pytest.raises(ValueError, match="takes no topk_idx"):
        buf.dispatch(ins.x, handle=handle, topk_idx=idx)
    with pytest.raises(ValueError, match="combine x has"):
        buf.combine(ins.x[: max(handle.num_recv_rows - 1, 0)], handle)


def test_a_flagged_device_error_raises_at_the_next_call(setup):
    buf, exts, ins, idx, layout = setup
    handle = _fresh(buf, ins, idx, layout)[4]
    buf._err.record = ErrorReport(flag=1, rank=0, kernel=3, phase=5, channel=2, peer=1, epoch=9)
    with pytest.raises(B.EPTimeoutError, match="timed out on rank 0"):
        buf.dispatch(ins.x, handle=handle)
    buf._err.record = ErrorReport()
    with pytest.raises(RuntimeError, match="unusable after an earlier error"):
        buf.combine(ins.x, handle)


def test_zero_token_rank_keeps_fp8_scales(monkeypatch):
    """The zero-token FP8 case on the host side: an empty scales tensor is still FP8 (the plan
    says fp8 and carries num_scales from hidden, never from the data pointer)."""
    buf, exts = fake_buffer(monkeypatch=monkeypatch)
    p = Problem(0, 256, 4, 16, 1)
    ins = make_rank_inputs(p, "uniform", 0, seed=1)
    idx = ins.topk_idx.to(B.topk_idx_t)
    layout = buf.get_dispatch_layout(idx, p.experts)
    q, s = ins.x_fp8
    for scales in (s, s.T.contiguous().T):
        out = buf.dispatch((q, scales), num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                           num_tokens_per_expert=layout[2])
        plan = buf._build(False).launcher.calls[-1][1]
        assert plan.fp8 and out[0][1].shape == (0, 2)
