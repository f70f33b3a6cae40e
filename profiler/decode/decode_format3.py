"""Format 3's 8-byte records -> format 2's 16-byte records, one launch at a time, before decoding.

A format-3 record (profiler/layout.toml, Record8) keeps clock64 bits 31..0 and packs kind | id |
a 16-bit payload into its second word; a 32-bit payload rides in a PAYLOAD slot after its record,
an anchor is two slots (ANCHOR: clock64 bits 59..0, then ANCHOR_NS: globaltimer bits 59..0).
`expand` applies format 3's own rules (docs/design.md, "Decoder rules") and hands the rest of the
decoder what format 2 would have written: each record with its full clock64, its payload, and
each anchor as a format-2 ANCHOR record. Every rule after that (spans, conversion through the
anchors, the time window, warnings) is format 2's, in profiler.decode.decode and its record loops.

The rules applied here (tests/profiler/reference_decoder.py implements them slot by slot):
  * pairing: a PAYLOAD right after a BEGIN..DEPART record of the same id gives that record its
    32-bit payload; an ANCHOR_NS right after an ANCHOR completes that anchor. Any other PAYLOAD or
    ANCHOR_NS, and any kind outside 1..8, is a corrupt record (CorruptRecords); an ANCHOR without
    its ANCHOR_NS cannot anchor (BadAnchors). A record without a PAYLOAD whose 16-bit payload is
    0xFFFF may have been saturated by the recorder (PayloadSaturated).
  * the clock chain: c starts at the region's clk_start; a record sets c += (t - c) mod 2^32; a
    paired anchor's clock (bits 47..0 completed from clk_start, as format 2's) replaces c unless it
    lies behind it. A record after the finish clock of a FINISHED region whose clk_end > clk_start
    is a bad timestamp. Where a full clock (an anchor, or that finish clock) lies 2^32 cycles or
    more after the last record before it, some gap among those records may hide whole wraps: the
    region counts as AmbiguousClock (records are expected less than 2^32 cycles apart, or an anchor
    between them).

Vectorised numpy for the regions without an anchor (the recorder's common case); a region with
one is walked slot by slot (anchors are rare: `rec.anchor()` in long kernels).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..generated import layout as L

WRAP = 1 << 32
# clock64 bits an anchor's conversion point keeps: completed from clk_start modulo 2^48 (39 hours at
# 2 GHz), as format 2's ANCHOR records do; the globaltimer of an anchor modulo 2^60 from gt_start
ANCHOR_CLOCK_BITS = 48
ANCHOR_NS_BITS = L.META_KIND_SHIFT + 32          # 60: t plus the meta bits under the kind
# A record after its region's finish clock gets clk_start + 2^62 as its clock: a clock no conversion
# accepts (0.1 ns a cycle at least puts it 4.6e17 ns past its start, outside every launch window),
# so the record loops count it as a bad timestamp like any other.
PAST_FINISH = 1 << 62

_U32 = np.uint64(0xFFFF_FFFF)
_M48 = (1 << ANCHOR_CLOCK_BITS) - 1
_HIGH = (1 << L.META_KIND_SHIFT) - 1            # meta bits under the kind (an anchor's high clock bits)
_PAYLOAD_MAX = (1 << L.META_PAYLOAD_BITS) - 1
_TIMED = (L.KIND_BEGIN, L.KIND_BARRIER_DEPART)   # kinds 1..5: records with a time


@dataclass
class Expanded:
    """A launch's candidate records in format 2's shape: slots (k, 2) u64 [clock or ns, id | kind << 16 |
    payload << 32], region r's at slots[base[r]:base[r] + n[r]]; the counts the expansion found."""

    slots: np.ndarray
    n: np.ndarray
    base: np.ndarray
    saturated: int
    ambiguous: int


def _s64(v: np.ndarray) -> np.ndarray:
    return v.view(np.int64)


def _meta_fields(meta: np.ndarray):
    kind = (meta >> np.uint64(L.META_KIND_SHIFT)).astype(np.int64)
    pid = ((meta >> np.uint64(L.META_ID_SHIFT)) & np.uint64((1 << L.META_ID_BITS) - 1)).astype(np.int64)
    return kind, pid


def _pairs(kind: np.ndarray, pid: np.ndarray, first: np.ndarray):
    """(timed, ok_payload, paired_anchor, ok_anchor_ns, has_payload) masks over the candidates."""
    timed = (kind >= _TIMED[0]) & (kind <= _TIMED[1])
    prev_ok = ~first                                   # the slot before is of the same region
    ok_pl = (kind == L.KIND_PAYLOAD) & prev_ok & np.r_[False, timed[:-1]] & (pid == np.r_[-1, pid[:-1]])
    is_ns = kind == L.KIND_ANCHOR_NS
    paired = (kind == L.KIND_ANCHOR) & np.r_[is_ns[1:] & ~first[1:], False]
    ok_ns = is_ns & np.r_[False, paired[:-1]]
    has_pl = np.r_[ok_pl[1:], False]
    return timed, ok_pl, paired, ok_ns, has_pl


def _chain(lo: np.ndarray, reg: np.ndarray, cs: np.ndarray) -> np.ndarray:
    """Full clocks of records (low words `lo`, regions `reg`, in order) of regions without anchors."""
    if not len(lo):
        return lo
    first = np.r_[True, reg[1:] != reg[:-1]]
    prev = np.where(first, cs[reg] & _U32, np.r_[np.uint64(0), lo[:-1]])
    delta = (lo - prev) & _U32                         # u64 arithmetic: a negative difference wraps, the mask keeps mod 2^32
    run = np.cumsum(delta, dtype=np.uint64)
    start = np.flatnonzero(first)
    before = (run - delta)[start][np.cumsum(first) - 1]
    return cs[reg] + (run - before)


# Regions are expanded in runs of about this many candidate slots: the temporaries (a dozen arrays
# of the run's length) then stay in a core's cache and the peak memory does not grow with the launch.
CHUNK_SLOTS = 1 << 15


def expand(words: np.ndarray, first_slot: int, n: np.ndarray, rh: np.ndarray, finished: np.ndarray,
           out: np.ndarray | None = None) -> Expanded:
    """words: (regions, stride / 8) u64 view of the regions (header, then the slots from column
    first_slot); n: candidate slots per region; rh: the region headers; finished: FINISHED regions;
    out: (at least n.sum(), 2) u64 for the records (default: a new array)."""
    nreg = len(n)
    n = n.astype(np.int64)
    end_check = finished & (_s64(rh["clk_end"] - rh["clk_start"]) > 0)
    n_out = np.zeros(nreg, np.int64)
    out = np.empty((int(n.sum()), 2), np.uint64) if out is None else out
    o, saturated, ambiguous = 0, 0, 0
    start = np.cumsum(n) - n
    cut = np.flatnonzero(np.diff(start // CHUNK_SLOTS)) + 1
    bounds = [0, *cut.tolist(), nreg]
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        if r1 > r0 and n[r0:r1].any():
            recs, n_out[r0:r1], sat, amb = _expand_chunk(words, first_slot, n, r0, r1, rh, end_check)
            out[o:o + len(recs)] = recs
            o += len(recs)
            saturated += sat
            ambiguous += amb
    return Expanded(out[:o], n_out, np.cumsum(n_out) - n_out, saturated, ambiguous)


def _expand_chunk(words, first_slot: int, n: np.ndarray, r0: int, r1: int, rh, end_check):
    """Regions r0..r1: (format-2 records, records per region, saturated payloads, ambiguous regions)."""
    cnt = n[r0:r1]
    starts = np.cumsum(cnt) - cnt
    reg = np.repeat(np.arange(r0, r1, dtype=np.int64), cnt)
    j = np.arange(len(reg), dtype=np.int64) - starts[reg - r0]
    s = words.reshape(-1)[reg * words.shape[1] + first_slot + j]
    t, meta = s & _U32, s >> np.uint64(32)
    kind, pid = _meta_fields(meta)
    timed, ok_pl, paired, ok_ns, has_pl = _pairs(kind, pid, j == 0)
    payload = np.where(has_pl, np.r_[t[1:], np.uint64(0)], meta & np.uint64(_PAYLOAD_MAX))
    saturated = int(np.count_nonzero(timed & ~has_pl & ((meta & np.uint64(_PAYLOAD_MAX)) == _PAYLOAD_MAX)))
    cs, ce = rh["clk_start"], rh["clk_end"]
    clock = np.zeros(len(t), np.uint64)
    walked = np.zeros(len(n), bool)
    walked[reg[paired]] = True
    flat = np.flatnonzero(timed & ~walked[reg])
    clock[flat] = _chain(t[flat], reg[flat], cs)
    ambiguous = _flat_ends(clock[flat], reg[flat], ce, end_check)
    for r in np.flatnonzero(walked).tolist():
        sl = slice(starts[r - r0], starts[r - r0] + cnt[r - r0])
        ambiguous += _walk(r, sl, t, meta, kind, timed, paired, clock, rh, end_check)
    past = timed & end_check[reg] & (_s64(ce[reg] - clock) < 0)
    clock[past] = cs[reg[past]] + np.uint64(PAST_FINISH)
    x = _assemble(reg, len(n), t, meta, kind, pid, timed, ok_pl, paired, ok_ns, payload, clock, rh, saturated, ambiguous)
    return x.slots, x.n[r0:r1], saturated, ambiguous


def _flat_ends(clock: np.ndarray, reg: np.ndarray, ce: np.ndarray, end_check: np.ndarray) -> int:
    """Regions (without anchors) whose finish clock lies 2^32 cycles or more after their last record."""
    if not len(clock):
        return 0
    last = np.r_[reg[1:] != reg[:-1], True]
    r = reg[last]
    gap = _s64(ce[r] - clock[last])
    return int(np.count_nonzero(end_check[r] & (gap >= WRAP)))


def _walk(r, sl, t, meta, kind, timed, paired, clock, rh, end_check) -> int:
    """The clock chain of one region with anchors, slot by slot; 1 if the region is ambiguous."""
    c = int(rh["clk_start"][r])
    since, ambiguous = False, False
    for i in range(sl.start, sl.stop):
        if timed[i]:
            c = (c + ((int(t[i]) - c) % WRAP)) % (1 << 64)
            clock[i] = c
            since = True
        elif paired[i]:
            ca = anchor_clock(int(t[i]), int(meta[i]), int(rh["clk_start"][r]))
            ahead = _signed(ca - c)
            if since and ahead >= WRAP:
                ambiguous = True
            if ahead >= 0:
                c, since = ca, False
            clock[i] = ca
    if end_check[r] and since and _signed(int(rh["clk_end"][r]) - c) >= WRAP:
        ambiguous = True
    return int(ambiguous)


def _signed(v: int) -> int:
    v %= 1 << 64
    return v - (1 << 64) if v >= 1 << 63 else v


def anchor_clock(t: int, meta: int, clk_start: int) -> int:
    """An ANCHOR slot's clock64: bits 47..0 completed from the region's clk_start."""
    bits = (((meta & _HIGH) << 32) | t) & _M48
    return (clk_start + ((bits - clk_start) & _M48)) % (1 << 64)


def anchor_ns(t: int, meta: int, gt_start: int) -> int:
    """An ANCHOR_NS slot's globaltimer: bits 59..0 completed from the region's gt_start."""
    bits = ((meta & _HIGH) << 32) | t
    m = (1 << ANCHOR_NS_BITS) - 1
    return (gt_start + ((bits - gt_start) & m)) % (1 << 64)


def _assemble(reg, nreg, t, meta, kind, pid, timed, ok_pl, paired, ok_ns, payload, clock, rh, saturated, ambiguous):
    """The format-2 records: every candidate but the PAYLOAD / ANCHOR_NS slots merged into the one before."""
    keep = ~(ok_pl | ok_ns)
    k = np.flatnonzero(keep)
    w0 = np.zeros(len(k), np.uint64)
    w1 = np.zeros(len(k), np.uint64)
    tk = timed[k]
    w0[tk] = clock[k[tk]]
    w1[tk] = (pid[k[tk]].astype(np.uint64) | (kind[k[tk]].astype(np.uint64) << np.uint64(16))
              | (payload[k[tk]] << np.uint64(32)))
    an = np.flatnonzero(kind[k] == L.KIND_ANCHOR)      # paired or not: unpaired ones keep gt 0 (BadAnchors)
    for q in an.tolist():
        i = int(k[q])
        r = int(reg[i])
        c48 = anchor_clock(int(t[i]), int(meta[i]), int(rh["clk_start"][r])) & _M48
        w1[q] = np.uint64((c48 >> 32) | (L.KIND_ANCHOR << 16) | ((c48 & 0xFFFF_FFFF) << 32))
        if paired[i]:
            w0[q] = np.uint64(anchor_ns(int(t[i + 1]), int(meta[i + 1]), int(rh["gt_start"][r])))
    out = np.empty((len(k), 2), np.uint64)
    out[:, 0], out[:, 1] = w0, w1                       # other kinds: all zero, a corrupt record (kind 0)
    n_out = np.bincount(reg[k], minlength=nreg).astype(np.int64) if len(k) else np.zeros(nreg, np.int64)
    return Expanded(out, n_out, np.cumsum(n_out) - n_out, saturated, ambiguous)
