"""A test double of ep_core.Buffer built from `ep_core.reference` and torch.distributed
collectives (gloo on the CPU): each call all-gathers every rank's inputs and runs the reference.

It exists to run the GPU acceptance checks (tests/gpu/ep_checks.py) on the CPU, so the checks
themselves are tested before they judge the real kernels: a check that fails here is wrong."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ep_core import reference as ref
from ep_core.config import Config, combine_config, dispatch_config

topk_idx_t = torch.int64


class EventOverlap:
    def __init__(self, event=None):
        self.event = event

    def current_stream_wait(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.current_stream_wait()


def _gather(t: torch.Tensor, group) -> list:
    """all_gather of tensors whose first dimension differs by rank (fp8 travels as bytes)."""
    world = dist.get_world_size(group)
    n = torch.tensor([t.size(0)], dtype=torch.int64)
    ns = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(ns, n, group=group)
    is_fp8 = t.dtype == torch.float8_e4m3fn
    send = t.view(torch.uint8) if is_fp8 else t
    send = send.contiguous()
    width = max(int(x) for x in ns)
    pad = torch.zeros((width,) + tuple(send.shape[1:]), dtype=send.dtype)
    pad[: send.size(0)] = send
    outs = [torch.empty_like(pad) for _ in range(world)]
    dist.all_gather(outs, pad, group=group)
    res = [o[: int(k)] for o, k in zip(outs, ns)]
    return [r.view(torch.float8_e4m3fn) for r in res] if is_fp8 else res


def _gather_x(x, group):
    if isinstance(x, tuple):
        parts = [_gather(p.contiguous(), group) for p in x]
        return list(zip(*parts))
    return _gather(x, group)


class ReferenceBuffer:
    num_sms = 20

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, **kw):
        if num_rdma_bytes:
            raise NotImplementedError("internode")
        self.group = group
        self.rank = dist.get_rank(group)
        self.group_size = dist.get_world_size(group)
        self.num_nvl_bytes = num_nvl_bytes

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return dispatch_config(num_ranks, ReferenceBuffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return combine_config(num_ranks, ReferenceBuffer.num_sms)

    @staticmethod
    def get_buffer_size_hint(num_max_tokens_per_rank, hidden, num_ranks, num_topk=16):
        return 0  # the reference keeps no buffer

    get_hook_buffer_size_hint = get_buffer_size_hint

    def capture(self):
        return EventOverlap()

    def get_dispatch_layout(self, topk_idx, num_experts, previous_event=None, async_finish=False,
                            allocate_on_comm_stream=False):
        a, b, c, d = ref.get_dispatch_layout(topk_idx, num_experts, self.group_size)
        return a, b, c, d, EventOverlap()

    def dispatch(self, x, handle=None, num_tokens_per_rank=None, num_tokens_per_rdma_rank=None,
                 is_token_in_rank=None, num_tokens_per_expert=None, topk_idx=None, topk_weights=None,
                 expert_alignment=1, num_worst_tokens=0, config=None, previous_event=None, async_finish=False,
                 allocate_on_comm_stream=False, return_recv_hook=False):
        if return_recv_hook:
            assert not async_finish, "async_finish and return_recv_hook cannot be combined"
            out = self.dispatch(x, handle, num_tokens_per_rank, num_tokens_per_rdma_rank, is_token_in_rank,
                                num_tokens_per_expert, topk_idx, topk_weights, expert_alignment, num_worst_tokens,
                                config, previous_event)
            return _deferred(out, (0, 1, 2))
        g = self.group
        if handle is not None:
            assert topk_idx is None and topk_weights is None, "cached dispatch takes no top-k arguments"
            is_token_in_rank = handle[2]
        xs = _gather_x(x, g)
        ins = _gather(is_token_in_rank.to(torch.uint8), g)
        ins = [i.bool() for i in ins]
        kw = {}
        if handle is None:
            kw["num_tokens_per_expert"] = _gather(num_tokens_per_expert, g)
        if topk_idx is not None and handle is None:
            kw = dict(topk_idx=_gather(topk_idx, g), topk_weights=_gather(topk_weights, g),
                      num_experts=num_tokens_per_expert.numel())
        out = ref.dispatch(xs, is_token_in_rank=ins, expert_alignment=expert_alignment,
                           num_worst_tokens=num_worst_tokens, **kw)[self.rank]
        h = (out.handle.rank_prefix_matrix, out.handle, is_token_in_rank)
        if handle is not None:
            return out.recv_x, None, None, None, None, EventOverlap()
        return out.recv_x, out.recv_topk_idx, out.recv_topk_weights, out.num_recv_tokens_per_expert_list, h, \
            EventOverlap()

    def combine(self, x, handle, topk_weights=None, bias=None, config=None, previous_event=None,
                async_finish=False, allocate_on_comm_stream=False, return_recv_hook=False):
        if return_recv_hook:
            assert not async_finish, "async_finish and return_recv_hook cannot be combined"
            return _deferred(self.combine(x, handle, topk_weights, bias, config, previous_event), (0, 1))
        g = self.group
        ys = _gather(x, g)
        handles = [None] * self.group_size
        # every rank needs every rank's handle: gather the pieces the reference reads
        rpm = handle[0]
        src_idx = _gather(handle[1].recv_src_idx, g)
        src_rank = _gather(handle[1].recv_src_rank, g)
        in_rank = [i.bool() for i in _gather(handle[2].to(torch.uint8), g)]
        for r in range(self.group_size):
            handles[r] = ref.RefHandle(rpm, src_idx[r], src_rank[r], in_rank[r], src_idx[r].numel())
        ws = _gather(topk_weights, g) if topk_weights is not None else None
        bs = None
        if bias is not None:
            bs = [None] * self.group_size
            bs[self.rank] = bias
        out = ref.combine(ys, handles, topk_weights=ws, bias=bs)[self.rank]
        return out[0], out[1], EventOverlap()


POISON = -7.0


def _deferred(out: tuple, outputs: tuple) -> tuple:
    """Hook mode on the reference: the outputs at positions `outputs` hold POISON until the hook
    (appended to the tuple) copies the results in, as the real receive writes them in place."""
    tensors = [t for i in outputs for t in (out[i] if isinstance(out[i], tuple) else (out[i],)) if t is not None]
    done = [t.clone() for t in tensors]
    for t in tensors:
        t.fill_(POISON)

    def hook():
        for t, d in zip(tensors, done):
            t.copy_(d)

    return (*out, hook)


class SwappedBlocksBuffer(ReferenceBuffer):
    """Wrong on purpose: receives the source-rank blocks in reverse order (check 3 must fail)."""

    def dispatch(self, x, handle=None, **kw):
        out = list(super().dispatch(x, handle=handle, **kw))
        rx = out[0]
        out[0] = tuple(p.flip(0) for p in rx) if isinstance(rx, tuple) else rx.flip(0)
        return tuple(out)


class LossyCombineBuffer(ReferenceBuffer):
    """Wrong on purpose: combine accumulates in bf16 and drops the last rank (check 7 must fail)."""

    def combine(self, x, handle, topk_weights=None, **kw):
        cx, cw, ev = super().combine(x, handle, topk_weights=topk_weights, **kw)
        return (cx * 0.5).to(cx.dtype), cw, ev


class ZeroTokenScalesBuffer(ReferenceBuffer):
    """Wrong on purpose, the way issue 9's bug was: a rank whose own input has zero tokens keeps
    whatever memory held in place of the FP8 scales it receives."""

    def dispatch(self, x, handle=None, **kw):
        out = list(super().dispatch(x, handle=handle, **kw))
        rx = out[0]
        if isinstance(rx, tuple) and x[0].size(0) == 0 and rx[1].numel():
            out[0] = (rx[0], torch.full_like(rx[1], -777.0))
        return tuple(out)


class LostHookBuffer(ReferenceBuffer):
    """Wrong on purpose: in hook mode the hook never writes the results (the outputs keep POISON)."""

    def dispatch(self, *args, return_recv_hook=False, **kw):
        out = super().dispatch(*args, return_recv_hook=return_recv_hook, **kw)
        return (*out[:-1], lambda: None) if return_recv_hook else out

    def combine(self, *args, return_recv_hook=False, **kw):
        out = super().combine(*args, return_recv_hook=return_recv_hook, **kw)
        return (*out[:-1], lambda: None) if return_recv_hook else out
