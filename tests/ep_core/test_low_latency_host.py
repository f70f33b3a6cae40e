"""The host side of the low-latency calls on the CPU (ep_core/low_latency.py over tests/ep_core/
ll_fake.py): argument checks with messages naming the argument, what is not supported, the recv
hook order, stable outputs and cached plans (knob 5) against per-call rebuilding, zero_copy,
the capacity check and device errors."""
from __future__ import annotations

import pytest
import torch

from ep_core import buffer as buffer_mod
from ep_core import low_latency as ll
from tests.ep_core.ll_fake import make_low_latency

T_MAX, H, E, K = 8, 256, 8, 2


@pytest.fixture(autouse=True)
def _raw_stream(monkeypatch):
    monkeypatch.setattr(buffer_mod, "current_raw_stream", lambda device_index: 77)


def _inputs(T=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((T, H), generator=g).to(torch.bfloat16)
    idx = torch.topk(torch.rand((T, E), generator=g), K, dim=1).indices.to(torch.int64)
    w = torch.rand((T, K), generator=g)
    return x, idx, w


def _dispatch(obj, x, idx, **kw):
    return obj.dispatch(x, idx, T_MAX, E, **kw)


def _y(obj):
    El = E // obj.buffer.group_size
    return torch.zeros((El, obj.buffer.group_size * T_MAX, H), dtype=torch.bfloat16)


def test_plain_calls_launch_both_halves_on_the_current_stream():
    obj = make_low_latency()
    x, idx, w = _inputs()
    recv, count, handle, event, hook = _dispatch(obj, x, idx)
    assert hook is None and event.event is None
    out, _, hook2 = obj.combine(_y(obj), idx, w, handle)
    assert hook2 is None
    log = obj.buffer.ext.launches
    assert [(l.kind, l.phases, l.stream) for l in log] == [("dispatch", 3, 77), ("combine", 3, 77)]
    q, scales = recv
    assert q.dtype == torch.float8_e4m3fn and q.shape == (4, 2 * T_MAX, H)
    # DeepEP's scales layout: [E/R, R*T_max, H/128], the last two dimensions column-major
    assert scales.shape == (4, 2 * T_MAX, H // 128) and scales.stride() == (2 * T_MAX * 2, 1, 2 * T_MAX)
    assert count.dtype == torch.int32 and count.shape == (4,)
    assert out.shape == (5, H) and out.dtype == torch.bfloat16
    assert handle[:5] == (handle.recv_src_info, handle.recv_layout_range, T_MAX, H, E)
    assert handle.recv_layout_range.dtype == torch.int64 and handle.slot.shape == (2, T_MAX, K)


def test_bf16_and_ue8m0_outputs():
    obj = make_low_latency()
    x, idx, _ = _inputs()
    recv, *_ = _dispatch(obj, x, idx, use_fp8=False)
    assert isinstance(recv, torch.Tensor) and recv.dtype == torch.bfloat16
    x512 = torch.zeros((3, 512), dtype=torch.bfloat16)
    obj2 = make_low_latency(num_bytes=ll.size_hint(T_MAX, 512, 2, E))
    (q, sc), *_ = obj2.dispatch(x512, idx[:3], T_MAX, E, round_scale=True, use_ue8m0=True)
    assert sc.dtype == torch.int32 and sc.shape == (4, 2 * T_MAX, 1)


def test_cached_host_path_reuses_outputs_two_calls_apart_and_plans_always():
    obj = make_low_latency()
    x, idx, w = _inputs()
    a = _dispatch(obj, x, idx)
    b = _dispatch(obj, x, idx)
    c = _dispatch(obj, x, idx)
    assert a[0][0] is c[0][0] and a[0][0] is not b[0][0], "outputs alternate between two stable sets"
    assert a[2] is c[2] and a[1] is c[1]
    log = obj.buffer.ext.launches
    assert log[0].plan is log[2].plan and log[0].plan is not log[1].plan
    o1 = obj.combine(_y(obj), idx, w, a[2])[0]
    o2 = obj.combine(_y(obj), idx, w, b[2])[0]
    o3 = obj.combine(_y(obj), idx, w, a[2])[0]
    assert o1 is o3 and o1 is not o2


def test_per_call_host_path_rebuilds_everything():
    obj = make_low_latency(config=ll.LowLatencyConfig(host="per_call"))
    x, idx, w = _inputs()
    a = _dispatch(obj, x, idx)
    c = (_dispatch(obj, x, idx), _dispatch(obj, x, idx))[1]
    assert a[0][0] is not c[0][0] and a[2] is not c[2]
    log = obj.buffer.ext.launches
    assert log[0].plan is not log[2].plan
    assert obj.combine(_y(obj), idx, w, a[2])[0] is not obj.combine(_y(obj), idx, w, a[2])[0]


def test_config_per_call_overrides_the_buffer_default_and_reaches_the_plan():
    obj = make_low_latency()
    x, idx, _ = _inputs()
    _dispatch(obj, x, idx, config=ll.LowLatencyConfig.old())
    plan = obj.buffer.ext.launches[-1].plan
    assert vars(plan.knobs) == dict(flat_split=False, count_working=False, min_slice_groups=1, loads_first=False)
    with obj.using(ll.LowLatencyConfig(num_blocks=32, warps_per_block=8)):
        _dispatch(obj, x, idx)
    plan = obj.buffer.ext.launches[-1].plan
    assert vars(plan.geometry) == dict(num_blocks=32, warps_per_block=8)
    assert vars(plan.knobs) == dict(flat_split=True, count_working=True, min_slice_groups=4, loads_first=True)


def test_recv_hooks_send_now_receive_later_in_order():
    obj = make_low_latency()
    x, idx, w = _inputs()
    log = obj.buffer.ext.launches
    *_, h1 = _dispatch(obj, x, idx, return_recv_hook=True)
    assert [(l.phases) for l in log] == [ll.SEND_PHASE]
    *_, h2 = _dispatch(obj, x, idx, return_recv_hook=True)  # two ops in flight is allowed
    with pytest.raises(ValueError, match="op 1 must be called before op 3"):
        _dispatch(obj, x, idx, return_recv_hook=True)
    with pytest.raises(ValueError, match="without return_recv_hook"):
        _dispatch(obj, x, idx)
    with pytest.raises(ValueError, match="in op order"):
        h2()
    h1()
    assert log[-1].phases == ll.RECV_PHASE and log[-1].kind == "dispatch"
    with pytest.raises(ValueError, match="already called"):
        h1()
    h2()
    _dispatch(obj, x, idx)  # nothing pending: a plain call again
    assert [l.phases for l in log] == [1, 1, 2, 2, 3]


def test_hook_objects_are_reused_two_ops_apart_in_cached_mode():
    obj = make_low_latency()
    x, idx, _ = _inputs()
    hooks = []
    for _ in range(4):
        *_, h = _dispatch(obj, x, idx, return_recv_hook=True)
        hooks.append(h)
        h()
    assert hooks[0] is hooks[2] and hooks[1] is hooks[3] and hooks[0] is not hooks[1]
    assert "called" in repr(hooks[0])


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda x, i: (x.float(), i), ValueError, "bf16"),
    (lambda x, i: (x, i.to(torch.int32)), ValueError, "topk_idx"),
    (lambda x, i: (x, i[:, :1].repeat(1, 17)), ValueError, "num_topk"),
    (lambda x, i: (torch.zeros((T_MAX + 1, H), dtype=torch.bfloat16),
                   torch.zeros((T_MAX + 1, K), dtype=torch.int64)), ValueError, "num_max_dispatch_tokens_per_rank"),
    (lambda x, i: (torch.zeros((3, 200), dtype=torch.bfloat16), i[:3]), ValueError, "hidden"),
])
def test_dispatch_argument_errors_name_the_argument(mutate, exc, match):
    obj = make_low_latency()
    x, idx, _ = _inputs()
    x2, idx2 = mutate(x, idx)
    with pytest.raises(exc, match=match):
        _dispatch(obj, x2, idx2)
    assert obj.buffer.ext.launches == [] and obj._ops == 0, "a refused call launches nothing"


def test_unsupported_options_say_so():
    obj = make_low_latency()
    x, idx, w = _inputs()
    with pytest.raises(NotImplementedError, match="dispatch_wait_recv_cost_stats"):
        _dispatch(obj, x, idx, dispatch_wait_recv_cost_stats=torch.zeros((2, 2), dtype=torch.int64))
    with pytest.raises(ValueError, match="round_scale"):
        _dispatch(obj, x, idx, use_ue8m0=True)
    with pytest.raises(ValueError, match="async_finish and return_recv_hook"):
        _dispatch(obj, x, idx, async_finish=True, return_recv_hook=True)
    with pytest.raises(ValueError, match="multiple of the rank count"):
        obj.dispatch(x, idx, T_MAX, 7)
    handle = _dispatch(obj, x, idx)[2]
    with pytest.raises(NotImplementedError, match="use_logfmt"):
        obj.combine(_y(obj), idx, w, handle, use_logfmt=True)
    with pytest.raises(NotImplementedError, match="combine_wait_recv_cost_stats"):
        obj.combine(_y(obj), idx, w, handle, combine_wait_recv_cost_stats=torch.zeros(1))
    with pytest.raises(ValueError, match="handle"):
        obj.combine(_y(obj), idx, w, handle[:5])
    # both paths check every argument in Python before the extension sees a pointer (the cached
    # one once per argument signature: test_cached_path_checks_a_new_signature_before_any_launch)
    per_call = ll.LowLatencyConfig(host="per_call")
    with pytest.raises(ValueError, match=r"\[4, 16, 256\]"):
        obj.combine(torch.zeros((4, 15, H), dtype=torch.bfloat16), idx, w, handle, config=per_call)
    with pytest.raises(ValueError, match="topk_weights"):
        obj.combine(_y(obj), idx, w.double(), handle, config=per_call)
    with pytest.raises(ValueError, match="out must be"):
        obj.combine(_y(obj), idx, w, handle, out=torch.zeros((5, H)), config=per_call)
    # a token count other than the dispatch's is refused on both paths
    with pytest.raises(ValueError, match="topk_idx must be the dispatch's"):
        obj.combine(_y(obj), idx[:4], w[:4], handle)


def test_cached_path_checks_a_new_signature_before_any_launch():
    # the first GPU run's host crash: after good calls, a non-contiguous or float32 combine x on the
    # cached path reached the extension unchecked. Now each is refused by name, launches nothing
    # and leaves the host's op counters where they were; the next good call runs as if it had not
    # happened.
    obj = make_low_latency()
    x, idx, w = _inputs()
    handle = _dispatch(obj, x, idx)[2]
    y = _y(obj)
    obj.combine(y, idx, w, handle)
    handle = _dispatch(obj, x, idx)[2]
    launched, counters = len(obj.buffer.ext.launches), obj._counters()
    for bad in (y[:, :-1], y.float(), y.transpose(1, 2).contiguous().transpose(1, 2), None):
        with pytest.raises(ValueError, match="combine x must be"):
            obj.combine(bad, idx, w, handle)
    with pytest.raises(ValueError, match="topk_weights"):
        obj.combine(y, idx, w.t().contiguous().t(), handle)
    wide = torch.zeros((5, 2 * H), dtype=torch.bfloat16)[:, :H]  # right shape, not contiguous
    with pytest.raises(ValueError, match="contiguous"):
        _dispatch(obj, wide, idx)
    assert len(obj.buffer.ext.launches) == launched and obj._counters() == counters
    out = obj.combine(y, idx, w, handle)[0]
    assert out is obj._combine_out(5, H, 1, True), "the good call after the refused ones keeps the output parity"
    assert [l.kind for l in obj.buffer.ext.launches[-1:]] == ["combine"]


def test_zero_copy_reads_the_next_combine_buffer():
    obj = make_low_latency()
    x, idx, w = _inputs()
    handle = _dispatch(obj, x, idx)[2]
    with pytest.raises(ValueError, match="get_next_low_latency_combine_buffer"):
        obj.combine(_y(obj), idx, w, handle, zero_copy=True)
    buf = obj.next_combine_buffer(handle)
    assert buf.shape == (4, 2 * T_MAX, H) and buf.dtype == torch.bfloat16
    obj.combine(_y(obj), idx, w, handle, zero_copy=True)
    assert obj.buffer.ext.launches[-1].tensors[0] is buf
    # the buffer returned is the next combine's: after one combine it is the other one
    assert obj.next_combine_buffer(handle) is not buf


def test_every_shape_gets_the_same_halves():
    # the halves sit at fixed places (half of the buffer each), so an op of one T_max never writes
    # into the half a peer may still read for the op before it, of another T_max
    obj = make_low_latency(num_bytes=ll.size_hint(64, H, 2, E) + 3 * 4096 + 100)
    x, idx, _ = _inputs()
    for t_max in (8, 64, 5):
        obj.dispatch(x, idx, t_max, E)
    offs = [launch.plan.layout.offsets for launch in obj.buffer.ext.launches]
    assert len({(o["half0"], o["half_stride"]) for o in offs}) == 1
    assert offs[0]["half_stride"] == (obj.num_bytes - ll.CONTROL_BYTES) // 2 // 4096 * 4096 == obj.half_stride
    assert obj.half_stride == ll.buffer_half_stride(obj.num_bytes)
    assert offs[0]["half_stride"] >= ll.LowLatencyLayout(64, H, 2, E).offsets()["half_stride"]
    assert len({o["rows_stride"] for o in offs}) == 3  # the regions inside a half follow the shape


def test_a_buffer_too_small_for_the_call_names_the_hint():
    obj = make_low_latency(num_bytes=ll.size_hint(4, H, 2, E))
    x, idx, _ = _inputs()
    with pytest.raises(buffer_mod.EPCapacityError, match=r"get_low_latency_rdma_size_hint\(8, 256, 2, 8\)"):
        _dispatch(obj, x, idx)
    with pytest.raises(ValueError, match="too small"):
        ll.LowLatency._check_size(1024)


def test_device_errors_raise_once_named_then_the_buffer_refuses():
    obj = make_low_latency()
    x, idx, _ = _inputs()
    _dispatch(obj, x, idx)
    obj._err.info.update(flag=1, rank=0, kernel=16, phase=6, peer=1, epoch=3)
    with pytest.raises(buffer_mod.EPTimeoutError, match=r"ll_dispatch timed out on rank 0.*wait_data.*rank 1.*op 3"):
        _dispatch(obj, x, idx)
    obj._err.info.update(flag=0)
    with pytest.raises(RuntimeError, match="unusable after an earlier error"):
        _dispatch(obj, x, idx)


def test_protocol_error_message():
    obj = make_low_latency()
    obj._err.info.update(flag=ll.ERROR_PROTOCOL, rank=1, kernel=18, epoch=5)
    assert "ran out of order" in obj.error_message() and "ll_dispatch_recv" in obj.error_message()


def test_clean_zeroes_the_control_block_and_drops_pending_hooks(monkeypatch):
    obj = make_low_latency(world=1)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    x, idx, _ = _inputs()
    obj.dispatch(x, idx, T_MAX, E, return_recv_hook=True)
    obj.clean()
    assert obj.buffer.ext.cleaned == [(obj.peers.local, ll.CONTROL_BYTES)]
    obj.dispatch(x, idx, T_MAX, E)  # no pending hook any more
