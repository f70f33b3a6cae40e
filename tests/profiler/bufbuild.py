"""Hand-build profile buffers from the generated numpy dtypes (profiler/generated/layout.py).

Tests write buffers only through these dtypes, so a change of layout.toml that the decoder does
not follow breaks them (style.md rule 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from profiler.generated import layout as L

B, E, I, A, D = L.KIND_BEGIN, L.KIND_END, L.KIND_INSTANT, L.KIND_BARRIER_ARRIVE, L.KIND_BARRIER_DEPART
# Hand-built buffers are format 1 unless a test asks for another: their times are globaltimer ns
# (format 2 records clock64 cycles in every buffer; tests/profiler/test_formats.py builds those).
FORMAT_1 = 1


def meta3(kind: int, pid: int, payload: int = 0) -> int:
    """A format-3 slot's meta word (the [record8] bit fields of layout.toml, through the generated constants)."""
    return (kind << L.META_KIND_SHIFT) | (pid << L.META_ID_SHIFT) | (payload << L.META_PAYLOAD_SHIFT)


def slots3(records: list) -> list[tuple[int, int]]:
    """Logical records (t, kind, id, payload) -> the format-3 slots (t, meta) the recorder writes: clock
    bits 31..0; a payload above 0xFFFF in a PAYLOAD slot after its record (what a phase declared
    `payload_bits = 32` gets); an ANCHOR record (see anchor()) as ANCHOR + ANCHOR_NS slots. A
    (t, meta) pair passes through as a raw slot."""
    high = (1 << L.META_KIND_SHIFT) - 1
    out = []
    for rec in records:
        if len(rec) == 2:
            out.append(rec)
            continue
        t, kind, pid, payload = rec
        if kind == L.KIND_ANCHOR:
            clk, gt = (pid << 32) | payload, t
            out += [(clk & 0xFFFF_FFFF, meta3(kind, 0) | (clk >> 32 & high)),
                    (gt & 0xFFFF_FFFF, meta3(L.KIND_ANCHOR_NS, 0) | (gt >> 32 & high))]
            continue
        out.append((t & 0xFFFF_FFFF, meta3(kind, pid, min(payload, 0xFFFF))))
        if payload > 0xFFFF:
            out.append((payload, meta3(L.KIND_PAYLOAD, pid)))
    return out


def anchor(gt_ns: int, clk: int) -> tuple:
    """A format-2 ANCHOR record as a (t, kind, id, payload) tuple: globaltimer ns, clock64 bits 47..0."""
    return (gt_ns, L.KIND_ANCHOR, (clk >> 32) & 0xFFFF, clk & 0xFFFF_FFFF)


@dataclass
class Region:
    """One warp's region. records: (t, kind, id, payload) tuples in write order."""

    records: list = field(default_factory=list)
    state: int = L.REGION_STATE_FINISHED
    sm: int = 0
    attempted: int | None = None     # default: len(records) (set larger to simulate drops)
    gt_start: int | None = None
    gt_end: int | None = None
    clk_start: int = 0
    clk_end: int = 0


def build(regions: list[Region], *, registry_hash: int, capacity: int, warps_per_block: int = 1,
          rank: int = 0, launch_id: int = 0, flags: int = 0, magic: int = L.MAGIC,
          version: int = FORMAT_1) -> bytes:
    hdr = np.zeros(1, L.BUFFERHEADER_DTYPE)
    hdr["magic"], hdr["version"], hdr["flags"] = magic, version, flags
    hdr["registry_hash"], hdr["num_regions"], hdr["region_capacity"] = registry_hash, len(regions), capacity
    hdr["rank"], hdr["launch_id"], hdr["warps_per_block"] = rank, launch_id, warps_per_block
    parts = [hdr.tobytes()]
    for i, r in enumerate(regions):
        rh = np.zeros(1, L.REGIONHEADER_DTYPE)
        if version >= 3:   # 8-byte slots; attempted counts slots
            slots = slots3(r.records)
            recs = np.zeros(capacity, L.RECORD8_DTYPE)
            for j, (t, meta) in enumerate(slots[:capacity]):
                recs[j] = (t, meta)
            attempted = len(slots)
        else:
            recs = np.zeros(capacity, L.RECORD_DTYPE)
            for j, (t, kind, pid, payload) in enumerate(r.records[:capacity]):
                recs[j] = (t, pid, kind, 0, payload)
            attempted = len(r.records)
        ts = [rec[0] for rec in r.records if len(rec) == 4] or [0]
        if r.state != L.REGION_STATE_UNUSED:
            rh["sm"], rh["block"], rh["warp"] = r.sm, i // warps_per_block, i % warps_per_block
            rh["gt_start"] = r.gt_start if r.gt_start is not None else min(ts)
            rh["clk_start"] = r.clk_start
            rh["state"] = r.state
        if r.state == L.REGION_STATE_FINISHED:
            rh["attempted"] = r.attempted if r.attempted is not None else attempted
            rh["gt_end"] = r.gt_end if r.gt_end is not None else max(ts)
            rh["clk_end"] = r.clk_end
        parts += [rh.tobytes(), recs.tobytes()]
    return b"".join(parts)


def random_buffer(rng: np.random.Generator, registry, *, n_regions: int = 8, capacity: int = 64,
                  warps_per_block: int = 4, t0: int = 1_700_000_000_000_000_000, version: int = FORMAT_1) -> bytes:
    """A valid buffer of nested spans, instants and barrier events (for fuzzing and benchmarks)."""
    spans = [p for p in registry.phases if p.kind == "span"]
    instants = [p for p in registry.phases if p.kind == "instant"]
    regions = []
    for _ in range(n_regions):
        t = t0 + int(rng.integers(0, 10_000))
        recs = []
        while len(recs) < capacity - 4:
            p = spans[int(rng.integers(len(spans)))]
            recs.append((t, B, p.id, int(rng.integers(0, 8))))
            t += int(rng.integers(0, 5)) * 32
            if instants and rng.random() < 0.3:
                recs.append((t, I, instants[int(rng.integers(len(instants)))].id, 1))
            t += int(rng.integers(1, 50)) * 32
            recs.append((t, E, p.id, 0))
            t += int(rng.integers(0, 4)) * 32
        if registry.barriers:
            recs += [(t, A, registry.barriers[0].id, 0), (t + 64, D, registry.barriers[0].id, 0)]
        regions.append(Region(recs, sm=int(rng.integers(0, 132))))
    return build(regions, registry_hash=registry.hash, capacity=capacity, warps_per_block=warps_per_block,
                 version=version)
