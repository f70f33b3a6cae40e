"""DeepEP V1's `Buffer` API held against ep_core's (issue 35): a DeepEP program passes nothing that
is a TypeError here, positionally or by keyword, and gets DeepEP's defaults.

The facts below are data recorded from DeepEP at commit 567632dd59810d77b3cc05553df953cc0f779799
(github.com/deepseek-ai/DeepEP): `deep_ep/buffer.py` (class Buffer: every method but the private
`_unpack_bias`, with its parameters in order and each default as written there), `deep_ep/utils.py`
(EventOverlap), `deep_ep/__init__.py` (the module's names) and `csrc/deep_ep.cpp` / `csrc/config.hpp`
(Config's pybind arguments and defaults; topk_idx_t = int64 in the default build,
csrc/kernels/configs.cuh TOPK_IDX_BITS 64). Nothing is fetched at run time.
"""
from __future__ import annotations

import ast
import ctypes
import inspect
import types

import pytest
import torch

import ep_core
from ep_core import buffer as B
from ep_core.peer import Collective
from tests.ep_core.fake_ext import fake_buffer

REQUIRED = None  # a parameter without a default

# (method, "static" | "instance", ((parameter, default as written in DeepEP, or REQUIRED), ...))
DEEPEP_BUFFER = (
    ("__init__", "instance", (("group", REQUIRED), ("num_nvl_bytes", "0"), ("num_rdma_bytes", "0"),
                              ("low_latency_mode", "False"), ("num_qps_per_rank", "24"),
                              ("allow_nvlink_for_low_latency_mode", "True"), ("allow_mnnvl", "False"),
                              ("use_fabric", "False"), ("explicitly_destroy", "False"), ("enable_shrink", "False"),
                              ("comm", "None"))),
    ("destroy", "instance", ()),
    ("is_sm90_compiled", "static", ()),
    ("set_num_sms", "static", (("new_num_sms", REQUIRED),)),
    ("capture", "static", ()),
    ("get_low_latency_rdma_size_hint", "static", (("num_max_dispatch_tokens_per_rank", REQUIRED),
                                                  ("hidden", REQUIRED), ("num_ranks", REQUIRED),
                                                  ("num_experts", REQUIRED))),
    ("get_comm_stream", "instance", ()),
    ("get_local_buffer_tensor", "instance", (("dtype", REQUIRED), ("size", "None"), ("offset", "0"),
                                             ("use_rdma_buffer", "False"))),
    ("get_dispatch_config", "static", (("num_ranks", REQUIRED),)),
    ("get_combine_config", "static", (("num_ranks", REQUIRED),)),
    ("get_dispatch_layout", "instance", (("topk_idx", REQUIRED), ("num_experts", REQUIRED),
                                         ("previous_event", "None"), ("async_finish", "False"),
                                         ("allocate_on_comm_stream", "False"))),
    ("dispatch", "instance", (("x", REQUIRED), ("handle", "None"), ("num_tokens_per_rank", "None"),
                              ("num_tokens_per_rdma_rank", "None"), ("is_token_in_rank", "None"),
                              ("num_tokens_per_expert", "None"), ("topk_idx", "None"), ("topk_weights", "None"),
                              ("expert_alignment", "1"), ("num_worst_tokens", "0"), ("config", "None"),
                              ("previous_event", "None"), ("async_finish", "False"),
                              ("allocate_on_comm_stream", "False"))),
    ("combine", "instance", (("x", REQUIRED), ("handle", REQUIRED), ("topk_weights", "None"), ("bias", "None"),
                             ("config", "None"), ("previous_event", "None"), ("async_finish", "False"),
                             ("allocate_on_comm_stream", "False"))),
    ("internode_dispatch", "instance", (("x", REQUIRED), ("handle", "None"), ("num_tokens_per_rank", "None"),
                                        ("num_tokens_per_rdma_rank", "None"), ("is_token_in_rank", "None"),
                                        ("num_tokens_per_expert", "None"), ("topk_idx", "None"),
                                        ("topk_weights", "None"), ("expert_alignment", "1"),
                                        ("num_worst_tokens", "0"), ("config", "None"), ("previous_event", "None"),
                                        ("async_finish", "False"), ("allocate_on_comm_stream", "False"))),
    ("internode_combine", "instance", (("x", REQUIRED), ("handle", REQUIRED), ("topk_weights", "None"),
                                       ("bias", "None"), ("config", "None"), ("previous_event", "None"),
                                       ("async_finish", "False"), ("allocate_on_comm_stream", "False"))),
    ("clean_low_latency_buffer", "instance", (("num_max_dispatch_tokens_per_rank", REQUIRED),
                                              ("hidden", REQUIRED), ("num_experts", REQUIRED))),
    ("low_latency_dispatch", "instance", (("x", REQUIRED), ("topk_idx", REQUIRED),
                                          ("num_max_dispatch_tokens_per_rank", REQUIRED), ("num_experts", REQUIRED),
                                          ("cumulative_local_expert_recv_stats", "None"),
                                          ("dispatch_wait_recv_cost_stats", "None"), ("use_fp8", "True"),
                                          ("round_scale", "False"), ("use_ue8m0", "False"),
                                          ("async_finish", "False"), ("return_recv_hook", "False"))),
    ("low_latency_combine", "instance", (("x", REQUIRED), ("topk_idx", REQUIRED), ("topk_weights", REQUIRED),
                                         ("handle", REQUIRED), ("use_logfmt", "False"), ("zero_copy", "False"),
                                         ("async_finish", "False"), ("return_recv_hook", "False"), ("out", "None"),
                                         ("combine_wait_recv_cost_stats", "None"))),
    ("low_latency_update_mask_buffer", "instance", (("rank_to_mask", REQUIRED), ("mask", "False"))),
    ("low_latency_query_mask_buffer", "instance", (("mask_status", REQUIRED),)),
    ("low_latency_clean_mask_buffer", "instance", ()),
    ("get_next_low_latency_combine_buffer", "instance", (("handle", REQUIRED),)),
)
DEEPEP_BUFFER_NUM_SMS = 20  # class attribute `num_sms: int = 20`
# attributes DeepEP's constructor sets (its `runtime`, the C++ object, has no counterpart here)
DEEPEP_ATTRIBUTES = ("rank", "group", "group_size", "num_nvl_bytes", "num_rdma_bytes", "low_latency_mode",
                     "explicitly_destroy", "enable_shrink")
DEEPEP_EVENT_OVERLAP = (("__init__", "instance", (("event", "None"), ("extra_tensors", "None"))),
                        ("current_stream_wait", "instance", ()),
                        ("__enter__", "instance", ()),
                        ("__exit__", "instance", (("exc_type", REQUIRED), ("exc_val", REQUIRED), ("exc_tb", REQUIRED))))
# pybind: Config(num_sms=20, num_max_nvl_chunked_send_tokens=6, num_max_nvl_chunked_recv_tokens=256,
# num_max_rdma_chunked_send_tokens=6, num_max_rdma_chunked_recv_tokens=256) and two positional hints
DEEPEP_CONFIG = (("__init__", "instance", (("num_sms", "20"), ("num_max_nvl_chunked_send_tokens", "6"),
                                           ("num_max_nvl_chunked_recv_tokens", "256"),
                                           ("num_max_rdma_chunked_send_tokens", "6"),
                                           ("num_max_rdma_chunked_recv_tokens", "256"))),
                 ("get_nvl_buffer_size_hint", "instance", (("hidden_bytes", REQUIRED), ("num_ranks", REQUIRED))),
                 ("get_rdma_buffer_size_hint", "instance", (("hidden_bytes", REQUIRED), ("num_ranks", REQUIRED))))
DEEPEP_MODULE = ("Buffer", "EventOverlap", "Config", "topk_idx_t")


def _mismatches(cls, facts) -> list[str]:
    """How `cls` departs from DeepEP's `facts`: a missing method, another kind, a parameter of
    another name or place, another default, or a required parameter DeepEP does not pass."""
    out = []
    for name, kind, params in facts:
        static = inspect.getattr_static(cls, name, None)
        if static is None:
            out.append(f"{name}: missing")
            continue
        ours_kind = "static" if isinstance(static, (staticmethod, classmethod)) else "instance"
        if ours_kind != kind:
            out.append(f"{name}: {ours_kind}, DeepEP's is {kind}")
        sig = inspect.signature(getattr(cls, name))
        this = [None] if ours_kind == "instance" else []  # what stands for self in the binds below
        ps = list(sig.parameters.values())[len(this):]
        positional = [p for p in ps if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if [p.name for p in positional[:len(params)]] != [n for n, _ in params]:
            out.append(f"{name}: parameters {[p.name for p in positional]}, DeepEP's {[n for n, _ in params]}")
            continue
        for (pname, default), p in zip(params, positional):
            want = inspect.Parameter.empty if default is REQUIRED else ast.literal_eval(default)
            if p.default is not want and p.default != want:
                out.append(f"{name}({pname}): default {p.default!r}, DeepEP's {default}")
        for p in ps[len(params):]:
            if p.default is inspect.Parameter.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                out.append(f"{name}: ep_core's extra parameter {p.name} has no default")
        for how, args, kwargs in (("positionally", [object() for _ in params], {}),
                                  ("by keyword", [], {n: object() for n, _ in params})):
            try:
                sig.bind(*this, *args, **kwargs)
            except TypeError as e:
                out.append(f"{name}: DeepEP's arguments {how}: {e}")
    return out


def test_buffer_has_deepeps_methods_parameters_and_defaults():
    assert _mismatches(B.Buffer, DEEPEP_BUFFER) == []
    assert hasattr(B.Buffer, "num_sms") and ep_core.config.DEFAULT_NUM_SMS == DEEPEP_BUFFER_NUM_SMS


def test_event_overlap_config_and_module_names_are_deepeps():
    assert _mismatches(ep_core.EventOverlap, DEEPEP_EVENT_OVERLAP) == []
    assert _mismatches(ep_core.Config, DEEPEP_CONFIG) == []
    for name in DEEPEP_MODULE:
        assert getattr(ep_core, name) is not None
    assert ep_core.topk_idx_t == torch.int64


def test_the_check_sees_a_departure():
    class Drifted:
        def low_latency_combine(self, x, topk_idx, topk_weights, handle, zero_copy=False, use_logfmt=False):
            pass

        def capture(self):
            pass

    facts = [f for f in DEEPEP_BUFFER if f[0] in ("low_latency_combine", "capture", "destroy")]
    got = _mismatches(Drifted, facts)
    assert any(m.startswith("low_latency_combine: parameters") for m in got)
    assert "capture: instance, DeepEP's is static" in got and "destroy: missing" in got


def test_deepeps_attributes_are_set(monkeypatch):
    buf, _ = fake_buffer(monkeypatch=monkeypatch)
    for name in DEEPEP_ATTRIBUTES:
        assert hasattr(buf, name), name
    assert (buf.num_rdma_bytes, buf.low_latency_mode, buf.enable_shrink) == (0, False, False)
    assert buf.get_comm_stream() is buf.comm_stream


class _Recorder:
    """Stands for a Buffer's LowLatency: records what the Buffer forwards."""

    def dispatch(self, *args, **kwargs):
        self.got = ("dispatch", args, kwargs)

    def combine(self, *args, **kwargs):
        self.got = ("combine", args, kwargs)


def test_low_latency_calls_forward_deepeps_positional_order(monkeypatch):
    buf, _ = fake_buffer(monkeypatch=monkeypatch)
    buf._ll = rec = _Recorder()
    stats = object()
    buf.low_latency_dispatch("x", "idx", 8, 16, stats, None, False, True, True, False, True)
    _, args, _ = rec.got
    # LowLatency.dispatch(x, topk_idx, T_max, E, cumulative stats, wait stats, use_fp8, round_scale,
    # use_ue8m0, async_finish, return_recv_hook)
    assert args == ("x", "idx", 8, 16, stats, None, False, True, True, False, True)
    buf.low_latency_combine("y", "idx", "w", "h", True, True, False, True, "out")
    _, args, kwargs = rec.got
    # LowLatency.combine(x, topk_idx, topk_weights, handle, zero_copy, async_finish, return_recv_hook, out)
    assert args == ("y", "idx", "w", "h", True, False, True, "out") and kwargs["use_logfmt"] is True


class _HostPeers:
    """A real host allocation where the fake Buffer's peers point."""

    def __init__(self, n):
        self.mem = (ctypes.c_uint8 * n)()
        self.local = ctypes.addressof(self.mem)
        self.ptrs = [self.local]

    def close(self):
        pass


def test_get_local_buffer_tensor_shares_the_buffer(monkeypatch):
    buf, _ = fake_buffer(num_nvl_bytes=4096, monkeypatch=monkeypatch)
    buf.peers = peers = _HostPeers(4096)
    whole = buf.get_local_buffer_tensor(torch.int32)
    assert whole.dtype == torch.int32 and whole.numel() == 1024
    part = buf.get_local_buffer_tensor(torch.float32, torch.Size((4, 5)), offset=64)
    part.fill_(2.0)
    raw = torch.frombuffer(peers.mem, dtype=torch.float32)
    assert raw[16:36].eq(2.0).all() and raw[:16].eq(0).all() and raw[36:].eq(0).all()
    whole[0] = 7
    assert peers.mem[0] == 7
    with pytest.raises(ValueError, match="offset"):
        buf.get_local_buffer_tensor(torch.float32, offset=2)
    with pytest.raises(ValueError, match="exceeds"):
        buf.get_local_buffer_tensor(torch.float32, torch.Size((2000,)))
    with pytest.raises(NotImplementedError, match="low-latency buffer"):
        buf.get_local_buffer_tensor(torch.float32, use_rdma_buffer=True)
    buf._ll = types.SimpleNamespace(peers=_HostPeers(256), num_bytes=256)
    assert buf.get_local_buffer_tensor(torch.bfloat16, use_rdma_buffer=True).numel() == 128


def test_mask_buffer_methods_follow_deepeps_rules(monkeypatch):
    buf, _ = fake_buffer(monkeypatch=monkeypatch)
    status = torch.ones((1,), dtype=torch.int32)
    with pytest.raises(RuntimeError, match="low_latency_mode"):
        buf.low_latency_query_mask_buffer(status)
    buf._ll = object()
    for call in (lambda: buf.low_latency_query_mask_buffer(status), buf.low_latency_clean_mask_buffer,
                 lambda: buf.low_latency_update_mask_buffer(0)):
        with pytest.raises(RuntimeError, match="enable_shrink=True"):
            call()
    buf.enable_shrink = True
    buf.low_latency_query_mask_buffer(status)
    assert status.tolist() == [0]  # no rank is masked
    buf.low_latency_update_mask_buffer(0, False)
    buf.low_latency_clean_mask_buffer()
    with pytest.raises(NotImplementedError, match="EPTimeoutError"):
        buf.low_latency_update_mask_buffer(0, True)
    with pytest.raises(ValueError, match="rank_to_mask"):
        buf.low_latency_update_mask_buffer(1)
    with pytest.raises(ValueError, match="int32"):
        buf.low_latency_query_mask_buffer(torch.ones((1,), dtype=torch.int64))


class _FakeComm:
    """mpi4py's Comm as ep_core uses it."""

    def __init__(self, rank, size):
        self.rank, self.size, self.barriers = rank, size, 0

    def Get_rank(self):  # noqa: N802 (mpi4py's names)
        return self.rank

    def Get_size(self):  # noqa: N802
        return self.size

    def allgather(self, obj):
        return [obj if r == self.rank else ("peer", r) for r in range(self.size)]

    def Barrier(self):  # noqa: N802
        self.barriers += 1


def test_an_mpi_communicator_stands_for_the_group():
    comm = _FakeComm(1, 3)
    ranks = Collective(None, comm)
    assert (ranks.rank, ranks.size) == (1, 3)
    assert ranks.all_gather_object("mine") == [("peer", 0), "mine", ("peer", 2)]
    ranks.barrier()
    assert comm.barriers == 1
    alone = Collective()
    assert (alone.rank, alone.size, alone.all_gather_object(5)) == (0, 1, [5])
    with pytest.raises(ValueError, match="1..8 ranks"):  # refused before the extension or a GPU is touched
        B.Buffer(None, 1 << 30, comm=_FakeComm(0, 9))
