"""Tuning (`Config`), problem (`Problem`) and NVLink buffer-size arithmetic of ep_core.

Two separate validated value objects (house style rule 6): `Config` is the tuning, exactly the
fields and checks of DeepEP's `deep_ep.Config` so user code ports unchanged; `Problem` is what a
user brings (tokens, hidden, top-k, experts, ranks, dtype) with the limits of issue 3.

`NvlLayout` is the one place that lays out the per-rank NVLink buffer (control words, notify
counts, per-channel ring buffers); `Config.get_nvl_buffer_size_hint` and
`Problem.nvl_bytes_needed` both read it, so "this problem needs N bytes, the buffer has M" and
the size a user allocates cannot disagree.

No torch import at module level: the recording path and the CPU tests import this freely.
"""
from __future__ import annotations

from dataclasses import dataclass, field

# Limits of issue 3 ("any problem size a user may bring").
MAX_HIDDEN = 8192
MAX_EXPERTS = 512
MAX_TOPK = 16
MAX_RANKS = 8            # intranode: the GPUs of one NVLink node
SCALE_BLOCK = 128        # FP8 scales: one float32 per 128 columns (ep-api.md)
MAX_SCALES = MAX_HIDDEN // SCALE_BLOCK

# Every region of the buffer starts on a 128-byte boundary: DeepEP's NUM_BUFFER_ALIGNMENT_BYTES,
# and the width of one 128-bit-per-lane warp store (32 lanes x 4 B) so TMA/vector copies align.
BUFFER_ALIGNMENT = 128

DTYPES = ("bf16", "fp8")

# DeepEP's default `Buffer.num_sms` (deep_ep/buffer.py); the tables below scale with it.
DEFAULT_NUM_SMS = 20


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _check_int(owner: str, name: str, value) -> int:
    # bool is an int subclass; True as a size is always a bug.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__} {value!r}")
    return value


@dataclass(frozen=True)
class Config:
    """The tuning of one dispatch or combine: DeepEP's `Config`, field for field.

    `num_sms` SMs run the kernel as `num_sms // 2` channels (one send and one receive block per
    channel); each (channel, source rank) pair owns a ring buffer of
    `num_max_nvl_chunked_recv_tokens` token slots that senders fill `num_max_nvl_chunked_send_tokens`
    at a time. The RDMA fields exist for API compatibility (internode is not implemented) and are
    validated exactly as DeepEP does.
    """

    num_sms: int = DEFAULT_NUM_SMS
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256

    def __post_init__(self):
        for name in ("num_sms", "num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                     "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens"):
            _check_int("Config", name, getattr(self, name))
        if self.num_sms < 2 or self.num_sms % 2:
            raise ValueError(f"Config.num_sms must be even and >= 2 (one send and one receive SM "
                             f"per channel), got {self.num_sms}")
        if self.num_max_nvl_chunked_send_tokens <= 0:
            raise ValueError(f"Config.num_max_nvl_chunked_send_tokens must be > 0, "
                             f"got {self.num_max_nvl_chunked_send_tokens}")
        if self.num_max_nvl_chunked_recv_tokens <= 0:
            raise ValueError(f"Config.num_max_nvl_chunked_recv_tokens must be > 0, "
                             f"got {self.num_max_nvl_chunked_recv_tokens}")
        if self.num_max_nvl_chunked_send_tokens >= self.num_max_nvl_chunked_recv_tokens:
            # A sender waits for a whole chunk of free slots; with chunk >= ring size it never gets it.
            raise ValueError(
                f"Config.num_max_nvl_chunked_send_tokens ({self.num_max_nvl_chunked_send_tokens}) must be "
                f"< num_max_nvl_chunked_recv_tokens ({self.num_max_nvl_chunked_recv_tokens}): a send "
                f"chunk has to fit in the receive ring buffer with room to spare")
        if self.num_max_rdma_chunked_send_tokens <= 0:
            raise ValueError(f"Config.num_max_rdma_chunked_send_tokens must be > 0, "
                             f"got {self.num_max_rdma_chunked_send_tokens}")
        if self.num_max_rdma_chunked_recv_tokens <= 0:
            raise ValueError(f"Config.num_max_rdma_chunked_recv_tokens must be > 0, "
                             f"got {self.num_max_rdma_chunked_recv_tokens}")
        # DeepEP rounds the RDMA ring up to a whole number of send chunks, then requires two
        # chunks of room (its lazy head update must always leave senders space to push).
        rdma_recv = _align(self.num_max_rdma_chunked_recv_tokens, self.num_max_rdma_chunked_send_tokens)
        object.__setattr__(self, "num_max_rdma_chunked_recv_tokens", rdma_recv)
        if self.num_max_rdma_chunked_send_tokens > rdma_recv // 2:
            raise ValueError(
                f"Config.num_max_rdma_chunked_send_tokens ({self.num_max_rdma_chunked_send_tokens}) must be "
                f"<= num_max_rdma_chunked_recv_tokens / 2 ({rdma_recv} / 2 after rounding up to whole chunks)")

    @property
    def num_channels(self) -> int:
        return self.num_sms // 2

    def with_num_sms(self, num_sms: int) -> "Config":
        return Config(num_sms, self.num_max_nvl_chunked_send_tokens, self.num_max_nvl_chunked_recv_tokens,
                      self.num_max_rdma_chunked_send_tokens, self.num_max_rdma_chunked_recv_tokens)

    def with_send_chunk(self, tokens: int) -> "Config":
        return Config(self.num_sms, tokens, self.num_max_nvl_chunked_recv_tokens,
                      self.num_max_rdma_chunked_send_tokens, self.num_max_rdma_chunked_recv_tokens)

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Bytes of NVLink buffer per rank that any problem with rows of `hidden_bytes` needs
        (top-k and scales sized for the limits MAX_TOPK / MAX_SCALES). DeepEP's signature."""
        return NvlLayout(self, num_ranks, hidden_bytes, MAX_TOPK, MAX_SCALES, MAX_EXPERTS).total_bytes

    def get_rdma_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """Intranode only: no RDMA buffer is ever needed (DeepEP returns 0 up to 8 ranks too)."""
        _check_int("get_rdma_buffer_size_hint", "num_ranks", num_ranks)
        if not 1 <= num_ranks <= MAX_RANKS:
            raise ValueError(f"num_ranks must be in 1..{MAX_RANKS} (intranode), got {num_ranks}")
        return 0

    def to_dict(self) -> dict:
        return {"num_sms": self.num_sms,
                "num_max_nvl_chunked_send_tokens": self.num_max_nvl_chunked_send_tokens,
                "num_max_nvl_chunked_recv_tokens": self.num_max_nvl_chunked_recv_tokens,
                "num_max_rdma_chunked_send_tokens": self.num_max_rdma_chunked_send_tokens,
                "num_max_rdma_chunked_recv_tokens": self.num_max_rdma_chunked_recv_tokens}


@dataclass(frozen=True)
class Problem:
    """What one EP call moves: per-rank tokens, hidden size, top-k of `experts`, over `ranks`."""

    tokens: int
    hidden: int
    topk: int
    experts: int
    ranks: int
    dtype: str = "bf16"

    def __post_init__(self):
        for name in ("tokens", "hidden", "topk", "experts", "ranks"):
            _check_int("Problem", name, getattr(self, name))
        if self.dtype not in DTYPES:
            raise ValueError(f"Problem.dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.tokens < 0:
            raise ValueError(f"Problem.tokens (per rank) must be >= 0, got {self.tokens}")
        if not 1 <= self.ranks <= MAX_RANKS:
            raise ValueError(f"Problem.ranks must be in 1..{MAX_RANKS} (GPUs of one node), got {self.ranks}")
        if self.hidden <= 0 or self.hidden % SCALE_BLOCK or self.hidden > MAX_HIDDEN:
            raise ValueError(f"Problem.hidden must be a positive multiple of {SCALE_BLOCK} up to {MAX_HIDDEN}, "
                             f"got {self.hidden}")
        if self.experts <= 0 or self.experts % self.ranks or self.experts > MAX_EXPERTS:
            raise ValueError(f"Problem.experts must be a positive multiple of ranks ({self.ranks}) up to "
                             f"{MAX_EXPERTS}, got {self.experts}")
        if not 1 <= self.topk <= MAX_TOPK:
            raise ValueError(f"Problem.topk must be in 1..{MAX_TOPK}, got {self.topk}")
        if self.topk > self.experts:
            raise ValueError(f"Problem.topk ({self.topk}) must be <= experts ({self.experts}): "
                             f"a token picks distinct experts")

    @property
    def experts_per_rank(self) -> int:
        return self.experts // self.ranks

    @property
    def num_scales(self) -> int:
        return self.hidden // SCALE_BLOCK

    @property
    def elem_bytes(self) -> int:
        return 2 if self.dtype == "bf16" else 1

    @property
    def hidden_bytes(self) -> int:
        """Bytes of one row of x as it travels (FP8 scales travel in their own slot)."""
        return self.hidden * self.elem_bytes

    @property
    def row_bytes(self) -> int:
        """Bytes of one received row of recv_x, scales included (the logical-GB/s numerator)."""
        return self.hidden_bytes + (self.num_scales * 4 if self.dtype == "fp8" else 0)

    def layout(self, config: Config) -> "NvlLayout":
        return NvlLayout(config, self.ranks, self.hidden_bytes, self.topk,
                         self.num_scales if self.dtype == "fp8" else 0, self.experts)

    def nvl_bytes_needed(self, config: Config) -> int:
        return self.layout(config).total_bytes

    def check_fits(self, config: Config, buffer_bytes: int) -> None:
        """Raise ValueError naming both sizes when the buffer is too small for this problem."""
        need = self.nvl_bytes_needed(config)
        if buffer_bytes < need:
            raise ValueError(
                f"this problem needs {need} bytes of NVLink buffer per rank (hidden={self.hidden} "
                f"{self.dtype}, topk={self.topk}, experts={self.experts}, ranks={self.ranks}, "
                f"{config.num_channels} channels x {config.num_max_nvl_chunked_recv_tokens} slots), "
                f"the buffer has {buffer_bytes}; create the Buffer with num_nvl_bytes >= {need} "
                f"(Config.get_nvl_buffer_size_hint gives a size for every problem of that hidden)")

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "hidden": self.hidden, "topk": self.topk,
                "experts": self.experts, "ranks": self.ranks, "dtype": self.dtype}


# Control words per (channel, source rank) ring: start, end (the channel's row range in recv_x),
# head (consumer position, written by the receiver), tail (producer position, written by the sender).
RING_CONTROL_INTS = 4


@dataclass(frozen=True)
class NvlLayout:
    """Byte layout of one rank's NVLink buffer, written into by every peer.

    ```
    offset 0            notify area: int32 counts[ranks][ranks]          (tokens r -> this rank)
                                     int32 expert_counts[ranks][experts/ranks]
    ctrl_offset         int32 ctrl[channels][ranks][4]   start, end, head, tail
    data_offset         per (channel, source rank) ring of recv_tokens slots, as parallel arrays:
                          x        [slots][hidden_bytes]
                          src_idx  [slots] int32
                          topk_idx [slots][topk] int64
                          weights  [slots][topk] float32
                          scales   [slots][num_scales] float32   (FP8 only)
    ```
    Each region starts on BUFFER_ALIGNMENT. `slot_bytes` is the stride of one ring slot over the
    parallel arrays (what one token costs in the buffer).
    """

    config: Config
    num_ranks: int
    hidden_bytes: int
    num_topk: int
    num_scales: int
    num_experts: int = MAX_EXPERTS
    notify_bytes: int = field(init=False)
    ctrl_offset: int = field(init=False)
    ctrl_bytes: int = field(init=False)
    data_offset: int = field(init=False)
    slot_bytes: int = field(init=False)
    ring_bytes: int = field(init=False)
    total_bytes: int = field(init=False)

    def __post_init__(self):
        for name in ("num_ranks", "hidden_bytes", "num_topk", "num_scales", "num_experts"):
            _check_int("NvlLayout", name, getattr(self, name))
        if not 1 <= self.num_ranks <= MAX_RANKS:
            raise ValueError(f"NvlLayout.num_ranks must be in 1..{MAX_RANKS}, got {self.num_ranks}")
        if self.hidden_bytes <= 0 or self.hidden_bytes % 16:
            # rows are copied with 16-byte vector loads/stores
            raise ValueError(f"NvlLayout.hidden_bytes must be a positive multiple of 16, got {self.hidden_bytes}")
        if not 0 <= self.num_topk <= MAX_TOPK:
            raise ValueError(f"NvlLayout.num_topk must be in 0..{MAX_TOPK}, got {self.num_topk}")
        if not 0 <= self.num_scales <= MAX_SCALES:
            raise ValueError(f"NvlLayout.num_scales must be in 0..{MAX_SCALES}, got {self.num_scales}")
        r, c = self.num_ranks, self.config.num_channels
        experts_per_rank = max(self.num_experts // r, 1)
        notify = _align((r * r + r * experts_per_rank) * 4, BUFFER_ALIGNMENT)
        ctrl = _align(c * r * RING_CONTROL_INTS * 4, BUFFER_ALIGNMENT)
        slot = self.hidden_bytes + 4 + self.num_topk * (8 + 4) + self.num_scales * 4
        slots = self.config.num_max_nvl_chunked_recv_tokens
        # one ring = the parallel arrays of `slots` slots, each array aligned
        ring = (_align(slots * self.hidden_bytes, BUFFER_ALIGNMENT) + _align(slots * 4, BUFFER_ALIGNMENT)
                + _align(slots * self.num_topk * 8, BUFFER_ALIGNMENT)
                + _align(slots * self.num_topk * 4, BUFFER_ALIGNMENT)
                + _align(slots * self.num_scales * 4, BUFFER_ALIGNMENT))
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen dataclass)
        set_("notify_bytes", notify)
        set_("ctrl_offset", notify)
        set_("ctrl_bytes", ctrl)
        set_("data_offset", notify + ctrl)
        set_("slot_bytes", slot)
        set_("ring_bytes", ring)
        set_("total_bytes", notify + ctrl + c * r * ring)

    def ring_offset(self, channel: int, src_rank: int) -> int:
        """Byte offset of the ring that `src_rank` fills for `channel` in this rank's buffer."""
        if not 0 <= channel < self.config.num_channels:
            raise IndexError(f"channel {channel} outside 0..{self.config.num_channels - 1}")
        if not 0 <= src_rank < self.num_ranks:
            raise IndexError(f"src_rank {src_rank} outside 0..{self.num_ranks - 1}")
        return self.data_offset + (channel * self.num_ranks + src_rank) * self.ring_bytes


# Recommended tunings for 1..8 ranks. Rows 2, 4, 8 are DeepEP's published
# `Buffer.get_dispatch_config` / `get_combine_config` tables (deep_ep/buffer.py): (send chunk,
# recv ring) tokens. The other counts take the row of the next published count up, since the
# per-peer traffic shrinks with more peers; 1 rank (all local) takes the 2-rank row.
# ep-kernels retunes these on the H200 (benchmarks/bench_ep.py --sweep-chunks).
_DISPATCH_NVL = {1: (24, 256), 2: (24, 256), 3: (6, 256), 4: (6, 256),
                 5: (6, 256), 6: (6, 256), 7: (6, 256), 8: (6, 256)}
_COMBINE_NVL = {1: (10, 256), 2: (10, 256), 3: (9, 256), 4: (9, 256),
                5: (4, 256), 6: (4, 256), 7: (4, 256), 8: (4, 256)}
# DeepEP's tables use (6, 128) for the unused RDMA fields at these rank counts.
_RDMA = (6, 128)


def _table(table: dict, kind: str, num_ranks: int, num_sms: int) -> Config:
    _check_int(f"{kind}_config", "num_ranks", num_ranks)
    if num_ranks not in table:
        raise ValueError(f"{kind}_config: num_ranks must be in 1..{MAX_RANKS} (intranode), got {num_ranks}")
    send, recv = table[num_ranks]
    return Config(num_sms, send, recv, *_RDMA)


def dispatch_config(num_ranks: int, num_sms: int = DEFAULT_NUM_SMS) -> Config:
    """Recommended dispatch tuning for `num_ranks` (what `Buffer.get_dispatch_config` returns)."""
    return _table(_DISPATCH_NVL, "dispatch", num_ranks, num_sms)


def combine_config(num_ranks: int, num_sms: int = DEFAULT_NUM_SMS) -> Config:
    """Recommended combine tuning for `num_ranks` (what `Buffer.get_combine_config` returns)."""
    return _table(_COMBINE_NVL, "combine", num_ranks, num_sms)
