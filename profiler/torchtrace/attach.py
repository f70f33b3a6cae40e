"""Attach PyTorch traces to a run directory: `epscope merge RUN TRACE...` and a Session recorded
with torch_profiler=True. Each trace is read streaming, its rank found (distributedInfo, else its
launch labels), joined and aligned to the run (align.py), then stored as RUN/torch/rank<r>.trace.json.gz,
written beside its destination and renamed into place (profiler.store.atomic), with its SHA-256 and the
alignment in the manifest's `torch_profiler` field (store.py reads them back).
"""
from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

from ..store import atomic
from ..store.runreader import load_run, read_manifest
from ..store.runstore import update_manifest
from . import kineto as K
from .align import Alignment, AlignmentError, align, join, labels_of, trace_rank
from .store import DIR, FIELD, file_name, forget_merged, sha256_of

# What a format-2 GPU time may be off by when the manifest does not say (timer step 32 ns + anchor
# skew, benchmarks/results/recorder-h200-*: the bundled runs' clock.gpu_time.uncertainty_ns is 48-64)
DEFAULT_GPU_SLACK_NS = 64.0


def _slack(man: dict) -> float:
    u = ((man.get("clock") or {}).get("gpu_time") or {}).get("uncertainty_ns")
    return float(u) if isinstance(u, (int, float)) and np.isfinite(u) and u >= 0 else DEFAULT_GPU_SLACK_NS


def _prepare(src, run, name: str) -> tuple[int, K.KinetoTrace, Alignment | None, str | None]:
    """Read one trace and align it to the run: (rank, trace, alignment or None, error or None)."""
    trace = K.read_kineto(src)
    rank = trace_rank(trace, labels_of(trace.events), run.manifest.get("name") or name)
    try:
        joined, unmatched = join(trace, rank, run.manifest.get("name") or name, run.launches)
        return rank, trace, align(joined, run.launches, rank, _slack(run.manifest), unmatched, trace.path), None
    except AlignmentError as e:
        return rank, trace, None, str(e)


def attach(run_path, sources, *, require_alignment: bool = True) -> list[dict]:
    """Store the traces `sources` (paths or bytes) in the run, replacing the stored trace of the
    same rank; returns the manifest's alignment entries of the attached ranks. With
    require_alignment, a trace that cannot be aligned refuses the whole merge (AlignmentError)
    and nothing is written."""
    run_path = Path(run_path)
    run = load_run(run_path)
    prepared, seen = [], set()
    for src in sources:
        rank, trace, al, err = _prepare(src, run, run_path.name)
        if err is not None and require_alignment:
            raise AlignmentError(err)
        if rank in seen:
            raise AlignmentError(f"two traces of rank {rank} given")
        seen.add(rank)
        prepared.append((src, rank, trace, al, err))
    (run_path / DIR).mkdir(exist_ok=True)
    man = read_manifest(run_path)
    old = man.get(FIELD) or {}
    traces = {int(t["rank"]): t for t in old.get("traces", [])}
    aligns = {int(a["rank"]): a for a in old.get("alignment", [])}
    for src, rank, trace, al, err in prepared:
        dest = run_path / file_name(rank)
        atomic.clean_leftovers(dest)
        with atomic.TempFile(dest) as t:
            t.file.write(_gz_bytes(src))
            t.place(replace=True)
        traces[rank] = {"rank": rank, "file": file_name(rank), "sha256": sha256_of(dest), "bytes": dest.stat().st_size,
                        "events": int(trace.read), "source": "<recorded>" if isinstance(src, (bytes, bytearray))
                        else os.path.basename(str(src))}
        aligns[rank] = al.to_json() if al is not None else {"rank": rank, "error": err}
    update_manifest(run_path, {FIELD: {"traces": [traces[r] for r in sorted(traces)],
                                       "alignment": [aligns[r] for r in sorted(aligns)]}})
    forget_merged()   # the merged views of this run are stale
    return [aligns[r] for _, r, *_ in prepared]


def attach_bytes(run_path, traces: dict, *, require_alignment: bool = False) -> list[dict]:
    """attach() of in-memory traces (a recording session's, rank -> gzipped JSON bytes)."""
    return attach(run_path, [traces[r] for r in sorted(traces)], require_alignment=require_alignment)


def _gz_bytes(src) -> bytes:
    raw = bytes(src) if isinstance(src, (bytes, bytearray)) else Path(src).read_bytes()
    return raw if raw[:2] == b"\x1f\x8b" else gzip.compress(raw, compresslevel=6)
