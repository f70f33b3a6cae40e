"""Hook mode of the normal path (seed 000, issue 11; Buffer's hook seam): `dispatch(...,
return_recv_hook=True)` / `combine(...)` issue the send half on the comm stream and return a
RecvHook; calling it launches the receive half on the caller's stream. The rules (one pending
hook per Buffer, called once, no async_finish) and the capacity checks of the peer copies live
here; ep_core/buffer.py's module docstring describes the mode. `BufferHookMode` is a part of
ep_core.Buffer.
"""
from __future__ import annotations

from time import perf_counter_ns

from .buffer_profile import labelled
from .errors import EPCapacityError
from .handles import DispatchHandle, _Build, _Plan


class RecvHook:
    """The receive half of a hook-mode dispatch / combine (`return_recv_hook=True`): calling it
    launches the receive kernel on the current stream. Call it once, before this Buffer's next
    dispatch or combine (the buffer holds the rows of one op)."""

    __slots__ = ("buffer", "kind", "receive", "called")

    def __init__(self, buffer, kind: str, receive):
        self.buffer, self.kind, self.receive, self.called = buffer, kind, receive, False

    def __call__(self) -> None:
        self.buffer._run_hook(self)

    def __repr__(self) -> str:
        return f"RecvHook({self.kind}, {'called' if self.called else 'pending'})"


class BufferHookMode:
    """The hook-mode calls of ep_core.Buffer (see the module docstring)."""

    def _check_hook_call(self, return_recv_hook: bool, async_finish: bool) -> None:
        """The rules of hook mode (see the module docstring), checked before anything launches."""
        if self._pending_hook is not None:
            raise ValueError(f"ep_core: call the recv hook of the pending {self._pending_hook.kind} before this "
                             f"Buffer's next dispatch / combine (the buffer holds the rows of one op)")
        if return_recv_hook and async_finish:
            raise ValueError("ep_core: async_finish and return_recv_hook cannot be combined (the hook completes "
                             "the op on the caller's stream)")

    def _arm_hook(self, kind: str, receive) -> RecvHook:
        h = self._pending_hook = RecvHook(self, kind, receive)
        return h

    def _run_hook(self, hook: RecvHook) -> None:
        if hook.called:
            raise ValueError(f"ep_core: the recv hook of this {hook.kind} was already called")
        if self._pending_hook is not hook:
            raise ValueError(f"ep_core: this {hook.kind}'s recv hook is not the pending one of this Buffer")
        self._check_usable()
        hook.called = True
        self._pending_hook = None
        hook.receive()
        if self._err.flag():
            self._raise_device_error()

    def _receive(self, launch, args: tuple, geometry: tuple, name: str, session, iteration: int) -> None:
        """The receive half of a hook-mode op on the caller's current stream, profiled like its send."""
        compute = self._raw_stream()
        if session is None:
            launch(*args, compute, 0)
            return
        t0, first = perf_counter_ns(), session.num_launches
        with labelled(session):
            launch(*args, compute, self._slot(session, geometry, iteration))
        session.host_call(name, iteration, t0, perf_counter_ns(), first)

    def _dispatch_hook(self, build: _Build, plan: _Plan, x_data, x_scales, topk_idx, topk_weights, mode, session,
                       timing: tuple | None = None):
        """The send half of a hook-mode dispatch (pack, peer copies, signal, on the comm stream)
        and its RecvHook (the copy-out kernel). `timing`: (iteration, t0, first launch) of a call
        whose profiled launches began earlier (the non-cached dispatch's notify)."""
        launcher = build.launcher
        it = 0
        if session is None:
            out = launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, 0, 0, 0)
        else:
            it, t0, first = timing if timing is not None else (self._iteration(new=False), perf_counter_ns(),
                                                                session.num_launches)
            with labelled(session):
                p_open = self._slot(session, plan.prof_open, it) if plan.prof_open is not None else 0
                out = launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, p_open,
                                        self._slot(session, plan.prof_kernel, it),
                                        self._slot(session, plan.prof_signal, it))
            session.host_call("dispatch", it, t0, perf_counter_ns(), first)
        return out, self._arm_hook("dispatch", lambda: self._receive(launcher.dispatch_receive, (plan.cpp, out),
                                                                     plan.prof_recv, "dispatch_hook", session, it))

    def _combine_hook(self, build: _Build, plan: _Plan, x, topk_weights, b0, b1, mode, session,
                      allocate_on_comm_stream: bool):
        """The send half of a hook-mode combine (barrier, peer copies, signal, on the comm stream)
        -> (combined_x, combined_weights, event, hook); the hook runs the reducers."""
        launcher = build.launcher
        it = 0
        if session is None:
            out = launcher.combine(plan.cpp, x, topk_weights, b0, b1, mode, 0, 0, 0)
        else:
            t0, first = perf_counter_ns(), session.num_launches
            it = self._iteration(new=False)
            with labelled(session):
                out = launcher.combine(plan.cpp, x, topk_weights, b0, b1, mode, self._slot(session, plan.prof_open, it),
                                       0, self._slot(session, plan.prof_signal, it))
            session.host_call("combine", it, t0, perf_counter_ns(), first)
        recv_hook = self._arm_hook("combine", lambda: self._receive(
            launcher.combine_receive, (plan.cpp, x, topk_weights, b0, b1, out), plan.prof_recv, "combine_hook",
            session, it))
        event = self._finish(False, allocate_on_comm_stream, (out.x, out.topk_weights), session)
        return out.x, out.topk_weights, event, recv_hook

    def _hook_rank_prefix(self, handle: DispatchHandle) -> list:
        """The handle's rank_prefix_matrix on the host (flattened), read once per handle."""
        if handle.cache.rank_prefix is None:
            handle.cache.rank_prefix = [int(v) for v in handle.rank_prefix_matrix.flatten().tolist()]
        return handle.cache.rank_prefix

    def _check_hook_capacity(self, rank_prefix: list, recv_cap: int, stage_cap: int | None) -> None:
        """Every rank's rows fit: a hook-mode dispatch's rows received (recv_cap) and packed for the
        peers (stage_cap), or a hook-mode combine's rows coming back (recv_cap; stage_cap None).
        Every rank computes the same numbers from rank_prefix, so all ranks raise together."""
        R = self.group_size
        m = [rank_prefix[i * R:(i + 1) * R] for i in range(R)]
        counts = [[m[i][j] - (m[i - 1][j] if i else 0) for j in range(R)] for i in range(R)]
        sent = max(sum(c) - c[i] for i, c in enumerate(counts))  # rows one rank sends its peers
        if stage_cap is None:
            needs = (("hook-mode combine", "sends back to one rank", sent, recv_cap),)
            hint = "Buffer.get_buffer_size_hint"
        else:
            needs = (("hook-mode dispatch", "puts on one rank", max(m[-1]), recv_cap),
                     ("hook-mode dispatch", "packs on one rank for its peers", sent, stage_cap))
            hint = "Buffer.get_hook_buffer_size_hint"
        for what, verb, n, cap in needs:
            if n > cap:
                raise EPCapacityError(f"ep_core: this {what} {verb} {n} rows, the buffer's region holds {cap}; "
                                      f"create the Buffer with num_nvl_bytes from {hint}")
