"""ep_core's low-latency (decode) dispatch and combine: DeepEP's `low_latency_*` API over NVLink.

    buffer = ep_core.Buffer(group, num_rdma_bytes=ep_core.Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts), low_latency_mode=True)
    (recv_x, recv_scales), recv_count, handle, event, hook = buffer.low_latency_dispatch(
        x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=True)
    combined_x, event, hook = buffer.low_latency_combine(y, topk_idx, topk_weights, handle)

What is where:
  LowLatencyLayout   the buffer map (the one source of its offsets: the kernels take them by name)
                     and the size hint; pure Python, tested on the CPU (low_latency_layout.py).
  LowLatencyConfig   the launch geometry and seed 002's five techniques as knobs, each with its
                     old behaviour selectable (validated value object; low_latency_layout.py).
  LowLatencyHandle   what combine needs from its dispatch (its first five fields are DeepEP's;
                     low_latency_handles.py, with the stable output sets and the recv hook).
  LowLatency         the host side a Buffer in low_latency_mode holds (this file): its own
                     IPC-mapped buffer, stable output tensors, cached plans, the recv hooks and
                     their order; argument checks and plans in low_latency_checks.py, launches
                     in low_latency_launch.py.

Kernels (ep_core/csrc/low_latency_*.cu, docs/design.md "Low-latency kernels"): dispatch sends
each token once per destination rank (FP8 with one scale per 128 columns, or BF16) and the
receiver fans it out to its local experts, rows packed per expert in the order (source rank,
counted from the receiver, then token); combine sends the weights to the expert ranks, which
reduce each token over their experts (fp32, weighted) and send one BF16 partial row back.
The op's epoch and buffer half live on the device, so calls can be captured in a CUDA graph.

Rules the host enforces (ValueError otherwise), because the buffer has two halves and the kernels
take their epochs in order:
  * with `return_recv_hook=True` the call only sends; the hook receives. At most two ops may be in
    flight: the hook of op n must be called before op n + 2 is issued, hooks in op order, and no
    call without a hook while a hook is pending (its receive would run ahead of the pending one).
  * the tensors a call returns are reused two calls of the same kind later (DeepEP's rule: do
    not hold more than two low-latency results at once).
  * a CUDA graph must capture an even number of low-latency ops if its replays are interleaved
    with eager ops that expect alternating outputs (the outputs alternate on the host).
num_max_dispatch_tokens_per_rank (and hidden, num_experts) may change from one call to the next:
the two halves sit at fixed places (half of the buffer each, LowLatency.half_stride), so every
shape's op n writes only into half n & 1.

Not supported, each a clear error: dispatch_wait_recv_cost_stats / combine_wait_recv_cost_stats
(NotImplementedError), use_logfmt (NotImplementedError), internode ranks (the Buffer is intranode).
`zero_copy=True` reads the tensor of get_next_low_latency_combine_buffer; it saves nothing here
(combine reads the experts' outputs in place either way) and exists for DeepEP compatibility.
"""
from __future__ import annotations

import collections
import contextlib
from time import perf_counter_ns

from .low_latency_checks import LowLatencyChecks
from .low_latency_launch import LowLatencyLaunches
from .low_latency_layout import (FAMILY, BARRIERS, CONTROL_BYTES, CONTROL_WORDS, ERROR_PROTOCOL, FLAG_ARRAYS,  # noqa: F401
                                 GROUP, HEADER_BYTES, HOSTS, KERNELS, LINE, LOADS, MAX_BLOCKS, MAX_LOCAL_EXPERTS,
                                 MAX_TOKENS, MAX_WARPS_PER_BLOCK, META_BYTES, RECV_PHASE, SEND_PHASE, SPLITS,
                                 LowLatencyConfig, LowLatencyLayout, buffer_half_stride, size_hint)
from .low_latency_handles import LowLatencyHandle, RecvHook, _OutputSet, _signature  # noqa: F401


class LowLatency(LowLatencyChecks, LowLatencyLaunches):
    """The low-latency state of one Buffer (Buffer(..., low_latency_mode=True)); the Buffer's
    low_latency_* methods forward here. See the module docstring. Its parts: argument checks and
    plans (low_latency_checks.py), launches and hooks (low_latency_launch.py); this file holds the
    state, the two calls and the lifecycle."""

    def __init__(self, buffer, num_bytes: int, config: LowLatencyConfig | None = None):
        import torch

        from .peer import PeerBuffers

        ext = buffer.ext
        self._check_limits(ext)
        num_sms = torch.cuda.get_device_properties(buffer.device).multi_processor_count
        self._check_size(num_bytes)
        peers = PeerBuffers(ext, buffer._ranks, int(num_bytes))
        self._init_state(buffer, num_bytes, config, peers, num_sms)
        ext.ll_clean(peers.local, CONTROL_BYTES, 0)
        torch.cuda.synchronize(buffer.device)
        buffer._ranks.barrier()  # every control block is zero before anyone writes


    def _init_state(self, buffer, num_bytes: int, config, peers, num_sms: int) -> None:
        """Everything but the GPU allocations (the CPU tests build a LowLatency around a fake
        extension and fake peers with this)."""
        self.buffer = buffer
        self.num_bytes = int(num_bytes)
        self.num_sms = int(num_sms)
        self.config = config if config is not None else LowLatencyConfig()
        self.config.check_geometry(buffer.group_size, self.num_sms)
        self._tunable = self.config if config is None else None  # see _call_config
        self._tuned: dict = {}           # (kernel, T_max, hidden, dtype) -> the tuned config or None
        self.peers = peers
        self._err = buffer.ext.ErrorRecord()
        self._launchers: dict = {}       # id(ext) -> LLLauncher of that build
        self._layouts: dict = {}         # (T_max, H, E) -> (LowLatencyLayout, {id(ext): LLLayout})
        self._sets: dict = {}            # (dispatch key, parity) -> _OutputSet
        self._outs: dict = {}            # (T, H, parity) -> combine output tensor
        self._hooks: dict = {}           # (kind, op parity) -> RecvHook reused by host="cached"
        self._ops = 0                    # low-latency ops issued (the host's count; epochs live on the device)
        self._dispatches = 0
        self._combines = 0
        self._pending: collections.deque = collections.deque()  # ops whose recv hook is not called yet
        self._checked: set = set()       # argument signatures validated once (host="cached"): _signature
        self._broken: str | None = None
        self._destroyed = False

    # -- errors ------------------------------------------------------------------------------------
    def _check_usable(self) -> None:
        if self._destroyed:
            raise RuntimeError("ep_core: this Buffer was destroyed")
        if self._err.flag():
            self._raise_device_error()
        if self._broken:
            raise RuntimeError(f"ep_core: the low-latency buffer is unusable after an earlier error: {self._broken}")

    def error_message(self) -> str | None:
        e = self._err.report()
        if e.flag <= 0:
            return None
        kname = KERNELS.get(e.kernel, f"kernel {e.kernel}")
        from ep_core.generated import ep_low_latency_phases as P

        what = (P.BARRIERS if e.is_barrier else P.PHASES).get(e.phase, f"id {e.phase}")
        if e.flag == 1:
            where = f"barrier {what}" if e.is_barrier else f"phase {what}"
            return (f"ep_core {kname} timed out on rank {e.rank} after {self.buffer.timeout_s:g} s: {where} waiting "
                    f"for rank {e.peer} (op {e.epoch}); rank {e.peer} never signalled (it hung, died, or skipped "
                    f"this op)")
        if e.flag == ERROR_PROTOCOL:
            return (f"ep_core {kname} on rank {e.rank}: the send and receive halves of op {e.epoch} ran out of order "
                    f"(a receive ran before its send, or a hook was called out of order)")
        return f"ep_core {kname} on rank {e.rank}: device error flag {e.flag} (phase {what}, peer {e.peer})"

    def _raise_device_error(self, session=None) -> None:
        from .errors import EPTimeoutError, save_partial_profile

        msg = self.error_message()
        if msg is None:
            return
        self._broken = msg
        msg = save_partial_profile(session if session is not None else self.buffer._session, msg)
        raise (EPTimeoutError if self._err.flag() == 1 else RuntimeError)(msg)

    def synchronize(self) -> None:
        """Wait for the device and raise any low-latency device error so far."""
        import torch

        torch.cuda.synchronize(self.buffer.device)
        if self._err.flag():
            self._raise_device_error()


    @property
    def half_stride(self) -> int:
        return buffer_half_stride(self.num_bytes)


    # -- dispatch ----------------------------------------------------------------------------------
    def dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank: int, num_experts: int,
                 cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None, use_fp8: bool = True,
                 round_scale: bool = False, use_ue8m0: bool = False, async_finish: bool = False,
                 return_recv_hook: bool = False, config: LowLatencyConfig | None = None, profile=None):
        t0 = perf_counter_ns()
        if self._err.flag() or self._broken or self._destroyed:
            self._check_usable()
        cfg = self._call_config(config, "ll_dispatch", num_max_dispatch_tokens_per_rank,
                                (getattr(x, "shape", None) or (0,))[-1], "fp8" if use_fp8 else "bf16")
        if dispatch_wait_recv_cost_stats is not None:
            raise NotImplementedError("ep_core: dispatch_wait_recv_cost_stats is not supported by the low-latency "
                                      "kernels (no per-token wait timing)")
        if use_ue8m0 and not round_scale:
            raise ValueError("ep_core: use_ue8m0=True needs round_scale=True (UE8M0 scales are powers of two)")
        if use_ue8m0 and not use_fp8:
            raise ValueError("ep_core: use_ue8m0=True needs use_fp8=True")
        if async_finish and return_recv_hook:
            raise ValueError("ep_core: async_finish and return_recv_hook cannot be combined")
        T_max, E = num_max_dispatch_tokens_per_rank, num_experts
        stats = cumulative_local_expert_recv_stats
        cached = cfg.host == "cached"
        # every call's tensors are checked before any pointer reaches the extension: in full on a
        # new signature (shape, strides, dtype, device of each), by the signature alone after
        sig = ("dispatch", T_max, E, bool(use_fp8), bool(use_ue8m0), _signature(x), _signature(topk_idx),
               _signature(stats))
        if not cached or sig not in self._checked:
            self._check_dispatch_args(x, topk_idx, T_max, E, use_fp8, use_ue8m0, stats)
            if cached:
                self._checked.add(sig)
        key = (T_max, x.size(1), E, topk_idx.size(1), bool(use_fp8), bool(use_ue8m0), stats is not None)
        H, K = x.size(1), topk_idx.size(1)
        session = self.buffer._session_for(profile)
        build = self.buffer._build(session is not None)
        ext = build.ext
        layout, cpp_layout = self._layout(T_max, H, E, ext, cached)
        undo = self._counters()
        n = self._open(return_recv_hook)
        parity = self._dispatches & 1
        self._dispatches += 1
        oset = self._output_set(key, parity, layout, K, use_fp8, use_ue8m0, cached)
        pkey = (id(ext), cfg, bool(round_scale), id(cumulative_local_expert_recv_stats))
        plan = oset.plans.get(pkey) if cached else None
        if plan is None:
            plan = ext.LLDispatchPlan(layout=cpp_layout, outputs=oset.cpp(ext),
                                      cumulative_stats=cumulative_local_expert_recv_stats,
                                      num_ranks=self.buffer.group_size, num_experts=E, max_tokens=T_max, hidden=H,
                                      num_topk=K, fp8=bool(use_fp8), round_scale=bool(round_scale),
                                      ue8m0=bool(use_ue8m0), knobs=cfg.knobs(ext), geometry=cfg.geometry(ext))
            if cached:
                # the stats tensor's id is in the key: keep the tensor alive with the plan
                oset.plans[pkey] = (plan, cumulative_local_expert_recv_stats)
        else:
            plan = plan[0]
        handle = oset.handle if cached else None
        if handle is None or handle.num_tokens != x.size(0):
            handle = LowLatencyHandle(oset.recv_src_info, oset.recv_layout_range, T_max, H, E, oset.slot,
                                      oset.recv_tokens, oset.sent_mask, x.size(0), K, oset)
            if cached:
                oset.handle = handle
        launcher = self._launcher(build)
        it = self.buffer._iteration(new=True) if session is not None else 0

        def launch(phases: int, kernel: str, stream: int):
            from .buffer_profile import labelled   # torch: imported where the call runs
            with labelled(session):
                prof = self._slot(session, kernel, cfg, layout, it) if session is not None else 0
                launcher.dispatch(plan, x, topk_idx, phases, prof, stream)

        event, hook = self._run(launch, "ll_dispatch", n, async_finish, return_recv_hook, cfg, (x, topk_idx),
                                session, it, t0, undo)
        return oset.received(), oset.recv_count, handle, event, hook


    # -- combine -----------------------------------------------------------------------------------
    def combine(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, zero_copy: bool = False,
                async_finish: bool = False, return_recv_hook: bool = False, out=None, *, use_logfmt: bool = False,
                combine_wait_recv_cost_stats=None, config: LowLatencyConfig | None = None, profile=None):
        t0 = perf_counter_ns()
        if self._err.flag() or self._broken or self._destroyed:
            self._check_usable()
        cfg = self._call_config(config, "ll_combine", getattr(handle, "num_max_dispatch_tokens_per_rank", 0),
                                getattr(handle, "hidden", 0), "bf16")
        if use_logfmt:
            raise NotImplementedError("ep_core: use_logfmt (DeepEP's 10-bit LogFMT combine) is not supported; "
                                      "the partial rows travel as BF16")
        if combine_wait_recv_cost_stats is not None:
            raise NotImplementedError("ep_core: combine_wait_recv_cost_stats is not supported by the low-latency "
                                      "kernels (no per-token wait timing)")
        if async_finish and return_recv_hook:
            raise ValueError("ep_core: async_finish and return_recv_hook cannot be combined")
        if not isinstance(handle, LowLatencyHandle):
            raise ValueError("ep_core: low_latency_combine needs the handle returned by this Buffer's "
                             "low_latency_dispatch")
        cached = cfg.host == "cached"
        oset = handle.outputs
        T_max, H, E = handle.num_max_dispatch_tokens_per_rank, handle.hidden, handle.num_experts
        if zero_copy:
            zc = oset.zero_copy
            if zc is None or zc[1] != self._combines & 1:
                raise ValueError("ep_core: zero_copy=True reads the tensor of get_next_low_latency_combine_buffer("
                                 "handle), called before this combine")
            x = zc[0]
        # as in dispatch: checked in full on a new signature, by the signature after (the first GPU
        # run's host crash came from a call whose x the cached path let through unchecked)
        sig = ("combine", T_max, H, E, handle.num_tokens, handle.num_topk, _signature(x), _signature(topk_idx),
               _signature(topk_weights), _signature(out))
        if not cached or sig not in self._checked:
            self._check_combine_args(x, topk_idx, topk_weights, handle, out)
            if cached:
                self._checked.add(sig)
        session = self.buffer._session_for(profile)
        build = self.buffer._build(session is not None)
        ext = build.ext
        parity = self._combines & 1
        layout, cpp_layout = self._layout(T_max, H, E, ext, cached)
        undo = self._counters()
        n = self._open(return_recv_hook)
        self._combines += 1
        pkey = ("combine", id(ext), cfg)
        plan = oset.plans.get(pkey) if cached else None
        if plan is None:
            plan = ext.LLCombinePlan(layout=cpp_layout, handle=oset.cpp(ext), num_ranks=self.buffer.group_size,
                                     num_experts=E, max_tokens=T_max, hidden=H, num_topk=handle.num_topk,
                                     knobs=cfg.knobs(ext), geometry=cfg.geometry(ext))
            if cached:
                oset.plans[pkey] = plan
        if out is None:
            out = self._combine_out(handle.num_tokens, H, parity, cached)
        launcher = self._launcher(build)
        it = self.buffer._iteration(new=False) if session is not None else 0

        def launch(phases: int, kernel: str, stream: int):
            from .buffer_profile import labelled   # torch: imported where the call runs
            with labelled(session):
                prof = self._slot(session, kernel, cfg, layout, it) if session is not None else 0
                launcher.combine(plan, x, topk_idx, topk_weights, out, phases, prof, stream)

        event, hook = self._run(launch, "ll_combine", n, async_finish, return_recv_hook, cfg,
                                (x, topk_idx, topk_weights, out), session, it, t0, undo)
        return out, event, hook


    def next_combine_buffer(self, handle: LowLatencyHandle):
        """The tensor the next combine reads with zero_copy=True: [E/R, R * T_max, H] bf16."""
        import torch

        if not isinstance(handle, LowLatencyHandle):
            raise ValueError("ep_core: get_next_low_latency_combine_buffer needs a low_latency_dispatch handle")
        parity = self._combines & 1
        key = ("zero_copy", parity)
        oset = handle.outputs
        buf = self._sets.get((key, oset.recv_x.shape))
        if buf is None:
            El, RT, H = oset.recv_x.shape
            buf = self._sets[(key, oset.recv_x.shape)] = torch.empty((El, RT, H), dtype=torch.bfloat16,
                                                                      device=self.buffer.device)
        oset.zero_copy = (buf, parity)
        return buf


    # -- lifecycle -----------------------------------------------------------------------------------
    def clean(self) -> None:
        """Zero every rank's control block (collective): the epochs restart at 1 on every rank.
        Pending recv hooks are dropped."""
        import torch

        torch.cuda.synchronize(self.buffer.device)
        self.buffer._ranks.barrier()  # nobody still writes into a control block
        self.buffer.ext.ll_clean(self.peers.local, CONTROL_BYTES, 0)
        torch.cuda.synchronize(self.buffer.device)
        self.buffer._ranks.barrier()
        self._pending.clear()

    def destroy(self) -> None:
        if self._destroyed:
            return
        self.peers.close()
        self._err.close()
        self._launchers.clear()
        self._destroyed = True

    @contextlib.contextmanager
    def using(self, config: LowLatencyConfig):
        """Calls inside the block use `config` (the A/B recordings switch knobs this way)."""
        config.check_geometry(self.buffer.group_size, self.num_sms)
        prev = self.config
        self.config = config
        try:
            yield
        finally:
            self.config = prev
