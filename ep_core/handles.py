"""What a Buffer hands back and keeps between calls: DeepEP's dispatch handle (with the plans of
later calls cached on it), one cached plan, and one compiled build of the extension with this
Buffer's Launcher in it.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

class PlanCache:
    """The plans built for one handle, keyed by what a call may change: the build (compiled out
    or instrumented), dtype, config, options. A plan keeps its config object alive, so a config's
    id() in the key cannot be reused by another config while the entry exists. `rank_prefix` is
    the handle's rank_prefix_matrix on the host, flattened (what hook-mode plans are built from):
    the non-cached dispatch's read-back, or read once by the first hook-mode call that needs it."""

    __slots__ = ("plans", "rank_prefix")

    def __init__(self, rank_prefix: list | None = None):
        self.plans: dict = {}
        self.rank_prefix = rank_prefix

    def __repr__(self) -> str:
        return f"PlanCache({len(self.plans)} plans)"


class _Plan(NamedTuple):
    """One cached plan: the extension's plan object plus what the Python side needs per call."""

    config: object          # the Config it was built for (kept alive: its id() is in the key)
    cpp: object             # ext.DispatchPlan / ext.CombinePlan
    prof_open: tuple | None  # launch_slot arguments of the op's first kernel (barrier), None if none
    prof_kernel: tuple      # launch_slot arguments of the dispatch / combine kernel
    prof_signal: tuple | None = None  # hook mode: the send half's flag kernel (hook.cu's signal)
    prof_recv: tuple | None = None    # hook mode: the receive half's kernel


class DispatchHandle(NamedTuple):
    """What a cached dispatch and combine need. handle[0] is DeepEP's rank_prefix_matrix."""

    rank_prefix_matrix: torch.Tensor   # [R, R] int32
    send_chunk_prefix: torch.Tensor    # [R, max_chunks + 1] int32: rows to d before my chunk c
    recv_chunk_prefix: torch.Tensor    # [R, max_chunks + 1] int32: rows from s before s's chunk c
    recv_num_chunks: torch.Tensor      # [R] int32
    send_pos: torch.Tensor             # [T, R] int32: row of my token t in the stream to d, or -1
    is_token_in_rank: torch.Tensor     # [T, R] bool
    num_tokens: int
    hidden: int
    chunk_size: int
    num_chunks: int
    num_recv_tokens: int               # -1 when dispatched with num_worst_tokens (not read back)
    num_recv_rows: int                 # rows of recv_x (num_recv_tokens or num_worst_tokens)
    max_combine_rows: int              # rows any rank receives back in combine, -1 if unknown
    max_recv_rows: int                 # rows the fullest rank receives (same on every rank)
    cache: PlanCache                   # plans of later calls with this handle (not part of DeepEP's handle)

    def kernel_tensors(self, ext):
        """The handle as the extension's named HandleTensors of build `ext`."""
        return ext.HandleTensors(is_token_in_rank=self.is_token_in_rank, send_pos=self.send_pos,
                                 send_chunk_prefix=self.send_chunk_prefix, rank_prefix_matrix=self.rank_prefix_matrix,
                                 recv_chunk_prefix=self.recv_chunk_prefix, recv_num_chunks=self.recv_num_chunks,
                                 num_tokens=self.num_tokens, chunk_size=self.chunk_size, num_chunks=self.num_chunks)


class _Build:
    """One compiled variant of the extension (compiled out, or instrumented) with this Buffer's
    Launcher in it. Each build has its own types (module_local), so plans are per build."""

    def __init__(self, ext, launcher):
        self.ext = ext
        self.profile = bool(ext.profile_enabled())
        self.launcher = launcher
        self._modes: dict = {}

    def mode(self, compute: int, fork: bool, join: bool, async_finish: bool, alloc_on_comm: bool):
        """The StreamMode of a call; one object per combination of flags, its stream updated."""
        key = (fork, join, async_finish, alloc_on_comm)
        m = self._modes.get(key)
        if m is None:
            m = self._modes[key] = self.ext.StreamMode(compute=compute, fork=fork, join=join,
                                                       async_finish=async_finish, alloc_on_comm=alloc_on_comm)
        else:
            m.compute = compute
        return m
