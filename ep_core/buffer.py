"""ep_core.Buffer: DeepEP's intranode normal-path API over ep_core's kernels, with profiling.

    buffer = ep_core.Buffer(group, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(4096, 7168, 2))
    n_rank, _, n_expert, in_rank, _ = buffer.get_dispatch_layout(topk_idx, num_experts)
    recv_x, recv_idx, recv_w, per_expert, handle, event = buffer.dispatch(
        x, num_tokens_per_rank=n_rank, is_token_in_rank=in_rank, num_tokens_per_expert=n_expert,
        topk_idx=topk_idx, topk_weights=topk_weights)
    combined_x, combined_w, event = buffer.combine(recv_x, handle, topk_weights=recv_w)

Design (ep_core/csrc/, benchmarks/NOTES.md): a notify kernel exchanges the counts, so every
sender knows the final row of each token in each destination; dispatch writes rows straight
there in one NVLink pass and receivers copy chunks out as they land; combine pushes the rows
back per chunk and reduces in fp32. There is no ring: the data region of the buffer holds the
rows of a whole op, which is why the buffer size depends on the token count
(`get_buffer_size_hint`); a call that does not fit raises `EPCapacityError` naming the sizes.

Kernels run on the buffer's communication stream. `previous_event` (or else the current stream)
orders them after the caller's work; `async_finish=True` returns an EventOverlap to wait on,
otherwise the current stream waits for the comm stream before the call returns.

Failures never hang: every device wait is bounded (`timeout_s`, default 10 s, env
EPSCOPE_TIMEOUT_S). A timed-out kernel fills a host-mapped error record and returns; the host
raises `EPTimeoutError` naming rank, kernel, phase, chunk and peer at the next point it looks:
the host sync of a non-cached dispatch, the start and end of every call (a host-mapped read, no
sync), `synchronize()`, and the end of a `profile()` block. With a profiling session active, the partial
profile is saved (`Session.save(status="timeout", error=...)`) before raising. After an error the
Buffer refuses further calls: the peers' state is unknown.

Test hook: env EPSCOPE_TEST_SKIP_SEND_RANK=r (or `Buffer(..., _test_skip_send_rank=r)`) makes
rank r's dispatch write nothing to its peers, so they time out waiting for its rows.

Profiling: `profile=` on any call (a profiler.record Session, or True for the session set by
`with buffer.profile(session):`), off by default. The first profiled call loads the instrumented
build; unprofiled calls keep using the compiled-out one.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.distributed as dist

from . import _ext
from .config import MAX_EXPERTS, MAX_HIDDEN, MAX_RANKS, MAX_TOPK, SCALE_BLOCK, Config
from .config import combine_config as _combine_config
from .config import dispatch_config as _dispatch_config
from .peer import PeerBuffers

topk_idx_t = torch.int64  # DeepEP's top-k index dtype; callers convert with .to(topk_idx_t)

FAMILY = "ep_intranode"
DEFAULT_TIMEOUT_S = 10.0
REGION_ALIGN = 128
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

_KERNELS = {1: "layout", 2: "notify", 3: "dispatch", 4: "combine", 5: "barrier"}


class EPTimeoutError(TimeoutError):
    """A bounded device wait expired; the message names rank, kernel, phase, chunk and peer."""


class EPCapacityError(ValueError):
    """A call needs more buffer (or exceeds a limit) than this Buffer was created for."""


def _registry():
    from ep_core.generated import ep_intranode_phases as P

    return P


def _phase_name(phase: int, is_barrier: bool) -> str:
    try:
        P = _registry()
        names = P.BARRIERS if is_barrier else P.PHASES
        return names.get(phase, f"id {phase}")
    except (ImportError, AttributeError):
        return f"{'barrier' if is_barrier else 'phase'} id {phase}"


@dataclass(frozen=True)
class ErrorReport:
    """The first device failure of a rank's Buffer (the host-mapped ErrorInfo), named fields.
    `kind`: 'timeout' (a bounded wait expired), 'overflow' (more rows than recv_x holds) or
    'capacity' (the op does not fit the buffer); `phase` is a phase name, or a barrier name when
    `is_barrier`; `peer` is the rank waited on (or written to)."""

    kind: str
    rank: int
    kernel: str
    phase: str
    is_barrier: bool
    chunk: int
    peer: int
    epoch: int


_ERROR_KINDS = {1: "timeout", 2: "capacity", 3: "overflow"}


class EventOverlap:
    """A CUDA event recorded on the comm stream, plus the tensors that must live until it fires."""

    def __init__(self, event: torch.cuda.Event | None = None, extra_tensors: tuple | None = None):
        self.event = event
        self.extra_tensors = extra_tensors

    def current_stream_wait(self) -> None:
        if self.event is not None:
            torch.cuda.current_stream().wait_event(self.event)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.current_stream_wait()
        return False


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

    def kernel_tensors(self) -> list:
        return [self.is_token_in_rank, self.send_pos, self.send_chunk_prefix, self.rank_prefix_matrix,
                self.recv_chunk_prefix, self.recv_num_chunks]


def _align(n: int, a: int = REGION_ALIGN) -> int:
    return (n + a - 1) // a * a


class Buffer:
    """DeepEP's intranode `Buffer` (normal kernels). See the module docstring."""

    num_sms: int = 20  # DeepEP's default; set_num_sms changes it for every Buffer

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, use_fabric: bool = False, explicitly_destroy: bool = False, *,
                 timeout_s: float | None = None, _test_skip_send_rank: int | None = None):
        if num_rdma_bytes > 0:
            raise NotImplementedError("ep_core: internode (num_rdma_bytes > 0) is not implemented; "
                                      "ep_core is intranode only (the GPUs of one NVLink node)")
        if low_latency_mode:
            raise NotImplementedError("ep_core: low-latency mode is not implemented (issue 3 covers the normal "
                                      "prefill/training kernels only)")
        self.group = group
        self.rank = group.rank() if group is not None else 0
        self.group_size = group.size() if group is not None else 1
        if not 1 <= self.group_size <= MAX_RANKS:
            raise ValueError(f"ep_core: 1..{MAX_RANKS} ranks (intranode), the group has {self.group_size}")
        self.ext = _ext.load(profile=False)
        self.limits = dict(self.ext.limits())
        self.num_nvl_bytes = int(num_nvl_bytes)
        if self.num_nvl_bytes < self.limits["data_offset"] + REGION_ALIGN * 8:
            raise EPCapacityError(
                f"ep_core: num_nvl_bytes={self.num_nvl_bytes} is below the minimum "
                f"{self.limits['data_offset'] + REGION_ALIGN * 8} (signals + layout slots); size it with "
                f"Buffer.get_buffer_size_hint(num_max_tokens_per_rank, hidden, num_ranks)")
        self.explicitly_destroy = explicitly_destroy
        self.timeout_s = float(timeout_s if timeout_s is not None else
                               os.environ.get("EPSCOPE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        skip = _test_skip_send_rank
        if skip is None and os.environ.get("EPSCOPE_TEST_SKIP_SEND_RANK", "") != "":
            skip = int(os.environ["EPSCOPE_TEST_SKIP_SEND_RANK"])
        self._skip_send = skip is not None and int(skip) == self.rank
        self.device = torch.device("cuda", torch.cuda.current_device())
        self.peers = PeerBuffers(self.ext, group, self.num_nvl_bytes)
        self._err_host, self._err_dev = self.ext.alloc_error()
        self.comm_stream = torch.cuda.Stream(device=self.device)
        self._epoch = 0
        self._broken: str | None = None
        self._destroyed = False
        self._session = None          # set by `with buffer.profile(session)`
        self.profile_iteration: int | None = None  # iteration label of profiled launches (auto if None)
        self._auto_iteration = -1
        self._info_host = None

    # -- static API ------------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        return True  # the extension is built for sm_90 only (profiler/record/build.py)

    @classmethod
    def set_num_sms(cls, new_num_sms: int) -> None:
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or new_num_sms < 2 or new_num_sms % 2:
            raise ValueError(f"Buffer.set_num_sms: the SM count must be even and >= 2, got {new_num_sms!r}")
        cls.num_sms = new_num_sms

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return _dispatch_config(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return _combine_config(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_ranks: int,
                             num_topk: int = MAX_TOPK) -> int:
        """num_nvl_bytes that fits every dispatch (BF16 or FP8, with top-k) and combine of up to
        `num_max_tokens_per_rank` tokens per rank: the data region holds the rows of one op, up to
        T x R rows (the widest row is a BF16 one in combine / dispatch, plus FP8 scales and top-k)."""
        ext = _ext.load(profile=False)
        rows = max(int(num_max_tokens_per_rank), 1) * int(num_ranks)
        row = hidden * 2 + (hidden // SCALE_BLOCK) * 4 + num_topk * (8 + 4)
        return int(ext.limits()["data_offset"]) + rows * row + 8 * REGION_ALIGN

    # -- lifecycle -------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Free the buffer (collective: every rank calls it). Only with explicitly_destroy=True."""
        if not self.explicitly_destroy:
            raise RuntimeError("ep_core: destroy() needs Buffer(..., explicitly_destroy=True)")
        if self._destroyed:
            return
        torch.cuda.synchronize(self.device)
        if self.group_size > 1:
            dist.barrier(group=self.group)  # no peer may still write into a buffer we unmap
        self.peers.close()
        self.ext.free_error(self._err_host)
        self._destroyed = True

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("ep_core: this Buffer was destroyed")
        self._raise_device_error()
        if self._broken:
            raise RuntimeError(f"ep_core: this Buffer is unusable after an earlier error: {self._broken}")

    # -- errors ----------------------------------------------------------------------------------
    def error_report(self) -> ErrorReport | None:
        """This rank's first device failure so far (a host-mapped read, no sync), or None."""
        flag, rank, kernel, phase, is_barrier, channel, peer, epoch = self.ext.read_error(self._err_host)
        if flag <= 0:
            return None
        return ErrorReport(_ERROR_KINDS.get(flag, f"flag {flag}"), rank, _KERNELS.get(kernel, f"kernel {kernel}"),
                           _phase_name(phase, bool(is_barrier)), bool(is_barrier), channel, peer, epoch)

    def _device_error(self) -> str | None:
        flag, rank, kernel, phase, is_barrier, channel, peer, epoch = self.ext.read_error(self._err_host)
        if flag <= 0:
            return None
        kname = _KERNELS.get(kernel, f"kernel {kernel}")
        what = _phase_name(phase, bool(is_barrier))
        if flag == 1:
            where = (f"barrier {what} waiting for rank {peer}" if is_barrier
                     else f"phase {what}, chunk {channel}, waiting for rank {peer}")
            return (f"ep_core {kname} timed out on rank {rank} after {self.timeout_s:g} s: {where} "
                    f"(op {epoch}); rank {peer} never signalled (it hung, died, or skipped this op)")
        if flag == 3:
            return (f"ep_core {kname} on rank {rank}: more rows arrive than recv_x holds (phase {what}, chunk "
                    f"{channel}, from rank {peer}): num_worst_tokens is smaller than the rows this rank receives")
        return (f"ep_core {kname} on rank {rank}: the rows of this op do not fit the buffer "
                f"(phase {what}, chunk {channel}, peer {peer}); create the Buffer with a larger num_nvl_bytes "
                f"(Buffer.get_buffer_size_hint)")

    def _raise_device_error(self, session=None) -> None:
        msg = self._device_error()
        if msg is None:
            return
        self._broken = msg
        session = session if session is not None else self._session
        if session is not None and not getattr(session, "_saved", False):
            try:
                session.note("KernelTimeout", msg)
                session.save(status="timeout", error=msg)
            except Exception as e:  # the kernel error matters more; say why there is no trace
                msg += f" (saving the partial profile failed: {type(e).__name__}: {e})"
        flag = self.ext.read_error(self._err_host)[0]
        raise (EPTimeoutError if flag == 1 else EPCapacityError)(msg)

    def synchronize(self) -> None:
        """Wait for the comm stream and raise any device error of the calls so far."""
        self.comm_stream.synchronize()
        self._raise_device_error()

    # -- profiling -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def profile(self, session, iteration: int | None = None):
        """Profile every call inside the block into `session` (a profiler.record Session); clock
        samples against the peers are taken at the start and the end."""
        prev, prev_it = self._session, self.profile_iteration
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

    def _prof(self, session, kernel: str, grid: int, warps: int, iteration: int, units: int = 0,
              role_blocks: int = 0):
        """A profile buffer for one launch. For dispatch/combine the region capacity is a bound
        derived from the work split instead of the session default: a warp handles at most
        ceil(units / role_blocks) (source, chunk) units and writes at most R + 4 records for each
        (send_chunk begin/end + one publish per destination, or wait/copy begin/end), plus a few
        barrier and start records. At the issue-3 shape that is ~100-200 records against the 56
        the bundled traces show at most, and ~25x fewer bytes to zero per launch than the
        session default; a wrong bound shows as counted drops, never as silent loss."""
        if session is None:
            return None
        cap = None
        if units > 0 and role_blocks > 0:
            cap = (self.group_size + 4) * math.ceil(units / role_blocks) + 32
            cap = min(cap, session.capacity)
        return session.buffer(kernel, FAMILY, grid, warps, iteration, capacity=cap)

    def _ext_for(self, session):
        return _ext.load(profile=True) if session is not None else self.ext

    @contextlib.contextmanager
    def _host_span(self, session, name: str, iteration: int):
        if session is None:
            yield
            return
        with session.host_span(name, iteration):
            yield

    # -- stream plumbing -------------------------------------------------------------------------
    def _begin(self, previous_event):
        compute = torch.cuda.current_stream()
        if previous_event is not None and previous_event.event is not None:
            self.comm_stream.wait_event(previous_event.event)
        else:
            self.comm_stream.wait_stream(compute)
        return compute

    def _finish(self, compute, async_finish: bool, allocate_on_comm_stream: bool, tensors: list,
                session) -> EventOverlap:
        tensors = [t for t in tensors if isinstance(t, torch.Tensor)]
        if allocate_on_comm_stream:
            for t in tensors:
                t.record_stream(compute)
        if session is not None:
            # Profiling must be cheap enough to leave on, so a profiled call does not wait for its
            # kernels: a timeout of an earlier call that has already been flagged surfaces here
            # (a host-mapped read, no sync); a pending one at the next call, synchronize(), or
            # the end of the profile block, with the partial trace saved each time.
            self._raise_device_error(session)
        if async_finish:
            for t in tensors:
                t.record_stream(self.comm_stream)
            ev = torch.cuda.Event()
            ev.record(self.comm_stream)
            return EventOverlap(ev, tuple(tensors))
        compute.wait_stream(self.comm_stream)
        return EventOverlap(None)

    def _alloc_stream(self, compute, allocate_on_comm_stream: bool):
        return torch.cuda.stream(self.comm_stream if allocate_on_comm_stream else compute)

    def capture(self) -> EventOverlap:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return EventOverlap(ev)

    def _next_epoch(self) -> int:
        self._epoch += 1
        return self._epoch

    def _fail_args(self, epoch: int) -> tuple:
        return (self.rank, epoch, self._err_dev, int(self.timeout_s * 1e9))

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

    def _chunking(self, num_tokens: int, num_sender_blocks: int, config: Config) -> tuple[int, int]:
        if num_tokens == 0:
            return 1, 0
        want = max(num_sender_blocks * CHUNKS_PER_SENDER_BLOCK, 1)
        size = max(config.num_max_nvl_chunked_send_tokens, math.ceil(num_tokens / want),
                   math.ceil(num_tokens / self.limits["max_chunks"]))
        return size, math.ceil(num_tokens / size)

    def _dispatch_blocks(self, config: Config) -> tuple[int, int]:
        n = int(config.num_sms)
        if self.group_size == 1:
            return n, n
        frac = DISPATCH_SENDER_FRACTION if DISPATCH_SENDER_FRACTION is not None else _split(n, DISPATCH_SPLIT)
        senders = min(max(int(round(n * frac)), 1), n - 1)
        return n, senders

    def _combine_blocks(self, config: Config) -> tuple[int, int]:
        n = int(config.num_sms)
        if self.group_size == 1:
            return n, 1
        frac = COMBINE_SENDER_FRACTION if COMBINE_SENDER_FRACTION is not None else _split(n, COMBINE_SPLIT)
        senders = min(max(int(round(n * frac)), 1), n - 1)
        return n, senders

    # -- get_dispatch_layout ---------------------------------------------------------------------
    def get_dispatch_layout(self, topk_idx: torch.Tensor, num_experts: int, previous_event: EventOverlap | None = None,
                            async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None):
        self._check_usable()
        R = self.group_size
        if topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t or not topk_idx.is_cuda:
            raise ValueError(f"ep_core: topk_idx must be a CUDA {topk_idx_t} [num_tokens, num_topk] tensor, got "
                             f"{topk_idx.dtype} {tuple(topk_idx.shape)}")
        self._check_experts(num_experts, topk_idx.size(1))
        topk_idx = topk_idx.contiguous()
        session = self._session_for(profile)
        it = self._iteration(new=True) if session is not None else 0
        ext = self._ext_for(session)
        compute = self._begin(previous_event)
        with self._host_span(session, "get_dispatch_layout", it):
            with torch.cuda.stream(self.comm_stream):
                prof = self._prof(session, "layout", int(ext.layout_grid(topk_idx.size(0))), 8, it)
            with self._alloc_stream(compute, allocate_on_comm_stream):
                per_rank, per_expert, in_rank = ext.get_dispatch_layout(
                    topk_idx, num_experts, R, prof, self.comm_stream.cuda_stream)
            event = self._finish(compute, async_finish, allocate_on_comm_stream,
                                 [topk_idx, per_rank, per_expert, in_rank], session)
        return per_rank, None, per_expert, in_rank, event

    def _check_experts(self, num_experts: int, num_topk: int) -> None:
        R = self.group_size
        if num_experts <= 0 or num_experts % R or num_experts > MAX_EXPERTS:
            raise ValueError(f"ep_core: num_experts must be a positive multiple of the rank count ({R}) up to "
                             f"{MAX_EXPERTS}, got {num_experts}")
        if not 1 <= num_topk <= MAX_TOPK:
            raise ValueError(f"ep_core: num_topk must be in 1..{MAX_TOPK}, got {num_topk}")

    # -- dispatch --------------------------------------------------------------------------------
    def dispatch(self, x, handle: DispatchHandle | None = None, num_tokens_per_rank: torch.Tensor | None = None,
                 num_tokens_per_rdma_rank: torch.Tensor | None = None, is_token_in_rank: torch.Tensor | None = None,
                 num_tokens_per_expert: torch.Tensor | None = None, topk_idx: torch.Tensor | None = None,
                 topk_weights: torch.Tensor | None = None, expert_alignment: int = 1, num_worst_tokens: int = 0,
                 config: Config | None = None, previous_event: EventOverlap | None = None,
                 async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None):
        self._check_usable()
        R = self.group_size
        if num_tokens_per_rdma_rank is not None:
            raise NotImplementedError("ep_core: num_tokens_per_rdma_rank is internode-only (not implemented)")
        x_data, x_scales = (x if isinstance(x, tuple) else (x, None))
        T, H = self._check_x(x_data, x_scales)
        config = config if config is not None else self.get_dispatch_config(R)
        if handle is not None:
            if topk_idx is not None or topk_weights is not None:
                raise ValueError("ep_core: cached dispatch (handle given) takes no topk_idx / topk_weights")
            if handle.num_tokens != T:
                raise ValueError(f"ep_core: cached dispatch of {T} tokens with a handle of {handle.num_tokens}")
        else:
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

        K = topk_idx.size(1) if topk_idx is not None else 0
        hidden_bytes = H * x_data.element_size()
        num_scales = H // SCALE_BLOCK if x_scales is not None else 0
        regions = self._regions(hidden_bytes, num_scales, K, K if topk_weights is not None else 0)
        num_blocks, num_senders = self._dispatch_blocks(config)
        session = self._session_for(profile)
        it = self._iteration(new=handle is None) if session is not None else 0
        ext = self._ext_for(session)
        fail = self._fail_args
        compute = self._begin(previous_event)
        with self._host_span(session, "dispatch", it):
            if handle is None:
                chunk_size, num_chunks = self._chunking(T, num_senders, config)
                epoch = self._next_epoch()
                is_token_in_rank = is_token_in_rank.contiguous()
                with torch.cuda.stream(self.comm_stream):
                    prof = self._prof(session, "notify", 1, self.limits["notify_threads"] // 32, it)
                    outs = ext.notify(is_token_in_rank, num_tokens_per_expert.to(torch.int32).contiguous(),
                                      E, chunk_size, num_chunks, int(expert_alignment), self.peers.ptrs, *fail(epoch),
                                      prof, self.comm_stream.cuda_stream)
                send_pos, send_chunk_prefix, rpm, recv_chunk_prefix, recv_num_chunks, recv_info = outs
                expert_list: list[int] = []
                if num_worst_tokens == 0:
                    info, rpm_host = self._read_back(recv_info, rpm)
                    num_recv = info[0]
                    expert_list = info[1:]
                    rows = num_recv
                    m = rpm_host.tolist()  # rows j receives from ranks 0..i
                    need = max(m[-1])
                    counts = [[m[i][j] - (m[i - 1][j] if i else 0) for j in range(R)] for i in range(R)]
                    combine_rows = max(sum(c) - c[i] for i, c in enumerate(counts))
                else:
                    num_recv, rows, need, combine_rows = -1, num_worst_tokens, num_worst_tokens, -1
                if need > regions[4]:
                    raise EPCapacityError(
                        f"ep_core: this dispatch puts {need} rows on one rank but the buffer holds {regions[4]} rows "
                        f"of {hidden_bytes} B (+ scales/top-k); create the Buffer with num_nvl_bytes >= "
                        f"{self.get_buffer_size_hint(math.ceil(need / R), H, R, max(K, 1))} "
                        f"(Buffer.get_buffer_size_hint)")
                handle = DispatchHandle(rpm, send_chunk_prefix, recv_chunk_prefix, recv_num_chunks, send_pos,
                                        is_token_in_rank, T, H, chunk_size, num_chunks, num_recv, rows, combine_rows,
                                        need)
            else:
                # checks against the fullest rank's rows (in the handle, the same number on every
                # rank), so every rank raises together instead of leaving its peers to time out
                if num_worst_tokens and handle.max_recv_rows > num_worst_tokens:
                    raise ValueError(f"ep_core: num_worst_tokens={num_worst_tokens} < {handle.max_recv_rows} "
                                     f"rows received by the fullest rank")
                rows = num_worst_tokens if num_worst_tokens else handle.num_recv_rows
                if max(handle.max_recv_rows, num_worst_tokens) > regions[4]:
                    raise EPCapacityError(f"ep_core: this dispatch needs {max(handle.max_recv_rows, num_worst_tokens)} "
                                          f"rows on one rank, the buffer holds {regions[4]} rows of {hidden_bytes} B "
                                          f"(+ scales/top-k) (Buffer.get_buffer_size_hint)")
                expert_list = []
                epoch = self._next_epoch()
                with torch.cuda.stream(self.comm_stream):
                    prof = self._prof(session, "barrier", 1, 1, it)
                    ext.barrier(self.peers.ptrs, *fail(epoch), prof, self.comm_stream.cuda_stream)

            with self._alloc_stream(compute, allocate_on_comm_stream):
                recv_x = torch.empty((rows, H), dtype=x_data.dtype, device=self.device)
                recv_scales = (torch.empty((rows, num_scales), dtype=torch.float32, device=self.device)
                               if x_scales is not None else None)
                recv_idx = recv_w = None
                if topk_idx is not None:
                    recv_idx = torch.empty((rows, K), dtype=topk_idx_t, device=self.device)
                    if topk_weights is not None:
                        recv_w = torch.empty((rows, K), dtype=torch.float32, device=self.device)
            with torch.cuda.stream(self.comm_stream):
                # padding rows of num_worst_tokens keep -1 / 0 (ep-api.md); filled on the comm stream
                # so the fill is ordered before the kernel (an allocation stream fill would not be)
                if recv_idx is not None and rows > handle.num_recv_tokens:
                    recv_idx.fill_(-1)
                if recv_w is not None and rows > handle.num_recv_tokens:
                    recv_w.zero_()
                prof = self._prof(session, "dispatch", num_blocks, self.limits["threads"] // 32, it,
                                  units=R * handle.num_chunks,
                                  role_blocks=min(num_senders, max(num_blocks - num_senders, 1)))
                ext.dispatch(x_data, x_scales, topk_idx.contiguous() if topk_idx is not None else None,
                             topk_weights.contiguous() if topk_weights is not None else None,
                             handle.kernel_tensors(), handle.chunk_size, handle.num_chunks,
                             num_tokens_per_expert.numel() if num_tokens_per_expert is not None else R,
                             recv_x, recv_scales, recv_idx, recv_w, regions, self.peers.ptrs, *fail(epoch),
                             num_blocks, num_senders, self._skip_send, prof, self.comm_stream.cuda_stream)
            event = self._finish(compute, async_finish, allocate_on_comm_stream,
                                 [x_data, x_scales, topk_idx, topk_weights, recv_x, recv_scales, recv_idx, recv_w,
                                  *handle.kernel_tensors()], session)
        recv = (recv_x, recv_scales) if x_scales is not None else recv_x
        return recv, recv_idx, recv_w, expert_list, handle, event

    def _check_x(self, x_data, x_scales) -> tuple[int, int]:
        if not isinstance(x_data, torch.Tensor) or x_data.dim() != 2 or not x_data.is_cuda:
            raise ValueError("ep_core: x must be a CUDA [num_tokens, hidden] tensor (or an (x_fp8, scales) tuple)")
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
            if (x_scales.dim() != 2 or tuple(x_scales.shape) != (T, H // SCALE_BLOCK)
                    or x_scales.dtype != torch.float32 or not x_scales.is_cuda):
                raise ValueError(f"ep_core: FP8 scales must be float32 [{T}, {H // SCALE_BLOCK}] (row- or "
                                 f"column-major), got {x_scales.dtype} {tuple(x_scales.shape)}")
        return T, H

    def _read_back(self, recv_info: torch.Tensor, rpm: torch.Tensor):
        """The one host sync of a non-cached dispatch: received rows, per-expert counts, rpm."""
        n = recv_info.numel() + rpm.numel()
        if self._info_host is None or self._info_host.numel() < n:
            self._info_host = torch.empty(max(n, 1024), dtype=torch.int32, pin_memory=True)
        host = self._info_host
        with torch.cuda.stream(self.comm_stream):
            host[: recv_info.numel()].copy_(recv_info, non_blocking=True)
            host[recv_info.numel(): n].copy_(rpm.view(-1), non_blocking=True)
        self.comm_stream.synchronize()
        self._raise_device_error()
        # .tolist(): iterating a tensor element by element costs ~2 µs per element (v1 spent
        # ~550 µs here per dispatch, benchmarks/NOTES.md)
        info = host[: recv_info.numel()].tolist()
        return info, host[recv_info.numel(): n].clone().view(self.group_size, self.group_size)

    # -- combine ---------------------------------------------------------------------------------
    def combine(self, x: torch.Tensor, handle: DispatchHandle, topk_weights: torch.Tensor | None = None,
                bias=None, config: Config | None = None, previous_event: EventOverlap | None = None,
                async_finish: bool = False, allocate_on_comm_stream: bool = False, profile=None):
        self._check_usable()
        R = self.group_size
        if not isinstance(handle, DispatchHandle):
            raise ValueError("ep_core: combine needs the handle returned by this Buffer's dispatch")
        if x.dim() != 2 or x.dtype != torch.bfloat16 or not x.is_cuda:
            raise ValueError(f"ep_core: combine x must be a CUDA bf16 [num_recv_tokens, hidden] tensor, got "
                             f"{x.dtype} {tuple(x.shape)}")
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
        biases = list(bias) if isinstance(bias, (tuple, list)) else ([bias] if bias is not None else [])
        if len(biases) > 2:
            raise ValueError("ep_core: bias is a tensor or a pair of tensors")
        for b in biases:
            if tuple(b.shape) != (T, H) or b.dtype != torch.bfloat16:
                raise ValueError(f"ep_core: bias must be bf16 [{T}, {H}], got {b.dtype} {tuple(b.shape)}")
        biases = [b.contiguous() for b in biases] + [None] * (2 - len(biases))
        config = config if config is not None else self.get_combine_config(R)
        regions = self._regions(H * 2, 0, 0, K)
        if handle.max_combine_rows > regions[4]:
            raise EPCapacityError(f"ep_core: this combine sends {handle.max_combine_rows} rows back to one rank, the "
                                  f"buffer holds {regions[4]} (Buffer.get_buffer_size_hint)")
        num_blocks, num_senders = self._combine_blocks(config)
        session = self._session_for(profile)
        it = self._iteration(new=False) if session is not None else 0
        ext = self._ext_for(session)
        x = x.contiguous()
        compute = self._begin(previous_event)
        with self._host_span(session, "combine", it):
            epoch = self._next_epoch()
            with torch.cuda.stream(self.comm_stream):
                prof = self._prof(session, "barrier", 1, 1, it)
                ext.barrier(self.peers.ptrs, *self._fail_args(epoch), prof, self.comm_stream.cuda_stream)
            with self._alloc_stream(compute, allocate_on_comm_stream):
                out = torch.empty((T, H), dtype=torch.bfloat16, device=self.device)
                out_w = torch.empty((T, K), dtype=torch.float32, device=self.device) if K else None
            with torch.cuda.stream(self.comm_stream):
                prof = self._prof(session, "combine", num_blocks, self.limits["threads"] // 32, it,
                                  units=R * handle.num_chunks,
                                  role_blocks=min(num_senders, max(num_blocks - num_senders, 1)))
                ext.combine(x, topk_weights.contiguous() if topk_weights is not None else None, biases[0], biases[1],
                            handle.kernel_tensors(), handle.chunk_size, handle.num_chunks, out, out_w, regions,
                            self.peers.ptrs, *self._fail_args(epoch), num_blocks, num_senders, prof,
                            self.comm_stream.cuda_stream)
            event = self._finish(compute, async_finish, allocate_on_comm_stream,
                                 [x, topk_weights, *[b for b in biases if b is not None], out, out_w,
                                  *handle.kernel_tensors()], session)
        return out, out_w, event

    # -- low latency (not in this issue) ---------------------------------------------------------
    def low_latency_dispatch(self, *args, **kwargs):
        raise NotImplementedError("ep_core: low_latency_dispatch is not implemented (normal kernels only, issue 3)")

    def low_latency_combine(self, *args, **kwargs):
        raise NotImplementedError("ep_core: low_latency_combine is not implemented (normal kernels only, issue 3)")

    def get_next_low_latency_combine_buffer(self, *args, **kwargs):
        raise NotImplementedError("ep_core: low-latency buffers are not implemented (normal kernels only, issue 3)")

    def clean_low_latency_buffer(self, *args, **kwargs):
        raise NotImplementedError("ep_core: low-latency buffers are not implemented (normal kernels only, issue 3)")

    def internode_dispatch(self, *args, **kwargs):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")

    def internode_combine(self, *args, **kwargs):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")
