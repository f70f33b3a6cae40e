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

import os

import torch

from . import _ext
from .buffer_compat import BufferCompat
from .buffer_hook import BufferHookMode, RecvHook  # noqa: F401  (ep_core.buffer.RecvHook, as before the split)
from .buffer_ops import BufferOps
from .buffer_plans import (CHUNKS_PER_SENDER_BLOCK, COMBINE_SENDER_FRACTION, COMBINE_SPLIT,  # noqa: F401
                           DISPATCH_SENDER_FRACTION, DISPATCH_SPLIT, BufferPlans, _split)
from .buffer_profile import FAMILY, BufferProfiling  # noqa: F401
from .config import DATA_OFFSET, MAX_RANKS, MAX_TOPK, REGION_ALIGN, Config, buffer_size_hint, hook_buffer_size_hint
from .config import combine_config as _combine_config
from .config import dispatch_config as _dispatch_config
from .errors import BufferErrors, EPCapacityError, EPTimeoutError, EPUnavailableError, ErrorReport  # noqa: F401  (DeepEP-style names)
from .handles import DispatchHandle, PlanCache, _Build  # noqa: F401
from .low_latency import LowLatency
from .low_latency_layout import size_hint as _ll_size_hint
from .peer import Collective, PeerBuffers
from .streams import _NO_EVENT, EventOverlap, _device_name, current_raw_stream, topk_idx_t  # noqa: F401

DEFAULT_TIMEOUT_S = 10.0


class Buffer(BufferOps, BufferHookMode, BufferPlans, BufferProfiling, BufferErrors, BufferCompat):
    """DeepEP's intranode `Buffer` (normal kernels). See the module docstring. Its parts, one seam
    a file: argument checks and plans (buffer_plans.py), launches (buffer_ops.py), hook mode
    (buffer_hook.py), profiling (buffer_profile.py), device errors (errors.py), the rest of DeepEP's
    API and what each of its keywords does here (buffer_compat.py); this file holds construction,
    the builds, the static API and the lifecycle."""

    num_sms: int = 20  # DeepEP's default; set_num_sms changes it for every Buffer
    _num_sms_set: bool = False  # set_num_sms was called: the caller chose the SMs, no tuned entry applies

    def __init__(self, group, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 24, allow_nvlink_for_low_latency_mode: bool = True,
                 allow_mnnvl: bool = False, use_fabric: bool = False, explicitly_destroy: bool = False,
                 enable_shrink: bool = False, comm=None, *,
                 timeout_s: float | None = None, _test_skip_send_rank: int | None = None):
        """DeepEP's constructor, keyword for keyword; what each one does here: ep_core/buffer_compat.py."""
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
        ranks = Collective(group, comm)
        self.group = group if group is not None else comm  # DeepEP keeps the communicator here when no group
        if not 1 <= ranks.size <= MAX_RANKS:
            raise ValueError(f"ep_core: 1..{MAX_RANKS} ranks (intranode), the group has {ranks.size}")
        if not torch.cuda.is_available():
            raise EPUnavailableError(f"ep_core: Buffer needs a CUDA GPU, and torch ({torch.__version__}) sees none "
                                     "(the size hints need none: Buffer.get_buffer_size_hint works anywhere)")
        ext = _ext.load(profile=False)
        limits = dict(ext.limits())
        # the size hints' header size (config.DATA_OFFSET) is the compiled map's (buffer_map.h asserts it too)
        assert limits["data_offset"] == DATA_OFFSET, (limits["data_offset"], DATA_OFFSET)
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
        peers = PeerBuffers(ext, ranks, int(num_nvl_bytes))
        self._init_host_state(ext, rank=ranks.rank, group_size=ranks.size, num_nvl_bytes=int(num_nvl_bytes),
                              timeout_s=timeout, skip_send=skip is not None and int(skip) == ranks.rank,
                              device=device, comm_stream=torch.cuda.Stream(device=device), peers=peers, ranks=ranks)
        self.num_rdma_bytes, self.low_latency_mode = int(num_rdma_bytes), bool(low_latency_mode)
        self.enable_shrink = bool(enable_shrink)
        # low-latency mode: its own IPC-mapped buffer of num_rdma_bytes (ep_core/low_latency.py)
        self._ll = LowLatency(self, int(num_rdma_bytes)) if low_latency_mode else None

    def _init_host_state(self, ext, *, rank, group_size, num_nvl_bytes, timeout_s, skip_send, device, comm_stream,
                         peers, ranks: Collective | None = None) -> None:
        """Everything but the process group and the GPU allocations (the CPU tests build a Buffer
        around a fake extension with this)."""
        self.rank, self.group_size = rank, group_size
        self._ranks = ranks if ranks is not None else Collective()
        # DeepEP's attributes; the constructor sets them from its arguments
        self.num_rdma_bytes, self.low_latency_mode, self.enable_shrink = 0, False, False
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
        self._prof_seen: dict = {}    # profile geometries launched so far (buffer_profile._slot)
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
        return buffer_size_hint(num_max_tokens_per_rank, hidden, num_ranks, num_topk)

    @staticmethod
    def get_hook_buffer_size_hint(num_max_tokens_per_rank: int, hidden: int, num_ranks: int,
                                  num_topk: int = MAX_TOPK) -> int:
        """num_nvl_bytes that fits every call get_buffer_size_hint fits, with or without
        return_recv_hook: a hook-mode dispatch needs, besides the rows it receives (up to T x R), a
        staging region for the rows it packs for its peers (up to T x (R - 1)), so the data region
        holds T x (2R - 1) rows. A hook-mode combine needs no more than a normal one."""
        return hook_buffer_size_hint(num_max_tokens_per_rank, hidden, num_ranks, num_topk)

    # -- lifecycle -------------------------------------------------------------------------------
    def destroy(self) -> None:
        """Free the buffer (collective: every rank calls it). Only with explicitly_destroy=True."""
        if not self.explicitly_destroy:
            raise RuntimeError("ep_core: destroy() needs Buffer(..., explicitly_destroy=True)")
        if self._destroyed:
            return
        torch.cuda.synchronize(self.device)
        self._ranks.barrier()  # no peer may still write into a buffer we unmap
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

    def _raw_stream(self) -> int:
        """The caller's current stream as a raw handle (the CPU tests replace current_raw_stream)."""
        return current_raw_stream(self._device_index)

    def synchronize(self) -> None:
        """Wait for every call so far (on the comm stream and, direct calls, on the callers'
        streams: the device) and raise any device error of them."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        else:  # the CPU tests' fake Buffer
            self.comm_stream.synchronize()
        self._raise_device_error()

    # -- low latency (ep_core/low_latency.py) ------------------------------------------------------
    @staticmethod
    def get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int,
                                       num_experts: int) -> int:
        """num_rdma_bytes of a low_latency_mode Buffer for this shape (an NVLink buffer here)."""
        return _ll_size_hint(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts)

    def _low_latency(self):
        ll = getattr(self, "_ll", None)
        if ll is None:
            raise RuntimeError("ep_core: low-latency calls need Buffer(..., num_rdma_bytes="
                               "Buffer.get_low_latency_rdma_size_hint(...), low_latency_mode=True)")
        return ll

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,
                             use_fp8: bool = True, round_scale: bool = False, use_ue8m0: bool = False,
                             async_finish: bool = False, return_recv_hook: bool = False, *, config=None, profile=None):
        """DeepEP's low_latency_dispatch (its positional order) -> (recv_x, recv_count, handle, event,
        hook); `config` (a LowLatencyConfig) and `profile` are ep_core's additions."""
        return self._low_latency().dispatch(x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,
                                            cumulative_local_expert_recv_stats, dispatch_wait_recv_cost_stats,
                                            use_fp8, round_scale, use_ue8m0, async_finish, return_recv_hook,
                                            config=config, profile=profile)

    def low_latency_combine(self, x, topk_idx, topk_weights, handle, use_logfmt: bool = False, zero_copy: bool = False,
                            async_finish: bool = False, return_recv_hook: bool = False, out=None,
                            combine_wait_recv_cost_stats=None, *, config=None, profile=None):
        """DeepEP's low_latency_combine (its positional order; weighted by topk_weights) ->
        (combined_x, event, hook)."""
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
