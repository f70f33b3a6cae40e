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

Streams, as DeepEP orders them: `previous_event` (or else the current stream) orders a call after
the caller's work; `async_finish=True` returns an EventOverlap to wait on, otherwise the current
stream holds the finished op when the call returns. A call with neither `previous_event`,
`async_finish` nor `allocate_on_comm_stream` runs its kernels on the current stream itself: the
same order as forking the communication stream and joining it back, without the two event
record / wait pairs (issue 9). Every other call runs on the buffer's communication stream. Calls
of one Buffer follow each other whichever stream each runs on (the Launcher orders a stream
change with one event), so `synchronize()` waits for the device.

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
build; unprofiled calls keep using the compiled-out one. A profiled call takes its profile
buffers from the session's pool (`Session.launch_slot`: slabs zeroed and stamped once per 32
launches of one geometry, or once per block with `buffer.profile(session, calls=N)`), so it passes
pointers and neither allocates nor synchronises (with `calls`, not even one call in 32).

Hook mode (seed 000; issue 11): `dispatch(..., return_recv_hook=True)` and `combine(...,
return_recv_hook=True)` issue the send half on the comm stream and return at once, with a
RecvHook appended to the usual tuple; calling `hook()` launches the receive half on the current
stream. The bulk data moves by the copy engines (cudaMemcpyAsync into the peers' IPC-mapped
buffers, ep_core/csrc/hook.cu) while no SM polls: dispatch's send packs the rows for each peer
contiguously in this rank's buffer (own rows straight into recv_x) with the bulk-copy kernels
(Config.num_tma_buffers staging buffers, whatever Config.path says), combine's send copies x's
rows straight from x; then one 32-thread kernel raises a flag on every peer. The receive waits
for this rank's send half by a stream wait (no kernel), then its kernel waits for the peers'
flags and only unpacks (dispatch) or reduces (combine). Rules (ValueError otherwise): one pending
hook per Buffer, called once, before the Buffer's next dispatch / combine; no async_finish with
a hook; outputs are complete once the hook ran (on the stream it ran on). A hook-mode dispatch
reads rank_prefix_matrix back to the host even with num_worst_tokens (the copies are sized
there; a cached one reads it once per handle), and needs the staging region on top of the
receive region: size the Buffer with `Buffer.get_hook_buffer_size_hint` (T x (2R - 1) rows).

Host cost (issue 9, benchmarks/NOTES.md): everything a call needs that its handle, dtype,
config and options fix is built once into a plan (a `DispatchPlan` / `CombinePlan` of the
extension, kept on the handle), and a call makes one extension call that orders the streams,
allocates the outputs and launches the kernels (`Launcher`, ep_core/csrc/bindings.cpp). Cached
dispatch and combine neither synchronise nor allocate outside torch's caching allocator, and the
op's epoch lives on the device, so both can be captured in a CUDA graph and replayed (profiled or
not; see `tests/gpu/test_ep_graphs.py`).
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass
from time import perf_counter_ns
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


def _kernel_tma_buffers(config: Config, hook: bool) -> int:
    """Staging buffers per warp the kernels run with: Config.kernel_tma_buffers, except in hook
    mode, whose pack / receive kernels are the bulk-copy path's whatever Config.path says (the
    direct path has no send-only or receive-only half): Config.num_tma_buffers."""
    return int(config.num_tma_buffers) if hook else config.kernel_tma_buffers


def _buffer_bytes(rows: int, hidden: int, num_topk: int) -> int:
    """num_nvl_bytes of a buffer whose data region holds `rows` of the widest row (a BF16 row plus
    FP8 scales and top-k ids and weights) after the signals and layout slots; 8 x REGION_ALIGN
    covers the alignment of up to 8 regions (_regions: 4, _hook_regions: 8)."""
    row = hidden * 2 + (hidden // SCALE_BLOCK) * 4 + num_topk * (8 + 4)
    return int(_ext.load(profile=False).limits()["data_offset"]) + rows * row + 8 * REGION_ALIGN


_KERNELS = {1: "layout", 2: "notify", 3: "dispatch", 4: "combine", 5: "barrier", 6: "hook_signal"}


class EPTimeoutError(TimeoutError):
    """A bounded device wait expired; the message names rank, kernel, phase, chunk and peer."""


class EPCapacityError(ValueError):
    """A call needs more buffer (or exceeds a limit) than this Buffer was created for."""


def _ll_module():
    from . import low_latency

    return low_latency


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


_ERROR_KINDS = {1: "timeout", 2: "capacity", 3: "overflow", 4: "staged_copy", 5: "launch_plan"}


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


# The caller's current CUDA stream as a raw handle: torch's own C entry point (what Triton and
# Inductor use) costs a fraction of a µs, torch.cuda.current_stream() a few µs. Tests on the CPU
# replace this function.
_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_raw_stream(device_index: int) -> int:
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def _device_name(device) -> str:
    """The GPU's name for the tuned table; a CPU device (the CPU tests' fake Buffer) is named by type."""
    if device is not None and device.type != "cuda":
        return device.type
    return torch.cuda.get_device_name(device)


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


def _align(n: int, a: int = REGION_ALIGN) -> int:
    return (n + a - 1) // a * a


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


class Buffer:
    """DeepEP's intranode `Buffer` (normal kernels). See the module docstring."""

    num_sms: int = 20  # DeepEP's default; set_num_sms changes it for every Buffer
    _num_sms_set: bool = False  # set_num_sms was called: the caller chose the SMs, no tuned entry applies

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, use_fabric: bool = False, explicitly_destroy: bool = False, *,
                 timeout_s: float | None = None, _test_skip_send_rank: int | None = None):
        if num_rdma_bytes > 0 and not low_latency_mode:
            raise NotImplementedError("ep_core: internode (num_rdma_bytes > 0) is not implemented; "
                                      "ep_core is intranode only (the GPUs of one NVLink node)")
        if low_latency_mode and num_rdma_bytes <= 0:
            raise ValueError("ep_core: low_latency_mode needs num_rdma_bytes (the low-latency buffer, NVLink-mapped "
                             "here): size it with Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank,"
                             " hidden, num_ranks, num_experts)")
        if low_latency_mode and not allow_nvlink_for_low_latency_mode:
            raise NotImplementedError("ep_core: the low-latency kernels move data over NVLink only "
                                      "(allow_nvlink_for_low_latency_mode=False needs RDMA)")
        self.group = group
        rank = group.rank() if group is not None else 0
        group_size = group.size() if group is not None else 1
        if not 1 <= group_size <= MAX_RANKS:
            raise ValueError(f"ep_core: 1..{MAX_RANKS} ranks (intranode), the group has {group_size}")
        ext = _ext.load(profile=False)
        limits = dict(ext.limits())
        if low_latency_mode:  # decode-only Buffers size num_rdma_bytes alone: the normal map gets its minimum
            num_nvl_bytes = max(int(num_nvl_bytes), limits["data_offset"] + REGION_ALIGN * 8)
        if int(num_nvl_bytes) < limits["data_offset"] + REGION_ALIGN * 8:
            raise EPCapacityError(
                f"ep_core: num_nvl_bytes={int(num_nvl_bytes)} is below the minimum "
                f"{limits['data_offset'] + REGION_ALIGN * 8} (signals + layout slots); size it with "
                f"Buffer.get_buffer_size_hint(num_max_tokens_per_rank, hidden, num_ranks)")
        self.explicitly_destroy = explicitly_destroy
        timeout = float(timeout_s if timeout_s is not None else os.environ.get("EPSCOPE_TIMEOUT_S", DEFAULT_TIMEOUT_S))
        skip = _test_skip_send_rank
        if skip is None and os.environ.get("EPSCOPE_TEST_SKIP_SEND_RANK", "") != "":
            skip = int(os.environ["EPSCOPE_TEST_SKIP_SEND_RANK"])
        device = torch.device("cuda", torch.cuda.current_device())
        peers = PeerBuffers(ext, group, int(num_nvl_bytes))
        self._init_host_state(ext, rank=rank, group_size=group_size, num_nvl_bytes=int(num_nvl_bytes),
                              timeout_s=timeout, skip_send=skip is not None and int(skip) == rank, device=device,
                              comm_stream=torch.cuda.Stream(device=device), peers=peers)
        # low-latency mode: its own IPC-mapped buffer of num_rdma_bytes (ep_core/low_latency.py)
        self._ll = _ll_module().LowLatency(self, int(num_rdma_bytes)) if low_latency_mode else None

    def _init_host_state(self, ext, *, rank, group_size, num_nvl_bytes, timeout_s, skip_send, device, comm_stream,
                         peers) -> None:
        """Everything but the process group and the GPU allocations (the CPU tests build a Buffer
        around a fake extension with this)."""
        self.rank, self.group_size = rank, group_size
        self.ext = ext
        self.limits = dict(ext.limits())
        self.num_nvl_bytes = num_nvl_bytes
        self.timeout_s = timeout_s
        self._skip_send = skip_send
        self.device = device
        self._device_index = device.index if device.index is not None else 0
        self.peers = peers
        self._err = ext.ErrorRecord()
        self.comm_stream = comm_stream
        self._builds: dict[bool, _Build] = {}
        self._builds[False] = self._make_build(ext)
        self._instrumented = False     # use_instrumented_build(): the instrumented build with recording off
        self._broken: str | None = None
        self._destroyed = False
        self._session = None          # set by `with buffer.profile(session)`
        self.profile_iteration: int | None = None  # iteration label of profiled launches (auto if None)
        self._auto_iteration = -1
        self._info_host = None
        self._default_configs: dict = {}
        self._pending_hook: RecvHook | None = None  # a hook-mode op whose receive has not run yet

    def _make_build(self, ext) -> _Build:
        s = self.comm_stream
        launcher = ext.Launcher(peers=list(self.peers.ptrs), rank=self.rank, error_device=self._err.device,
                                timeout_ns=int(self.timeout_s * 1e9), skip_send=self._skip_send,
                                comm_stream=int(s.cuda_stream), comm_stream_id=int(s.stream_id),
                                device_index=int(s.device_index), device_type=int(s.device_type))
        return _Build(ext, launcher)

    def _build(self, profiled: bool) -> _Build:
        """The compiled-out build, or the instrumented one (loaded on first use) for profiled calls
        and after use_instrumented_build(True)."""
        key = profiled or self._instrumented
        b = self._builds.get(key)
        if b is None:
            b = self._builds[key] = self._make_build(_ext.load(profile=True))
        return b

    def use_instrumented_build(self, on: bool = True) -> None:
        """Run unprofiled calls with the instrumented build too (recording off through a null
        profile buffer: the runtime switch), as the benchmark's 'instrumented, recording off' row."""
        self._instrumented = bool(on)

    # -- static API ------------------------------------------------------------------------------
    @staticmethod
    def is_sm90_compiled() -> bool:
        return True  # the extension is built for sm_90 only (profiler/record/build.py)

    @classmethod
    def set_num_sms(cls, new_num_sms: int) -> None:
        if isinstance(new_num_sms, bool) or not isinstance(new_num_sms, int) or new_num_sms < 2 or new_num_sms % 2:
            raise ValueError(f"Buffer.set_num_sms: the SM count must be even and >= 2, got {new_num_sms!r}")
        cls.num_sms = new_num_sms
        cls._num_sms_set = True

    @staticmethod
    def get_dispatch_config(num_ranks: int) -> Config:
        return _dispatch_config(num_ranks, Buffer.num_sms)

    @staticmethod
    def get_combine_config(num_ranks: int) -> Config:
        return _combine_config(num_ranks, Buffer.num_sms)

    def _default_config(self, kind: str, num_tokens: int, hidden: int, dtype: str) -> Config:
        """The config of a call that passed none, made once per key (Config validates on
        construction: a few µs a call if remade every time; cached plans key on its identity):
        the tuned table's entry for this GPU and shape when one matches (ep_core.tuned, which
        says so once) unless set_num_sms chose the SMs, else the recommended table at num_sms."""
        key = (kind, Buffer.num_sms, Buffer._num_sms_set, num_tokens, hidden, dtype)
        c = self._default_configs.get(key)
        if c is None:
            c = self._default_configs[key] = self._tuned_config(kind, num_tokens, hidden, dtype) or (
                self.get_dispatch_config if kind == "dispatch" else self.get_combine_config)(self.group_size)
        return c

    def _tuned_config(self, kind: str, num_tokens: int, hidden: int, dtype: str) -> Config | None:
        from . import tuned

        if Buffer._num_sms_set or num_tokens <= 0 or hidden <= 0:
            return None
        m = tuned.match(kind, tuned.TunedKey(_device_name(self.device), self.group_size, dtype, hidden, num_tokens))
        if m.entry is None:
            return None
        tuned.announce(m)
        return Config(**m.entry.config)

    @staticmethod
    def get_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_ranks: int,
                             num_topk: int = MAX_TOPK) -> int:
        """num_nvl_bytes that fits every dispatch (BF16 or FP8, with top-k) and combine of up to
        `num_max_tokens_per_rank` tokens per rank: the data region holds the rows of one op, up to
        T x R rows (the widest row is a BF16 one in combine / dispatch, plus FP8 scales and top-k)."""
        return _buffer_bytes(max(int(num_max_tokens_per_rank), 1) * int(num_ranks), hidden, num_topk)

    @staticmethod
    def get_hook_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_ranks: int,
                                  num_topk: int = MAX_TOPK) -> int:
        """num_nvl_bytes that fits every call get_buffer_size_hint fits, with or without
        return_recv_hook: a hook-mode dispatch needs, besides the rows it receives (up to T x R), a
        staging region for the rows it packs for its peers (up to T x (R - 1)), so the data region
        holds T x (2R - 1) rows. A hook-mode combine needs no more than a normal one."""
        return _buffer_bytes(max(int(num_max_tokens_per_rank), 1) * (2 * int(num_ranks) - 1), hidden, num_topk)

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
        self._pending_hook = None
        if getattr(self, "_ll", None) is not None:
            self._ll.destroy()
        self.peers.close()
        self._builds.clear()
        self._err.close()
        self._destroyed = True

    def _usable_fast(self) -> bool:
        """One host read of the error flag plus two attributes: the check at every call's start."""
        return not self._err.flag() and self._broken is None and not self._destroyed

    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("ep_core: this Buffer was destroyed")
        self._raise_device_error()
        if self._broken:
            raise RuntimeError(f"ep_core: this Buffer is unusable after an earlier error: {self._broken}")

    # -- errors ----------------------------------------------------------------------------------
    def error_report(self) -> ErrorReport | None:
        """This rank's first device failure so far (a host-mapped read, no sync), or None."""
        e = self._err.report()
        if e.flag <= 0:
            return None
        return ErrorReport(_ERROR_KINDS.get(e.flag, f"flag {e.flag}"), e.rank,
                           _KERNELS.get(e.kernel, f"kernel {e.kernel}"), _phase_name(e.phase, bool(e.is_barrier)),
                           bool(e.is_barrier), e.channel, e.peer, e.epoch)

    def _device_error(self) -> str | None:
        e = self._err.report()
        if e.flag <= 0:
            return None
        kname = _KERNELS.get(e.kernel, f"kernel {e.kernel}")
        what = _phase_name(e.phase, bool(e.is_barrier))
        if e.flag == 1:
            where = (f"barrier {what} waiting for rank {e.peer}" if e.is_barrier
                     else f"phase {what}, chunk {e.channel}, waiting for rank {e.peer}")
            return (f"ep_core {kname} timed out on rank {e.rank} after {self.timeout_s:g} s: {where} "
                    f"(op {e.epoch}); rank {e.peer} never signalled (it hung, died, or skipped this op)")
        if e.flag in (4, 5):  # the bulk-copy path (Config.path="tma", ep_core/csrc/tma.cuh)
            why = ("a staged bulk copy did not land in shared memory within the bound" if e.flag == 4 else
                   "the launch plan does not match the kernel (buffer count or shared memory)")
            return f"ep_core {kname} on rank {e.rank}: {why} (phase {what}, unit {e.channel}); an ep_core bug, please report"
        if e.flag == 3:
            return (f"ep_core {kname} on rank {e.rank}: more rows arrive than recv_x holds (phase {what}, chunk "
                    f"{e.channel}, from rank {e.peer}): num_worst_tokens is smaller than the rows this rank receives")
        return (f"ep_core {kname} on rank {e.rank}: the rows of this op do not fit the buffer "
                f"(phase {what}, chunk {e.channel}, peer {e.peer}); create the Buffer with a larger num_nvl_bytes "
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
        raise (EPTimeoutError if self._err.flag() == 1 else EPCapacityError)(msg)

    def synchronize(self) -> None:
        """Wait for every call so far (on the comm stream and, direct calls, on the callers'
        streams: the device) and raise any device error of them."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        else:  # the CPU tests' fake Buffer
            self.comm_stream.synchronize()
        self._raise_device_error()

    # -- profiling -------------------------------------------------------------------------------
    @contextlib.contextmanager
    def profile(self, session, iteration: int | None = None, calls: int | None = None):
        """Profile every call inside the block into `session` (a profiler.record Session); clock
        samples against the peers are taken at the start and the end. `calls`: how many calls
        the block will profile at most, all ops together. A call launches each of its kernels
        once (dispatch's and combine's barrier share one geometry), so `Session.reserve(calls)`
        covers every kernel: its profile buffers are allocated, zeroed and stamped once, at the
        block's entry for kernels profiled before, else at the kernel's first profiled call, and
        no later call allocates or copies (without it, every 32nd call of a kernel does)."""
        prev, prev_it = self._session, self.profile_iteration
        if calls is not None:
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

    @staticmethod
    def _slot(session, geometry: tuple, iteration: int) -> int:
        kernel, family, grid, warps, cap = geometry
        if cap is not None and cap > session.capacity:
            cap = session.capacity
        return session.launch_slot(kernel, family, grid, warps, iteration, cap)

    # -- stream plumbing -------------------------------------------------------------------------
    def _stream_mode(self, build: _Build, previous_event, async_finish: bool, allocate_on_comm_stream: bool,
                     fork: bool = True):
        compute = current_raw_stream(self._device_index)
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

    def capture(self) -> EventOverlap:
        ev = torch.cuda.Event()
        ev.record(torch.cuda.current_stream())
        return EventOverlap(ev)

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
            return n, 1
        frac = COMBINE_SENDER_FRACTION if COMBINE_SENDER_FRACTION is not None else _split(n, COMBINE_SPLIT)
        senders = min(max(int(round(n * frac)), 1), n - 1)
        return n, senders

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
            out = build.launcher.layout(topk_idx, num_experts, mode,
                                        self._slot(session, ("layout", FAMILY, grid, 8, None), it))
            session.host_call("get_dispatch_layout", it, t0, perf_counter_ns(), first)
        per_rank, per_expert, in_rank = out.num_tokens_per_rank, out.num_tokens_per_expert, out.is_token_in_rank
        event = self._finish(async_finish, allocate_on_comm_stream, (topk_idx, per_rank, per_expert, in_rank), session)
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

    # -- hook mode -------------------------------------------------------------------------------
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
        compute = current_raw_stream(self._device_index)
        if session is None:
            launch(*args, compute, 0)
            return
        t0, first = perf_counter_ns(), session.num_launches
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
            p_open = self._slot(session, plan.prof_open, it) if plan.prof_open is not None else 0
            out = launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, p_open,
                                    self._slot(session, plan.prof_kernel, it),
                                    self._slot(session, plan.prof_signal, it))
            session.host_call("dispatch", it, t0, perf_counter_ns(), first)
        return out, self._arm_hook("dispatch", lambda: self._receive(launcher.dispatch_receive, (plan.cpp, out),
                                                                     plan.prof_recv, "dispatch_hook", session, it))

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

    def _launch_dispatch(self, build: _Build, plan: _Plan, x_data, x_scales, topk_idx, topk_weights, mode, session,
                         new_iteration: bool):
        if session is None:
            return build.launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, 0, 0)
        t0, first = perf_counter_ns(), session.num_launches
        it = self._iteration(new=new_iteration)
        p_open = self._slot(session, plan.prof_open, it) if plan.prof_open is not None else 0
        out = build.launcher.dispatch(plan.cpp, x_data, x_scales, topk_idx, topk_weights, mode, p_open,
                                      self._slot(session, plan.prof_kernel, it))
        session.host_call("dispatch", it, t0, perf_counter_ns(), first)
        return out

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
                                          role_blocks=min(num_senders, max(num_blocks - num_senders, 1)))
        prof_open = self._prof_geometry("barrier", 1, 1) if open_op else None
        if not hook:
            return _Plan(config, cpp, prof_open, prof_kernel)
        # a hook-mode op's launches are all profiled as its kernel, `dispatch` (their phases tell the
        # send, pack, from the signal, publish_hook, and the receive, wait_hook / copy_out), so a
        # comparison with the normal mode compares the same kernels: send + signal + receive time
        return _Plan(config, cpp, prof_open, prof_kernel, self._prof_geometry("dispatch", 1, 1),
                     self._prof_geometry("dispatch", num_blocks, warps))

    def _dispatch_fresh(self, x_data, x_scales, num_tokens_per_rank, is_token_in_rank, num_tokens_per_expert,
                        topk_idx, topk_weights, expert_alignment, num_worst_tokens, config, previous_event,
                        async_finish, allocate_on_comm_stream, session, hook: bool = False):
        """A dispatch without a handle: notify (the count exchange), the read-back of the counts
        (the one host sync, skipped with num_worst_tokens unless `hook`: the peer copies are sized
        on the host), then the dispatch kernel (or, with `hook`, the send half)."""
        R = self.group_size
        T, H = self._check_x(x_data, x_scales)
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
        prof = (self._slot(session, self._prof_geometry("notify", 1, self.limits["notify_threads"] // 32), it)
                if session is not None else 0)
        notified = build.launcher.notify(is_token_in_rank.contiguous(), num_tokens_per_expert.to(torch.int32).contiguous(),
                                         E, chunk_size, num_chunks, int(expert_alignment), mode, prof)
        h = notified.handle
        expert_list: list[int] = []
        rpm_host = None
        if num_worst_tokens == 0 or hook:
            info, rpm_host = self._read_back(build, notified)
        if num_worst_tokens == 0:
            num_recv = info[0]
            expert_list = info[1:]
            rows = num_recv
            m = rpm_host  # rows j receives from ranks 0..i
            need = max(m[-1])
            counts = [[m[i][j] - (m[i - 1][j] if i else 0) for j in range(R)] for i in range(R)]
            combine_rows = max(sum(c) - c[i] for i, c in enumerate(counts))
        else:
            num_recv, rows, need, combine_rows = -1, num_worst_tokens, num_worst_tokens, -1
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

    def _read_back(self, build: _Build, notified) -> tuple[list[int], list[list[int]]]:
        """The one host sync of a non-cached dispatch: received rows, per-expert counts, rpm."""
        R = self.group_size
        n = notified.recv_info.numel() + R * R
        if self._info_host is None or self._info_host.numel() < n:
            self._info_host = torch.empty(max(n, 1024), dtype=torch.int32, pin_memory=self.device.type == "cuda")
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
            out = launcher.combine(plan.cpp, x, topk_weights, b0, b1, mode, self._slot(session, plan.prof_open, it), 0,
                                   self._slot(session, plan.prof_signal, it))
            session.host_call("combine", it, t0, perf_counter_ns(), first)
        recv_hook = self._arm_hook("combine", lambda: self._receive(
            launcher.combine_receive, (plan.cpp, x, topk_weights, b0, b1, out), plan.prof_recv, "combine_hook",
            session, it))
        event = self._finish(False, allocate_on_comm_stream, (out.x, out.topk_weights), session)
        return out.x, out.topk_weights, event, recv_hook

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
                                          role_blocks=min(num_senders, max(num_blocks - num_senders, 1)))
        return _Plan(config, cpp, prof_open, prof_kernel)

    # -- low latency (ep_core/low_latency.py) ------------------------------------------------------
    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """num_rdma_bytes of a low_latency_mode Buffer for this shape (an NVLink buffer here)."""
        return _ll_module().size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def _low_latency(self):
        ll = getattr(self, "_ll", None)
        if ll is None:
            raise RuntimeError("ep_core: low-latency calls need Buffer(..., num_rdma_bytes="
                               "Buffer.get_low_latency_rdma_size_hint(...), low_latency_mode=True)")
        return ll

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False, *,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             config=None, profile=None):
        """DeepEP's low_latency_dispatch -> (recv_x, recv_count, handle, event, hook); `config` (a
        LowLatencyConfig) and `profile` are ep_core's additions."""
        return self._low_latency().dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                                            cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats,
                                            use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook,
                                            config=config, profile=profile)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False, out=None, *,
                            use_logfmt: bool = False, combine_wait_recv_cost_stats=None, config=None, profile=None):
        """DeepEP's low_latency_combine (weighted by topk_weights) -> (combined_x, event, hook)."""
        return self._low_latency().combine(x, topk_idx, topk_weights, handle, zero_copy, async_finish,
                                           return_recv_hook, out, use_logfmt=use_logfmt,
                                           combine_wait_recv_cost_stats=combine_wait_recv_cost_stats,
                                           config=config, profile=profile)

    def get_next_low_latency_combine_buffer(self, handle):
        """The [E/R, R * T_max, H] bf16 tensor the next low_latency_combine(zero_copy=True) reads."""
        return self._low_latency().next_combine_buffer(handle)

    def clean_low_latency_buffer(self, num_max_dispatch_tokens_per_rank: int, hidden: int, num_experts: int) -> None:
        """Zero the low-latency buffer's control block on every rank (collective)."""
        self._low_latency().clean()

    def internode_dispatch(self, *args, **kwargs):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")

    def internode_combine(self, *args, **kwargs):
        raise NotImplementedError("ep_core: internode is not implemented (intranode only)")


# What a synchronous call returns as its event (DeepEP returns an EventOverlap without an event).
_NO_EVENT = EventOverlap(None)
