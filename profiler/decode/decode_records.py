"""One chunk of a launch's records -> its rows of the event table (the decoder's inner loop).

profiler.decode.decode plans a launch (headers, region states, the time window, clock pairs) and hands
chunks of whole regions to `decode_chunk`, which writes the chunk's events straight into the
preallocated output columns. Everything here is numpy on arrays of one chunk (~32 k records, a
few hundred kB: they stay in the core's cache); no Python loop runs per record or per region.

Steps of a chunk:
  1. copy its candidate records (the first n of each region) into one contiguous scratch array
     (`compact`: a memcpy per region when regions are full, one gather otherwise);
  2. span matching on the BEGIN/END records (`match_spans`): leaf pairs first, the rest by phase;
  3. gather the event rows (every kept record but ENDs) and fill the columns;
  4. check every time against the launch window; a chunk with a bad time is decoded again with
     those records dropped (rare: only corrupt buffers get there).
"""
from __future__ import annotations

import numpy as np

from ..generated import layout as L

B, E_, I, A, D = L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT, L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART
# Record words as u32: [t lo, t hi, id | kind << 16 | reserved << 24, payload]
_W_IDKIND, _W_PAYLOAD = L.RECORD_DTYPE.fields["id"][1] // 4, L.RECORD_DTYPE.fields["payload"][1] // 4
_KIND_BYTE = L.RECORD_DTYPE.fields["kind"][1]
assert L.RECORD_SIZE == 16 and L.RECORD_DTYPE.fields["t"][1] == 0, "the chunk code reads records as two u64 words"
assert L.RECORD_DTYPE.fields["kind"][1] == L.RECORD_DTYPE.fields["id"][1] + 2, "id and kind share the third u32 word"
_ID_KIND_MASK = np.uint32(0x00FF_FFFF)     # id (16 bits) | kind (8 bits); the reserved byte is ignored
_ONE_KIND = np.uint32(1 << 16)             # BEGIN -> END of the same id differ by this in that word
# Event LUT key: id | (kind & 7) << 16 from the second u64 word (kinds of events are 1, 3, 4, 5)
KEY_BITS = 19
_KEY_MASK = np.uint64((1 << KEY_BITS) - 1)
# Leaf rounds before the per-phase fallback: flat and nested-by-phase traces resolve in 1-3.
_LEAF_ROUNDS = 4


class Scratch:
    """Per-decode work arrays, sized for the largest chunk and reused by every chunk."""

    def __init__(self, records: int):
        self.rec = np.empty((records, 2), np.uint64)   # compact candidate records
        self.tend = np.empty(records, np.int64)        # end time of each record's event


def compact(plan, r0: int, r1: int, scratch: Scratch) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Copy the candidate records of regions [r0, r1) into scratch: (records (k, 2) u64, start of
    each region in them, mask of the slots past a region's candidates or None).

    Regions are copied as a block of their first w = max(n) slots each (a strided memcpy, the
    fastest way through a sparse buffer) when that wastes at most half the block; the slots past
    a region's n are then holes the caller masks. Otherwise the candidates are gathered."""
    n = plan.n[r0:r1]
    nr, w = r1 - r0, plan.width(r0, r1)
    if w is not None:
        rc = scratch.rec[:nr * w]
        np.copyto(rc.reshape(nr, w, 2), plan.slots[r0:r1, :w])
        holes = None if (n == w).all() else np.arange(w) >= n[:, None]
        return rc, np.arange(nr, dtype=np.int64) * w, holes
    m = int(n.sum())
    rc = scratch.rec[:m]
    np.take(plan.all_slots, plan.slot_index(r0, r1), axis=0, out=rc, mode="clip")
    return rc, np.cumsum(n) - n, None


def _pairs_in_order(pos: np.ndarray, val: np.ndarray, seg: np.ndarray) -> np.ndarray:
    """Indices j where (pos[j], pos[j+1]) is BEGIN -> END of one id in one region; pos ascending."""
    leaf = (val[1:] - val[:-1]) == _ONE_KIND
    cut = np.searchsorted(pos, seg[1:])          # first entry of each later region
    cut = cut[(cut > 0) & (cut < len(pos))]
    leaf[cut - 1] = False
    return np.flatnonzero(leaf)


def match_spans(km1: np.ndarray, words: np.ndarray, seg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """BEGIN/END pairs of a chunk as (begin positions, end positions) in compact order.

    The rule (docs/design.md): within a region, a BEGIN immediately followed, among the records
    of its phase id, by an END of that id is a span. A BEGIN directly followed by its END among
    ALL the BEGIN/END records of the region (a leaf) is such a pair. Once a round's leaf pairs of
    the ids that have no other records left are removed, the rest is the same problem on fewer
    records (an id's records are either all removed or all kept), so rounds repeat; whatever is
    left (ids interleaved without nesting, unmatched records) is grouped by id with a stable sort.
    """
    be = np.flatnonzero(km1 < 2)
    val = words[be]
    pos = be
    got_b, got_e = [], []
    for _ in range(_LEAF_ROUNDS):
        if len(pos) < 2:
            break
        li = _pairs_in_order(pos, val, seg)
        if not len(li):
            break
        if 2 * len(li) < len(pos):  # only ids with no record outside a leaf pair are done
            rest = np.ones(len(pos), bool)
            rest[li] = rest[li + 1] = False
            busy = np.zeros(1 << 16, bool)
            busy[val[rest] & np.uint32(0xFFFF)] = True
            li = li[~busy[val[li] & np.uint32(0xFFFF)]]
            if not len(li):
                break
        got_b.append(pos[li])
        got_e.append(pos[li + 1])
        if 2 * len(li) == len(pos):
            pos = pos[:0]
            break
        keep = np.ones(len(pos), bool)
        keep[li] = keep[li + 1] = False
        pos, val = pos[keep], val[keep]
    if len(pos) > 1:
        order = np.argsort(val & np.uint32(0xFFFF), kind="stable")
        s, v = pos[order], val[order]
        region = np.searchsorted(seg, s, side="right")
        ok = ((v[1:] - v[:-1]) == _ONE_KIND) & (region[1:] == region[:-1])
        li = np.flatnonzero(ok)
        got_b.append(s[li])
        got_e.append(s[li + 1])
    if not got_b:
        return be[:0], be[:0]
    if len(got_b) == 1:
        return got_b[0], got_e[0]
    return np.concatenate(got_b), np.concatenate(got_e)


def _last_kept(km1: np.ndarray, seg: np.ndarray, m: int) -> np.ndarray:
    """Compact position of each region's last kept record (-1 if none)."""
    kp = np.flatnonzero(km1 < 5)
    ends = np.r_[seg[1:], m]
    j = np.searchsorted(kp, ends) - 1
    out = np.where(j >= 0, kp[np.maximum(j, 0)], -1)
    return np.where(out >= seg, out, -1)


class ChunkResult:
    __slots__ = ("events", "tmin", "tmax", "counts", "unknown")

    def __init__(self):
        self.events = 0
        self.tmin = self.tmax = None
        self.counts = {}
        self.unknown = None


def decode_chunk(plan, r0: int, r1: int, out: dict, o: int, codes, scratch: Scratch) -> ChunkResult:
    """Decode regions [r0, r1) of `plan` into out[column][o:o + events]."""
    res = ChunkResult()
    bad = None
    for attempt in range(2):
        rc, seg, holes = compact(plan, r0, r1, scratch)  # again on the second pass: the first patched payloads
        if not len(rc):
            return res
        if bad is not None:  # records with a bad time are skipped like corrupt ones
            rc.view(np.uint8)[:, _KIND_BYTE][bad] = 0
        km1 = rc.view(np.uint8)[:, _KIND_BYTE] - np.uint8(1)    # 0 BEGIN .. 4 DEPART; EMPTY wraps to 255
        n_holes = 0
        if holes is not None:
            np.copyto(km1.reshape(holes.shape), 255, where=holes)
            n_holes = int(np.count_nonzero(holes))
        n_bad = 0 if bad is None else int(np.count_nonzero(bad))
        words = rc.view(np.uint32)[:, _W_IDKIND] & _ID_KIND_MASK
        b, e = match_spans(km1, words, seg)
        n_begin, n_end = int(np.count_nonzero(km1 == 0)), int(np.count_nonzero(km1 == 1))
        res = ChunkResult()
        # format 2: ANCHOR records (km1 == 5) are conversion points (profiler.decode.decode), not events
        n_anchors = int(np.count_nonzero(km1 == L.KIND_ANCHOR - 1)) if plan.version >= 2 else 0
        res.counts = {"CorruptRecords": int(np.count_nonzero(km1 > 4)) - n_holes - n_bad - n_anchors, "BadTimestamps": n_bad,
                      "UnmatchedEnd": n_end - len(b), "UnmatchedBegin": n_begin - len(b)}
        if _events(plan, r0, r1, rc, seg, km1, b, e, out, o, codes, scratch, res):
            return res
        assert attempt == 0, "records with bad times were dropped, yet a time is outside the window"
        bad = plan.bad_times(rc, seg, km1, r0, r1)
        assert bad.any(), "a time outside the window that no record has"
    raise AssertionError("unreachable")


def _events(plan, r0, r1, rc, seg, km1, b, e, out, o, codes, scratch, res) -> bool:
    """Fill the event rows; False when a time lies outside the launch window (not kept)."""
    m = len(rc)
    t = rc[:, 0].view(np.int64)
    tend = scratch.tend[:m]
    np.copyto(tend, t)
    tend[b] = t[e]
    # a span's payload is its BEGIN's, or its END's when the BEGIN carried 0 (counts known at the end)
    w32 = rc.view(np.uint32)
    zero = w32[b, _W_PAYLOAD] == 0
    if zero.any():
        w32[b[zero], _W_PAYLOAD] = w32[e[zero], _W_PAYLOAD]
    opened = None
    if res.counts["UnmatchedBegin"]:
        begins = np.flatnonzero(km1 == 0)
        paired = np.zeros(m, bool)
        paired[b] = True
        ob = begins[~paired[begins]]
        last = _last_kept(km1, seg, m)
        region = np.searchsorted(seg, ob, side="right") - 1
        tend[ob] = t[last[region]]
        opened = np.zeros(m, bool)
        opened[ob] = True
    src = np.flatnonzero((km1 < 5) & (km1 != 1))
    n = len(src)
    rows = np.take(rc, src, axis=0, mode="clip")
    sl = slice(o, o + n)
    begin, end = out["begin_ns"][sl], out["end_ns"][sl]
    np.copyto(begin.view(np.uint64), rows[:, 0])
    np.take(tend, src, out=end, mode="clip")
    evoff = np.searchsorted(src, seg)
    counts = np.diff(evoff, append=n)
    if plan.hires:
        if not plan.convert(begin, end, r0, r1, counts):
            return False
    if res.counts["UnmatchedEnd"] and plan.bad_times(rc, seg, km1, r0, r1).any():
        return False  # an unmatched END makes no row, but whether it is kept depends on its time
    if not n:
        return True
    lo, hi = plan.window
    bmin, bmax, emin, emax = int(begin.min()), int(begin.max()), int(end.min()), int(end.max())
    if bmin < lo or bmax > hi or emin < lo or emax > hi:
        return False
    if emin < bmax:  # only corrupt timestamps do this: globaltimer and per-SM clock64 never run backwards
        back = end < begin
        nb = int(np.count_nonzero(back))
        if nb:
            res.counts["ReversedSpans"] = nb
            np.maximum(end, begin, out=end)
    res.tmin, res.tmax = bmin, max(bmax, emax)
    meta = rows[:, 1]
    np.right_shift(meta, np.uint64(32), out=out["payload"][sl].view(np.uint64))
    key = np.bitwise_and(meta, _KEY_MASK).view(np.int64)
    phase, role = out["phase"][sl], out["role"][sl]
    np.take(codes.phase_lut(plan.family), key, out=phase, mode="clip")
    np.take(codes.role_lut(plan.family), key, out=role, mode="clip")
    np.take(codes.kind_lut, key, out=out["kind"][sl], mode="clip")
    out["open"][sl] = False if opened is None else opened[src]
    for col, values in (("block", plan.block), ("warp", plan.warp), ("sm", plan.sm)):
        out[col][sl] = np.repeat(values[r0:r1], counts)
    if (role < 0).any():  # barrier events take the role of the warp's first role-bearing event
        _barrier_roles(role, evoff, n)
    if (phase < 0).any():  # ids the registry does not name: named once the whole launch is decoded
        u = np.flatnonzero(phase < 0)
        res.unknown = (u + o, key[u].copy())
    res.events = n
    return True


def _barrier_roles(role: np.ndarray, evoff: np.ndarray, n: int) -> None:
    bar = np.flatnonzero(role < 0)
    bearing = np.flatnonzero(role > 0)
    region_end = np.r_[evoff[1:], n]
    j = np.searchsorted(bearing, evoff)
    has = j < len(bearing)
    has[has] = bearing[j[has]] < region_end[has]
    first_role = np.zeros(len(evoff), role.dtype)
    first_role[has] = role[bearing[j[has]]]
    region = np.searchsorted(evoff, bar, side="right") - 1
    role[bar] = first_role[region]
