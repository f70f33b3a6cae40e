"""PyTorch traces stored in a run directory (the reading side), and the merged view of the run's step.

    RUN/torch/rank<r>.trace.json.gz     each rank's Kineto trace, gzipped as stored
    manifest "torch_profiler": {"traces": [{"rank", "file", "sha256", "bytes", "events", "source"}],
                                "alignment": [Alignment.to_json() | {"rank", "error"}]}

attach.py writes them (`epscope merge`, a Session recorded with torch_profiler=True), each with its
SHA-256 in the manifest (the run's own `checksums` cover the data files the decoder wrote; these
are the same guarantee for the attached traces). `verify` is what `epscope check` adds for them;
`load_merged` reads them back, each hashed before it is parsed.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import EpscopeError
from ..store.runreader import read_manifest
from . import kineto as K
from .align import Alignment, join

FIELD = "torch_profiler"
DIR = "torch"


class TorchTraceError(EpscopeError):
    """A stored PyTorch trace that is missing, damaged or malformed in the manifest."""


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace on the run timeline: events (kineto.COLUMNS + begin_ns, end_ns: run
    timeline ns), joined (align.JOIN_COLUMNS + the same columns in run time: call_begin_ns,
    call_end_ns, kernel_begin_ns, kernel_end_ns), and its alignment."""
    rank: int
    alignment: Alignment
    events: pd.DataFrame
    joined: pd.DataFrame


@dataclass(frozen=True)
class MergedTrace:
    """The run's stored traces that could be aligned (per rank), and why the others could not."""
    ranks: dict
    errors: dict

    def rank(self, r: int) -> RankTrace | None:
        return self.ranks.get(int(r))


def file_name(rank: int) -> str:
    return f"{DIR}/rank{int(rank)}.trace.json.gz"


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return f"sha256:{h.hexdigest()}"


def entries(man: dict) -> list[dict]:
    """The manifest's stored traces, each checked (TorchTraceError naming the field otherwise)."""
    field = man.get(FIELD)
    if field is None:
        return []
    if not isinstance(field, dict) or not isinstance(field.get("traces", []), list):
        raise TorchTraceError(f"manifest field '{FIELD}' is not an object with a 'traces' list")
    out = []
    for i, t in enumerate(field.get("traces", [])):
        ok = (isinstance(t, dict) and isinstance(t.get("rank"), int) and t["rank"] >= 0
              and t.get("file") == file_name(t["rank"]) and isinstance(t.get("sha256"), str))
        if not ok:
            raise TorchTraceError(f"manifest field '{FIELD}.traces[{i}]' is malformed (rank, file, sha256)")
        out.append(t)
    return out


def verify(run_path) -> list[str]:
    """Problems of the run's stored traces (missing, checksum mismatch, malformed manifest entry),
    one line each; [] when they are intact or there are none."""
    run_path = Path(run_path)
    try:
        items = entries(read_manifest(run_path))
    except (TorchTraceError, EpscopeError) as e:
        return [str(e)]
    problems = []
    for t in items:
        p = run_path / t["file"]
        if not p.is_file() or p.is_symlink():
            problems.append(f"{p}: missing (the manifest lists rank {t['rank']}'s PyTorch trace)")
        elif sha256_of(p) != t["sha256"]:
            problems.append(f"{p}: checksum mismatch: the PyTorch trace of rank {t['rank']} changed after it was stored")
    return problems


def load_merged(run) -> MergedTrace | None:
    """The run's stored traces on its timeline (None when it has none). `run`: a loaded Run.
    Each file is hashed before it is parsed; a damaged one is an error of its rank. The last few
    merged views are kept (by the run's path, the traces' checksums and the alignments)."""
    man = run.manifest
    if not man.get(FIELD):
        return None
    items = entries(man)
    aligns = {int(a["rank"]): a for a in (man.get(FIELD) or {}).get("alignment", []) if isinstance(a, dict)}
    name = man.get("name") or Path(run.path).name
    key = (str(Path(run.path).resolve()), tuple((t["file"], t["sha256"]) for t in items), name,
           json.dumps(aligns, sort_keys=True))
    hit = _CACHE.get(key)
    if hit is None:
        hit = _merge(Path(run.path), items, name, aligns, run.launches)
        _CACHE[key] = hit
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
    return hit


_CACHE: dict = {}
_CACHE_SIZE = 4


def forget_merged() -> None:
    """Drop the kept merged views (attach.py, after it stored a trace)."""
    _CACHE.clear()


def _merge(path: Path, items: list[dict], name: str, aligns: dict, launches: pd.DataFrame) -> MergedTrace:
    ranks, errors = {}, {}
    for t in items:
        rank, p = int(t["rank"]), path / t["file"]
        if not p.is_file() or sha256_of(p) != t["sha256"]:
            errors[rank] = f"{p}: missing or changed since it was stored"
            continue
        a = aligns.get(rank)
        if a is None or "error" in a:
            errors[rank] = (a or {}).get("error", "no alignment stored")
            continue
        trace = K.read_kineto(p)
        joined, _ = join(trace, rank, name, launches)
        ranks[rank] = _on_run_timeline(rank, Alignment.from_json(a), trace.events, joined)
    return MergedTrace(ranks, errors)


def _on_run_timeline(rank: int, al: Alignment, events: pd.DataFrame, joined: pd.DataFrame) -> RankTrace:
    ev = events.copy()
    ev["begin_ns"] = al.to_run(ev["ts_ns"].to_numpy())
    ev["end_ns"] = np.maximum(al.to_run((ev["ts_ns"] + ev["dur_ns"]).to_numpy()), ev["begin_ns"].to_numpy())
    j = joined.copy()
    for a, b in (("call_ts_ns", "call_begin_ns"), ("call_end_ns", "call_end_run_ns"),
                 ("kernel_ts_ns", "kernel_begin_ns"), ("kernel_end_ns", "kernel_end_run_ns"),
                 ("label_ts_ns", "label_begin_ns"), ("label_end_ns", "label_end_run_ns")):
        j[b] = al.to_run(j[a].to_numpy())
    return RankTrace(rank, al, ev, j)


def has_traces(run_path) -> bool:
    try:
        return bool((read_manifest(Path(run_path)) or {}).get(FIELD))
    except EpscopeError:
        return False


