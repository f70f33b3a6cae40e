"""ep_core's low-latency (decode) dispatch and combine: DeepEP's `low_latency_*` API over NVLink.

    buffer = ep_core.Buffer(group, num_rdma_bytes=ep_core.Buffer.get_low_latency_rdma_size_hint(
        num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts), low_latency_mode=True)
    (recv_x, recv_scales), recv_count, handle, event, hook = buffer.low_latency_dispatch(
        x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts, use_fp8=True)
    combined_x, event, hook = buffer.low_latency_combine(y, topk_idx, topk_weights, handle)

What is where:
  LowLatencyLayout   the buffer map (the one source of its offsets: the kernels take them by name)
                     and the size hint; pure Python, tested on the CPU.
  LowLatencyConfig   the launch geometry and seed 002's five techniques as knobs, each with its
                     old behaviour selectable (validated value object).
  LowLatencyHandle   what combine needs from its dispatch (its first five fields are DeepEP's).
  LowLatency         the host side a Buffer in low_latency_mode holds: its own IPC-mapped buffer,
                     stable output tensors, cached plans, the recv hooks and their order.

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
import dataclasses
import math
from dataclasses import dataclass
from time import perf_counter_ns
from typing import NamedTuple

from .config import MAX_HIDDEN, MAX_RANKS, MAX_TOPK

FAMILY = "ep_low_latency"

# Mirrors of ep_core/csrc/low_latency.cuh (tests/ep_core/test_low_latency_layout.py reads the
# header and compares; LowLatency checks them against the compiled extension's ll_limits()).
GROUP = 128                  # elements per FP8 scale group, the unit of a slice
MAX_TOKENS = 1024            # num_max_dispatch_tokens_per_rank: positions are 16-bit fields
MAX_BLOCKS = 256
MAX_WARPS_PER_BLOCK = 16     # 512 threads per block (launch bounds)
MAX_LOCAL_EXPERTS = 512
KERNELS = {16: "ll_dispatch", 17: "ll_dispatch_send", 18: "ll_dispatch_recv",
           19: "ll_combine", 20: "ll_combine_send", 21: "ll_combine_recv"}
ERROR_PROTOCOL = 4
SEND_PHASE, RECV_PHASE = 1, 2

# ---- the buffer map --------------------------------------------------------------------------
# Control block: one int32 word per 128-byte line (counters that many blocks poll or add to do
# not share a line), then three [2 halves][MAX_RANKS] int32 flag arrays. Zeroed by clean.
CONTROL_WORDS = ("send_seq", "send_tickets", "recv_seq", "recv_tickets", "send_done", "recv_done",
                 "send_gen", "recv_gen", "abort", "claim")
FLAG_ARRAYS = ("credit", "data_flag", "cw_flag")
LINE = 128
CONTROL_BYTES = 4096
META_BYTES = MAX_TOPK * 4    # routing record of one token: int32 (pos << 16 | local expert) per top-k slot
HEADER_BYTES = 16            # {num_tokens, pad[3]} before the per-expert counts


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _check_int(owner: str, name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class LowLatencyLayout:
    """Where everything lives in every rank's low-latency buffer (the same on every rank).

        control (4 KiB) | half 0 | half 1            op n uses half n & 1
        half:  hdr[R]       {num_tokens, pad[3], counts[E/R]}   written by source r's router
               meta[R][T]   [MAX_TOPK] int32 routing records    written by source r's router
               rows[R][T]   staged token: FP8 H bytes + H/128 float scales, or BF16 2H bytes
               cweights[R][T][MAX_TOPK] float                   combine weights from source r
               cpartials[R][T][H] bf16                          combine partials from expert rank r
    T = num_max_dispatch_tokens_per_rank; every region 128-byte aligned, halves 4 KiB aligned."""

    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_ranks: int
    num_experts: int

    def __post_init__(self):
        for name in ("num_max_dispatch_tokens_per_rank", "hidden", "num_ranks", "num_experts"):
            _check_int("LowLatencyLayout", name, getattr(self, name))
        T, H, R, E = self.num_max_dispatch_tokens_per_rank, self.hidden, self.num_ranks, self.num_experts
        if not 1 <= T <= MAX_TOKENS:
            raise ValueError(f"LowLatencyLayout.num_max_dispatch_tokens_per_rank must be in 1..{MAX_TOKENS}, got {T}")
        if H <= 0 or H % GROUP or H > MAX_HIDDEN:
            raise ValueError(f"LowLatencyLayout.hidden must be a positive multiple of {GROUP} up to {MAX_HIDDEN}, "
                             f"got {H}")
        if not 1 <= R <= MAX_RANKS:
            raise ValueError(f"LowLatencyLayout.num_ranks must be in 1..{MAX_RANKS}, got {R}")
        if E <= 0 or E % R or E // R > MAX_LOCAL_EXPERTS:
            raise ValueError(f"LowLatencyLayout.num_experts must be a positive multiple of num_ranks ({R}) with at "
                             f"most {MAX_LOCAL_EXPERTS} per rank, got {E}")

    @property
    def num_local_experts(self) -> int:
        return self.num_experts // self.num_ranks

    @property
    def rows_per_expert(self) -> int:
        """Rows of recv_x per local expert: every rank's tokens could pick it (R * T)."""
        return self.num_ranks * self.num_max_dispatch_tokens_per_rank

    def offsets(self, half_stride: int | None = None) -> dict[str, int]:
        """Every named byte offset the kernels take (ep_core/csrc/low_latency.cuh `Layout`).

        half_stride: where half 1 starts after half 0, when the buffer is larger than this shape
        needs (LowLatency passes half of its buffer, the same for every shape, so that op n of one
        num_max_dispatch_tokens_per_rank and op n + 1 of another never write into each other's
        half); None = this shape's own (the size hint)."""
        T, H, R = self.num_max_dispatch_tokens_per_rank, self.hidden, self.num_ranks
        off: dict[str, int] = {}
        at = 0
        for name in CONTROL_WORDS:
            off[name] = at
            at += LINE
        for name in FLAG_ARRAYS:
            off[name] = at
            at += _align(2 * MAX_RANKS * 4, LINE)
        assert at <= CONTROL_BYTES, "the control block outgrew its 4 KiB"
        off["half0"] = CONTROL_BYTES
        row_bytes = _align(2 * H, LINE)  # the wider of FP8 (H + 4 H / 128) and BF16 (2 H)
        strides = {"hdr_stride": _align(HEADER_BYTES + 4 * self.num_local_experts, LINE),
                   "meta_stride": _align(T * META_BYTES, LINE),
                   "rows_stride": T * row_bytes,
                   "cw_stride": _align(T * MAX_TOPK * 4, LINE),
                   "cp_stride": _align(T * 2 * H, LINE)}
        at = 0
        for region, stride in (("hdr", "hdr_stride"), ("meta", "meta_stride"), ("rows", "rows_stride"),
                               ("cweights", "cw_stride"), ("cpartials", "cp_stride")):
            off[region] = at
            off[stride] = strides[stride]
            at = _align(at + R * strides[stride], LINE)
        off["row_bytes"] = row_bytes
        need = _align(at, 4096)
        if half_stride is not None:
            _check_int("LowLatencyLayout.offsets", "half_stride", half_stride)
            if half_stride < need or half_stride % 4096:
                raise ValueError(f"LowLatencyLayout.offsets: half_stride {half_stride} must be a multiple of 4096 "
                                 f"and >= this shape's {need}")
            need = half_stride
        off["half_stride"] = need
        off["size"] = off["half0"] + 2 * off["half_stride"]
        return off

    @property
    def size(self) -> int:
        return self.offsets()["size"]


def size_hint(num_max_dispatch_tokens_per_rank: int, hidden: int, num_ranks: int, num_experts: int) -> int:
    """Bytes of the low-latency buffer for this shape (Buffer.get_low_latency_rdma_size_hint)."""
    return LowLatencyLayout(num_max_dispatch_tokens_per_rank, hidden, num_ranks, num_experts).size


def buffer_half_stride(num_bytes: int) -> int:
    """Bytes between the two halves of a low-latency buffer of num_bytes, the same for every
    call's shape: half of what it holds after its control block, in 4 KiB pages. A call with
    another T_max, hidden or expert count than the op before it then still writes only into its
    own half, which the credits protect (a shape-dependent half 1 would start inside the previous
    op's half 0 while a peer may still read it)."""
    return (int(num_bytes) - CONTROL_BYTES) // 2 // 4096 * 4096


# ---- tuning and seed 002's knobs ---------------------------------------------------------------
SPLITS = ("flat", "per_block")
BARRIERS = ("working", "all")
LOADS = ("first", "in_order")
HOSTS = ("cached", "per_call")


@dataclass(frozen=True)
class LowLatencyConfig:
    """Launch geometry and seed 002's five techniques (../shared/seeds/002_*), each a knob whose
    old behaviour stays selectable. Defaults are the new behaviours; `LowLatencyConfig.old()` is
    every old one.

    num_blocks, warps_per_block: every low-latency launch's grid (blocks <= the GPU's SMs: the
        `barrier="all"` variant waits for the whole grid, which must be resident).
    split (1)            "flat": a token's 128-column groups are cut into slices and (token, slice)
                         tasks are spread over every warp of the grid; "per_block": each block owns
                         a contiguous run of ceil(T / blocks) tokens and its warps take whole tokens.
    barrier (2)          "working": a phase's completion counts only the warps and blocks with
                         work, which arrive and leave; "all": every warp of the grid arrives and
                         waits for the whole grid.
    min_slice_groups (3) a slice's floor in 128-column groups when the flat split cuts a token
                         (4 = 512 columns, seed 002's measured floor); 1 = no floor (the finest split).
    loads (4)            "first": a task issues its independent loads (top-k ids, rows, routing
                         records) before it uses any; "in_order": each load right before its use.
    host (5)             "cached": a call reuses its layout, plans, output tensors and hook objects;
                         "per_call": rebuilds them every call.
    """

    num_blocks: int = 64
    warps_per_block: int = 16
    split: str = "flat"
    barrier: str = "working"
    min_slice_groups: int = 4
    loads: str = "first"
    host: str = "cached"

    KNOBS = ("split", "barrier", "min_slice_groups", "loads", "host")
    OLD = {"split": "per_block", "barrier": "all", "min_slice_groups": 1, "loads": "in_order", "host": "per_call"}

    def __post_init__(self):
        for name in ("num_blocks", "warps_per_block", "min_slice_groups"):
            _check_int("LowLatencyConfig", name, getattr(self, name))
        if not 1 <= self.num_blocks <= MAX_BLOCKS:
            raise ValueError(f"LowLatencyConfig.num_blocks must be in 1..{MAX_BLOCKS}, got {self.num_blocks}")
        if not 1 <= self.warps_per_block <= MAX_WARPS_PER_BLOCK:
            raise ValueError(f"LowLatencyConfig.warps_per_block must be in 1..{MAX_WARPS_PER_BLOCK}, "
                             f"got {self.warps_per_block}")
        if self.min_slice_groups < 1:
            raise ValueError(f"LowLatencyConfig.min_slice_groups must be >= 1 (1 = no floor), got {self.min_slice_groups}")
        for name, allowed in (("split", SPLITS), ("barrier", BARRIERS), ("loads", LOADS), ("host", HOSTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"LowLatencyConfig.{name} must be one of {allowed}, got {getattr(self, name)!r}")

    @classmethod
    def old(cls, **geometry) -> "LowLatencyConfig":
        """Every knob at its old behaviour (the state before seed 002's changes)."""
        return cls(**geometry, **cls.OLD)

    def with_old(self, knob: str) -> "LowLatencyConfig":
        """This config with one knob at its old behaviour (one side of an A/B story)."""
        if knob not in self.KNOBS:
            raise ValueError(f"LowLatencyConfig: no knob {knob!r}; the knobs are {self.KNOBS}")
        return dataclasses.replace(self, **{knob: self.OLD[knob]})

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check_geometry(self, num_ranks: int, num_sms: int | None = None) -> None:
        if self.num_blocks < num_ranks:
            raise ValueError(f"LowLatencyConfig.num_blocks ({self.num_blocks}) must be >= the rank count "
                             f"({num_ranks}): block d runs the router of destination d")
        if num_sms is not None and self.num_blocks > num_sms:
            raise ValueError(f"LowLatencyConfig.num_blocks ({self.num_blocks}) must be <= the GPU's {num_sms} SMs: "
                             f"a low-latency launch keeps all its blocks resident")

    def knobs(self, ext):
        return ext.LLKnobs(flat_split=self.split == "flat", count_working=self.barrier == "working",
                           min_slice_groups=self.min_slice_groups, loads_first=self.loads == "first")

    def geometry(self, ext):
        return ext.LLGeometry(num_blocks=self.num_blocks, warps_per_block=self.warps_per_block)


def _signature(t):
    """What the argument checks depend on, per tensor: shape, strides (contiguity), dtype, device;
    the type for anything else (None, a wrong object). A cached call with a known signature is as
    valid as the call that was checked."""
    try:
        return (tuple(t.shape), t.stride(), t.dtype, t.device)
    except (AttributeError, TypeError):
        return type(t)


# ---- the handle --------------------------------------------------------------------------------
class LowLatencyHandle(NamedTuple):
    """What low_latency_combine needs from its dispatch. The first five fields are DeepEP's
    handle: recv_src_info[e, i] is the index, at its source rank, of row i of local expert e, and
    recv_layout_range[e, r] = (begin << 32) | count of the rows that came from rank r. The rest
    are ep_core's: the row of each (source, token, top-k slot) in the experts' rows (slot), the
    token count of every source (recv_tokens), this rank's tokens' destination ranks (sent_mask,
    a bitmask per token), and the dispatch's own token count and top-k width."""

    recv_src_info: object          # torch.Tensor [E/R, R * T_max] int32
    recv_layout_range: object      # torch.Tensor [E/R, R] int64
    num_max_dispatch_tokens_per_rank: int
    hidden: int
    num_experts: int
    slot: object                   # torch.Tensor [R, T_max, K] int32: e * R * T_max + row, or -1
    recv_tokens: object            # torch.Tensor [R] int32
    sent_mask: object              # torch.Tensor [T_max] int32
    num_tokens: int
    num_topk: int
    outputs: object                # _OutputSet the tensors belong to (its plans are cached on it)


# ---- the host side -----------------------------------------------------------------------------
class _OutputSet:
    """One set of stable output tensors of a dispatch shape (two per shape, used alternately), the
    DeepEP-facing views of them, and the plans built over them per extension build."""

    __slots__ = ("recv_x", "scales_storage", "recv_scales", "recv_count", "recv_src_info", "recv_layout_range", "slot",
                 "recv_tokens", "sent_mask", "plans", "handle", "zero_copy")

    def __init__(self, layout: LowLatencyLayout, num_topk: int, use_fp8: bool, use_ue8m0: bool, device):
        import torch

        El, RT, H, R, T = (layout.num_local_experts, layout.rows_per_expert, layout.hidden, layout.num_ranks,
                           layout.num_max_dispatch_tokens_per_rank)
        i32 = dict(dtype=torch.int32, device=device)
        self.recv_x = torch.empty((El, RT, H), dtype=torch.float8_e4m3fn if use_fp8 else torch.bfloat16, device=device)
        self.scales_storage = self.recv_scales = None
        if use_fp8:
            groups = H // (4 * GROUP) if use_ue8m0 else H // GROUP
            self.scales_storage = torch.empty((El, groups, RT), **i32) if use_ue8m0 else \
                torch.empty((El, groups, RT), dtype=torch.float32, device=device)
            # DeepEP's layout: [E/R, R*T_max, groups] with the last two dimensions column-major
            self.recv_scales = self.scales_storage.transpose(1, 2)
        self.recv_count = torch.empty((El,), **i32)
        self.recv_src_info = torch.empty((El, RT), **i32)
        self.recv_layout_range = torch.empty((El, R), dtype=torch.int64, device=device)
        self.slot = torch.empty((R, T, num_topk), **i32)
        self.recv_tokens = torch.empty((R,), **i32)
        self.sent_mask = torch.empty((T,), **i32)
        self.plans: dict = {}
        self.handle = None
        self.zero_copy = None

    def cpp(self, ext):
        return ext.LLDispatchOutputs(recv_x=self.recv_x, recv_scales=self.scales_storage, recv_count=self.recv_count,
                                     recv_src_info=self.recv_src_info, recv_layout_range=self.recv_layout_range,
                                     slot=self.slot, recv_tokens=self.recv_tokens, sent_mask=self.sent_mask)

    def received(self):
        return (self.recv_x, self.recv_scales) if self.recv_scales is not None else self.recv_x


class RecvHook:
    """The receive half of a low-latency call (return_recv_hook=True): calling it launches the
    receive kernel on the current stream. Call each hook once, in op order."""

    __slots__ = ("ll", "op", "kind", "launch", "called")

    def __init__(self, ll, op: int, kind: str, launch):
        self.ll, self.op, self.kind, self.launch, self.called = ll, op, kind, launch, False

    def __call__(self) -> None:
        self.ll._run_hook(self)

    def __repr__(self) -> str:
        return f"RecvHook({self.kind}, op {self.op}, {'called' if self.called else 'pending'})"


class LowLatency:
    """The low-latency state of one Buffer (Buffer(..., low_latency_mode=True)); the Buffer's
    low_latency_* methods forward here. See the module docstring."""

    def __init__(self, buffer, num_bytes: int, config: LowLatencyConfig | None = None):
        import torch

        from .peer import PeerBuffers

        ext = buffer.ext
        self._check_limits(ext)
        num_sms = torch.cuda.get_device_properties(buffer.device).multi_processor_count
        self._check_size(num_bytes)
        peers = PeerBuffers(ext, buffer.group, int(num_bytes))
        self._init_state(buffer, num_bytes, config, peers, num_sms)
        ext.ll_clean(peers.local, CONTROL_BYTES, 0)
        torch.cuda.synchronize(buffer.device)
        if buffer.group_size > 1:
            torch.distributed.barrier(group=buffer.group)  # every control block is zero before anyone writes

    @staticmethod
    def _check_limits(ext) -> None:
        limits = dict(ext.ll_limits())
        mine = {"group": GROUP, "max_tokens": MAX_TOKENS, "max_blocks": MAX_BLOCKS,
                "max_warps_per_block": MAX_WARPS_PER_BLOCK, "max_local_experts": MAX_LOCAL_EXPERTS,
                "max_topk": MAX_TOPK, "max_ranks": MAX_RANKS, "max_hidden": MAX_HIDDEN,
                "kernels": {v: k for k, v in KERNELS.items()}, "error_protocol": ERROR_PROTOCOL,
                "send_phase": SEND_PHASE, "recv_phase": RECV_PHASE}
        got = {k: (dict(v) if isinstance(v, dict) else v) for k, v in limits.items() if k != "threads"}
        if got != mine:
            raise RuntimeError(f"ep_core low-latency: ep_core/low_latency.py and the compiled kernels disagree on "
                               f"their limits: {mine} vs {got} (rebuild the extension)")

    @staticmethod
    def _check_size(num_bytes: int) -> None:
        if int(num_bytes) < CONTROL_BYTES + 4096:
            raise ValueError(f"ep_core: the low-latency buffer (num_rdma_bytes={int(num_bytes)}) is too small; size it "
                             f"with Buffer.get_low_latency_rdma_size_hint(num_max_dispatch_tokens_per_rank, hidden, "
                             f"num_ranks, num_experts)")

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
        from .buffer import EPTimeoutError

        msg = self.error_message()
        if msg is None:
            return
        self._broken = msg
        session = session if session is not None else self.buffer._session
        if session is not None and not getattr(session, "_saved", False):
            try:
                session.note("KernelTimeout", msg)
                session.save(status="timeout", error=msg)
            except Exception as e:  # the kernel error matters more; say why there is no trace
                msg += f" (saving the partial profile failed: {type(e).__name__}: {e})"
        raise (EPTimeoutError if self._err.flag() == 1 else RuntimeError)(msg)

    def synchronize(self) -> None:
        """Wait for the device and raise any low-latency device error so far."""
        import torch

        torch.cuda.synchronize(self.buffer.device)
        if self._err.flag():
            self._raise_device_error()

    # -- per-build objects -------------------------------------------------------------------------
    def _launcher(self, build):
        ext = build.ext
        lau = self._launchers.get(id(ext))
        if lau is None:
            lau = self._launchers[id(ext)] = ext.LLLauncher(
                peers=list(self.peers.ptrs), rank=self.buffer.rank, error_device=self._err.device,
                timeout_ns=int(self.buffer.timeout_s * 1e9))
        return lau

    def _layout(self, T: int, H: int, E: int, ext, cached: bool):
        key = (T, H, E)
        entry = self._layouts.get(key) if cached else None
        if entry is None:
            layout = LowLatencyLayout(T, H, self.buffer.group_size, E)
            if layout.size > self.num_bytes:
                from .buffer import EPCapacityError

                raise EPCapacityError(
                    f"ep_core: the low-latency buffer holds {self.num_bytes} bytes, this call's layout (T_max={T}, "
                    f"hidden={H}, {self.buffer.group_size} ranks, {E} experts) needs {layout.size}; create the Buffer "
                    f"with num_rdma_bytes >= Buffer.get_low_latency_rdma_size_hint({T}, {H}, "
                    f"{self.buffer.group_size}, {E})")
            entry = (layout, {})
            if cached:
                self._layouts[key] = entry
        layout, per_ext = entry
        cpp = per_ext.get(id(ext))
        if cpp is None:
            cpp = per_ext[id(ext)] = ext.LLLayout(offsets=layout.offsets(half_stride=self.half_stride))
        return layout, cpp

    @property
    def half_stride(self) -> int:
        return buffer_half_stride(self.num_bytes)

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

    # -- the tuned table (ep_core/tuned.py, `epscope tune --ll`) -------------------------------------
    def _call_config(self, config, kernel: str, t_max, hidden, dtype: str) -> LowLatencyConfig:
        """A call's config: its own, else the Buffer's when one was chosen (`using`, or set), else
        the tuned table's entry for this GPU, rank count, dtype, hidden and T_max, else the defaults."""
        if config is not None:
            return config
        if self.config is not self._tunable or not isinstance(t_max, int) or not isinstance(hidden, int):
            return self.config  # (arguments of the wrong kind: the call's own checks name them)
        key = (kernel, t_max, hidden, dtype)
        cfg = self._tuned.get(key, self)
        if cfg is self:  # first call of this shape: one table lookup (the host path stays a dict lookup)
            from . import tuned

            cfg = self._tuned[key] = tuned.ll_default(kernel, self.buffer.device, self.buffer.group_size,
                                                      self.num_sms, t_max, hidden, dtype)
        return cfg or self.config

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
            prof = self._slot(session, kernel, cfg, layout, it) if session is not None else 0
            launcher.dispatch(plan, x, topk_idx, phases, prof, stream)

        event, hook = self._run(launch, "ll_dispatch", n, async_finish, return_recv_hook, cfg, (x, topk_idx),
                                session, it, t0, undo)
        return oset.received(), oset.recv_count, handle, event, hook

    def _check_dispatch_args(self, x, topk_idx, T_max, E, use_fp8, use_ue8m0, stats) -> None:
        import torch

        from .buffer import topk_idx_t

        R = self.buffer.group_size
        if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.dtype != torch.bfloat16 or x.device != self.buffer.device:
            raise ValueError(f"ep_core: low_latency_dispatch x must be a bf16 [num_tokens, hidden] tensor on "
                             f"{self.buffer.device}, got {getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        T, H = x.shape
        if H % GROUP or H > MAX_HIDDEN:
            raise ValueError(f"ep_core: hidden must be a multiple of {GROUP} up to {MAX_HIDDEN}, got {H}")
        if use_ue8m0 and H % (4 * GROUP):
            raise ValueError(f"ep_core: use_ue8m0 packs 4 scales per int32: hidden must be a multiple of "
                             f"{4 * GROUP}, got {H}")
        if (not isinstance(topk_idx, torch.Tensor) or topk_idx.dim() != 2 or topk_idx.dtype != topk_idx_t
                or topk_idx.size(0) != T or topk_idx.device != self.buffer.device):
            raise ValueError(f"ep_core: topk_idx must be a {topk_idx_t} [{T}, num_topk] tensor on "
                             f"{self.buffer.device}, got {getattr(topk_idx, 'dtype', None)} "
                             f"{tuple(getattr(topk_idx, 'shape', ()))}")
        if not 1 <= topk_idx.size(1) <= MAX_TOPK:
            raise ValueError(f"ep_core: num_topk must be in 1..{MAX_TOPK}, got {topk_idx.size(1)}")
        if not x.is_contiguous() or not topk_idx.is_contiguous():
            raise ValueError("ep_core: low_latency_dispatch x and topk_idx must be contiguous")
        if not 1 <= T_max <= MAX_TOKENS or T > T_max:
            raise ValueError(f"ep_core: num_max_dispatch_tokens_per_rank must be in 1..{MAX_TOKENS} and >= the "
                             f"{T} tokens of this call, got {T_max}")
        if E <= 0 or E % R or E // R > MAX_LOCAL_EXPERTS:
            raise ValueError(f"ep_core: num_experts must be a positive multiple of the rank count ({R}) with at most "
                             f"{MAX_LOCAL_EXPERTS} per rank, got {E}")
        if stats is not None and (stats.dtype != torch.int32 or tuple(stats.shape) != (E // R,)
                                  or stats.device != self.buffer.device):
            raise ValueError(f"ep_core: cumulative_local_expert_recv_stats must be int32 [{E // R}] on "
                             f"{self.buffer.device}")

    def _output_set(self, key, parity: int, layout: LowLatencyLayout, K: int, use_fp8: bool, use_ue8m0: bool,
                    cached: bool) -> _OutputSet:
        if not cached:
            return _OutputSet(layout, K, use_fp8, use_ue8m0, self.buffer.device)
        s = self._sets.get((key, parity))
        if s is None:
            s = self._sets[(key, parity)] = _OutputSet(layout, K, use_fp8, use_ue8m0, self.buffer.device)
        return s

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
            prof = self._slot(session, kernel, cfg, layout, it) if session is not None else 0
            launcher.combine(plan, x, topk_idx, topk_weights, out, phases, prof, stream)

        event, hook = self._run(launch, "ll_combine", n, async_finish, return_recv_hook, cfg,
                                (x, topk_idx, topk_weights, out), session, it, t0, undo)
        return out, event, hook

    def _check_combine_args(self, x, topk_idx, topk_weights, handle: LowLatencyHandle, out) -> None:
        import torch

        from .buffer import topk_idx_t

        El, RT, H = handle.num_experts // self.buffer.group_size, handle.recv_src_info.size(1), handle.hidden
        T, K = handle.num_tokens, handle.num_topk
        if (not isinstance(x, torch.Tensor) or x.dtype != torch.bfloat16 or tuple(x.shape) != (El, RT, H)
                or not x.is_contiguous() or x.device != self.buffer.device):
            raise ValueError(f"ep_core: low_latency_combine x must be a contiguous bf16 [{El}, {RT}, {H}] tensor on "
                             f"{self.buffer.device}, got {getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}")
        if (not isinstance(topk_idx, torch.Tensor) or topk_idx.dtype != topk_idx_t or tuple(topk_idx.shape) != (T, K)
                or not topk_idx.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine topk_idx must be the dispatch's: contiguous {topk_idx_t} "
                             f"[{T}, {K}], got {getattr(topk_idx, 'dtype', None)} "
                             f"{tuple(getattr(topk_idx, 'shape', ()))}")
        if (not isinstance(topk_weights, torch.Tensor) or topk_weights.dtype != torch.float32
                or tuple(topk_weights.shape) != (T, K) or not topk_weights.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine topk_weights must be contiguous float32 [{T}, {K}], got "
                             f"{getattr(topk_weights, 'dtype', None)} {tuple(getattr(topk_weights, 'shape', ()))}")
        if out is not None and (out.dtype != torch.bfloat16 or tuple(out.shape) != (T, H) or not out.is_contiguous()):
            raise ValueError(f"ep_core: low_latency_combine out must be a contiguous bf16 [{T}, {H}] tensor")

    def _combine_out(self, T: int, H: int, parity: int, cached: bool):
        import torch

        if not cached:
            return torch.empty((T, H), dtype=torch.bfloat16, device=self.buffer.device)
        o = self._outs.get((T, H, parity))
        if o is None:
            o = self._outs[(T, H, parity)] = torch.empty((T, H), dtype=torch.bfloat16, device=self.buffer.device)
        return o

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

        from .buffer import EventOverlap, current_raw_stream

        first = session.num_launches if session is not None else 0
        event, hook = EventOverlap(None), None
        dev = self.buffer._device_index
        if with_hook:
            try:
                launch(SEND_PHASE, name + "_send", current_raw_stream(dev))
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
                launch(SEND_PHASE | RECV_PHASE, name, current_raw_stream(dev))
            except ValueError:
                self._ops, self._dispatches, self._combines = undo
                raise
        if session is not None:
            session.host_call(name, iteration, t0, perf_counter_ns(), first)
        if self._err.flag():
            self._raise_device_error(session)
        return event, hook

    def _hook_launch(self, launch, name: str, session, iteration: int) -> None:
        from .buffer import current_raw_stream

        t0 = perf_counter_ns()
        first = session.num_launches if session is not None else 0
        launch(RECV_PHASE, name + "_recv", current_raw_stream(self.buffer._device_index))
        if session is not None:
            session.host_call(name + "_recv", iteration, t0, perf_counter_ns(), first)
        if self._err.flag():
            self._raise_device_error(session)

    # -- lifecycle -----------------------------------------------------------------------------------
    def clean(self) -> None:
        """Zero every rank's control block (collective): the epochs restart at 1 on every rank.
        Pending recv hooks are dropped."""
        import torch
        import torch.distributed as dist

        torch.cuda.synchronize(self.buffer.device)
        if self.buffer.group_size > 1:
            dist.barrier(group=self.buffer.group)  # nobody still writes into a control block
        self.buffer.ext.ll_clean(self.peers.local, CONTROL_BYTES, 0)
        torch.cuda.synchronize(self.buffer.device)
        if self.buffer.group_size > 1:
            dist.barrier(group=self.buffer.group)
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
