"""What the low-latency calls hand back and keep: DeepEP's handle (LowLatencyHandle), the stable
output tensors of a dispatch shape (_OutputSet, two per shape, used alternately) and the recv hook.
Torch is imported where tensors are made, so the module imports without it.
"""
from __future__ import annotations

from typing import NamedTuple

from .low_latency_layout import GROUP, LowLatencyLayout


def _signature(t):
    """What the argument checks depend on, per tensor: shape, strides (contiguity), dtype, device;
    the type for anything else (None, a wrong object). A cached call with a known signature is as
    valid as the call that was checked."""
    try:
        return (tuple(t.shape), t.stride(), t.dtype, t.device)
    except (AttributeError, TypeError):
        return type(t)


# ---- the handle --------------------------------------------------------------------------------
class LowLatencyHandle(NamedTuple):
    """What low_latency_combine needs from its dispatch. The first five fields are DeepEP's
    handle: recv_src_info[e, i] is the index, at its source rank, of row i of local expert e, and
    recv_layout_range[e, r] = (begin << 32) | count of the rows that came from rank r. The rest
    are ep_core's: the row of each (source, token, top-k slot) in the experts' rows (slot), the
    token count of every source (recv_tokens), this rank's tokens' destination ranks (sent_mask,
    a bitmask per token), and the dispatch's own token count and top-k width."""

    recv_src_info: object          # torch.Tensor [E/R, R * T_max] int32
    recv_layout_range: object      # torch.Tensor [E/R, R] int64
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int
    slot: object                   # torch.Tensor [R, T_max, K] int32: e * R * T_max + row, or -1
    recv_tokens: object            # torch.Tensor [R] int32
    sent_mask: object              # torch.Tensor [T_max] int32
    num_tokens: int
    num_topk: int
    outputs: object                # _OutputSet the tensors belong to (its plans are cached on it)


# ---- the host side -----------------------------------------------------------------------------
class _OutputSet:
    """One set of stable output tensors of a dispatch shape (two per shape, used alternately), the
    DeepEP-facing views of them, and the plans built over them per extension build."""

    __slots__ = ("recv_x", "scales_storage", "recv_scales", "recv_count", "recv_src_info", "recv_layout_range", "slot",
                 "recv_tokens", "sent_mask", "plans", "handle", "zero_copy")

    def __init__(self, layout: LowLatencyLayout, num_topk: int, use_fp8: bool, use_ue8m0: bool, device):
        import torch

        El, RT, H, R, T = (layout.num_local_experts, layout.rows_per_expert, layout.hidden, layout.num_ranks,
                           layout.num_max_dispatch_tokens_per_rank)
        i32 = dict(dtype=torch.int32, device=device)
        self.recv_x = torch.empty((El, RT, H), dtype=torch.float8_e4m3fn if use_fp8 else torch.bfloat16, device=device)
        self.scales_storage = self.recv_scales = None
        if use_fp8:
            groups = H // (4 * GROUP) if use_ue8m0 else H // GROUP
            self.scales_storage = torch.empty((El, groups, RT), **i32) if use_ue8m0 else \
                torch.empty((El, groups, RT), dtype=torch.float32, device=device)
            # DeepEP's layout: [E/R, R*T_max, groups] with the last two dimensions column-major
            self.recv_scales = self.scales_storage.transpose(1, 2)
        self.recv_count = torch.empty((El,), **i32)
        self.recv_src_info = torch.empty((El, RT), **i32)
        self.recv_layout_range = torch.empty((El, R), dtype=torch.int64, device=device)
        self.slot = torch.empty((R, T, num_topk), **i32)
        self.recv_tokens = torch.empty((R,), **i32)
        self.sent_mask = torch.empty((T,), **i32)
        self.plans: dict = {}
        self.handle = None
        self.zero_copy = None

    def cpp(self, ext):
        return ext.LLDispatchOutputs(recv_x=self.recv_x, recv_scales=self.scales_storage, recv_count=self.recv_count,
                                     recv_src_info=self.recv_src_info, recv_layout_range=self.recv_layout_range,
                                     slot=self.slot, recv_tokens=self.recv_tokens, sent_mask=self.sent_mask)

    def received(self):
        return (self.recv_x, self.recv_scales) if self.recv_scales is not None else self.recv_x


class RecvHook:
    """The receive half of a low-latency call (return_recv_hook=True): calling it launches the
    receive kernel on the current stream. Call each hook once, in op order."""

    __slots__ = ("ll", "op", "kind", "launch", "called")

    def __init__(self, ll, op: int, kind: str, launch):
        self.ll, self.op, self.kind, self.launch, self.called = ll, op, kind, launch, False

    def __call__(self) -> None:
        self.ll._run_hook(self)

    def __repr__(self) -> str:
        return f"RecvHook({self.kind}, op {self.op}, {'called' if self.called else 'pending'})"
