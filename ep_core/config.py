"""Tuning (`Config`) and problem (`Problem`) value objects of ep_core, and the recommended tables.

Two separate validated value objects (house style rule 6): `Config` is the tuning, exactly the
fields and checks of DeepEP's `deep_ep.Config` so user code ports unchanged; `Problem` is what a
user brings (tokens, hidden, top-k, experts, ranks, dtype) with the limits of issue 3.

Buffer sizes: ep_core's buffer holds the rows of one whole op (no ring buffers; see
ep_core/buffer.py), so its size depends on the token count and the one formula for it is
`buffer_size_hint` here. `Buffer.get_buffer_size_hint`, `Config.get_nvl_buffer_size_hint` and
`Problem.nvl_bytes_needed` all call it, so the size a user allocates and the size a call needs
cannot disagree. It needs neither a GPU nor the CUDA extension (issue 34: the README's snippet
ended in torch's `CUDA_HOME ... not set` on a CPU machine): the header size it adds is DATA_OFFSET,
which buffer_map.h static_asserts and a Buffer checks against the compiled extension.

No torch import at module level: the recording path and the CPU tests import this freely.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# Limits of issue 3 ("any problem size a user may bring").
MAX_HIDDEN = 8192
MAX_EXPERTS = 512
MAX_TOPK = 16
MAX_RANKS = 8            # intranode: the GPUs of one NVLink node
SCALE_BLOCK = 128        # FP8 scales: one float32 per 128 columns (ep-api.md)
MAX_SCALES = MAX_HIDDEN // SCALE_BLOCK

# DeepEP's Config.get_nvl_buffer_size_hint(hidden_bytes, num_ranks) takes no token count (its
# rings stream any number of tokens); ep_core's buffer holds a whole op, so that compatibility
# hint sizes for this many tokens per rank. 8192 covers DeepEP's own test shape (4096) twice;
# a bigger call fails with EPCapacityError naming both sizes, never a hang.
HINT_TOKENS_PER_RANK = 8192
# each region of the data region (x, scales, top-k ids, top-k weights) starts 128-B aligned
REGION_ALIGN = 128
# Bytes before the data region of every rank's buffer: the signals and the layout slots, each
# rounded to 4 KiB (ep_core/csrc/buffer_map.h, kDataOffset). The header static_asserts this very
# number (tests/ep_core/test_buffer_logic.py reads it there and compares) and Buffer checks it
# against the compiled extension's limits(), so a struct change cannot leave the hint behind.
DATA_OFFSET = 122_880

DTYPES = ("bf16", "fp8")

# DeepEP's default `Buffer.num_sms` (deep_ep/buffer.py); the tables below scale with it.
DEFAULT_NUM_SMS = 20

# How dispatch and combine move rows (Config.path). "direct": each lane loads 16-byte vectors into
# registers and stores them (the v3 kernels, the default). "tma": the pipelined bulk-copy path,
# global -> shared -> global by the copy engine of each SM with Config.num_tma_buffers staging
# buffers per warp. The buffer-count bounds are tma.cuh's kMinBuffers / kMaxBuffers
# (tests/ep_core/test_config.py reads them from there).
PATHS = ("direct", "tma")
TMA_BUFFERS = (1, 2, 3)


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

    `num_sms` is the number of SMs (blocks) a dispatch or combine kernel occupies;
    `num_max_nvl_chunked_send_tokens` the smallest chunk of tokens a sender publishes at once
    (ep_core/buffer.py `_chunking`); `num_max_nvl_chunked_recv_tokens` bounds it from above as in
    DeepEP. The RDMA fields exist for API compatibility (internode is not implemented) and are
    validated exactly as DeepEP does. `path` picks how rows move ("direct" registers, the
    default, or the pipelined bulk-copy "tma" path) and `num_tma_buffers` (1..3) the staging
    buffers per warp of the "tma" path: with 1 every row loads, stores and drains in turn; with 2
    or 3 the next row loads while earlier rows' stores are in flight (ep_core/csrc/tma.cuh).
    """

    num_sms: int = DEFAULT_NUM_SMS
    num_max_nvl_chunked_send_tokens: int = 6
    num_max_nvl_chunked_recv_tokens: int = 256
    num_max_rdma_chunked_send_tokens: int = 6
    num_max_rdma_chunked_recv_tokens: int = 256
    # ep_core's own fields, after DeepEP's (its positional order is unchanged)
    path: str = "direct"
    num_tma_buffers: int = 3

    def _check_positive(self, *names: str) -> None:
        for name in names:
            if getattr(self, name) <= 0:
                raise ValueError(f"Config.{name} must be > 0, got {getattr(self, name)}")

    def __post_init__(self):
        for name in ("num_sms", "num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens",
                     "num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens", "num_tma_buffers"):
            _check_int("Config", name, getattr(self, name))
        if self.path not in PATHS:
            raise ValueError(f"Config.path must be one of {PATHS}, got {self.path!r}")
        if self.num_tma_buffers not in TMA_BUFFERS:
            raise ValueError(f"Config.num_tma_buffers must be in {TMA_BUFFERS} (staging buffers per warp of the "
                             f"'tma' path), got {self.num_tma_buffers}")
        if self.num_sms < 2 or self.num_sms % 2:
            raise ValueError(f"Config.num_sms must be even and >= 2 (DeepEP's rule), got {self.num_sms}")
        self._check_positive("num_max_nvl_chunked_send_tokens", "num_max_nvl_chunked_recv_tokens")
        if self.num_max_nvl_chunked_send_tokens >= self.num_max_nvl_chunked_recv_tokens:
            # DeepEP: a sender waits for a whole chunk of free receive slots; it must fit with room.
            raise ValueError(
                f"Config.num_max_nvl_chunked_send_tokens ({self.num_max_nvl_chunked_send_tokens}) must be "
                f"< num_max_nvl_chunked_recv_tokens ({self.num_max_nvl_chunked_recv_tokens}): a send "
                f"chunk has to fit in the receive window with room to spare")
        self._check_positive("num_max_rdma_chunked_send_tokens", "num_max_rdma_chunked_recv_tokens")
        # DeepEP rounds the RDMA ring up to a whole number of send chunks, then requires two
        # chunks of room (its lazy head update must always leave senders space to push).
        rdma_recv = _align(self.num_max_rdma_chunked_recv_tokens, self.num_max_rdma_chunked_send_tokens)
        object.__setattr__(self, "num_max_rdma_chunked_recv_tokens", rdma_recv)
        if self.num_max_rdma_chunked_send_tokens > rdma_recv // 2:
            raise ValueError(
                f"Config.num_max_rdma_chunked_send_tokens ({self.num_max_rdma_chunked_send_tokens}) must be "
                f"<= num_max_rdma_chunked_recv_tokens / 2 ({rdma_recv} / 2 after rounding up to whole chunks)")

    def with_num_sms(self, num_sms: int) -> "Config":
        return dataclasses.replace(self, num_sms=num_sms)

    def with_send_chunk(self, tokens: int) -> "Config":
        return dataclasses.replace(self, num_max_nvl_chunked_send_tokens=tokens)

    def with_path(self, path: str, num_tma_buffers: int | None = None) -> "Config":
        """The same tuning on another copy path (and buffer count)."""
        n = self.num_tma_buffers if num_tma_buffers is None else num_tma_buffers
        return dataclasses.replace(self, path=path, num_tma_buffers=n)

    @property
    def kernel_tma_buffers(self) -> int:
        """What the kernels take: 0 for the direct path, else the staging buffers per warp."""
        return self.num_tma_buffers if self.path == "tma" else 0

    def get_nvl_buffer_size_hint(self, hidden_bytes: int, num_ranks: int) -> int:
        """num_nvl_bytes for any problem of BF16 rows of `hidden_bytes` (hidden * 2, DeepEP's
        convention) with up to HINT_TOKENS_PER_RANK tokens per rank. DeepEP's signature; for other
        token counts use `Buffer.get_buffer_size_hint(tokens, hidden, ranks)`."""
        _check_int("get_nvl_buffer_size_hint", "hidden_bytes", hidden_bytes)
        _check_int("get_nvl_buffer_size_hint", "num_ranks", num_ranks)
        if not 1 <= num_ranks <= MAX_RANKS:
            raise ValueError(f"num_ranks must be in 1..{MAX_RANKS} (intranode), got {num_ranks}")
        hidden = -(-hidden_bytes // 2)
        hidden = -(-hidden // SCALE_BLOCK) * SCALE_BLOCK  # round up to whole FP8 scale blocks
        if not 0 < hidden <= MAX_HIDDEN:
            raise ValueError(f"hidden_bytes must be in 1..{2 * MAX_HIDDEN} (hidden up to {MAX_HIDDEN}), got {hidden_bytes}")
        return buffer_size_hint(HINT_TOKENS_PER_RANK, hidden, num_ranks, MAX_TOPK)

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
                "num_max_rdma_chunked_recv_tokens": self.num_max_rdma_chunked_recv_tokens,
                "path": self.path, "num_tma_buffers": self.num_tma_buffers}


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

    def nvl_bytes_needed(self) -> int:
        """num_nvl_bytes a Buffer needs for this problem (every routing: up to T x R rows land
        on one rank): `buffer_size_hint`."""
        return buffer_size_hint(self.tokens, self.hidden, self.ranks, self.topk)

    def to_dict(self) -> dict:
        return {"tokens": self.tokens, "hidden": self.hidden, "topk": self.topk,
                "experts": self.experts, "ranks": self.ranks, "dtype": self.dtype}


def _buffer_bytes(rows: int, hidden: int, num_topk: int) -> int:
    """num_nvl_bytes of a buffer whose data region holds `rows` of the widest row (a BF16 row plus
    FP8 scales and top-k ids and weights) after the signals and layout slots; 8 x REGION_ALIGN
    covers the alignment of up to 8 regions (Buffer._regions: 4, Buffer._hook_regions: 8)."""
    row = hidden * 2 + (hidden // SCALE_BLOCK) * 4 + num_topk * (8 + 4)
    return DATA_OFFSET + rows * row + 8 * REGION_ALIGN


def buffer_size_hint(tokens: int, hidden: int, ranks: int, topk: int = MAX_TOPK) -> int:
    """num_nvl_bytes that fits every dispatch (BF16 or FP8, with top-k) and combine of up to
    `tokens` tokens per rank: the data region holds the rows of one op, up to T x R rows (the widest
    row is a BF16 one in combine / dispatch, plus FP8 scales and top-k)."""
    return _buffer_bytes(max(int(tokens), 1) * int(ranks), hidden, topk)


def hook_buffer_size_hint(tokens: int, hidden: int, ranks: int, topk: int = MAX_TOPK) -> int:
    """num_nvl_bytes that fits every call buffer_size_hint fits, with or without return_recv_hook:
    a hook-mode dispatch needs, besides the rows it receives (up to T x R), a staging region for the
    rows it packs for its peers (up to T x (R - 1)), so the data region holds T x (2R - 1) rows. A
    hook-mode combine needs no more than a normal one."""
    return _buffer_bytes(max(int(tokens), 1) * (2 * int(ranks) - 1), hidden, topk)


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


def op_configs(ranks: int, num_sms: int, chunk: int | None = None) -> tuple[Config, Config]:
    """(dispatch, combine) Configs of one op: the recommended tables at `num_sms`, with the send
    chunk overridden when `chunk` is given (Config validates it and names the field)."""
    d, c = dispatch_config(ranks, num_sms), combine_config(ranks, num_sms)
    if chunk:
        d, c = d.with_send_chunk(chunk), c.with_send_chunk(chunk)
    return d, c
