"""`epscope analyze` on a Dask cluster: the chunks' passes run on dask.distributed workers.

A run analysed in chunks of whole iterations (profiler.analysis.chunked) needs each chunk's pass
(read its events, build its graph, compute its tables, timeline tiles, report share and what-if
input) once and independently; only the small outputs meet afterwards. So a worker takes a chunk
(the run's path, the chunk's iterations), reads it from the run's events.parquet through its own
runreader.EventReader (one open reader a worker process, its checksum checked once), runs
`chunked.chunk_pass` and writes what scales with the chunk's events (the what-if input, the span
durations) into the spill directories, and sends back the `ChunkOut` (pickled: tables per warp and
launch, per occurrence and per op; well under 1 % of the chunk's events). This process combines
them in chunk order (`chunked._finish`) exactly as the single-process loop does, so the stored
results are the same files (tests/analysis/test_distributed.py holds them equal, byte for byte).

The run directory must be one every worker reads and writes at the same path (a shared file
system, or one machine: `--workers N` starts a LocalCluster of N processes). dask.distributed is
an optional extra (`pip install 'epscope[dask]'`): nothing else imports this module.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

from distributed import Client, LocalCluster

from . import chunked, heap
from .semantics import semantics
from .spill import Spill


@dataclass
class _Context:
    """What a worker process keeps of a run between its chunks."""
    run: object
    reader: object
    lock: threading.Lock
    sem: object


_CONTEXTS: dict[tuple, _Context] = {}
_CONTEXTS_LOCK = threading.Lock()
CONTEXTS_KEPT = 4          # runs a worker keeps open (the oldest closed first)


def _context(path: str, version_id) -> _Context:
    """The run opened once a worker process (its launch table, registry and event reader: its
    checksum is checked at the open, 0.9 s for 400 MB); the reads of the threads of one process
    take turns on the reader's open file."""
    from profiler.store.runreader import EventReader, load_run

    key = (path, version_id)
    with _CONTEXTS_LOCK:
        ctx = _CONTEXTS.pop(key, None)
        if ctx is None:
            run = load_run(path)
            if run.version_id != version_id:
                raise RuntimeError(f"{path}: the run was rewritten since the analysis began; analyse it again")
            ctx = _Context(run=run, reader=EventReader(run), lock=threading.Lock(),
                           sem=semantics(run.manifest.get("registry")))
        _CONTEXTS[key] = ctx                   # the most recently used last
        while len(_CONTEXTS) > CONTEXTS_KEPT:
            old = _CONTEXTS.pop(next(iter(_CONTEXTS)))
            with old.lock:
                old.reader.close()
        return ctx


_KEPT: list = []


def _keep_freed_memory() -> None:
    """Freed memory stays in a worker process from its first chunk on (heap.kept, entered once and
    never left): left after each chunk, glibc gave the pages back and the next chunk faulted them
    in again (the single-process loop keeps them across its chunks)."""
    with _CONTEXTS_LOCK:
        if not _KEPT:
            k = heap.kept()
            k.__enter__()
            _KEPT.append(k)


def _keeping(fn):
    """fn run with the worker's freed memory kept (_keep_freed_memory)."""
    def run(item, **shared):
        _keep_freed_memory()
        return fn(item, **shared)
    run.__name__ = getattr(fn, "__name__", "run")
    return run


def chunk_task(path: str, version_id, index: int, iterations, ranks: int, what_if_dir: str,
               durations_dir: str) -> chunked.ChunkOut:
    """One chunk's pass on a worker (what analyze_run's loop does for it in one process)."""
    _keep_freed_memory()
    heap.between_chunks()                  # the worker's previous chunk's free pages (heap.py)
    ctx = _context(path, version_id)
    with ctx.lock:
        ev = chunked.read_chunk(ctx.reader, iterations)
    spills = chunked.Spills(what_if=Spill(Path(what_if_dir)), durations=Spill(Path(durations_dir), checksums=False))
    out, _ = chunked.chunk_pass(ev, ctx.run.launches, ctx.sem, ranks, index, spills, lambda tables: True)
    return out


class DaskEngine:
    """Sends a run's chunks to the workers of a dask.distributed cluster (chunked.analyze_run's
    `engine`). `DaskEngine.connect(address)`: a running scheduler; `DaskEngine.local(n)`: a
    LocalCluster of n worker processes (one thread each) started here and closed with `close()`."""

    def __init__(self, client: Client, cluster: LocalCluster | None = None, what: str = ""):
        self.client, self.cluster, self.what = client, cluster, what

    @classmethod
    def connect(cls, address: str) -> "DaskEngine":
        return cls(Client(address), what=f"the Dask scheduler at {address}")

    @classmethod
    def local(cls, workers: int, processes: bool = True) -> "DaskEngine":
        if workers < 1:
            raise ValueError(f"a local cluster needs at least one worker, not {workers}")
        # no dashboard; the scheduler's own HTTP server (health, metrics) still starts, on 8787
        # unless told otherwise: a second cluster (a user's notebook's, or this process's) made it
        # warn "Port 8787 is already in use". An ephemeral port instead.
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                               dashboard_address=None, scheduler_kwargs={"dashboard_address": ":0"})
        return cls(Client(cluster), cluster, what=f"a local Dask cluster of {workers} worker"
                   + ("s" if workers > 1 else "") + ("" if processes else " threads"))

    def describe(self) -> str:
        return self.what

    def map_chunks(self, run, groups, ranks: int, spills: chunked.Spills) -> list[chunked.ChunkOut]:
        """Every chunk's ChunkOut, in chunk order; their what-if inputs registered in spills."""
        n = len(groups)
        futures = self.client.map(chunk_task, [str(run.path)] * n, [run.version_id] * n, list(range(n)),
                                  [list(map(int, g)) for g in groups], [ranks] * n,
                                  [str(spills.what_if.directory)] * n, [str(spills.durations.directory)] * n,
                                  pure=False)
        outs = self.client.gather(futures)
        for o in outs:
            if o.what_if is not None:
                spills.what_if.adopt(o.what_if, o.what_if_sha256, o.what_if_bytes)
        return sorted(outs, key=lambda o: o.index)

    def map(self, fn, items, **shared) -> list:
        """fn(item, **shared) for each item on the workers, in order (chunked.LocalMap's contract):
        what the run's results need of every chunk after the pass (the what-if inputs' recorded
        lengths, the balancing what-if), read by the workers from the spills. The shared
        arguments go to the workers once (scattered), not once a chunk."""
        if not items:
            return []
        futures = {k: self.client.scatter(v, broadcast=True) for k, v in shared.items()}
        got = self.client.gather(self.client.map(_keeping(fn), list(items), pure=False, **futures))
        for f in futures.values():
            f.release()
        return got

    def close(self) -> None:
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()

    def __enter__(self) -> "DaskEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
