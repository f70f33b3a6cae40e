"""Profiling of the normal path (Buffer's profiling seam): `with buffer.profile(session):` or
`profile=` on a call; a profiled call takes its profile buffers from the session's pool
(`Session.launch_slot`), so it neither allocates nor synchronises. The region capacity of each
kernel is a bound from the work split (`_prof_geometry`). `BufferProfiling` is a part of
ep_core.Buffer; the session is profiler.record.session.Session (never imported here: any object
with its methods records).
"""
from __future__ import annotations

import contextlib
import math

import torch

FAMILY = "ep_intranode"   # the phase registry of these kernels: ep_core/phases/ep_intranode.toml


def labelled(session):
    """While torch's profiler records, a `record_function` range around one launcher call naming
    the profiled launches it takes from `session` (`session.launch_label(first launch)`: the run,
    the rank and the launch index, profiler/torchtrace/labels.py), so that `epscope merge` joins
    the PyTorch trace's kernels to the run's launches one for one. The range holds the launcher
    call; a call that makes the session's pool slab of a geometry also runs aten::zeros and
    aten::copy_ inside it (the merge skips kernels an operator launched, torchtrace/align.py).
    Free when the profiler is off (one C flag read); a session without `launch_label` (any
    duck-typed recorder) gets no range."""
    label = getattr(session, "launch_label", None)
    if label is None or not torch._C._autograd._profiler_enabled():
        return contextlib.nullcontext()
    return torch.profiler.record_function(label(session.num_launches))


class BufferProfiling:
    """Profiling of ep_core.Buffer's calls into a profiler.record Session (see the module docstring)."""

    @contextlib.contextmanager
    def profile(self, session, iteration: int | None = None, calls: int | None = None):
        """Profile every call inside the block into `session` (a profiler.record Session); clock
        samples against the peers are taken at the start and the end. `calls`: how many calls
        the block will profile at most, all ops together. A call launches each of its kernels
        once (dispatch's and combine's barrier share one geometry), so `Session.reserve(calls)`
        covers every kernel: its profile buffers are allocated, zeroed and stamped once, at the
        block's entry for kernels profiled before, else at the kernel's first profiled call, and
        no later call allocates or copies (without it, every 32nd call of a kernel does). With
        `calls`, every geometry this Buffer profiled before, in any session, gets its pool here
        too: a block after one profiled warm-up call allocates nothing inside its calls (the first
        profiled call of a session otherwise pays the slabs between its host call and its
        launch, ~1-2 ms that a merged PyTorch trace shows before the op: the first H100
        ground-truth recording)."""
        prev, prev_it = self._session, self.profile_iteration
        if calls is not None:
            for kernel, family, grid, warps, cap in (self._prof_seen if hasattr(session, "pool") else ()):
                session.pool(kernel, family, grid, warps, self._capped(session, cap))
            session.reserve(calls)
        self._session = session
        if iteration is not None:
            self.profile_iteration = iteration
        self.sync_clocks(session, "start")
        try:
            yield session
            self.sync_clocks(session, "end")
        finally:
            self._session, self.profile_iteration = prev, prev_it

    def sync_clocks(self, session, when: str, n: int = 32) -> None:
        """Clock-alignment ping-pong through this buffer's mapped clock area (collective)."""
        if self.group_size == 1 or not hasattr(session, "sync_clocks"):
            return
        off = int(self.limits["clock_sync_offset"])
        torch.cuda.synchronize(self.device)
        session.sync_clocks(self.peers.local + off, {r: p + off for r, p in enumerate(self.peers.ptrs)}, when, n=n)

    def _session_for(self, profile):
        if profile is None or profile is False:
            return self._session
        if profile is True:
            if self._session is None:
                raise ValueError("ep_core: profile=True needs an active session (with buffer.profile(session))")
            return self._session
        return profile

    def _iteration(self, new: bool) -> int:
        if self.profile_iteration is not None:
            return int(self.profile_iteration)
        if new:
            self._auto_iteration += 1
        return max(self._auto_iteration, 0)

    def _prof_geometry(self, kernel: str, grid: int, warps: int, units: int = 0, role_blocks: int = 0) -> tuple:
        """launch_slot arguments (without the iteration) of one kernel of a plan. For dispatch /
        combine the region capacity is a bound derived from the work split instead of the session
        default: a warp handles at most ceil(units / role_blocks) (source, chunk) units and writes
        at most R + 4 records for each (send_chunk begin/end + one publish per destination, or
        wait/copy begin/end), plus a few barrier and start records. At the issue-3 shape that is
        ~100-200 records against the 56 the bundled traces show at most, and ~25x fewer bytes
        than the session default; a wrong bound shows as counted drops, never as silent loss.
        None = the session's capacity (capped to it either way in _slot)."""
        cap = None
        if units > 0 and role_blocks > 0:
            cap = (self.group_size + 4) * math.ceil(units / role_blocks) + 32
        return (kernel, FAMILY, int(grid), int(warps), cap)

    def _slot(self, session, geometry: tuple, iteration: int) -> int:
        kernel, family, grid, warps, cap = geometry
        self._prof_seen[geometry] = None     # an ordered set: profile(calls=) pre-makes these pools
        return session.launch_slot(kernel, family, grid, warps, iteration, self._capped(session, cap))

    @staticmethod
    def _capped(session, cap):
        return session.capacity if cap is not None and cap > session.capacity else cap
