"""The tuned config table: what `epscope tune` measured best, and the lookup ep_core uses by default.

    {"format": "epscope-tuned", "format_version": 1,
     "entries": [{"kernel": "dispatch", "gpu": "NVIDIA H200", "ranks": 2, "dtype": "bf16", "hidden": 7168,
                  "tokens_min": 2049, "tokens_max": 4096,
                  "config": {Config fields}, "latency_us": 228.1, "spread_us": 3.2, "samples": 80, "runs": 4,
                  "incumbent": {"config": {...}, "latency_us": 241.0}, "verdict": {...},
                  "commit": "...", "created": "...", "tune": {settings the tuner ran with}}]}

An entry tuned at T tokens per rank covers the bucket (T/2, T] (tokens_min = T // 2 + 1,
tokens_max = T): a rule measured at one token count never governs a larger one, and a lookup
above every tuned bucket says so and falls back to the recommended tables (ep_core.config).
Every lookup returns a Match naming the entry it matched and why, or why none did.

ep_core.Buffer uses a matching entry when dispatch / combine get no `config` (and set_num_sms was
not called), and prints one line saying so the first time each entry is used. The table is
DEFAULT_TABLE unless EPSCOPE_TUNED_TABLE names another file; EPSCOPE_TUNED_TABLE=off disables it.

Low-latency entries (kernels ll_dispatch / ll_combine, `epscope tune --ll`) hold a LowLatencyConfig
and are keyed on num_max_dispatch_tokens_per_rank (T_max), not on the call's token count: T_max is
the same on every rank (the buffer map is computed from it), so every rank picks the same entry
and the ranks of one op run one geometry. Their buckets are explicit (`ll_buckets`: 1..16, 17..64,
...), each tuned at its top, so again a rule never governs a larger T_max than it was measured at.
LowLatency (ep_core/low_latency.py) asks `ll_default` when neither the call nor the Buffer chose a
config.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

FORMAT = "epscope-tuned"
FORMAT_VERSION = 1
DEFAULT_TABLE = Path(__file__).resolve().parent / "tuned.json"
ENV = "EPSCOPE_TUNED_TABLE"
NORMAL_KERNELS = ("dispatch", "combine")
LL_KERNELS = ("ll_dispatch", "ll_combine")
KERNELS = NORMAL_KERNELS + LL_KERNELS


class TunedTableError(ValueError):
    """A table that does not follow the format; the message names the file and the field."""


@dataclass(frozen=True)
class TunedKey:
    """What a lookup is for: the GPU, the rank count, the payload dtype, hidden and tokens per rank."""

    gpu: str
    ranks: int
    dtype: str
    hidden: int
    tokens: int

    def describe(self) -> str:
        return f"{self.gpu}, {self.ranks} ranks, {self.dtype}, hidden {self.hidden}, {self.tokens} tokens"


def unit(kernel: str) -> str:
    """What an entry's token range counts: the call's tokens per rank, or (low-latency) T_max."""
    return "T_max" if kernel in LL_KERNELS else "tokens"


def bucket(tokens: int) -> tuple[int, int]:
    """(tokens_min, tokens_max) of an entry tuned at `tokens`: (tokens/2, tokens]."""
    if tokens < 1:
        raise TunedTableError(f"a tuned token count must be >= 1, got {tokens}")
    return tokens // 2 + 1, tokens


def ll_buckets(tops) -> list[tuple[int, int]]:
    """The low-latency buckets (tokens_min, tokens_max) of increasing tops: 1..tops[0],
    tops[0]+1..tops[1], ... Each is tuned at its top (the most work in it)."""
    from .low_latency_layout import MAX_TOKENS

    tops = list(tops)
    if not tops:
        raise TunedTableError("low-latency buckets: give at least one top")
    for t in tops:
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= MAX_TOKENS:
            raise TunedTableError(f"low-latency bucket top {t!r} must be an int in 1..{MAX_TOKENS} "
                                  f"(num_max_dispatch_tokens_per_rank)")
    if any(b <= a for a, b in zip(tops, tops[1:])):
        raise TunedTableError(f"low-latency bucket tops must increase, got {tops}")
    return [(lo + 1, hi) for lo, hi in zip([0] + tops[:-1], tops)]


def config_of(kernel: str, config: dict):
    """The validated config object of an entry: ep_core.Config for dispatch / combine, LowLatencyConfig
    for ll_dispatch / ll_combine (ValueError / TypeError naming the field otherwise)."""
    if kernel in LL_KERNELS:
        from .low_latency_layout import LowLatencyConfig

        return LowLatencyConfig(**config)
    from .config import Config

    return Config(**config)


@dataclass(frozen=True)
class Entry:
    kernel: str
    gpu: str
    ranks: int
    dtype: str
    hidden: int
    tokens_min: int
    tokens_max: int
    config: dict
    latency_us: float
    spread_us: float
    samples: int
    runs: int
    incumbent: dict | None = None
    verdict: dict | None = None
    commit: str = "unknown"
    created: str = ""
    tune: dict = field(default_factory=dict)

    def same_shape(self, kernel: str, key: TunedKey) -> bool:
        return (self.kernel, self.gpu, self.ranks, self.dtype, self.hidden) == (kernel, key.gpu, key.ranks, key.dtype,
                                                                                 key.hidden)

    def covers(self, kernel: str, key: TunedKey) -> bool:
        return self.same_shape(kernel, key) and self.tokens_min <= key.tokens <= self.tokens_max

    def describe(self) -> str:
        return (f"{self.kernel} {self.gpu}, {self.ranks} ranks, {self.dtype}, hidden {self.hidden}, "
                f"{unit(self.kernel)} {self.tokens_min}..{self.tokens_max} (tuned at {self.tokens_max})")


@dataclass(frozen=True)
class Match:
    entry: Entry | None
    reason: str
    table: str


_FIELDS = {"kernel": str, "gpu": str, "ranks": int, "dtype": str, "hidden": int, "tokens_min": int,
           "tokens_max": int, "config": dict, "latency_us": (int, float), "spread_us": (int, float),
           "samples": int, "runs": int}


def _entry(d, where: str) -> Entry:
    if not isinstance(d, dict):
        raise TunedTableError(f"{where}: an entry must be an object")
    for k, t in _FIELDS.items():
        v = d.get(k)
        if v is None or isinstance(v, bool) or not isinstance(v, t):
            raise TunedTableError(f"{where}.{k}: expected {t if isinstance(t, type) else 'a number'}, got {v!r}")
    if d["kernel"] not in KERNELS:
        raise TunedTableError(f"{where}.kernel must be one of {KERNELS}, got {d['kernel']!r}")
    if not 1 <= d["tokens_min"] <= d["tokens_max"]:
        raise TunedTableError(f"{where}: tokens_min..tokens_max ({d['tokens_min']}..{d['tokens_max']}) is empty")
    try:
        config_of(d["kernel"], d["config"])
    except (TypeError, ValueError) as e:
        raise TunedTableError(f"{where}.config: {e}") from None
    unknown = sorted(set(d) - {f for f in Entry.__dataclass_fields__})
    if unknown:
        raise TunedTableError(f"{where}: unknown fields {unknown}")
    return Entry(**d)


def load_table(path) -> list[Entry]:
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except OSError as e:
        raise TunedTableError(f"{path}: cannot read ({e})") from None
    except json.JSONDecodeError as e:
        raise TunedTableError(f"{path}: not JSON ({e})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT:
        raise TunedTableError(f"{path}: not an {FORMAT} table")
    if not isinstance(d.get("format_version"), int) or d["format_version"] > FORMAT_VERSION:
        raise TunedTableError(f"{path}: table version {d.get('format_version')!r} is newer than this ep_core's "
                              f"{FORMAT_VERSION}")
    entries = d.get("entries")
    if not isinstance(entries, list):
        raise TunedTableError(f"{path}: 'entries' must be a list")
    return [_entry(e, f"{path}: entries[{i}]") for i, e in enumerate(entries)]


def save_entries(path, new: list[Entry]) -> Path:
    """Add entries to the table at path (created if absent); an entry replaces the one with the same
    kernel, shape and bucket. Written to a temporary name and renamed."""
    path = Path(path)
    old = load_table(path) if path.exists() else []
    keys = {(e.kernel, e.gpu, e.ranks, e.dtype, e.hidden, e.tokens_max) for e in new}
    kept = [e for e in old if (e.kernel, e.gpu, e.ranks, e.dtype, e.hidden, e.tokens_max) not in keys]
    entries = sorted(kept + list(new), key=lambda e: (e.gpu, e.ranks, e.dtype, e.hidden, e.kernel, e.tokens_max))
    text = json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION,
                       "entries": [asdict(e) for e in entries]}, indent=1) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return path


def lookup(entries: list[Entry], kernel: str, key: TunedKey, table: str = "") -> Match:
    """The entry covering `key` for `kernel`, with the reason; or None and why not."""
    u = unit(kernel)
    what = f"{key.tokens} tokens" if u == "tokens" else f"{u} {key.tokens}"
    hits = [e for e in entries if e.covers(kernel, key)]
    if hits:
        e = min(hits, key=lambda e: e.tokens_max)   # buckets do not overlap; the tightest if they do
        return Match(e, f"matched {e.describe()}: {what} in {e.tokens_min}..{e.tokens_max}", table)
    same = sorted((e for e in entries if e.same_shape(kernel, key)), key=lambda e: e.tokens_max)
    if not same:
        return Match(None, f"no tuned {kernel} entry for {key.gpu}, {key.ranks} ranks, {key.dtype}, hidden "
                           f"{key.hidden}", table)
    tuned = ", ".join(f"{e.tokens_min}..{e.tokens_max}" for e in same)
    if key.tokens > same[-1].tokens_max:
        top = f"{same[-1].tokens_max} tokens" if u == "tokens" else f"{u} {same[-1].tokens_max}"
        return Match(None, f"{what} is above every tuned {kernel} bucket ({tuned}): a rule measured "
                           f"at {top} does not govern more", table)
    return Match(None, f"{what} falls in no tuned {kernel} bucket ({tuned})", table)


# -- what ep_core.Buffer calls --------------------------------------------------------------------
_cache: dict = {}
_announced: set = set()


def table_path() -> Path | None:
    """The table in use: EPSCOPE_TUNED_TABLE (a path, or 'off'), else DEFAULT_TABLE if it exists."""
    v = os.environ.get(ENV)
    if v is not None:
        if not v.strip():
            raise TunedTableError(f"{ENV} is set but empty: give a table path, or 'off'")
        if v.strip().lower() == "off":
            return None
        p = Path(v)
        if not p.exists():
            raise TunedTableError(f"{ENV}={v}: no such file")
        return p
    return DEFAULT_TABLE if DEFAULT_TABLE.exists() else None


def match(kernel: str, key: TunedKey) -> Match:
    """Lookup in the table in use (loaded once per path)."""
    p = table_path()
    if p is None:
        return Match(None, "no tuned table in use", "")
    entries = _cache.get(p)
    if entries is None:
        entries = _cache[p] = load_table(p)
    return lookup(entries, kernel, key, str(p))


def announce(m: Match) -> None:
    """Say once per entry that ep_core uses it."""
    if m.entry is None:
        return
    e = m.entry
    key = (m.table, e.kernel, e.gpu, e.ranks, e.dtype, e.hidden, e.tokens_max)
    if key in _announced:
        return
    _announced.add(key)
    print(f"ep_core: {m.entry.kernel} uses the tuned config {m.entry.config} ({m.reason}; table {m.table}); "
          f"pass config= or set {ENV}=off to override", file=sys.stderr)


# -- what ep_core's low-latency calls ask (LowLatency._call_config) ---------------------------------
_ll_cache: dict = {}
_device_names: dict = {}


def ll_default(kernel: str, device, ranks: int, num_sms: int, t_max, hidden, dtype: str):
    """The tuned LowLatencyConfig of a low-latency call that chose none, or None (the Buffer's
    default applies). Keyed on T_max (see the module docstring); one object per key (the plan
    caches key on it, and a call's host path stays a dict lookup); says so once per entry. An
    entry whose grid does not fit this GPU is a broken table: TunedTableError, not a silent fallback.
    t_max / hidden that are not positive ints give None: the call's own checks then name them."""
    if isinstance(t_max, bool) or not isinstance(t_max, int) or t_max < 1:
        return None
    if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
        return None
    env = os.environ.get(ENV)
    key = (env, device, ranks, kernel, t_max, hidden, dtype)
    hit = _ll_cache.get(key, _ll_cache)
    if hit is not _ll_cache:
        return hit
    name = _device_names.get(device)
    if name is None:
        from .streams import _device_name

        name = _device_names[device] = _device_name(device)
    m = match(kernel, TunedKey(name, ranks, dtype, hidden, t_max))
    cfg = None
    if m.entry is not None:
        cfg = config_of(kernel, m.entry.config)
        try:
            cfg.check_geometry(ranks, num_sms)
        except ValueError as e:
            raise TunedTableError(f"{m.table}: the tuned {m.entry.describe()} does not fit this GPU: {e}") from None
        announce(m)
    _ll_cache[key] = cfg
    return cfg
