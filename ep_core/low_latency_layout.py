"""The low-latency buffer's map and the launch configuration, pure Python (no torch): what the
kernels, the tuned table (ep_core.tuned) and the tuning sweep agree on. ep_core/low_latency.py's
module docstring describes the calls; docs/design.md "ep_core's low-latency kernels" the map.

  LowLatencyLayout   the buffer map (the one source of its offsets: the kernels take them by name)
                     and the size hint; tested on the CPU.
  LowLatencyConfig   the launch geometry and seed 002's five techniques as knobs, each with its
                     old behaviour selectable (validated value object).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .config import MAX_HIDDEN, MAX_RANKS, MAX_TOPK, _align, _check_int

FAMILY = "ep_low_latency"   # the phase registry: ep_core/phases/ep_low_latency.toml

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
