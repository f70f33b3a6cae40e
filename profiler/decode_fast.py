"""A launch's records -> its rows of the event table, compiled with numba (optional: the `fast` extra).

profiler.decode plans each launch with numpy (headers, region states, the time window, the clock
conversion of every region and its anchor segments) and then hands the whole launch either to
profiler.decode_records (numpy, chunk by chunk) or, when numba is importable, to `decode_launch`
here: one compiled loop over each region's candidate records that applies the decoder rules of
docs/design.md record by record, the way tests/profiler/reference_decoder.py does, and writes the
rows straight into the preallocated columns. The differential tests hold both paths equal to the
reference decoder (tests/profiler/differential.py).

Why a compiled loop: the numpy path makes ~45 array passes over each chunk and tops out near
10-24 M records/s a core (benchmarks/results/decode-cpu-2026-11-30.md); this loop reads each
record once. Importing this module imports numba (~0.3-0.4 s on the dev VM): profiler.decode
imports it at the first decode, never at its own import, and the kernel is cached on disk
(`cache=True`: numba's __pycache__ next to this file, or its per-user cache directory when that
is read-only), so a fresh process loads it instead of compiling it.
"""
from __future__ import annotations

import numba as nb
import numpy as np

from .generated import layout as L

# Record as two u64 words: t, then id (bits 0-15) | kind (16-23) | reserved (24-31) | payload (32-63)
_RF = L.RECORD_DTYPE.fields
assert L.RECORD_SIZE == 16 and _RF["t"][1] == 0 and _RF["id"][1] == 8, "the loop reads records as two u64 words"
assert _RF["kind"][1] == 10 and _RF["payload"][1] == 12, "kind at bits 16-23 and payload at 32-63 of the second word"
# (u64 constants: numba types a u64 mixed with an i64 as float64)
_KIND_SHIFT, _PAYLOAD_SHIFT = np.uint64(8 * (_RF["kind"][1] - 8)), np.uint64(8 * (_RF["payload"][1] - 8))
_ID_MASK, _BYTE, _KEY_SHIFT = np.uint64(0xFFFF), np.uint64(0xFF), np.uint64(16)
# What the loop returns, by index of its result array
R_EVENTS, R_CORRUPT, R_BADTIME, R_UNMATCHED_END, R_UNMATCHED_BEGIN, R_REVERSED, R_UNKNOWN, R_TMIN, R_TMAX = range(9)
_RESULTS = 9
_IDS = 1 << 16
_I64_MAX = np.iinfo(np.int64).max


@nb.njit(cache=True, nogil=True, boundscheck=False)
def _launch(slots, base, n, hires, v2, lo, hi, cs, rate, gs, ylo, yhi, seg_at, seg_len, pcs, pgs, prates,
            phase_lut, role_lut, kind_lut, blk, wrp, smv,
            o_begin, o_end, o_payload, o_phase, o_role, o_kind, o_open, o_block, o_warp, o_sm,
            o, unk_pos, unk_key, res):
    """Rows of every region of one launch from row `o` on; counts and time bounds into `res`."""
    m_max = 0
    for r in range(n.shape[0]):
        m_max = max(m_max, n[r])
    tconv = np.empty(m_max, np.int64)      # a region's kept records: converted time,
    state = np.empty(m_max, np.uint8)      # kind (0: skipped),
    partner = np.empty(m_max, np.int64)    # the END that closes a BEGIN (-1: none)
    stamp = np.zeros(_IDS, np.int32)       # an id's open BEGIN belongs to region stamp - 1 ...
    prev = np.zeros(_IDS, np.int64)        # ... and is record prev of it
    ulo, uhi = np.uint64(lo), np.uint64(hi)
    ev = o
    corrupt = badtime = unmatched_end = unmatched_begin = reversed_ = unknown = 0
    tmin, tmax = _I64_MAX, -_I64_MAX
    for r in range(n.shape[0]):
        m = n[r]
        if m == 0:
            continue
        b0 = base[r]
        gen = np.int32(r + 1)
        sa, sl = seg_at[r], seg_len[r]
        last_t = np.int64(0)
        # pass 1: which records are kept, their times, and the spans (per id, a BEGIN then an END)
        for j in range(m):
            w0, w1 = slots[b0 + j, 0], slots[b0 + j, 1]
            kind = np.uint8((w1 >> _KIND_SHIFT) & _BYTE)
            state[j] = 0
            if v2 and kind == 6:   # an ANCHOR: a conversion point (profiler.decode plans it), not an event
                continue
            if kind < 1 or kind > 5:
                corrupt += 1
                continue
            if not hires:
                ok = w0 >= ulo and w0 <= uhi
                t = np.int64(w0)
            else:
                if sa >= 0:   # the segment of the last anchor point at or before this clock
                    off = np.int64(w0 - pcs[sa])
                    k = 0
                    for q in range(1, sl - 1):
                        if np.int64(pcs[sa + q] - pcs[sa]) <= off:
                            k += 1
                    c0, g0, rt = pcs[sa + k], pgs[sa + k], prates[sa + k]
                    yl, yh = np.float64(lo - g0), np.float64(hi - g0)
                else:
                    c0, g0, rt, yl, yh = cs[r], gs[r], rate[r], ylo[r], yhi[r]
                y = np.float64(np.int64(w0 - c0)) * rt
                ok = y >= yl and y <= yh
                t = g0 + np.int64(np.rint(y)) if ok else np.int64(0)
            if not ok:
                badtime += 1
                continue
            state[j] = kind
            tconv[j] = t
            last_t = t
            partner[j] = -1
            pid = w1 & _ID_MASK
            if kind == 1:
                stamp[pid] = gen
                prev[pid] = j
            elif kind == 2:
                if stamp[pid] == gen:
                    partner[prev[pid]] = j
                    stamp[pid] = 0
                else:
                    unmatched_end += 1
        # pass 2: the rows (every kept record but ENDs), in record order
        first_role = 0
        barriers = False
        r_start = ev
        for j in range(m):
            kind = state[j]
            if kind == 0 or kind == 2:
                continue
            w1 = slots[b0 + j, 1]
            key = (w1 & _ID_MASK) | (np.uint64(kind & 7) << _KEY_SHIFT)
            b = tconv[j]
            e = b
            pl = w1 >> _PAYLOAD_SHIFT
            opened = False
            if kind == 1:
                p = partner[j]
                if p >= 0:
                    e = tconv[p]
                    if pl == 0:   # counts known only at the end ride on the END
                        pl = slots[b0 + p, 1] >> _PAYLOAD_SHIFT
                else:
                    e = last_t
                    opened = True
                    unmatched_begin += 1
                if e < b:
                    e = b
                    reversed_ += 1
            o_begin[ev] = b
            o_end[ev] = e
            o_payload[ev] = np.int64(pl)
            ph = phase_lut[key]
            o_phase[ev] = ph
            if ph < 0:
                unk_pos[unknown] = ev
                unk_key[unknown] = np.int64(key)
                unknown += 1
            ro = role_lut[key]
            o_role[ev] = ro
            if ro < 0:
                barriers = True
            elif ro > 0 and first_role == 0:
                first_role = ro
            o_kind[ev] = kind_lut[key]
            o_open[ev] = opened
            o_block[ev] = blk[r]
            o_warp[ev] = wrp[r]
            o_sm[ev] = smv[r]
            tmin = min(tmin, b)
            tmax = max(tmax, e)
            ev += 1
        if barriers:   # a barrier event takes the role of its warp's first role-bearing event
            for q in range(r_start, ev):
                if o_role[q] < 0:
                    o_role[q] = first_role
    res[R_EVENTS], res[R_CORRUPT], res[R_BADTIME] = ev - o, corrupt, badtime
    res[R_UNMATCHED_END], res[R_UNMATCHED_BEGIN], res[R_REVERSED], res[R_UNKNOWN] = \
        unmatched_end, unmatched_begin, reversed_, unknown
    res[R_TMIN], res[R_TMAX] = tmin, tmax


def _segments(plan, nreg: int):
    """The anchor segments of plan.segments as flat arrays: (first point of each region or -1,
    points of each region, point clocks, point ns, rate of the segment from each point)."""
    seg_at, seg_len = np.full(nreg, -1, np.int64), np.zeros(nreg, np.int64)
    pcs, pgs, prates = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)], [np.zeros(0, np.float64)]
    at = 0
    for r, (pc, pg, rates) in plan.segments.items():
        seg_at[r], seg_len[r] = at, len(pc)
        pcs.append(pc)
        pgs.append(pg)
        prates.append(np.r_[rates, 0.0])   # one rate per segment; the last point starts none
        at += len(pc)
    return seg_at, seg_len, np.concatenate(pcs), np.concatenate(pgs), np.concatenate(prates)


def decode_launch(plan, out: dict, o: int, codes, rh_slots: int):
    """Decode every record of `plan` into out[column][o:]; a decode_records.ChunkResult."""
    from .decode_records import ChunkResult
    nreg = len(plan.n)
    n = plan.n.astype(np.int64)
    base = np.arange(nreg, dtype=np.int64) * (rh_slots + plan.cap) + rh_slots
    if plan.hires:
        cs, rate, gs = (np.ascontiguousarray(a, dt) for a, dt in ((plan.cs, np.uint64), (plan.rate, np.float64),
                                                                  (plan.gs, np.int64)))
        ylo, yhi = np.ascontiguousarray(plan.ylo, np.float64), np.ascontiguousarray(plan.yhi, np.float64)
    else:   # unused: times are raw globaltimer ns checked against the window
        cs, gs = np.zeros(nreg, np.uint64), np.zeros(nreg, np.int64)
        rate = ylo = yhi = np.zeros(nreg, np.float64)
    seg_at, seg_len, pcs, pgs, prates = _segments(plan, nreg)
    lo, hi = plan.window
    unk_pos, unk_key = np.empty(plan.n_records, np.int64), np.empty(plan.n_records, np.int64)  # pages touched only if used
    r = np.zeros(_RESULTS, np.int64)
    _launch(plan.all_slots, base, n, plan.hires, plan.version >= 2, np.int64(lo), np.int64(hi),
            cs, rate, gs, ylo, yhi, seg_at, seg_len, pcs, pgs, prates,
            codes.phase_lut(plan.family), codes.role_lut(plan.family), codes.kind_lut,
            plan.block, plan.warp, plan.sm,
            out["begin_ns"], out["end_ns"], out["payload"], out["phase"], out["role"], out["kind"], out["open"],
            out["block"], out["warp"], out["sm"], np.int64(o), unk_pos, unk_key, r)
    res = ChunkResult()
    res.events = int(r[R_EVENTS])
    res.counts = {"CorruptRecords": int(r[R_CORRUPT]), "BadTimestamps": int(r[R_BADTIME]),
                  "UnmatchedEnd": int(r[R_UNMATCHED_END]), "UnmatchedBegin": int(r[R_UNMATCHED_BEGIN]),
                  "ReversedSpans": int(r[R_REVERSED])}
    if res.events:
        res.tmin, res.tmax = int(r[R_TMIN]), int(r[R_TMAX])
    k = int(r[R_UNKNOWN])
    if k:
        res.unknown = (unk_pos[:k], unk_key[:k])
    return res
