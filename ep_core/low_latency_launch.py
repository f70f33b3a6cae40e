"""The launches of the low-latency calls (LowLatency's launch seam): the op order on the host
(`_open`: epochs, halves, pending hooks), a launch on the caller's stream or the comm stream with
its event, the recv hooks in op order, and each profiled launch's slot in the session's pool.
`LowLatencyLaunches` is a part of ep_core.low_latency.LowLatency.
"""
from __future__ import annotations

import math
from time import perf_counter_ns

from .low_latency_handles import RecvHook
from .low_latency_layout import FAMILY, GROUP, RECV_PHASE, SEND_PHASE, LowLatencyConfig, LowLatencyLayout


class LowLatencyLaunches:
    """Launches, recv hooks and profiled launch slots of ep_core's LowLatency (see the module docstring)."""

    # -- per-build objects -------------------------------------------------------------------------
    def _launcher(self, build):
        ext = build.ext
        lau = self._launchers.get(id(ext))
        if lau is None:
            lau = self._launchers[id(ext)] = ext.LLLauncher(
                peers=list(self.peers.ptrs), rank=self.buffer.rank, error_device=self._err.device,
                timeout_ns=int(self.buffer.timeout_s * 1e9))
        return lau

    # -- the hook protocol -------------------------------------------------------------------------
    def _open(self, with_hook: bool) -> int:
        """The host's view of the op order (see the module docstring); returns the op number."""
        n = self._ops + 1
        if self._pending:
            if not with_hook:
                raise ValueError(f"ep_core: call the pending recv hook(s) of low-latency op(s) {list(self._pending)} "
                                 f"before a call without return_recv_hook (its receive would run first)")
            if self._pending[0] <= n - 2:
                raise ValueError(f"ep_core: the recv hook of low-latency op {self._pending[0]} must be called before "
                                 f"op {n} is issued (the buffer has two halves: at most two ops in flight)")
        self._ops = n
        return n

    def _hook(self, n: int, kind: str, launch, cfg: LowLatencyConfig) -> RecvHook:
        self._pending.append(n)
        if cfg.host == "per_call":
            return RecvHook(self, n, kind, launch)
        key = (kind, n & 1)
        h = self._hooks.get(key)
        if h is None:
            h = self._hooks[key] = RecvHook(self, n, kind, launch)
        else:
            h.op, h.launch, h.called = n, launch, False
        return h

    def _run_hook(self, hook: RecvHook) -> None:
        if hook.called:
            raise ValueError(f"ep_core: the recv hook of low-latency op {hook.op} was already called")
        if not self._pending or self._pending[0] != hook.op:
            raise ValueError(f"ep_core: recv hooks must be called in op order: op {hook.op} was called while "
                             f"{list(self._pending)} are pending")
        self._check_usable()
        self._pending.popleft()
        hook.called = True
        hook.launch()

    # -- launching -----------------------------------------------------------------------------------
    def _slot(self, session, kernel: str, cfg: LowLatencyConfig, layout: LowLatencyLayout, iteration: int) -> int:
        """A profile slot: records per warp are bounded by its tasks (a few records each) plus the
        duties and barriers; the finest split is the most tasks a warp can get."""
        warps = cfg.num_blocks * cfg.warps_per_block
        tasks = layout.rows_per_expert * (layout.hidden // GROUP)
        cap = min(session.capacity, 64 + 6 * math.ceil(tasks / warps) + 4 * layout.num_ranks)
        return session.launch_slot(kernel, FAMILY, cfg.num_blocks, cfg.warps_per_block, iteration, cap)

    def _counters(self) -> tuple:
        """The host's op counters before a call: restored when its launch is refused (nothing ran
        on the device, so the host's view of the op order must not move either)."""
        return self._ops, self._dispatches, self._combines

    def _run(self, launch, name: str, n: int, async_finish: bool, with_hook: bool, cfg: LowLatencyConfig, tensors,
             session, iteration: int, t0: int, undo: tuple):
        """Launch an op (both halves, the send half with a hook for the receive half, or on the
        comm stream with an event), record its host time when profiling, look at the error flag."""
        import torch

        from .streams import EventOverlap

        first = session.num_launches if session is not None else 0
        event, hook = EventOverlap(None), None
        if with_hook:
            try:
                launch(SEND_PHASE, name + "_send", self.buffer._raw_stream())
            except ValueError:
                self._ops, self._dispatches, self._combines = undo
                raise
            hook = self._hook(n, name, lambda: self._hook_launch(launch, name, session, iteration), cfg)
        elif async_finish:
            comm = self.buffer.comm_stream
            comm.wait_stream(torch.cuda.current_stream(self.buffer.device))
            try:
                launch(SEND_PHASE | RECV_PHASE, name, comm.cuda_stream)
            except ValueError:
                self._ops, self._dispatches, self._combines = undo
                raise
            for t in tensors:
                if isinstance(t, torch.Tensor):
                    t.record_stream(comm)
            ev = torch.cuda.Event()
            ev.record(comm)
            event = EventOverlap(ev, tuple(tensors))
        else:
            try:
                launch(SEND_PHASE | RECV_PHASE, name, self.buffer._raw_stream())
            except ValueError:
                self._ops, self._dispatches, self._combines = undo
                raise
        if session is not None:
            session.host_call(name, iteration, t0, perf_counter_ns(), first)
        if self._err.flag():
            self._raise_device_error(session)
        return event, hook

    def _hook_launch(self, launch, name: str, session, iteration: int) -> None:
        t0 = perf_counter_ns()
        first = session.num_launches if session is not None else 0
        launch(RECV_PHASE, name + "_recv", self.buffer._raw_stream())
        if session is not None:
            session.host_call(name + "_recv", iteration, t0, perf_counter_ns(), first)
        if self._err.flag():
            self._raise_device_error(session)
