"""The argument checks and plans of the low-latency calls (LowLatency's first seam): each call's
arguments checked with a message naming the argument (once per signature with the cached host
path, knob 5), the buffer layout of a call's shape, the stable output sets, the config of a call
that passed none (the tuned table's, else the Buffer's). `LowLatencyChecks` is a part of
ep_core.low_latency.LowLatency; ep_core/low_latency.py's module docstring describes the calls.
"""
from __future__ import annotations

from .config import MAX_HIDDEN, MAX_RANKS, MAX_TOPK
from .low_latency_handles import LowLatencyHandle, _OutputSet
from .low_latency_layout import (CONTROL_BYTES, ERROR_PROTOCOL, GROUP, KERNELS, RECV_PHASE, SEND_PHASE, MAX_BLOCKS, MAX_LOCAL_EXPERTS, MAX_TOKENS, MAX_WARPS_PER_BLOCK,
                                 LowLatencyConfig, LowLatencyLayout)


class LowLatencyChecks:
    """Argument checks, layouts and cached outputs of ep_core's LowLatency (see the module docstring)."""

    @staticmethod
    def _check_limits(ext) -> None:
        limits = dict(ext.ll_limits())
        mine = {"group": GROUP, "max_tokens": MAX_TOKENS, "max_blocks": MAX_BLOCKS,
                "max_warps_per_block": MAX_WARPS_PER_BLOCK, "max_local_experts": MAX_LOCAL_EXPERTS,
                "max_topk": MAX_TOPK, "max_ranks": MAX_RANKS, "max_hidden": MAX_HIDDEN,
                "kernels": {v: k for k, v in KERNELS.items()}, "error_protocol": ERROR_PROTOCOL,
                "send_phase": SEND_PHASE, "recv_phase": RECV_PHASE}
        got = {k: (dict(v) if isinstance(v, dict) else v) for k, v in limits.items() if k != "threads"}
        if got != mine:
            raise RuntimeError(f"ep_core low-latency: ep_core/low_latency.py and the compiled kernels disagree on "
                               f"their limits: {mine} vs {got} (rebuild the extension)")

    @staticmethod
    def _check_size(num_bytes: int) -> None:
        if int(num_bytes) < CONTROL_BYTES + 4096:
            raise ValueError(f"ep_core: the low-latency buffer (num_rdma_bytes={int(num_bytes)}) is too small; size it "
                             f"with Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, "
                             f"num_ranks, num_experts)")

    # -- the tuned table (ep_core/tuned.py, `epscope tune --ll`) -------------------------------------
    def _call_config(self, config, kernel: str, t_max, hidden, dtype: str) -> LowLatencyConfig:
        """A call's config: its own, else the Buffer's when one was chosen (`using`, or set), else
        the tuned table's entry for this GPU, rank count, dtype, hidden and T_max, else the defaults."""
        if config is not None:
            return config
        if self.config is not self._tunable or not isinstance(t_max, int) or not isinstance(hidden, int):
            return self.config  # (arguments of the wrong kind: the call's own checks name them)
        key = (kernel, t_max, hidden, dtype)
        cfg = self._tuned.get(key, self)
        if cfg is self:  # first call of this shape: one table lookup (the host path stays a dict lookup)
            from . import tuned

            cfg = self._tuned[key] = tuned.ll_default(kernel, self.buffer.device, self.buffer.group_size,
                                                      self.num_sms, t_max, hidden, dtype)
        return cfg or self.config

    def _layout(self, T: int, H: int, E: int, ext, cached: bool):
        key = (T, H, E)
        entry = self._layouts.get(key) if cached else None
        if entry is None:
            layout = LowLatencyLayout(T, H, self.buffer.group_size, E)
            if layout.size > self.num_bytes:
                from .errors import EPCapacityError

                raise EPCapacityError(
                    f"ep_core: the low-latency buffer holds {self.num_bytes} bytes, this call's layout (T_max={T}, "
                    f"hidden={H}, {self.buffer.group_size} ranks, {E} experts) needs {layout.size}; create the Buffer "
                    f"with num_rdma_bytes >= Buffer.get_low_latency_rdma_size_hint({T}, {H}, "
                    f"{self.buffer.group_size}, {E})")
            entry = (layout, {})
            if cached:
                self._layouts[key] = entry
        layout, per_ext = entry
        cpp = per_ext.get(id(ext))
        if cpp is None:
            cpp = per_ext[id(ext)] = ext.LLLayout(offsets=layout.offsets(half_stride=self.half_stride))
        return layout, cpp

    def _check_dispatch_args(self, x, topk_idx, T_max, E, use_fp8, use_ue8m0, stats) -> None:
        import torch

        from .streams import topk_idx_t

        R = self.buffer.group_size
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16 or x.device != self.buffer.device:
            raise ValueError(f"ep_core: low_latency_dispatch x must be a bf16 [num_tokens, hidden] tensor on "
                             f"{self.buffer.device}, got {getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        T, H = x.shape
        if H % GROUP or H > MAX_HIDDEN:
            raise ValueError(f"ep_core: hidden must be a multiple of {GROUP} up to {MAX_HIDDEN}, got {H}")
        if use_ue8m0 and H % (4 * GROUP):
            raise ValueError(f"ep_core: use_ue8m0 packs 4 scales per int32: hidden must be a multiple of "
                             f"{4 * GROUP}, got {H}")
        if (not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t
                or topk_idx.size(0) != T or topk_idx.device != self.buffer.device):
            raise ValueError(f"ep_core: topk_idx must be a {topk_idx_t} [{T}, num_topk] tensor on "
                             f"{self.buffer.device}, got {getattr(topk_idx, 'dtype', None)} "
                             f"{tuple(getattr(topk_idx, 'shape', ()))}")
        if not 1 <= topk_idx.size(1) <= MAX_TOPK:
            raise ValueError(f"ep_core: num_topk must be in 1..{MAX_TOPK}, got {topk_idx.size(1)}")
        if not x.is_contiguous() or not topk_idx.is_contiguous():
            raise ValueError("ep_core: low_latency_dispatch x and topk_idx must be contiguous")
        if not 1 <= T_max <= MAX_TOKENS or T > T_max:
            raise ValueError(f"ep_core: num_max_dispatch_tokens_per_rank must be in 1..{MAX_TOKENS} and >= the "
                             f"{T} tokens of this call, got {T_max}")
        if E <= 0 or E % R or E // R > MAX_LOCAL_EXPERTS:
            raise ValueError(f"ep_core: num_experts must be a positive multiple of the rank count ({R}) with at most "
                             f"{MAX_LOCAL_EXPERTS} per rank, got {E}")
        if stats is not None and (stats.dtype != torch.int32 or tuple(stats.shape) != (E // R,)
                                  or stats.device != self.buffer.device):
            raise ValueError(f"ep_core: cumulative_local_expert_recv_stats must be int32 [{E // R}] on "
                             f"{self.buffer.device}")

    def _output_set(self, key, parity: int, layout: LowLatencyLayout, K: int, use_fp8: bool, use_ue8m0: bool,
                    cached: bool) -> _OutputSet:
        if not cached:
            return _OutputSet(layout, K, use_fp8, use_ue8m0, self.buffer.device)
        s = self._sets.get((key, parity))
        if s is None:
            s = self._sets[(key, parity)] = _OutputSet(layout, K, use_fp8, use_ue8m0, self.buffer.device)
        return s

    def _check_combine_args(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, out) -> None:
        import torch

        from .streams import topk_idx_t

        El, RT, H = handle.num_experts // self.buffer.group_size, handle.recv_src_info.size(1), handle.hidden
        T, K = handle.num_tokens, handle.num_topk
        if (not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or tuple(x.shape) != (El, RT, H)
                or not x.is_contiguous() or x.device != self.buffer.device):
            raise ValueError(f"ep_core: low_latency_combine x must be a contiguous bf16 [{El}, {RT}, {H}] tensor on "
                             f"{self.buffer.device}, got {getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        if (not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype != topk_idx_t or tuple(topk_idx.shape) != (T, K)
                or not topk_idx.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine topk_idx must be the dispatch's: contiguous {topk_idx_t} "
                             f"[{T}, {K}], got {getattr(topk_idx, 'dtype', None)} "
                             f"{tuple(getattr(topk_idx, 'shape', ()))}")
        if (not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32
                or tuple(topk_weights.shape) != (T, K) or not topk_weights.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine topk_weights must be contiguous float32 [{T}, {K}], got "
                             f"{getattr(topk_weights, 'dtype', None)} {tuple(getattr(topk_weights, 'shape', ()))}")
        if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (T, H) or not out.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine out must be a contiguous bf16 [{T}, {H}] tensor")

    def _combine_out(self, T: int, H: int, parity: int, cached: bool):
        import torch

        if not cached:
            return torch.empty((T, H), dtype=torch.bfloat16, device=self.buffer.device)
        o = self._outs.get((T, H, parity))
        if o is None:
            o = self._outs[(T, H, parity)] = torch.empty((T, H), dtype=torch.bfloat16, device=self.buffer.device)
        return o
