"""A CPU stand-in for ep_core's extension (bindings.cpp) on ONE rank, so ep_core.Buffer's host path
(plans, their cache keys, stream modes, profile slots, error reporting) runs on a machine without
a GPU: the CPU tests check its behaviour and benchmarks/bench_host.py times its Python part.

It has the extension's interface and named types. With `compute=True` (the default) a launch
computes the one-rank result with plain torch ops (every token a rank keeps goes to itself), so
a test can compare outputs with ep_core.reference; with `compute=False` a launch returns outputs
of the right shapes allocated once (what bench_host.py uses: the Python side is then all that is
timed). Every launch is logged in `Launcher.calls` as (name, plan or None, mode flags, profile
addresses).

Hook mode (plans with `hook=True`): the send call returns outputs filled with POISON and the
receive call (dispatch_receive / combine_receive) writes the results into them in place, so a
test sees whether, and when, the Buffer ran the hook."""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from ep_core import config as C
from ep_core import reference as ref

MAX_CHUNKS = 1024
POISON = -7.0  # what a hook-mode send leaves in its outputs until the receive ran


def profile_enabled_for(profile: bool):
    return lambda: profile


@dataclass
class ErrorReport:
    flag: int = 0
    rank: int = 0
    kernel: int = 0
    phase: int = 0
    is_barrier: bool = False
    channel: int = 0
    peer: int = 0
    epoch: int = 0


class ErrorRecord:
    """The host-mapped error record; a test sets `record` to what a kernel would have written."""

    def __init__(self):
        self.record = ErrorReport()
        self.device = 0x1000
        self.closed = False

    def flag(self) -> int:
        return self.record.flag

    def report(self) -> ErrorReport:
        return self.record

    def close(self) -> None:
        self.closed = True


@dataclass
class RowRegions:
    x: int
    scales: int
    topk_idx: int
    topk_weights: int
    capacity: int


@dataclass
class HandleTensors:
    is_token_in_rank: torch.Tensor
    send_pos: torch.Tensor
    send_chunk_prefix: torch.Tensor
    rank_prefix_matrix: torch.Tensor
    recv_chunk_prefix: torch.Tensor
    recv_num_chunks: torch.Tensor
    num_tokens: int
    chunk_size: int
    num_chunks: int


@dataclass
class Notified:
    handle: HandleTensors
    recv_info: torch.Tensor


@dataclass
class DispatchLayout:
    num_tokens_per_rank: torch.Tensor
    num_tokens_per_expert: torch.Tensor
    is_token_in_rank: torch.Tensor


@dataclass
class DispatchPlan:
    handle: HandleTensors
    rows: RowRegions
    hidden: int
    fp8: bool
    num_topk: int
    with_weights: bool
    num_experts: int
    recv_rows: int
    fill_from: int
    num_blocks: int
    num_sender_blocks: int
    open_op: bool
    num_tma_buffers: int = 0  # 0: the direct path (bindings.cpp's default)
    hook: bool = False
    rank_prefix: list = field(default_factory=list)
    stage: RowRegions | None = None

    def __post_init__(self):  # bindings.cpp's make_hook_plan checks, those the host path must satisfy
        if self.hook:
            assert 1 <= self.num_tma_buffers <= 3 and self.stage is not None and self.num_sender_blocks == self.num_blocks
            assert len(self.rank_prefix) == 1 and self.rank_prefix[0] <= self.rows.capacity
        else:
            assert not self.rank_prefix and self.stage is None


@dataclass
class CombinePlan:
    handle: HandleTensors
    rows: RowRegions
    hidden: int
    num_topk: int
    min_rows: int
    num_blocks: int
    num_sender_blocks: int
    num_tma_buffers: int = 0
    hook: bool = False
    rank_prefix: list = field(default_factory=list)

    def __post_init__(self):
        if self.hook:
            assert 1 <= self.num_tma_buffers <= 3 and len(self.rank_prefix) == 1
        else:
            assert not self.rank_prefix


@dataclass
class StreamMode:
    compute: int
    fork: bool
    join: bool
    async_finish: bool
    alloc_on_comm: bool


@dataclass
class Received:
    x: torch.Tensor
    scales: torch.Tensor | None = None
    topk_idx: torch.Tensor | None = None
    topk_weights: torch.Tensor | None = None


@dataclass
class Combined:
    x: torch.Tensor
    topk_weights: torch.Tensor | None = None


@dataclass
class Launcher:
    peers: list
    rank: int
    error_device: int
    timeout_ns: int
    skip_send: bool
    comm_stream: int
    comm_stream_id: int
    device_index: int
    device_type: int
    compute: bool = True
    calls: list = field(default_factory=list)
    _outs: dict = field(default_factory=dict)
    _pending: dict = field(default_factory=dict)  # hook mode: id(send outputs) -> the results the receive writes

    def _log(self, name, plan, mode, *prof):
        self.calls.append((name, plan, (mode.fork, mode.join, mode.async_finish, mode.alloc_on_comm), prof))

    def layout(self, topk_idx, num_experts, mode, prof):
        self._log("layout", None, mode, prof)
        per_rank, _, per_expert, in_rank = ref.get_dispatch_layout(topk_idx, num_experts, len(self.peers))
        return DispatchLayout(per_rank, per_expert, in_rank)

    def notify(self, is_token_in_rank, num_tokens_per_expert, num_experts, chunk_size, num_chunks, expert_alignment,
               mode, prof):
        assert len(self.peers) == 1, "the fake extension runs one rank"
        self._log("notify", None, mode, prof)
        T = is_token_in_rank.size(0)
        keep = is_token_in_rank[:, 0]
        send_pos = torch.where(keep, keep.to(torch.int32).cumsum(0, dtype=torch.int32) - 1, -1).view(T, 1)
        prefix = torch.zeros((1, MAX_CHUNKS + 1), dtype=torch.int32)
        for c in range(num_chunks):
            prefix[0, c + 1] = prefix[0, c] + int(keep[c * chunk_size: (c + 1) * chunk_size].sum())
        n = int(keep.sum())
        per_expert = [(int(v) + expert_alignment - 1) // expert_alignment * expert_alignment
                      for v in num_tokens_per_expert.tolist()]
        h = HandleTensors(is_token_in_rank, send_pos.to(torch.int32), prefix, torch.tensor([[n]], dtype=torch.int32),
                          prefix.clone(), torch.tensor([num_chunks], dtype=torch.int32), T, chunk_size, num_chunks)
        return Notified(h, torch.tensor([n, *per_expert], dtype=torch.int32))

    def read_back(self, notified, host):
        src = torch.cat([notified.recv_info, notified.handle.rank_prefix_matrix.view(-1)]).contiguous()
        ctypes.memmove(host, src.data_ptr(), src.numel() * 4)

    def _out(self, key, make):
        if self.compute:
            return make()
        if key not in self._outs:
            self._outs[key] = make()
        return self._outs[key]

    def dispatch(self, plan, x, x_scales, topk_idx, topk_weights, mode, prof_open, prof_kernel, prof_signal=0):
        if plan.hook:
            out = self._dispatch(plan, x, x_scales, topk_idx, topk_weights, mode, prof_open, prof_kernel, prof_signal)
            self._pending[id(out)] = _copy_received(out)
            return _poisoned(out)
        return self._dispatch(plan, x, x_scales, topk_idx, topk_weights, mode, prof_open, prof_kernel)

    def dispatch_receive(self, plan, out, compute, prof):
        assert plan.hook, "dispatch_receive needs a hook-mode plan"
        self.calls.append(("dispatch_receive", plan, compute, (prof,)))
        done = self._pending.pop(id(out))
        for name in ("x", "scales", "topk_idx", "topk_weights"):
            if getattr(out, name) is not None:
                getattr(out, name).copy_(getattr(done, name))

    def combine_receive(self, plan, x, topk_weights, bias0, bias1, out, compute, prof):
        assert plan.hook, "combine_receive needs a hook-mode plan"
        self.calls.append(("combine_receive", plan, compute, (prof,)))
        done = self._combine(plan, x, topk_weights, bias0, bias1, None, None, None, log=False)
        out.x.copy_(done.x)
        if out.topk_weights is not None:
            out.topk_weights.copy_(done.topk_weights)

    def _dispatch(self, plan, x, x_scales, topk_idx, topk_weights, mode, prof_open, prof_kernel, *more):
        if not self.compute and id(plan) in self._outs:  # bench_host.py: nothing but the Python side
            return self._outs[id(plan)]
        # the checks the extension makes before it launches anything
        dtype = torch.float8_e4m3fn if plan.fp8 else torch.bfloat16
        if x.dim() != 2 or tuple(x.shape) != (plan.handle.num_tokens, plan.hidden) or x.dtype != dtype:
            raise RuntimeError("ep_core: dispatch x does not fit this handle")
        if (x_scales is not None) != plan.fp8 or (topk_idx is not None) != (plan.num_topk > 0):
            raise RuntimeError("ep_core: arguments differ from this dispatch plan")
        self._log("dispatch", plan, mode, prof_open, prof_kernel, *more)
        N, H = plan.recv_rows, plan.hidden

        def make():
            keep = plan.handle.send_pos[:, 0] >= 0
            rx = torch.zeros((N, H), dtype=dtype)
            rx[: int(keep.sum())] = x[keep]
            out = Received(rx)
            if plan.fp8:
                out.scales = torch.zeros((N, H // C.SCALE_BLOCK), dtype=torch.float32)
                out.scales[: int(keep.sum())] = x_scales[keep]
            if plan.num_topk:
                out.topk_idx = torch.full((N, plan.num_topk), -1, dtype=torch.int64)
                out.topk_idx[: int(keep.sum())] = topk_idx[keep]
                if plan.with_weights:
                    out.topk_weights = torch.zeros((N, plan.num_topk), dtype=torch.float32)
                    out.topk_weights[: int(keep.sum())] = torch.where(topk_idx[keep] >= 0, topk_weights[keep], 0.0)
            return out

        return self._out(id(plan), make)

    def combine(self, plan, x, topk_weights, bias0, bias1, mode, prof_open, prof_kernel, prof_signal=0):
        if plan.hook:
            self._log("combine", plan, mode, prof_open, prof_kernel, prof_signal)
            out = self._combine(plan, x, topk_weights, bias0, bias1, mode, prof_open, prof_kernel, log=False)
            return _poisoned(Combined(out.x.clone(), None if out.topk_weights is None else out.topk_weights.clone()))
        return self._combine(plan, x, topk_weights, bias0, bias1, mode, prof_open, prof_kernel)

    def _combine(self, plan, x, topk_weights, bias0, bias1, mode, prof_open, prof_kernel, log=True):
        if not self.compute and id(plan) in self._outs:
            return self._outs[id(plan)]
        if x.dim() != 2 or x.size(1) != plan.hidden or x.dtype != torch.bfloat16 or x.size(0) < plan.min_rows:
            raise RuntimeError("ep_core: combine x does not fit this plan")
        if (topk_weights is not None) != (plan.num_topk > 0):
            raise RuntimeError("ep_core: topk_weights differ from this combine plan")
        if log:
            self._log("combine", plan, mode, prof_open, prof_kernel)
        T = plan.handle.num_tokens

        def make():
            pos = plan.handle.send_pos[:, 0].long()
            keep = pos >= 0
            out = torch.zeros((T, plan.hidden), dtype=torch.float32)
            out[keep] = x[pos[keep]].float()
            for b in (bias0, bias1):
                if b is not None:
                    out += b.float()
            w = None
            if plan.num_topk:
                w = torch.zeros((T, plan.num_topk), dtype=torch.float32)
                w[keep] = topk_weights[pos[keep]]
            return Combined(out.to(torch.bfloat16), w)

        return self._out(id(plan), make)


def _copy_received(out: Received) -> Received:
    return Received(*(None if t is None else t.clone() for t in (out.x, out.scales, out.topk_idx, out.topk_weights)))


def _poisoned(out):
    """`out` with every tensor filled with POISON (in place: the receive later writes the same tensors)."""
    for t in vars(out).values():
        if t is not None:
            t.fill_(POISON)
    return out


class FakeExt:
    """The module: one per build (profile=False / True), as the real extension is."""

    def __init__(self, profile: bool = False, compute: bool = True):
        self._profile = profile
        self.compute = compute
        self.launchers: list[Launcher] = []
        for cls in (ErrorRecord, RowRegions, HandleTensors, DispatchPlan, CombinePlan, StreamMode):
            setattr(self, cls.__name__, cls)

    def profile_enabled(self) -> bool:
        return self._profile

    def limits(self) -> dict:
        return {"max_ranks": C.MAX_RANKS, "max_experts": C.MAX_EXPERTS, "max_topk": C.MAX_TOPK,
                "max_chunks": MAX_CHUNKS, "max_hidden": C.MAX_HIDDEN, "threads": 512, "notify_threads": 1024,
                "data_offset": C.DATA_OFFSET, "clock_sync_offset": 0, "clock_sync_bytes": 0}

    def layout_grid(self, num_tokens: int) -> int:
        return max(1, (num_tokens + 255) // 256)

    def Launcher(self, **kw):  # noqa: N802 (the extension's class name)
        la = Launcher(**kw, compute=self.compute)
        self.launchers.append(la)
        return la


class FakeStream:
    cuda_stream, stream_id, device_index, device_type = 0x5000, 3, 0, 1

    def wait_event(self, event):
        pass

    def synchronize(self):
        pass


class FakePeers:
    def __init__(self):
        self.ptrs = [0x7000_0000]
        self.local = self.ptrs[0]

    def close(self):
        pass


def fake_buffer(num_nvl_bytes: int = 1 << 30, compute: bool = True, monkeypatch=None):
    """A one-rank ep_core.Buffer on the CPU over FakeExt (both builds), its raw-stream lookup
    replaced by a constant when `monkeypatch` is given (pytest's fixture)."""
    from ep_core import _ext
    from ep_core import buffer as B

    exts = {False: FakeExt(False, compute), True: FakeExt(True, compute)}
    if monkeypatch is not None:
        monkeypatch.setattr(B, "current_raw_stream", lambda index: 0x4000)
        monkeypatch.setattr(_ext, "load", lambda profile=False: exts[bool(profile)])
    b = B.Buffer.__new__(B.Buffer)
    b.group = None
    b.explicitly_destroy = False
    b._init_host_state(exts[False], rank=0, group_size=1, num_nvl_bytes=num_nvl_bytes, timeout_s=10.0,
                       skip_send=False, device=torch.device("cpu"), comm_stream=FakeStream(), peers=FakePeers())
    return b, exts


def one_rank_dispatch(problem, seed: int, monkeypatch):
    """fake_buffer plus seeded inputs of `problem` (uniform routing, 10 % -1 entries), their
    top-k indices in the Buffer's dtype and the dispatch layout: (buf, exts, ins, idx, layout)."""
    from ep_core import buffer as B
    from profiler.workflows.workload import make_rank_inputs

    buf, exts = fake_buffer(monkeypatch=monkeypatch)
    ins = make_rank_inputs(problem, "uniform", 0, seed=seed, drop=0.1)
    idx = ins.topk_idx.to(B.topk_idx_t)
    layout = buf.get_dispatch_layout(idx, problem.experts)
    return buf, exts, ins, idx, layout


def fresh_dispatch(buf, ins, idx, layout, x=None, **kw):
    """A non-cached dispatch of `ins` (or of `x` in its place) through the layout's counts."""
    return buf.dispatch(ins.x if x is None else x, num_tokens_per_rank=layout[0], is_token_in_rank=layout[3],
                        num_tokens_per_expert=layout[2], topk_idx=idx, topk_weights=ins.topk_weights, **kw)
