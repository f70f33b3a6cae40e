"""The argument checks and plans of the normal path (Buffer's first seam): every call's arguments
are checked with a message naming the argument, and what its handle, dtype, config and options fix
is built once into a plan (the extension's DispatchPlan / CombinePlan, kept on the handle): the
row regions of the data region, the block split, the chunking. `BufferPlans` is a part of
ep_core.Buffer (it reads the Buffer's state: group size, limits, num_nvl_bytes).
"""
from __future__ import annotations

import math
import os

import torch

from .config import MAX_EXPERTS, MAX_HIDDEN, MAX_TOPK, REGION_ALIGN, SCALE_BLOCK, Config
from .errors import EPCapacityError
from .handles import DispatchHandle, _Build, _Plan
from .streams import topk_idx_t

# Tuning of the block split. Senders push NVLink rows; the rest copy out (dispatch) or reduce
# (combine). The split that was fastest depends on the SM count (sweep of run 2 on 2xH200,
# benchmarks/NOTES.md): dispatch 62.5 % senders at 24 SMs, 50 % at 64; combine 37.5 % at 24,
# 50 % at 64; linear in between. None = that rule; a number (env, for sweeps) overrides it.
def _env_float(name):
    v = os.environ.get(name, "")
    return float(v) if v else None


DISPATCH_SENDER_FRACTION = _env_float("EPSCOPE_DISPATCH_SENDER_FRACTION")


COMBINE_SENDER_FRACTION = _env_float("EPSCOPE_COMBINE_SENDER_FRACTION")


DISPATCH_SPLIT = ((24, 0.625), (64, 0.5))


COMBINE_SPLIT = ((24, 0.375), (64, 0.5))


# chunks per sender block: 8 was best at 24 and 64 SMs (run 2); more chunks = earlier copy-out
CHUNKS_PER_SENDER_BLOCK = int(os.environ.get("EPSCOPE_CHUNKS_PER_SENDER_BLOCK", "8"))


def _split(num_sms: int, table) -> float:
    (s0, f0), (s1, f1) = table
    if num_sms <= s0:
        return f0
    if num_sms >= s1:
        return f1
    return f0 + (f1 - f0) * (num_sms - s0) / (s1 - s0)


def _kernel_tma_buffers(config: Config, hook: bool) -> int:
    """Staging buffers per warp the kernels run with: Config.kernel_tma_buffers, except in hook
    mode, whose pack / receive kernels are the bulk-copy path's whatever Config.path says (the
    direct path has no send-only or receive-only half): Config.num_tma_buffers."""
    return int(config.num_tma_buffers) if hook else config.kernel_tma_buffers


def _align(n: int, a: int = REGION_ALIGN) -> int:
    return (n + a - 1) // a * a


def _role_blocks(num_blocks: int, num_senders: int) -> int:
    """Blocks of the smaller role, for the profile capacity bound (_prof_geometry): senders or
    receivers; every block when a one-rank combine has no senders."""
    return min(num_senders, max(num_blocks - num_senders, 1)) if num_senders else num_blocks


class BufferPlans:
    """Argument checks, row regions, block split and plans of ep_core.Buffer (see the module docstring)."""

    # -- row regions -----------------------------------------------------------------------------
    def _regions(self, hidden_bytes: int, num_scales: int, idx_k: int, w_k: int) -> list[int]:
        """Byte offsets (x, scales, topk_idx, topk_weights) and row capacity of the data region;
        every rank computes the same ones from the same call arguments."""
        base = int(self.limits["data_offset"])
        per_row = hidden_bytes + num_scales * 4 + idx_k * 8 + w_k * 4
        cap = max((self.num_nvl_bytes - base - 4 * REGION_ALIGN) // per_row, 0)
        x = base
        s = _align(x + cap * hidden_bytes)
        i = _align(s + cap * num_scales * 4)
        w = _align(i + cap * idx_k * 8)
        assert w + cap * w_k * 4 <= self.num_nvl_bytes
        return [x, s, i, w, int(cap)]

    def _hook_regions(self, hidden_bytes: int, num_scales: int, idx_k: int, w_k: int) -> tuple[list[int], list[int]]:
        """A hook-mode dispatch's regions: the receive regions (what peers copy into; the same
        offsets on every rank) and, after them, the staging regions this rank packs its peers'
        rows into, the data region split R : R - 1 (get_hook_buffer_size_hint)."""
        base = int(self.limits["data_offset"])
        R = self.group_size
        per_row = hidden_bytes + num_scales * 4 + idx_k * 8 + w_k * 4
        total = max((self.num_nvl_bytes - base - 8 * REGION_ALIGN) // per_row, 0)
        recv_cap = total * R // (2 * R - 1)

        def lay(start: int, cap: int) -> list[int]:
            x = _align(start)
            sc = _align(x + cap * hidden_bytes)
            i = _align(sc + cap * num_scales * 4)
            w = _align(i + cap * idx_k * 8)
            return [x, sc, i, w, int(cap)]

        recv = lay(base, recv_cap)
        stage = lay(recv[3] + recv_cap * w_k * 4, total - recv_cap)
        assert stage[3] + stage[4] * w_k * 4 <= self.num_nvl_bytes
        return recv, stage

    def _row_regions(self, ext, hidden_bytes: int, num_scales: int, idx_k: int, w_k: int):
        x, s, i, w, cap = self._regions(hidden_bytes, num_scales, idx_k, w_k)
        return ext.RowRegions(x=x, scales=s, topk_idx=i, topk_weights=w, capacity=cap)

    def _chunking(self, num_tokens: int, num_sender_blocks: int, config: Config) -> tuple[int, int]:
        if num_tokens == 0:
            return 1, 0
        want = max(num_sender_blocks * CHUNKS_PER_SENDER_BLOCK, 1)
        size = max(config.num_max_nvl_chunked_send_tokens, math.ceil(num_tokens / want),
                   math.ceil(num_tokens / self.limits["max_chunks"]))
        return size, math.ceil(num_tokens / size)

    def _dispatch_blocks(self, config: Config, hook: bool = False) -> tuple[int, int]:
        n = int(config.num_sms)
        if self.group_size == 1 or hook:  # a hook-mode send is senders only (its receive runs later)
            return n, n
        frac = DISPATCH_SENDER_FRACTION if DISPATCH_SENDER_FRACTION is not None else _split(n, DISPATCH_SPLIT)
        senders = min(max(int(round(n * frac)), 1), n - 1)
        return n, senders

    def _combine_blocks(self, config: Config) -> tuple[int, int]:
        n = int(config.num_sms)
        if self.group_size == 1:
            # one rank sends nothing back (its rows are its own): every block reduces. A sender
            # block here did no work at all, and the idle page said so on every one-rank run.
            return n, 0
        frac = COMBINE_SENDER_FRACTION if COMBINE_SENDER_FRACTION is not None else _split(n, COMBINE_SPLIT)
        senders = min(max(int(round(n * frac)), 1), n - 1)
        return n, senders

    def _check_experts(self, num_experts: int, num_topk: int) -> None:
        R = self.group_size
        if num_experts <= 0 or num_experts % R or num_experts > MAX_EXPERTS:
            raise ValueError(f"ep_core: num_experts must be a positive multiple of the rank count ({R}) up to "
                             f"{MAX_EXPERTS}, got {num_experts}")
        if not 1 <= num_topk <= MAX_TOPK:
            raise ValueError(f"ep_core: num_topk must be in 1..{MAX_TOPK}, got {num_topk}")

    def _check_x(self, x_data, x_scales) -> tuple[int, int]:
        if not isinstance(x_data, torch.Tensor) or x_data.dim() != 2 or x_data.device != self.device:
            raise ValueError(f"ep_core: x must be a [num_tokens, hidden] tensor on {self.device} (or an (x_fp8, "
                             f"scales) tuple)")
        if not x_data.is_contiguous():
            raise ValueError("ep_core: x must be contiguous")
        T, H = x_data.shape
        if H <= 0 or H % SCALE_BLOCK or H > MAX_HIDDEN:
            raise ValueError(f"ep_core: hidden must be a positive multiple of {SCALE_BLOCK} up to {MAX_HIDDEN}, got {H}")
        if x_scales is None:
            if x_data.dtype != torch.bfloat16:
                raise ValueError(f"ep_core: x must be bfloat16 (or an (float8_e4m3fn, scales) tuple), got {x_data.dtype}")
        else:
            if x_data.dtype != torch.float8_e4m3fn:
                raise ValueError(f"ep_core: FP8 x must be float8_e4m3fn, got {x_data.dtype}")
            if (not isinstance(x_scales, torch.Tensor) or x_scales.dim() != 2
                    or tuple(x_scales.shape) != (T, H // SCALE_BLOCK)
                    or x_scales.dtype != torch.float32 or x_scales.device != self.device):
                raise ValueError(f"ep_core: FP8 scales must be float32 [{T}, {H // SCALE_BLOCK}] (row- or "
                                 f"column-major), got {getattr(x_scales, 'dtype', type(x_scales).__name__)} "
                                 f"{tuple(getattr(x_scales, 'shape', ()))}")
        return T, H

    def _check_cached_dispatch(self, handle, x_data, x_scales, num_worst_tokens: int) -> tuple[int, int]:
        if not isinstance(handle, DispatchHandle):
            raise ValueError("ep_core: cached dispatch needs the handle returned by this Buffer's dispatch")
        T, H = self._check_x(x_data, x_scales)
        if handle.num_tokens != T:
            raise ValueError(f"ep_core: cached dispatch of {T} tokens with a handle of {handle.num_tokens}")
        if handle.hidden != H:
            raise ValueError(f"ep_core: cached dispatch of hidden {H} with a handle of hidden {handle.hidden}")
        if num_worst_tokens < 0:
            raise ValueError(f"ep_core: num_worst_tokens must be >= 0, got {num_worst_tokens}")
        # checks against the fullest rank's rows (in the handle, the same number on every rank),
        # so every rank raises together instead of leaving its peers to time out
        if num_worst_tokens and handle.max_recv_rows > num_worst_tokens:
            raise ValueError(f"ep_core: num_worst_tokens={num_worst_tokens} < {handle.max_recv_rows} "
                             f"rows received by the fullest rank")
        return T, H

    def _cached_dispatch_plan(self, build: _Build, handle: DispatchHandle, x_data, x_scales, config: Config,
                              num_worst_tokens: int, hook: bool = False) -> _Plan:
        """Validate a cached dispatch's arguments once for this key and build its plan."""
        T, H = self._check_cached_dispatch(handle, x_data, x_scales, num_worst_tokens)
        hidden_bytes = H * x_data.element_size()
        num_scales = H // SCALE_BLOCK if x_scales is not None else 0
        regions, stage = (self._hook_regions(hidden_bytes, num_scales, 0, 0) if hook
                          else (self._regions(hidden_bytes, num_scales, 0, 0), None))
        need = max(handle.max_recv_rows, num_worst_tokens)
        if need > regions[4]:
            raise EPCapacityError(f"ep_core: this dispatch needs {need} rows on one rank, the buffer holds {regions[4]} "
                                  f"rows of {hidden_bytes} B (+ scales/top-k) (Buffer.get_"
                                  f"{'hook_' if hook else ''}buffer_size_hint)")
        rank_prefix = None
        if hook:
            rank_prefix = self._hook_rank_prefix(handle)
            self._check_hook_capacity(rank_prefix, regions[4], stage[4])
        rows = num_worst_tokens if num_worst_tokens else handle.num_recv_rows
        return self._dispatch_plan(build, handle, H, x_scales is not None, 0, False, self.group_size, rows,
                                   regions, config, open_op=True, stage=stage, rank_prefix=rank_prefix)

    def _dispatch_plan(self, build: _Build, handle: DispatchHandle, hidden: int, fp8: bool, num_topk: int,
                       with_weights: bool, num_experts: int, rows: int, regions: list, config: Config,
                       open_op: bool, stage: list | None = None, rank_prefix: list | None = None) -> _Plan:
        """`stage` (with `rank_prefix`) makes a hook-mode plan: its send packs into the staging regions."""
        hook = stage is not None
        num_blocks, num_senders = self._dispatch_blocks(config, hook)
        fill_from = min(max(handle.num_recv_tokens, 0), rows)
        ext = build.ext
        cpp = ext.DispatchPlan(
            handle=handle.kernel_tensors(ext), rows=ext.RowRegions(
                x=regions[0], scales=regions[1], topk_idx=regions[2], topk_weights=regions[3], capacity=regions[4]),
            hidden=hidden, fp8=fp8, num_topk=num_topk, with_weights=with_weights, num_experts=num_experts,
            recv_rows=rows, fill_from=fill_from, num_blocks=num_blocks, num_sender_blocks=num_senders, open_op=open_op,
            num_tma_buffers=_kernel_tma_buffers(config, hook), hook=hook, rank_prefix=rank_prefix if hook else [],
            stage=None if stage is None else ext.RowRegions(x=stage[0], scales=stage[1], topk_idx=stage[2],
                                                            topk_weights=stage[3], capacity=stage[4]))
        warps = self.limits["threads"] // 32
        # the bulk-copy path also records its stalls (stage_wait, per row): the session's capacity
        tma = _kernel_tma_buffers(config, hook) > 0
        prof_kernel = self._prof_geometry("dispatch", num_blocks, warps,
                                          units=0 if tma else self.group_size * handle.num_chunks,
                                          role_blocks=_role_blocks(num_blocks, num_senders))
        prof_open = self._prof_geometry("barrier", 1, 1) if open_op else None
        if not hook:
            return _Plan(config, cpp, prof_open, prof_kernel)
        # a hook-mode op's launches are all profiled as its kernel, `dispatch` (their phases tell the
        # send, pack, from the signal, publish_hook, and the receive, wait_hook / copy_out), so a
        # comparison with the normal mode compares the same kernels: send + signal + receive time
        return _Plan(config, cpp, prof_open, prof_kernel, self._prof_geometry("dispatch", 1, 1),
                     self._prof_geometry("dispatch", num_blocks, warps))

    def _check_combine_args(self, handle: DispatchHandle, x, topk_weights, biases) -> int:
        """The checks of a combine's arguments with the error a user can act on; returns top-k."""
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16 or x.device != self.device:
            raise ValueError(f"ep_core: combine x must be a bf16 [num_recv_tokens, hidden] tensor on {self.device}, got "
                             f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
        H = x.size(1)
        if H != handle.hidden:
            raise ValueError(f"ep_core: combine hidden {H} differs from the dispatch's {handle.hidden}")
        if handle.num_recv_tokens >= 0 and x.size(0) < handle.num_recv_tokens:
            raise ValueError(f"ep_core: combine x has {x.size(0)} rows, the dispatch received {handle.num_recv_tokens}")
        K = 0
        if topk_weights is not None:
            if topk_weights.dim() != 2 or topk_weights.size(0) != x.size(0) or topk_weights.dtype != torch.float32:
                raise ValueError(f"ep_core: combine topk_weights must be float32 [{x.size(0)}, num_topk], got "
                                 f"{topk_weights.dtype} {tuple(topk_weights.shape)}")
            K = topk_weights.size(1)
            if K > MAX_TOPK:
                raise ValueError(f"ep_core: num_topk must be <= {MAX_TOPK}, got {K}")
        T = handle.num_tokens
        for b in biases:
            if b is not None and (tuple(b.shape) != (T, H) or b.dtype != torch.bfloat16):
                raise ValueError(f"ep_core: bias must be bf16 [{T}, {H}], got {b.dtype} {tuple(b.shape)}")
        return K

    def _combine_plan(self, build: _Build, handle: DispatchHandle, x, topk_weights, config: Config,
                      hook: bool = False) -> _Plan:
        K = self._check_combine_args(handle, x, topk_weights, ())
        H = handle.hidden
        regions = self._regions(H * 2, 0, 0, K)
        if handle.max_combine_rows > regions[4]:
            raise EPCapacityError(f"ep_core: this combine sends {handle.max_combine_rows} rows back to one rank, the "
                                  f"buffer holds {regions[4]} (Buffer.get_buffer_size_hint)")
        rank_prefix = None
        if hook:  # the copies are planned on the host: the same check, from the host copy of the handle
            rank_prefix = self._hook_rank_prefix(handle)
            self._check_hook_capacity(rank_prefix, regions[4], None)
        num_blocks, num_senders = self._combine_blocks(config)
        tma = _kernel_tma_buffers(config, hook)
        cpp = build.ext.CombinePlan(handle=handle.kernel_tensors(build.ext), rows=build.ext.RowRegions(
            x=regions[0], scales=regions[1], topk_idx=regions[2], topk_weights=regions[3], capacity=regions[4]),
            hidden=H, num_topk=K, min_rows=max(handle.num_recv_tokens, 0), num_blocks=num_blocks,
            num_sender_blocks=num_senders, num_tma_buffers=tma, hook=hook, rank_prefix=rank_prefix or [])
        warps = self.limits["threads"] // 32
        prof_open = self._prof_geometry("barrier", 1, 1)
        if hook:  # the reducers run in the receive half, on every block
            return _Plan(config, cpp, prof_open, self._prof_geometry("combine", num_blocks, warps),
                         self._prof_geometry("combine", 1, 1), self._prof_geometry("combine", num_blocks, warps))
        prof_kernel = self._prof_geometry("combine", num_blocks, warps,
                                          units=0 if tma else self.group_size * handle.num_chunks,
                                          role_blocks=_role_blocks(num_blocks, num_senders))
        return _Plan(config, cpp, prof_open, prof_kernel)

    def _check_fresh_dispatch(self, T: int, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, topk_idx,
                              topk_weights, expert_alignment: int, num_worst_tokens: int) -> int:
        """The arguments of a dispatch without a handle, checked before anything launches; returns
        the expert count."""
        R = self.group_size
        if num_tokens_per_rank is None or is_token_in_rank is None or num_tokens_per_expert is None:
            raise ValueError("ep_core: dispatch needs num_tokens_per_rank, is_token_in_rank and "
                             "num_tokens_per_expert (from get_dispatch_layout) or a handle")
        if tuple(is_token_in_rank.shape) != (T, R) or is_token_in_rank.dtype != torch.bool:
            raise ValueError(f"ep_core: is_token_in_rank must be bool [{T}, {R}], got "
                             f"{is_token_in_rank.dtype} {tuple(is_token_in_rank.shape)}")
        E = num_tokens_per_expert.numel()
        if topk_idx is not None:
            if tuple(topk_idx.shape[:1]) != (T,) or topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t:
                raise ValueError(f"ep_core: topk_idx must be {topk_idx_t} [{T}, num_topk], got "
                                 f"{topk_idx.dtype} {tuple(topk_idx.shape)}")
            self._check_experts(E, topk_idx.size(1))
            if topk_weights is not None and (tuple(topk_weights.shape) != tuple(topk_idx.shape)
                                             or topk_weights.dtype != torch.float32):
                raise ValueError(f"ep_core: topk_weights must be float32 {tuple(topk_idx.shape)}, got "
                                 f"{topk_weights.dtype} {tuple(topk_weights.shape)}")
        elif topk_weights is not None:
            raise ValueError("ep_core: topk_weights without topk_idx")
        if E <= 0 or E % R or E > MAX_EXPERTS:
            raise ValueError(f"ep_core: num_experts ({E}) must be a positive multiple of {R} up to {MAX_EXPERTS}")
        if expert_alignment < 1:
            raise ValueError(f"ep_core: expert_alignment must be >= 1, got {expert_alignment}")
        if num_worst_tokens < 0:
            raise ValueError(f"ep_core: num_worst_tokens must be >= 0, got {num_worst_tokens}")
        return E
