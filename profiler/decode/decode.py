"""Raw profile buffers -> the tidy event table (profiler.store.schema).

The buffer layout comes only from profiler/generated/layout.py (generated from layout.toml): no
offset in this file is written by hand. This module plans each launch with numpy (buffer and
region headers, region states, the launch's time window, high-resolution clock pairs) and
assembles the table; a record loop decodes the records straight into columns allocated once per
decode: profiler.decode.decode_records (numpy, chunk by chunk) or, with the `fast` extra,
profiler.decode.decode_fast (compiled, a launch at a time; see ENGINES). The rules are in docs/design.md ("Decoder rules"); the pure-Python
decoder of tests/profiler/reference_decoder.py implements them record by record and the fuzz
tests hold the two equal.

Nothing decodes to a silent wrong result: what cannot be read raises a DecodeError naming the
byte offset; what is read with losses comes back as a typed warning with its count.

No torch / perfetto / dash imports: this runs on the recording path of the GPU machine.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from .. import errors as E
from .align import ANCHOR_SKEW_NS, GLOBALTIMER_STEP_NS, NOMINAL_SM_GHZ, ClockModel, RankClock
from .decode_format3 import ANCHOR_CLOCK_BITS, expand
from .decode_records import KEY_BITS, Scratch, decode_chunk
from ..generated import layout as L
from ..pages import small_pages
from ..registry.registry import Registry
from ..store.schema import CATEGORICAL, COLUMNS, EVENT_KINDS, LAUNCH_COLUMNS, coerce_events, empty_events

_HDR = L.BUFFERHEADER_DTYPE
_RH = L.REGIONHEADER_DTYPE
# A region header occupies a whole number of record slots, which lets a region be viewed as
# record slots whose first ones are the header.
assert L.REGIONHEADER_SIZE % L.RECORD_SIZE == 0, "region header must be a multiple of the record size"
_RH_SLOTS = L.REGIONHEADER_SIZE // L.RECORD_SIZE
_RH_STATES = (L.REGION_STATE_UNUSED, L.REGION_STATE_STARTED, L.REGION_STATE_FINISHED)
assert L.META_KIND_SHIFT >= 24, "format 3's kind is read from the top byte of a slot's meta word"

# -- policy: what a plausible buffer holds (docs/design.md, "Decoder rules") --------------------
# Times are int64 ns on the event table. A raw time (or region clock) must be below 2^62 ns (year
# 2116 as %globaltimer; 73 years of clock64 at 2 GHz), so no shift or clock mapping can wrap.
TIME_LIMIT_NS = 1 << 62
# Every time of a launch lies within an hour of its median warp start (the longest EP wait gives
# up after 10 s: ep_core's timeout_s): a bit flip in a timestamp's upper bytes can't stretch a
# launch over years, nor move the run's time base.
LAUNCH_WINDOW_NS = 3_600 * 10**9
# A high-resolution clock pair must give 0.1-10 ns per cycle (a 0.1-10 GHz SM clock; H200 runs
# 1.98 GHz), else the region is converted at the nominal rate (ClockFallback).
MIN_NS_PER_CYCLE, MAX_NS_PER_CYCLE = 0.1, 10.0
# Format 2, clock change detection: two anchors' rates are the same clock when they differ by
# less than each rate's quantisation (2 x (timer step + anchor skew) over its span) plus this
# much. 2e-3: on one H200 the SMs' clock64 rates against the globaltimer differ by up to 1044 ppm
# over 10 ms (pairs of SMs, e.g. 14/15, 30/31, run slow: `epscope calibrate`, benchmarks/NOTES.md
# issue 22), which is not a change; one DVFS step (15 MHz of 1980) is 7600 ppm.
CLOCK_CHANGE_SLACK = 2e-3
ANCHOR_ERROR_NS = GLOBALTIMER_STEP_NS + ANCHOR_SKEW_NS
# clock64 bits an ANCHOR record keeps (format 2: id bits 47..32, payload bits 31..0): 39 hours at 2
# GHz; ANCHOR_CLOCK_BITS comes from profiler.decode.decode_format3, which completes format 3's the same way
# The event table stores warp and sm as int16.
MAX_WARPS_PER_BLOCK = 1 << 15
MAX_SM = (1 << 15) - 1
# Records are decoded in chunks of whole regions of about this many records (512 kB of compact
# records and their temporaries stay in a core's L2; 2^15 was fastest of 2^14..2^17 on the dev VM).
CHUNK_RECORDS = 1 << 15
# Which record loop decodes: "numba" (profiler.decode.decode_fast: compiled ahead of time with numba,
# the build cached on disk; needs the `fast` extra to build), "numba-jit" (the same loop under
# numba's JIT, what "numba" falls back to without a C compiler), "numpy" (profiler.decode.decode_records),
# or "auto": "numba" when a build is on disk or numba is importable, else "numpy". The environment
# variable EPSCOPE_DECODE sets the default; all give the same table (tests/profiler/differential.py).
ENGINES = ("auto", "numba", "numba-jit", "numpy")

_I16, _I32 = np.iinfo(np.int16), np.iinfo(np.int32)


def _field_offset(dtype: np.dtype, name: str) -> int:
    return dtype.fields[name][1]


def slot_size(version: int) -> int:
    """Bytes of one record slot in a buffer of this format version (format 3: 8, before: 16)."""
    return L.RECORD8_SIZE if version >= 3 else L.RECORD_SIZE


@dataclass(frozen=True)
class LaunchInfo:
    """What the host knows about one launch; it is authoritative over the buffer header's rank/launch_id."""

    rank: int
    launch: int
    kernel: str
    iteration: int
    family: str
    host_begin_ns: int = -1  # host clock ns (time.perf_counter_ns) or -1
    host_end_ns: int = -1

    def __post_init__(self):
        for name, lim in (("rank", _I16), ("launch", _I32), ("iteration", _I32)):
            v = getattr(self, name)
            if not isinstance(v, (int, np.integer)) or not lim.min <= int(v) <= lim.max:
                raise ValueError(f"LaunchInfo.{name} = {v!r}: must be an integer in [{lim.min}, {lim.max}] (the event table's dtype)")
        if not isinstance(self.kernel, str) or not isinstance(self.family, str):
            raise ValueError(f"LaunchInfo kernel and family must be strings, got {self.kernel!r}, {self.family!r}")


@dataclass
class DecodedLaunch:
    events: pd.DataFrame
    launch: dict
    warnings: list = field(default_factory=list)


@dataclass
class Decoded:
    events: pd.DataFrame
    launches: pd.DataFrame
    warnings: list = field(default_factory=list)
    conversion: dict = field(default_factory=dict)   # conversion_summary(): formats, anchors, uncertainty


def conversion_summary(plans: list, clock: ClockModel | None) -> dict:
    """How the decode turned raw timestamps into ns, and how far off a GPU time can be within its
    GPU (the cross-rank and host alignment are manifest["clock"]'s): one timer step for
    globaltimer records; for clock64 records the anchor error (timer step + anchor skew, from the
    calibration when there is one), or the bound of a detected clock change when larger."""
    step = clock.step_ns if clock is not None else GLOBALTIMER_STEP_NS
    anchor = clock.anchor_error_ns if clock is not None else ANCHOR_ERROR_NS
    cycles = [p for p in plans if p.hires]
    change = max((p.clock_change_ns for p in plans), default=0.0)
    return {"format_versions": sorted({int(p.version) for p in plans}), "cycle_launches": len(cycles),
            "anchors": int(sum(p.anchors_used for p in plans)),
            "clock_change_regions": int(sum(p.clock_changes for p in plans)),
            "uncertainty_ns": float(max(anchor if cycles else step if plans else 0, change))}


def _registry(registry) -> Registry:
    return registry if isinstance(registry, Registry) else Registry.from_dict(registry)


def _code_dtype(categories: int) -> type:
    """The codes dtype pandas keeps for this many categories (pandas coerce_indexer_dtype), so
    Categorical.from_codes takes the decoded array without a copy."""
    return np.int8 if categories < 127 else np.int16 if categories < _I16.max else np.int32


# -- category codes -----------------------------------------------------------------------------
_KIND_CODE = {L.KIND_BEGIN: "span", L.KIND_INSTANT: "instant", L.KIND_BARRIER_ARRIVE: "arrive",
              L.KIND_BARRIER_DEPART: "depart"}
_BARRIER_KINDS = (L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART)
_PHASE_KINDS = (L.KIND_BEGIN, L.KIND_INSTANT)
_LUT_CACHE: dict[tuple, np.ndarray] = {}
_LUT_CACHE_MAX = 32


def _key(kind: int, ident) -> np.ndarray:
    """The event LUT index of (kind, id): decode_records.KEY_BITS wide."""
    return (kind & 7) << 16 | np.asarray(ident, np.int64)


def _kind_lut() -> np.ndarray:
    lut = _LUT_CACHE.get(("kind",))
    if lut is None:
        lut = np.zeros(1 << KEY_BITS, np.int8)
        for k, name in _KIND_CODE.items():
            lut[(k & 7) << 16:((k & 7) + 1) << 16] = EVENT_KINDS.index(name)
        _LUT_CACHE[("kind",)] = lut
    return lut


def _cached(key: tuple, build) -> np.ndarray:
    lut = _LUT_CACHE.get(key)
    if lut is None:
        if len(_LUT_CACHE) >= _LUT_CACHE_MAX:
            _LUT_CACHE.clear()
        lut = _LUT_CACHE[key] = build()
    return lut


class _Codes:
    """The categories of one decode (kernels, roles, phase names, in first-seen order) and, per
    kernel family, event LUTs from (kind, id) straight to those codes."""

    def __init__(self, plans: list):
        self.kernels = list(dict.fromkeys(p.info.kernel for p in plans))
        self.registries = {p.info.family: p.registry for p in plans}
        self.roles = list(dict.fromkeys(r for reg in self.registries.values() for r in ("", *reg.roles, "host")))
        self.names: list[str] = []
        self._idx: dict[str, int] = {}
        for reg in self.registries.values():
            self.add_names([p.name for p in sorted(reg.phases, key=lambda p: p.id)]
                           + [b.name for b in sorted(reg.barriers, key=lambda b: b.id)])
        self.phase_dtype = _code_dtype(len(self.names))
        self.role_dtype = _code_dtype(len(self.roles))
        self.kind_lut = _kind_lut()

    def phase_lut(self, family: str) -> np.ndarray:
        reg = self.registries[family]

        def build():
            lut = np.full(1 << KEY_BITS, -1, self.phase_dtype)
            idx = self._idx
            for p in reg.phases:
                for k in _PHASE_KINDS:
                    lut[_key(k, p.id)] = idx[p.name]
            for b in reg.barriers:
                for k in _BARRIER_KINDS:
                    lut[_key(k, b.id)] = idx[b.name]
            return lut
        return _cached(("phase", reg.hash, tuple(self.names), self.phase_dtype), build)

    def role_lut(self, family: str) -> np.ndarray:
        reg = self.registries[family]

        def build():
            lut = np.zeros(1 << KEY_BITS, self.role_dtype)
            for k in _BARRIER_KINDS:  # -1: the warp's role, filled in per region
                lut[(k & 7) << 16:((k & 7) + 1) << 16] = -1
            for p in reg.phases:
                for k in _PHASE_KINDS:
                    lut[_key(k, p.id)] = self.roles.index(p.role) if p.role else 0
            return lut
        return _cached(("role", reg.hash, tuple(self.roles), self.role_dtype), build)

    def add_names(self, extra: list[str]) -> np.ndarray:
        """Codes of `extra`, appending the names not seen yet (the caller widens the phase column
        when they outgrow phase_dtype)."""
        idx = self._idx
        for x in extra:
            if x not in idx:
                idx[x] = len(self.names)
                self.names.append(x)
        return np.array([idx[x] for x in extra], np.int64)


# -- buffer parsing -------------------------------------------------------------------------------
def _as_bytes(buf) -> np.ndarray:
    if not isinstance(buf, (np.ndarray, bytes, bytearray, memoryview)) and hasattr(buf, "numpy"):
        buf = buf.detach().cpu().numpy() if hasattr(buf, "detach") else buf.numpy()  # a torch tensor, untyped
    if isinstance(buf, np.ndarray):
        return np.ascontiguousarray(buf).reshape(-1).view(np.uint8)
    return np.frombuffer(buf, dtype=np.uint8)


def _header(arr: np.ndarray, registry: Registry):
    n = arr.size
    if n < L.BUFFERHEADER_SIZE:
        raise E.TruncatedBuffer(f"buffer ends at byte {n}, before the end of its {L.BUFFERHEADER_SIZE}-byte header", n)
    h = arr[: L.BUFFERHEADER_SIZE].view(_HDR)[0]
    magic = int(h["magic"])
    if magic != L.MAGIC:
        raise E.BadMagic(f"bad magic 0x{magic:08X}, expected 0x{L.MAGIC:08X}: not an epscope profile buffer",
                         _field_offset(_HDR, "magic"))
    version = int(h["version"])
    if version > L.VERSION or version < 1:
        what = "newer than" if version > L.VERSION else "not supported by"
        raise E.UnsupportedVersion(f"buffer format version {version} is {what} this decoder (version {L.VERSION})",
                                   _field_offset(_HDR, "version"))
    rh = int(h["registry_hash"])
    if rh != registry.hash:
        raise E.RegistryMismatch(
            f"buffer registry_hash 0x{rh:08X} != 0x{registry.hash:08X} of registry {registry.family!r}: "
            "decode with the registry the buffer was recorded with (the run manifest embeds it)",
            _field_offset(_HDR, "registry_hash"))
    nreg, cap, wpb = int(h["num_regions"]), int(h["region_capacity"]), int(h["warps_per_block"])
    if nreg and not 1 <= wpb <= MAX_WARPS_PER_BLOCK:
        raise E.DecodeError(f"warps_per_block is {wpb}; a buffer with regions needs 1..{MAX_WARPS_PER_BLOCK} "
                            "(the event table's warp column is int16)", _field_offset(_HDR, "warps_per_block"))
    stride = L.REGIONHEADER_SIZE + cap * slot_size(version)
    need = L.BUFFERHEADER_SIZE + nreg * stride
    # (blocks = regions / warps_per_block fit the int32 block column: 2^31 regions need 128 GiB)
    if n < need:
        raise E.TruncatedBuffer(
            f"buffer ends at byte {n} but its header (num_regions={nreg}, region_capacity={cap}) "
            f"says data runs to byte {need}", n)
    return h, nreg, cap, wpb, stride, need, version


def _any_equal(v: np.ndarray, values) -> np.ndarray:
    """v == any of a few values (np.isin's setup costs ~0.2 ms a call: per launch, that shows)."""
    out = v == values[0]
    for x in values[1:]:
        out |= v == x
    return out


def _lower_median(v: np.ndarray):
    k = (len(v) - 1) // 2
    x = np.partition(v, k)[k]
    return float(x) if v.dtype.kind == "f" else int(x)


def _s64(v: int) -> int:
    """A difference of u64 clocks read as signed (a wrap stays small)."""
    v %= 1 << 64
    return v - (1 << 64) if v >= 1 << 63 else v


def _anchor_record(words, clk_start: int) -> tuple[int, int]:
    """(globaltimer ns, full clock64) of an ANCHOR record: its 48 clock bits are completed from the
    region's start clock (the anchor lies less than 2^48 cycles after it)."""
    g, meta = int(words[0]), int(words[1])
    c48 = ((meta & 0xFFFF) << 32) | (meta >> 32)
    mask = (1 << ANCHOR_CLOCK_BITS) - 1
    return g, (clk_start + ((c48 - clk_start) & mask)) % (1 << 64)


def _accept(c0: int, g0: int, c1: int, g1: int, lo: int, hi: int) -> bool:
    """Is (c1, g1) a usable next conversion point after (c0, g0)?"""
    dc = _s64(c1 - c0)
    if not (lo <= g1 <= hi and dc > 0 and g1 > g0):
        return False
    return MIN_NS_PER_CYCLE <= float(g1 - g0) / float(dc) <= MAX_NS_PER_CYCLE


def _candidates(plan, rh, body, nreg: int, stride: int, cap: int, finished, started) -> np.ndarray:
    """A plan's candidate slots of each region (the rules of docs/design.md); drops and aborted regions warned."""
    where = plan.where
    attempted = rh["attempted"].astype(np.int64)
    if plan.version >= 2:  # the overflow sink: past capacity, the last slot was overwritten
        kept = np.where(attempted > cap, max(cap - 1, 0), attempted)
    else:
        kept = np.minimum(attempted, cap)
    n = np.where(finished, kept, 0)
    over = np.where(finished, attempted - kept, 0)
    plan.dropped = int(over.sum())
    if plan.dropped:
        plan.warnings.append(E.DroppedRecords(plan.dropped, f"{where}: {plan.dropped} records past capacity {cap} "
                                                            f"in {int((over > 0).sum())} of {nreg} regions"))
    if started.any():
        si = np.flatnonzero(started)
        kinds = body.reshape(nreg, stride)[si, L.REGIONHEADER_SIZE:]
        if plan.version >= 3:   # the kind nibble of each 8-byte slot's meta word
            k = kinds.reshape(len(si), cap, L.RECORD8_SIZE)[:, :, _field_offset(L.RECORD8_DTYPE, "meta") + 3]
            empty = (k >> (L.META_KIND_SHIFT - 24)) == L.KIND_EMPTY
        else:
            empty = kinds.reshape(len(si), cap, L.RECORD_SIZE)[:, :, _field_offset(L.RECORD_DTYPE, "kind")] == L.KIND_EMPTY
        n[si] = np.where(empty.any(axis=1), empty.argmax(axis=1), cap) if cap else 0
        plan.warnings.append(E.UnfinishedRegion(len(si), f"{where}: {len(si)} regions never finished "
                                                         "(aborted kernel?); decoded up to their first empty record"))
    return n


class Reuse:
    """One work array that every launch of a decode reuses (format 3's expanded records): a fresh
    array per launch costs a page fault per 4 kB on its first touch, and all of them at once the
    memory of every launch's records."""

    def __init__(self):
        self._a = np.empty((0, 2), np.uint64)

    def records(self, n: int) -> np.ndarray:
        if len(self._a) < n:
            with small_pages():   # as the table's columns: 4 kB pages fault in faster here (profiler.pages)
                self._a = np.empty((n, 2), np.uint64)
        return self._a[:n]


def _expand(plan, raw, reuse: Reuse | None) -> None:
    """Format 3: a plan's candidate slots as format-2 records, region after region (decode_format3;
    with the compiled engine, its loop in decode_fast), into `reuse`'s array when given."""
    body, nreg, stride, n, rh, finished, fast = raw
    words = body.view(np.uint64).reshape(nreg, stride // 8) if nreg else np.zeros((0, 1), np.uint64)
    out = reuse.records(int(n.sum())) if reuse is not None else None
    x = (fast.expand if fast is not None else expand)(words, L.REGIONHEADER_SIZE // 8, n, rh, finished, out)
    plan.all_slots, plan.slots, plan.base, plan.n = x.slots, None, x.base, x.n
    plan.n_records = int(x.n.sum())
    if x.saturated:
        plan.warnings.append(E.PayloadSaturated(x.saturated, f"{plan.where}: 16-bit payloads at 0xFFFF "
                                                             "(the recorder saturates wider ones)"))
    if x.ambiguous:
        plan.warnings.append(E.AmbiguousClock(x.ambiguous, f"{plan.where}: regions whose records may lie more "
                                                           "than 2^32 cycles apart without an anchor"))


def _anchor_slots(plan) -> tuple[np.ndarray, np.ndarray]:
    """(region, index among its candidates) of every candidate ANCHOR record of a plan, in order."""
    kinds = plan.all_slots.view(np.uint8)[:, _field_offset(L.RECORD_DTYPE, "kind")]   # a strided view, no copy
    if plan.slots is None:   # format 3: the candidates lie together, region after region
        pos = np.flatnonzero(kinds == L.KIND_ANCHOR)
        ri = np.searchsorted(plan.base + plan.n, pos, side="right")
        return ri, pos - plan.base[ri]
    nreg, w = len(plan.n), int(plan.n.max())   # only candidate slots: a sparse buffer's unwritten tail is never read
    kind = kinds.reshape(nreg, _RH_SLOTS + plan.cap)[:, _RH_SLOTS:_RH_SLOTS + w]
    is_anchor = kind == L.KIND_ANCHOR
    if not is_anchor.any():   # skip the 2-D nonzero
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    ri, ji = np.nonzero(is_anchor)
    cand = ji < plan.n[ri]
    return ri[cand], ji[cand]


class _Plan:
    """One launch after its headers are read: where its records are, how many each region holds,
    its time window and clock conversion, and the warnings found so far."""

    def __init__(self, buf, info: LaunchInfo, registry: Registry, sm_ghz: float = NOMINAL_SM_GHZ, fast=None):
        self.info, self.registry, self.family = info, registry, info.family
        self.sm_ghz = sm_ghz  # the SM clock of regions without a usable clock pair (a calibration's, or nominal)
        arr = _as_bytes(buf)
        h, nreg, cap, wpb, stride, need, self.version = _header(arr, registry)
        # format 2 records clock64 cycles in every buffer; format 1 only when the HIRES flag says so
        self.cap, self.hires = cap, self.version >= 2 or bool(int(h["flags"]) & L.FLAGS_HIRES)
        self.where = where = f"rank {info.rank} launch {info.launch} ({info.kernel})"
        self.warnings: list[E.DecodeWarning] = []
        body = arr[L.BUFFERHEADER_SIZE:need]
        rh = np.ascontiguousarray(body.reshape(nreg, stride)[:, : L.REGIONHEADER_SIZE]).view(_RH).reshape(nreg)
        state = rh["state"]
        bad = np.flatnonzero(~_any_equal(state, _RH_STATES))
        if len(bad):
            i = int(bad[0])
            raise E.DecodeError(f"region {i}: state {int(state[i])} is not a region_state",
                                L.BUFFERHEADER_SIZE + i * stride + _field_offset(_RH, "state"))
        finished = state == L.REGION_STATE_FINISHED
        started = state == L.REGION_STATE_STARTED
        used = finished | started
        bad = np.flatnonzero(used & (rh["sm"] > MAX_SM))
        if len(bad):
            i = int(bad[0])
            raise E.DecodeError(f"region {i}: sm {int(rh['sm'][i])} is above {MAX_SM} (the event table's sm column is int16)",
                                L.BUFFERHEADER_SIZE + i * stride + _field_offset(_RH, "sm"))
        n = _candidates(self, rh, body, nreg, stride, cap, finished, started)
        self._raw3 = None
        if self.version >= 3:   # expanded by finish(), right before the launch is decoded (n: slots until then)
            self._raw3 = (body, nreg, stride, n, rh, finished, fast)
            self.all_slots = self.slots = self.base = None
            self.n = n
        else:
            # the record slots of every region as (regions, capacity, 2) u64: a region's header slots cut off
            self.all_slots = body.view(np.uint64).reshape(-1, 2)
            self.slots = self.all_slots.reshape(nreg, _RH_SLOTS + cap, 2)[:, _RH_SLOTS:, :]
            self.base = np.arange(nreg, dtype=np.int64) * (_RH_SLOTS + cap) + _RH_SLOTS
            self.n = n
        self.used, self.n_records = used, int(self.n.sum())
        ar, per_block = np.arange(nreg, dtype=np.int64), max(wpb, 1)
        self.block, self.warp = (ar // per_block).astype(np.int32), (ar % per_block).astype(np.int16)
        self.sm = rh["sm"].astype(np.int16)
        self.segments: dict[int, tuple] = {}   # region -> (point clocks u64, point ns i64, rates) of anchored regions
        self.anchors_used = self.bad_anchors = self.clock_changes = 0
        self.clock_change_ns = 0.0
        # the clocks are planned by finish(), right before the launch is decoded (the numpy engine's
        # anchor search then leaves the records in cache for its loop; the compiled one skips it)
        self._pending = (rh, finished, used)

    def finish(self, anchors: bool = True, reuse: Reuse | None = None) -> "_Plan":
        """Plan the clocks (once): the time window, each region's conversion and, unless `anchors`
        is False, format 2's anchor search. Without it the plan holds while no candidate record is
        an ANCHOR: the compiled loop counts them and calls with_anchors() when it met one. Format 3's
        slots become records first (into `reuse`'s array: valid until the next launch's finish)."""
        if self._raw3 is not None:
            raw, self._raw3 = self._raw3, None
            _expand(self, raw, reuse)
        if self._pending is not None:
            rh, finished, used = self._pending
            self._pending = None
            self._clock_inputs = (rh, finished, used, len(self.warnings))
            self.anchors_searched = anchors or self.version < 2
            self._clocks(rh, finished, used, self.anchors_searched)
        return self

    def with_anchors(self) -> "_Plan":
        """Plan the clocks again, this time with the anchor search (what finish() found is dropped)."""
        rh, finished, used, warned = self._clock_inputs
        del self.warnings[warned:]
        self.segments = {}
        self.anchors_used = self.bad_anchors = self.clock_changes = 0
        self.clock_change_ns = 0.0
        self.anchors_searched = True
        self._clocks(rh, finished, used, True)
        return self

    # -- time window and clocks --------------------------------------------------------------
    def _clocks(self, rh, finished, used, anchors: bool) -> None:
        gs, ge = rh["gt_start"], rh["gt_end"]
        in_range = used & (gs >= 1) & (gs < TIME_LIMIT_NS)
        if in_range.any():
            anchor = _lower_median(gs[in_range])
        elif not self.hires:
            anchor = self._record_anchor()
        else:
            anchor = None
        if anchor is None:
            lo, hi = 1, TIME_LIMIT_NS - 1
        else:
            lo, hi = max(1, anchor - LAUNCH_WINDOW_NS), min(TIME_LIMIT_NS - 1, anchor + LAUNCH_WINDOW_NS)
        self.window = (lo, hi)
        gs_ok = used & (gs >= lo) & (gs <= hi)
        ge_ok = finished & (ge >= lo) & (ge <= hi)
        bad = int(np.count_nonzero(used & (~gs_ok | (finished & ~ge_ok))))
        if bad:
            self.warnings.append(E.BadRegionClock(bad, f"{self.where}: warp start/finish clocks outside "
                                                        f"[{lo}, {hi}] (the launch's window) ignored"))
        if not self.hires:
            self._header_span(gs[gs_ok], ge[ge_ok])
            return
        gsi = gs.astype(np.int64)
        cs, ce = rh["clk_start"], rh["clk_end"]
        pair = gs_ok & ge_ok & (ce > cs) & (ge > gs)
        span_c = (ce - cs).view(np.int64).astype(np.float64)
        span_g = (ge.astype(np.int64) - gsi).astype(np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            rate = span_g / np.where(pair, span_c, 1.0)
        pair &= (rate >= MIN_NS_PER_CYCLE) & (rate <= MAX_NS_PER_CYCLE)
        self.rate = np.where(pair, rate, 1.0 / self.sm_ghz)
        # converted time = gs + rint((clk - cs) * rate), kept when the product lies in [ylo, yhi]
        self.gs, self.cs = np.where(gs_ok, gsi, 0), cs
        self.ylo = np.where(gs_ok, (lo - np.where(gs_ok, gsi, 0)).astype(np.float64), np.inf)
        self.yhi = np.where(gs_ok, (hi - np.where(gs_ok, gsi, 0)).astype(np.float64), -np.inf)
        end_ok = pair.copy()   # a finish clock that fails its pair's rate check is not trusted either
        if self.version >= 2:
            if anchors:
                self._anchored(gs_ok, ge_ok, gsi, cs, ce, ge, end_ok)
            if self.bad_anchors:
                self.warnings.append(E.BadAnchors(self.bad_anchors, f"{self.where}: anchors that cannot anchor ignored"))
            self._clock_change(pair, gsi, ge)
        self._header_span(gs[gs_ok], ge[end_ok])
        converts = pair.copy()
        converts[list(self.segments)] = True
        fallback = int(np.count_nonzero(gs_ok & ~converts & (self.n > 0)))
        if fallback:
            self.warnings.append(E.ClockFallback(fallback, f"{self.where}: high-res regions without a usable clock pair "
                                                           "converted at the nominal SM clock"))

    def _anchored(self, gs_ok, ge_ok, gsi, cs, ce, ge, end_ok) -> None:
        """Format 2: the ANCHOR records of each region become conversion points between its start
        and finish pairs (piecewise-linear conversion). An anchor is used when it lies in the
        launch's window and after the previous point in both clocks at a plausible rate; the
        finish pair then closes the last segment under the same test (docs/design.md, "Decoder
        rules"; tests/profiler/reference_decoder.py implements the same)."""
        lo, hi = self.window
        if not self.n_records:
            return
        ri, ji = _anchor_slots(self)
        if not len(ri):   # the common case (anchors are optional)
            return
        by_region: dict[int, list] = {}
        for r, j in zip(ri.tolist(), ji.tolist()):
            by_region.setdefault(r, []).append(j)
        for r, js in by_region.items():
            if not gs_ok[r]:
                self.bad_anchors += len(js)
                continue
            pc, pg = [int(cs[r])], [int(gsi[r])]
            for j in js:
                g, c = _anchor_record(self.all_slots[self.base[r] + j], pc[0])
                if _accept(pc[-1], pg[-1], c, g, lo, hi):
                    pc.append(c)
                    pg.append(g)
                else:
                    self.bad_anchors += 1
            if len(pc) == 1:
                continue   # no usable anchor: the region converts as in format 1
            self.anchors_used += len(pc) - 1
            end_ok[r] = bool(ge_ok[r]) and _accept(pc[-1], pg[-1], int(ce[r]), int(ge[r]), lo, hi)
            if end_ok[r]:
                pc.append(int(ce[r]))
                pg.append(int(ge[r]))
            rates = np.array([float(pg[k + 1] - pg[k]) / float(_s64(pc[k + 1] - pc[k])) for k in range(len(pc) - 1)])
            self.segments[r] = (np.array(pc, np.uint64), np.array(pg, np.int64), rates)

    def _clock_change(self, pair, gsi, ge) -> None:
        """Count the regions whose SM clock changed while they recorded (ClockChange): two
        consecutive segments' rates, or the region's start-to-finish rate against the launch's
        lower-median one, differ by more than the anchors' quantisation allows."""
        changed: dict[int, float] = {}
        seg = np.zeros(len(pair), bool)
        seg[list(self.segments)] = True
        plain = np.flatnonzero(pair & ~seg)
        idx = [plain]
        rate = [self.rate[plain].astype(np.float64)]
        span = [(ge[plain].astype(np.int64) - gsi[plain]).astype(np.float64)]
        for r, (pc, pg, rates) in self.segments.items():
            span_g = float(int(pg[-1]) - int(pg[0]))
            idx.append(np.array([r]))
            rate.append(np.array([span_g / float(_s64(int(pc[-1]) - int(pc[0])))]))
            span.append(np.array([span_g]))
            for k in range(len(rates) - 1):
                dg0, dg1 = float(int(pg[k + 1]) - int(pg[k])), float(int(pg[k + 2]) - int(pg[k + 1]))
                dev = abs(float(rates[k + 1]) / float(rates[k]) - 1.0)
                if dev > 2 * ANCHOR_ERROR_NS * (1 / dg0 + 1 / dg1) + CLOCK_CHANGE_SLACK:
                    changed[r] = max(changed.get(r, 0.0), dev * min(dg0, dg1))
        idx, rate, span = np.concatenate(idx), np.concatenate(rate), np.concatenate(span)
        if len(idx) >= 2:
            dev = np.abs(rate / _lower_median(rate) - 1.0)
            for k in np.flatnonzero(dev > 4 * ANCHOR_ERROR_NS / span + CLOCK_CHANGE_SLACK).tolist():
                r = int(idx[k])
                changed[r] = max(changed.get(r, 0.0), float(dev[k] * span[k]))
        self.clock_changes = len(changed)
        self.clock_change_ns = max(changed.values(), default=0.0)
        if changed:
            self.warnings.append(E.ClockChange(len(changed), f"{self.where}: SM clock changed in {len(changed)} regions; "
                                                             "converted piecewise between anchors, a time between two "
                                                             f"anchors may be off by up to {self.clock_change_ns:.0f} ns"))

    def _header_span(self, starts: np.ndarray, ends: np.ndarray) -> None:
        hdr = np.concatenate([starts, ends]).astype(np.int64)
        self.header_span = (int(hdr.min()), int(hdr.max())) if len(hdr) else None

    def _record_anchor(self) -> int | None:
        """Lower median of the plausible raw record times (used when no warp start clock is)."""
        if not self.n_records:
            return None
        rec = self.all_slots[self.slot_index(0, len(self.n))]
        t, kind = rec[:, 0], rec.view(np.uint8)[:, _field_offset(L.RECORD_DTYPE, "kind")]
        v = t[(kind >= 1) & (kind <= 5) & (t >= 1) & (t < TIME_LIMIT_NS)]
        return _lower_median(v) if len(v) else None

    def slot_index(self, r0: int, r1: int) -> np.ndarray:
        """Index in all_slots of every candidate record of regions r0..r1, in order."""
        n = self.n[r0:r1]
        first = self.base[r0:r1] - (np.cumsum(n) - n)
        idx = np.repeat(first, n)
        idx += np.arange(len(idx), dtype=np.int64)
        return idx

    def width(self, r0: int, r1: int) -> int | None:
        """Slots per region when regions r0..r1 are copied as a block (decode_records.compact), or
        None to gather their candidates: a block is used when it is at most twice their count."""
        if self.slots is None:   # format 3's records lie together already: a gather is a copy of a range
            return None
        n = self.n[r0:r1]
        w = int(n.max())
        return w if (r1 - r0) * w <= 2 * int(n.sum()) else None

    def chunk_slots(self, r0: int, r1: int) -> int:
        w = self.width(r0, r1)
        return (r1 - r0) * w if w is not None else int(self.n[r0:r1].sum())

    def _converted(self, clk: np.ndarray, per: np.ndarray, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(y, start ns, ok) of clock64 values `clk` (`per` of each region r0..r1, in order): the
        time is start + rint(y), usable where ok. A region converts from its start pair at one rate
        or, with anchors (format 2), from the conversion point before the value at its segment's rate."""
        cs, rate, gs = (np.repeat(a[r0:r1], per) for a in (self.cs, self.rate, self.gs))
        ylo, yhi = np.repeat(self.ylo[r0:r1], per), np.repeat(self.yhi[r0:r1], per)
        if self.segments:
            at = np.concatenate([[0], np.cumsum(per)])
            lo, hi = self.window
            for r, (pc, pg, rates) in self.segments.items():
                if not r0 <= r < r1 or not per[r - r0]:
                    continue
                sl = slice(at[r - r0], at[r - r0 + 1])
                off = (clk[sl] - pc[0]).view(np.int64)
                k = np.searchsorted((pc[1:-1] - pc[0]).view(np.int64), off, side="right")
                cs[sl], gs[sl], rate[sl] = pc[k], pg[k], rates[k]
                ylo[sl], yhi[sl] = (lo - pg[k]).astype(np.float64), (hi - pg[k]).astype(np.float64)
        y = (clk - cs).view(np.int64).astype(np.float64) * rate
        return y, gs, (y >= ylo) & (y <= yhi)

    def convert(self, begin: np.ndarray, end: np.ndarray, r0: int, r1: int, counts: np.ndarray) -> bool:
        """High-res cycles -> ns in place, per event (`counts` events of each region r0..r1);
        False if a time falls outside the window (nothing is kept then)."""
        out = []
        for a in (begin, end):
            y, gs, ok = self._converted(a.view(np.uint64), counts, r0, r1)
            if not ok.all():
                return False
            out.append((y, gs))
        for a, (y, gs) in zip((begin, end), out):
            np.add(gs, np.rint(y).astype(np.int64), out=a)
        return True

    def bad_times(self, rc: np.ndarray, seg: np.ndarray, km1: np.ndarray, r0: int, r1: int) -> np.ndarray:
        """Compact records of regions r0..r1 that are kept by kind but whose time is not usable."""
        t = rc[:, 0]
        lo, hi = self.window
        if not self.hires:
            return (km1 < 5) & ((t < lo) | (t > hi))
        per = np.diff(seg, append=len(rc))  # slots of each region in rc
        _, _, ok = self._converted(t, per, r0, r1)
        return (km1 < 5) & ~ok

    @functools.cached_property
    def chunks(self) -> list[tuple[int, int]]:
        """Runs of whole regions of about CHUNK_RECORDS candidate records (empty runs left out): the
        numpy loop's unit (0.1 ms a launch of numpy calls the compiled loop has no use for)."""
        if not self.n_records:
            return []
        start = np.cumsum(self.n) - self.n
        cut = np.flatnonzero(np.diff(start // CHUNK_RECORDS)) + 1
        bounds = [0, *cut.tolist(), len(self.n)]
        return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if self.n[a:b].any()]


def _engine(engine: str | None):
    """The compiled record loop (a decode_fast.Loop), or None for the numpy one."""
    engine = engine or os.environ.get("EPSCOPE_DECODE") or "auto"
    if engine not in ENGINES:
        raise ValueError(f"decode engine {engine!r}: must be one of {', '.join(ENGINES)} (EPSCOPE_DECODE or engine=)")
    if engine == "numpy":
        return None
    from . import decode_fast   # numpy only: numba is imported when a kernel must be built or JIT-compiled
    if engine == "auto" and not decode_fast.available():
        return None
    return decode_fast.Loop(jit_only=engine == "numba-jit")


# -- the table ------------------------------------------------------------------------------------
_COUNT_WARNINGS = (  # chunk counts -> warnings, in this order
    ("CorruptRecords", E.CorruptRecords, "records with kind outside 1..5 skipped"),
    ("BadTimestamps", E.BadTimestamps, "records with a time outside the launch's window skipped"),
    ("UnmatchedEnd", E.UnmatchedEnd, "ENDs without BEGIN dropped"),
    ("UnmatchedBegin", E.UnmatchedBegin, "BEGINs without END kept as open spans"),
    ("ReversedSpans", E.ReversedSpans, "spans ending before they begin; end set to begin"),
)


def _host_span(info: LaunchInfo, clock: ClockModel | None):
    """The launch's host span on the run timeline, or None (no host clock or an incomplete span)."""
    if clock is None or clock.host is None:
        return None, -1, -1
    hb, he = (int(v) for v in clock.host_to_run_timeline(np.array([info.host_begin_ns, info.host_end_ns])))
    hb, he = (hb if info.host_begin_ns >= 0 else -1), (he if info.host_end_ns >= 0 else -1)
    # a host row only for a complete host span (a recorder may add its own host rows instead)
    return ((hb, he) if 0 <= info.host_begin_ns <= info.host_end_ns else None), hb, he


class _Table:
    """The output columns of one decode, allocated once (sized by the record count, an upper bound
    of the event count: ENDs make no row) and trimmed at the end; untouched pages cost nothing."""

    def __init__(self, codes: _Codes, rows: int):
        self.codes = codes
        dt = {"kernel": _code_dtype(len(codes.kernels)), "role": codes.role_dtype, "phase": codes.phase_dtype,
              "kind": np.int8}
        with small_pages():
            self.out = {c: np.empty(rows, dt.get(c, t)) for c, t in COLUMNS.items()}
        self.reuse = Reuse()   # format 3's expanded records, one launch at a time

    def name_unknown(self, plan, unknown: list) -> None:
        """Name ids the registry does not declare phase_<id> / barrier_<id>, code them."""
        keys = np.concatenate([k for _, k in unknown])
        uk = np.unique(keys)
        extra = [f"{'barrier' if (k >> 16) in _BARRIER_KINDS else 'phase'}_{k & 0xFFFF}" for k in uk.tolist()]
        lut = self.codes.add_names(extra)
        want = _code_dtype(len(self.codes.names))
        if np.dtype(want).itemsize > self.out["phase"].dtype.itemsize:
            self.out["phase"] = self.out["phase"].astype(want)
            self.codes.phase_dtype = want
        for pos, key in unknown:
            self.out["phase"][pos] = lut[np.searchsorted(uk, key)]
        plan.warnings.append(E.UnknownPhase(len(keys), f"{plan.where}: ids not in registry "
                                                       f"{plan.registry.family!r}: {', '.join(extra)}"))


def _results(plan: _Plan, table: _Table, off: int, scratch, fast, tmap=None):
    """The decoded chunks of one launch: the whole launch at once with the compiled loop."""
    if fast is not None:
        plan.finish(anchors=False, reuse=table.reuse)   # the compiled loop looks for ANCHORs as it goes
        if plan.n_records:
            yield fast.decode(plan, table.out, off, table.codes, scratch, tmap)
        return
    plan.finish(reuse=table.reuse)
    for r0, r1 in plan.chunks:
        res = decode_chunk(plan, r0, r1, table.out, off, table.codes, scratch)
        off += res.events
        yield res


def _decode_launch(plan: _Plan, table: _Table, off: int, scratch, fast, tmap=None) -> tuple[int, int, int]:
    """Decode one launch's records at table row `off`; (events, gpu_begin, gpu_end) in raw ns. The
    rows' times are raw too, or mapped by `tmap` (the compiled loop's decode_fast.time_map)."""
    counts = dict.fromkeys([c for c, _, _ in _COUNT_WARNINGS], 0)
    unknown = []
    o = off
    spans = []
    for res in _results(plan, table, off, scratch, fast, tmap):
        o += res.events
        for k, v in res.counts.items():
            counts[k] += v
        if res.events:
            spans.append((res.tmin, res.tmax))
        if res.unknown is not None:
            unknown.append(res.unknown)
    if plan.header_span:   # known once the clocks are planned (in _results)
        spans.append(plan.header_span)
    for c, cls, what in _COUNT_WARNINGS:
        if counts[c]:
            plan.warnings.append(cls(counts[c], f"{plan.where}: {what}"))
    if unknown:
        table.name_unknown(plan, unknown)
    gb = min(s[0] for s in spans) if spans else -1
    ge = max(s[1] for s in spans) if spans else -1
    return o - off, gb, ge


def _time_map(fast, clock: ClockModel | None, rank: int):
    """With a clock model, what the compiled loop does to each row's times (decode_fast.time_map):
    ClockModel.to_run_timeline after the loop cost 23-27 ns an event on a 600 k-event launch (its
    temporaries), the loop's pass over rows still in cache ~1. None: raw times, mapped afterwards
    by _decode (the numpy loop; a clock model of another kind; no clock model, whose shift is a
    plain subtraction, 0.2-0.7 ns an event, no cheaper in the loop: benchmarks/NOTES.md, issue 20
    round 3)."""
    if fast is None or clock is None:
        return None
    from . import decode_fast
    rc = clock.clock(rank)
    # the loop does RankClock.to_ref's arithmetic: only for those classes, as they are here
    if type(clock).to_run_timeline is not ClockModel.to_run_timeline or type(rc).to_ref is not RankClock.to_ref:
        return None
    return decode_fast.time_map(-int(clock.t0_ns), rc)


def _decode(plans: list[_Plan], clock: ClockModel | None, fast) -> tuple[pd.DataFrame, list[dict]]:
    """Decode planned launches into one event table, every column allocated once (fast: _engine's)."""
    codes = _Codes(plans)
    kidx = {k: i for i, k in enumerate(codes.kernels)}
    hosts = [_host_span(p.info, clock) for p in plans]
    table = _Table(codes, sum(p.n_records + (1 if h[0] else 0) for p, h in zip(plans, hosts)))
    if fast is not None:
        scratch = fast.scratch(plans)
    else:
        scratch = Scratch(max((p.chunk_slots(a, b) for p in plans for a, b in p.chunks), default=0))
    launches, off = [], 0
    for p, (host, hb, he) in zip(plans, hosts):
        info = p.info
        tmap = _time_map(fast, clock, info.rank)
        k, gb, ge = _decode_launch(p, table, off, scratch, fast, tmap)
        out = table.out
        if clock is not None:
            if tmap is None:
                for c in ("begin_ns", "end_ns"):
                    out[c][off:off + k] = clock.to_run_timeline(info.rank, out[c][off:off + k])
            if gb >= 0:
                gb, ge = (int(v) for v in clock.to_run_timeline(info.rank, np.array([gb, ge])))
        rows = slice(off, off + k + (1 if host else 0))
        out["rank"][rows], out["launch"][rows] = info.rank, info.launch
        out["kernel"][rows], out["iteration"][rows] = kidx[info.kernel], info.iteration
        off += k
        if host:
            row = {"sm": -1, "block": -1, "warp": -1, "payload": 0, "open": False, "kind": EVENT_KINDS.index("host"),
                   "role": codes.roles.index("host"), "phase": int(codes.add_names([info.kernel])[0]),
                   "begin_ns": host[0], "end_ns": host[1]}
            if np.dtype(_code_dtype(len(codes.names))).itemsize > out["phase"].dtype.itemsize:
                out["phase"] = out["phase"].astype(_code_dtype(len(codes.names)))
                codes.phase_dtype = _code_dtype(len(codes.names))
            for c, v in row.items():
                out[c][off] = v
            off += 1
        launches.append({"rank": info.rank, "launch": info.launch, "kernel": info.kernel, "iteration": info.iteration,
                         "host_begin_ns": hb, "host_end_ns": he, "gpu_begin_ns": gb, "gpu_end_ns": ge,
                         "regions": int(p.used.sum()), "dropped": p.dropped})
    out = {c: a[:off] for c, a in table.out.items()}
    if clock is None:  # each rank's own globaltimer minus the earliest timestamp of the decode
        starts = [la["gpu_begin_ns"] for la in launches if la["gpu_begin_ns"] >= 0]
        if starts:  # every time is in [1, 2^62): no wrap
            shift = np.int64(min(starts))
            out["begin_ns"] -= shift
            out["end_ns"] -= shift
            for la in launches:
                if la["gpu_begin_ns"] >= 0:
                    la["gpu_begin_ns"] -= int(shift)
                    la["gpu_end_ns"] -= int(shift)
    cat = {"kernel": codes.kernels, "phase": codes.names, "role": codes.roles, "kind": list(EVENT_KINDS)}
    frame = {c: pd.Categorical.from_codes(out[c], categories=cat[c], validate=False) if c in cat else out[c]
             for c in COLUMNS}
    return pd.DataFrame(frame, copy=False), launches


def decode_buffer(buf, info: LaunchInfo, registry, clock: ClockModel | None = None, *,
                  engine: str | None = None) -> DecodedLaunch:
    """Decode one launch's profile buffer.

    buf: bytes | memoryview | np.ndarray (any dtype, viewed as bytes); registry: Registry or its
    to_json() dict. With a ClockModel, times are on the run timeline (ns since run start, rank 0
    clock) and the launch's host span becomes a kind='host' row (phase = kernel name); without
    one, times are this buffer's globaltimer minus its earliest timestamp. Raises DecodeError
    subclasses for unreadable buffers; recoverable problems come back in .warnings. engine: one of
    ENGINES (default: EPSCOPE_DECODE, else "auto").
    """
    fast = _engine(engine)
    plan = _Plan(buf, info, _registry(registry), clock.sm_ghz if clock is not None else NOMINAL_SM_GHZ, fast)
    events, launches = _decode([plan], clock, fast)
    return DecodedLaunch(events, launches[0], plan.warnings)


def aggregate_warnings(warns) -> list[E.DecodeWarning]:
    """One warning per type, counts summed, the first details kept."""
    by: dict[type, list] = {}
    for w in warns:
        by.setdefault(type(w), []).append(w)
    out = []
    for cls, ws in by.items():
        details = [w.detail for w in ws if w.detail]
        detail = "; ".join(details[:5]) + (f"; and {len(details) - 5} more" if len(details) > 5 else "")
        out.append(cls(sum(w.count for w in ws), detail))
    return out


def concat_events(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Concatenate event tables, taking the union of each categorical column's categories."""
    frames = [f for f in frames if len(f)]
    frames = [f if all(isinstance(f[c].dtype, pd.CategoricalDtype) for c in CATEGORICAL) else coerce_events(f)
              for f in frames]
    if not frames:
        return empty_events()
    if len(frames) == 1:
        return frames[0][list(COLUMNS)].reset_index(drop=True)
    out = {}
    for c, t in COLUMNS.items():
        if c == "kind":  # fixed categories: map each frame's codes onto EVENT_KINDS
            codes = [np.array([EVENT_KINDS.index(str(k)) for k in f[c].cat.categories] or [0], np.int8)[f[c].cat.codes.to_numpy()]
                     for f in frames]
            out[c] = pd.Categorical.from_codes(np.concatenate(codes), categories=list(EVENT_KINDS))
        elif t == "category":
            out[c] = union_categoricals([f[c] for f in frames])
        else:
            out[c] = np.concatenate([f[c].to_numpy() for f in frames]).astype(t, copy=False)
    return pd.DataFrame(out)


def _categorical(v: list[str]) -> pd.Categorical:
    """pd.Categorical(v) for strings (its sorted categories), from codes: pd.Categorical(list)
    costs ~1.8 ms on the first call of a process, from_codes ~0.3 (dev VM, issue 20 round 3)."""
    cats = sorted(set(v))
    idx = {x: i for i, x in enumerate(cats)}
    return pd.Categorical.from_codes(np.array([idx[x] for x in v], _code_dtype(len(cats))), categories=cats,
                                     validate=False)


def launches_frame(rows: list[dict]) -> pd.DataFrame:
    # column by column: DataFrame(rows).astype() cost 2-3 ms more on the first call of a process
    # (a tenth of a cold 1 M-record decode's budget)
    cols = {}
    for c, t in LAUNCH_COLUMNS.items():
        v = [r[c] for r in rows]
        cols[c] = _categorical(v) if t == "category" else np.array(v, dtype=t)
    return pd.DataFrame(cols, copy=False)


def decode_launches(items, registries, clocks: ClockModel | None = None, *, engine: str | None = None) -> Decoded:
    """Decode many launches (of any ranks and kernel families) into one table.

    items: iterable of (buf, LaunchInfo); registries: {family: Registry | to_json dict}. Without
    a clock model every rank's times are its own globaltimer minus the earliest raw timestamp of
    the whole decode (only meaningful across ranks that share one clock). Warnings are
    aggregated: one per type, counts summed. engine: the record loop, one of ENGINES (default:
    EPSCOPE_DECODE, else "auto": the compiled one when numba is importable).
    """
    regs = {fam: _registry(r) for fam, r in registries.items()}
    fast = _engine(engine)
    plans = []
    for buf, info in items:
        if info.family not in regs:
            raise KeyError(f"no registry for kernel family {info.family!r} (have {sorted(regs)})")
        plans.append(_Plan(buf, info, regs[info.family], clocks.sm_ghz if clocks is not None else NOMINAL_SM_GHZ, fast))
    events, launches = _decode(plans, clocks, fast)
    return Decoded(events, launches_frame(launches), aggregate_warnings([w for p in plans for w in p.warnings]),
                   conversion_summary(plans, clocks))
