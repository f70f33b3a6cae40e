"""The launches of the normal path (Buffer's launch seam): get_dispatch_layout, dispatch (fresh:
notify, read-back, dispatch; cached: one launch of a cached plan) and combine, and how a call's
streams are ordered (`_stream_mode`, `_finish`). Arguments are checked and plans built in
ep_core/buffer_plans.py; hook mode is ep_core/buffer_hook.py. `BufferOps` is a part of
ep_core.Buffer; ep_core/buffer.py's module docstring describes the calls.
"""
from __future__ import annotations

import math
from time import perf_counter_ns

import torch

from .buffer_profile import FAMILY, labelled
from .config import SCALE_BLOCK, Config
from .errors import EPCapacityError
from .handles import DispatchHandle, PlanCache, _Build, _Plan
from .streams import _NO_EVENT, EventOverlap, topk_idx_t


class BufferOps:
    """get_dispatch_layout, dispatch and combine of ep_core.Buffer (DeepEP's names and signatures)."""

    # -- stream plumbing -------------------------------------------------------------------------
    def _stream_mode(self, build: _Build, previous_event, async_finish: bool, allocate_on_comm_stream: bool,
                     fork: bool = True):
        compute = self._raw_stream()
        if previous_event is not None and previous_event.event is not None:
            self.comm_stream.wait_event(previous_event.event)
            fork = False
        return build.mode(compute, fork, not async_finish, bool(async_finish), bool(allocate_on_comm_stream))

    def _finish(self, async_finish: bool, allocate_on_comm_stream: bool, tensors, session) -> EventOverlap:
        """After the launches: the caller's event (async_finish) and, with outputs allocated on the
        comm stream, their use on the caller's stream; a device error already flagged is raised
        (a host-mapped read, no sync), with the partial profile saved when profiling."""
        if allocate_on_comm_stream:
            compute = torch.cuda.current_stream(self.device)
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    t.record_stream(compute)
        if self._err.flag():
            self._raise_device_error(session)
        if async_finish:
            ev = torch.cuda.Event()
            ev.record(self.comm_stream)
            return EventOverlap(ev, tuple(t for t in tensors if isinstance(t, torch.Tensor)))
        return EventOverlap(None)

    @staticmethod
    def capture() -> EventOverlap:
        """An event recorded on the current stream (DeepEP's static method)."""
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return EventOverlap(ev)

    # -- get_dispatch_layout ---------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event: EventOverlap | None = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None):
        if not self._usable_fast():
            self._check_usable()
        if topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t or topk_idx.device != self.device:
            raise ValueError(f"ep_core: topk_idx must be a {topk_idx_t} [num_tokens, num_topk] tensor on {self.device}, got "
                             f"{topk_idx.dtype} {tuple(topk_idx.shape)}")
        self._check_experts(num_experts, topk_idx.size(1))
        session = self._session_for(profile)
        build = self._build(session is not None)
        mode = self._stream_mode(build, previous_event, async_finish, allocate_on_comm_stream)
        if session is None:
            out = build.launcher.layout(topk_idx, num_experts, mode, 0)
        else:
            t0, first = perf_counter_ns(), session.num_launches
            it = self._iteration(new=True)
            grid = int(build.ext.layout_grid(topk_idx.size(0)))
            with labelled(session):
                out = build.launcher.layout(topk_idx, num_experts, mode,
                                            self._slot(session, ("layout", FAMILY, grid, 8, None), it))
            session.host_call("get_dispatch_layout", it, t0, perf_counter_ns(), first)
        per_rank, per_expert, in_rank = out.num_tokens_per_rank, out.num_tokens_per_expert, out.is_token_in_rank
        event = self._finish(async_finish, allocate_on_comm_stream, (topk_idx, per_rank, per_expert, in_rank), session)
        return per_rank, None, per_expert, in_rank, event

    # -- dispatch --------------------------------------------------------------------------------
    def dispatch(self, x, handle: DispatchHandle | None = None, num_tokens_per_rank: torch.Tensor | None = None,
                 num_tokens_per_rdma_rank: torch.Tensor | None = None, is_token_in_rank: torch.Tensor | None = None,
                 num_tokens_per_expert: torch.Tensor | None = None, topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Config | None = None, previous_event: EventOverlap | None = None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None,
                 return_recv_hook: bool = False):
        """DeepEP's dispatch. With `return_recv_hook=True` (ep_core's addition, seed 000) the call
        issues the send half only and returns at once with a RecvHook appended to the tuple;
        calling it launches the receive (see the module docstring, "Hook mode")."""
        if not self._usable_fast():
            self._check_usable()
        if self._pending_hook is not None or (return_recv_hook and async_finish):
            self._check_hook_call(return_recv_hook, async_finish)
        if num_tokens_per_rdma_rank is not None:
            raise NotImplementedError("ep_core: num_tokens_per_rdma_rank is internode-only (not implemented)")
        if type(x) is tuple:
            x_data, x_scales = x
        else:
            x_data, x_scales = x, None
        session = self._session if profile is None or profile is False else self._session_for(profile)
        if config is None:
            shape = getattr(x_data, "shape", ())   # not validated yet: a bad x gets the table, then its error
            config = self._default_config("dispatch", *(shape if len(shape) == 2 else (0, 0)),
                                          "fp8" if x_scales is not None else "bf16")
        hook = bool(return_recv_hook)
        if handle is None:
            return self._dispatch_fresh(x_data, x_scales, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
                                        topk_idx, topk_weights, expert_alignment, num_worst_tokens, config,
                                        previous_event, async_finish, allocate_on_comm_stream, session, hook)
        if topk_idx is not None or topk_weights is not None:
            raise ValueError("ep_core: cached dispatch (handle given) takes no topk_idx / topk_weights")
        build = self._build(session is not None)
        key = ("dispatch", build.profile, x_scales is not None, id(config), num_worst_tokens, hook)
        plan = handle.cache.plans.get(key)
        if plan is None or plan.config is not config:
            plan = handle.cache.plans[key] = self._cached_dispatch_plan(build, handle, x_data, x_scales, config,
                                                                        num_worst_tokens, hook)
        # a hook-mode send never joins the caller's stream: its outputs are complete when the hook ran
        mode = self._stream_mode(build, previous_event, async_finish or hook, allocate_on_comm_stream)
        try:
            if hook:
                out, recv_hook = self._dispatch_hook(build, plan, x_data, x_scales, None, None, mode, session)
            else:
                out = self._launch_dispatch(build, plan, x_data, x_scales, None, None, mode, session,
                                            new_iteration=False)
        except RuntimeError:
            # the extension checks every call's tensors before it launches anything; say what is
            # wrong the way the plan's first call would (ValueError naming the argument), else re-raise
            self._check_cached_dispatch(handle, x_data, x_scales, num_worst_tokens)
            raise
        event = self._finish(async_finish, allocate_on_comm_stream,
                             (x_data, x_scales, out.x, out.scales), session) if async_finish or \
            allocate_on_comm_stream or self._err.flag() else _NO_EVENT
        recv = (out.x, out.scales) if x_scales is not None else out.x
        if hook:
            return recv, None, None, [], handle, event, recv_hook
        return recv, None, None, [], handle, event

    def _launch_dispatch(self, build: _Build, plan: _Plan, x_data, x_scales, topk_idx, topk_weights, mode, session,
                         new_iteration: bool):
        if session is None:
            return build.launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, 0, 0)
        t0, first = perf_counter_ns(), session.num_launches
        it = self._iteration(new=new_iteration)
        with labelled(session):
            p_open = self._slot(session, plan.prof_open, it) if plan.prof_open is not None else 0
            out = build.launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, p_open,
                                          self._slot(session, plan.prof_kernel, it))
        session.host_call("dispatch", it, t0, perf_counter_ns(), first)
        return out

    def _dispatch_fresh(self, x_data, x_scales, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
                        topk_idx, topk_weights, expert_alignment, num_worst_tokens, config, previous_event,
                        async_finish, allocate_on_comm_stream, session, hook: bool = False):
        """A dispatch without a handle: notify (the count exchange), the read-back of the counts
        (the one host sync, skipped with num_worst_tokens unless `hook`: the peer copies are sized
        on the host), then the dispatch kernel (or, with `hook`, the send half)."""
        R = self.group_size
        T, H = self._check_x(x_data, x_scales)
        E = self._check_fresh_dispatch(T, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert, topk_idx,
                                       topk_weights, expert_alignment, num_worst_tokens)
        K = topk_idx.size(1) if topk_idx is not None else 0
        hidden_bytes = H * x_data.element_size()
        num_scales = H // SCALE_BLOCK if x_scales is not None else 0
        w_k = K if topk_weights is not None else 0
        regions, stage = (self._hook_regions(hidden_bytes, num_scales, K, w_k) if hook
                          else (self._regions(hidden_bytes, num_scales, K, w_k), None))
        num_blocks, num_senders = self._dispatch_blocks(config, hook)
        build = self._build(session is not None)
        mode = self._stream_mode(build, previous_event, async_finish, allocate_on_comm_stream)
        compute = mode.compute
        t0 = perf_counter_ns()
        first = session.num_launches if session is not None else 0
        it = self._iteration(new=True) if session is not None else 0
        chunk_size, num_chunks = self._chunking(T, num_senders, config)
        # the conversions launch kernels of their own: outside the launch's profiler label
        in_rank, per_expert = is_token_in_rank.contiguous(), num_tokens_per_expert.to(torch.int32).contiguous()
        with labelled(session):
            prof = (self._slot(session, self._prof_geometry("notify", 1, self.limits["notify_threads"] // 32), it)
                    if session is not None else 0)
            notified = build.launcher.notify(in_rank, per_expert, E, chunk_size, num_chunks, int(expert_alignment),
                                             mode, prof)
        h = notified.handle
        num_recv, expert_list, rows, need, combine_rows, rpm_host = self._received_rows(build, notified,
                                                                                     num_worst_tokens, hook)
        if need > regions[4]:
            hint = self.get_hook_buffer_size_hint if hook else self.get_buffer_size_hint
            raise EPCapacityError(
                f"ep_core: this dispatch puts {need} rows on one rank but the buffer holds {regions[4]} rows "
                f"of {hidden_bytes} B (+ scales/top-k); create the Buffer with num_nvl_bytes >= "
                f"{hint(math.ceil(need / R), H, R, max(K, 1))} (Buffer.{hint.__name__})")
        flat = None if rpm_host is None else [v for row in rpm_host for v in row]
        if hook:
            self._check_hook_capacity(flat, regions[4], stage[4])
        handle = DispatchHandle(h.rank_prefix_matrix, h.send_chunk_prefix, h.recv_chunk_prefix, h.recv_num_chunks,
                                h.send_pos, h.is_token_in_rank, T, H, chunk_size, num_chunks, num_recv, rows,
                                combine_rows, need, PlanCache(flat))
        plan = self._dispatch_plan(build, handle, H, x_scales is not None, K, topk_weights is not None, E, rows,
                                   regions, config, open_op=False, stage=stage, rank_prefix=flat)
        # the comm stream already waits for the caller (notify forked it); a hook-mode send never joins
        join = not (async_finish or hook)
        mode = build.mode(compute, False, join, not join, bool(allocate_on_comm_stream))
        recv_hook = None
        if hook:
            out, recv_hook = self._dispatch_hook(build, plan, x_data, x_scales, topk_idx, topk_weights, mode, session,
                                                 None if session is None else (it, t0, first))
        elif session is None:
            out = self._launch_dispatch(build, plan, x_data, x_scales, topk_idx, topk_weights, mode, None, False)
        else:
            with labelled(session):
                out = build.launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, 0,
                                              self._slot(session, plan.prof_kernel, it))
            session.host_call("dispatch", it, t0, perf_counter_ns(), first)
        event = self._finish(async_finish, allocate_on_comm_stream,
                             (x_data, x_scales, topk_idx, topk_weights, out.x, out.scales, out.topk_idx,
                              out.topk_weights, h.send_pos, h.send_chunk_prefix, h.rank_prefix_matrix,
                              h.recv_chunk_prefix, h.recv_num_chunks), session)
        recv = (out.x, out.scales) if x_scales is not None else out.x
        if hook:
            return recv, out.topk_idx, out.topk_weights, expert_list, handle, event, recv_hook
        return recv, out.topk_idx, out.topk_weights, expert_list, handle, event

    def _received_rows(self, build: _Build, notified, num_worst_tokens: int, hook: bool) -> tuple:
        """After notify: (num_recv, per-expert counts, rows of recv_x, rows the fullest rank
        receives, rows any rank sends back in combine, rank_prefix_matrix on the host or None),
        read back from the device (the one host sync), or from num_worst_tokens without a sync
        (a hook-mode send reads back anyway: the peer copies are sized on the host)."""
        R = self.group_size
        rpm_host = None
        if num_worst_tokens == 0 or hook:
            info, rpm_host = self._read_back(build, notified)
        if num_worst_tokens:
            return -1, [], num_worst_tokens, num_worst_tokens, -1, rpm_host
        m = rpm_host  # rows j receives from ranks 0..i
        counts = [[m[i][j] - (m[i - 1][j] if i else 0) for j in range(R)] for i in range(R)]
        combine_rows = max(sum(c) - c[i] for i, c in enumerate(counts))
        return info[0], info[1:], info[0], max(m[-1]), combine_rows, rpm_host

    def _read_back(self, build: _Build, notified) -> tuple[list[int], list[list[int]]]:
        """The one host sync of a non-cached dispatch: received rows, per-expert counts, rpm."""
        R = self.group_size
        n = notified.recv_info.numel() + R * R
        if self._info_host is None or self._info_host.numel() < n:
            # device="cpu" named: a caller's torch.set_default_device('cuda') must not move it (issue 35)
            self._info_host = torch.empty(max(n, 1024), dtype=torch.int32, device="cpu",
                                          pin_memory=self.device.type == "cuda")
        build.launcher.read_back(notified, self._info_host.data_ptr())
        self._raise_device_error()
        # .tolist(): iterating a tensor element by element costs ~2 µs per element (v1 spent
        # ~550 µs here per dispatch, benchmarks/NOTES.md)
        vals = self._info_host[:n].tolist()
        k = notified.recv_info.numel()
        return vals[:k], [vals[k + i * R: k + (i + 1) * R] for i in range(R)]

    # -- combine ---------------------------------------------------------------------------------
    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None,
                bias=None, config: Config | None = None, previous_event: EventOverlap | None = None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None,
                return_recv_hook: bool = False):
        """DeepEP's combine. With `return_recv_hook=True` the call issues the send half only (peer
        copies of x's rows) and returns a RecvHook as a fourth element; calling it reduces."""
        if not self._usable_fast():
            self._check_usable()
        if self._pending_hook is not None or (return_recv_hook and async_finish):
            self._check_hook_call(return_recv_hook, async_finish)
        session = self._session if profile is None or profile is False else self._session_for(profile)
        if config is None:
            shape = getattr(x, "shape", ())
            config = self._default_config("combine", getattr(handle, "num_tokens", 0),
                                          shape[1] if len(shape) == 2 else 0, "bf16")
        if not isinstance(handle, DispatchHandle):
            raise ValueError("ep_core: combine needs the handle returned by this Buffer's dispatch")
        if bias is None:
            b0 = b1 = None
        elif isinstance(bias, (tuple, list)):
            if len(bias) > 2:
                raise ValueError("ep_core: bias is a tensor or a pair of tensors")
            b0 = bias[0] if len(bias) > 0 else None
            b1 = bias[1] if len(bias) > 1 else None
        else:
            b0, b1 = bias, None
        build = self._build(session is not None)
        K = topk_weights.size(1) if topk_weights is not None and topk_weights.dim() == 2 else (
            -1 if topk_weights is not None else 0)
        hook = bool(return_recv_hook)
        key = ("combine", build.profile, id(config), K, hook)
        plan = handle.cache.plans.get(key)
        if plan is None or plan.config is not config:
            plan = handle.cache.plans[key] = self._combine_plan(build, handle, x, topk_weights, config, hook)
        mode = self._stream_mode(build, previous_event, async_finish or hook, allocate_on_comm_stream)
        try:
            if hook:
                return self._combine_hook(build, plan, x, topk_weights, b0, b1, mode, session,
                                          allocate_on_comm_stream)
            if session is None:
                out = build.launcher.combine(plan.cpp, x, topk_weights, b0, b1, mode, 0, 0)
            else:
                t0, first = perf_counter_ns(), session.num_launches
                it = self._iteration(new=False)
                with labelled(session):
                    out = build.launcher.combine(plan.cpp, x, topk_weights, b0, b1, mode,
                                                 self._slot(session, plan.prof_open, it),
                                                 self._slot(session, plan.prof_kernel, it))
                session.host_call("combine", it, t0, perf_counter_ns(), first)
        except RuntimeError:
            self._check_combine_args(handle, x, topk_weights, (b0, b1))
            raise
        if async_finish or allocate_on_comm_stream or self._err.flag():
            return out.x, out.topk_weights, self._finish(async_finish, allocate_on_comm_stream,
                                                         (x, topk_weights, b0, b1, out.x, out.topk_weights), session)
        return out.x, out.topk_weights, _NO_EVENT
