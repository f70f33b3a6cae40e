"""The recording session: one per process (rank); hands out profile buffers, notes host spans and
clock pairs, and on `save()` gathers everything on rank 0 and writes a run directory.

    with Session("traces", name="ep-2rank-balanced", description="...", rank=r, world_size=2,
                 group=pg, workload={"kind": "ep", ...}, config={...}) as s:
        s.sync_clocks(my_slots, peer_slots, when="start")   # or add_clock_samples(...)
        for it in range(iters):
            with s.host_span("dispatch", it):
                buf = s.buffer("dispatch", "ep_intranode", grid, warps, it)
                kernel(..., buf.data_ptr())
        s.sync_clocks(my_slots, peer_slots, when="end")
    # __exit__ saves: status "ok", or "error" with the exception's message (partial trace)

The run directory is `out_dir / name` (profiler.runstore layout). Raw device buffers are never
written there; they are decoded (profiler.decode) against the clock model fitted from the
session's samples (profiler.align). The GPU machine has no perfetto package, so the trace file is
made later on a CPU machine with `epscope export RUN` (write_run's perfetto=None does that
automatically where perfetto imports).

torch is the only heavy import (no dash / plotly / perfetto): this runs on the recording path.
"""
from __future__ import annotations

import contextlib
from array import array
import datetime as _dt
import functools
import gzip
import os
import pickle
import socket
import subprocess
import time
import types
import warnings as _warnings
from pathlib import Path

import numpy as np

from .. import errors as E
from ..align import ClockModel, ClockSample, clock_manifest, fit_host_clock, fit_rank_clock
from ..calibration import default_calibration
from ..decode import LaunchInfo, concat_events, decode_launches
from ..generated import layout as L
from ..runstore import write_run
from ..schema import coerce_events

REPO_ROOT = Path(__file__).resolve().parents[2]

# Move finished buffers to host memory once the device holds more than this many bytes of them
# (a 64-block x 24-warp launch at capacity 4096 is 100 MB; see docs/design.md, "Memory").
DEFAULT_MAX_DEVICE_BYTES = 1 << 30
# Launch slots per pool slab (launch_slot) when nothing was reserved: one zero fill and one header
# copy serve this many profiled launches of one geometry. A slab never takes more than a quarter of
# max_device_bytes. A caller that knows how many calls it will profile reserves them
# (`Session.reserve`, `Buffer.profile(session, launches=N)`): then the slab of each geometry is
# made once, at the first launch of that geometry or at the reserve, and no later profiled call
# allocates, fills or copies (bench_ep at b28d6ee: a new slab inside the timed calls cost a
# cudaMalloc of ~280 µs once in 30 calls and two aten::copy_ per slab).
POOL_SLOTS = 32


class SessionError(RuntimeError):
    """Misuse of a Session (unknown family, buffer after save, ...); the message says what."""


@functools.lru_cache(maxsize=None)
def registry_module(family: str):
    """The registry of `family` as the generated tables carry it: REGISTRY (canonical JSON) and
    REGISTRY_HASH (what every buffer header holds), read from the family's TOML wherever it
    lives (profiler.registry's search path), so the recorder names no kernel family."""
    from ..registry import RegistryError, Registry, find_registry

    try:
        reg = Registry.load(find_registry(family))
    except RegistryError as e:
        raise SessionError(f"unknown kernel family {family!r}: {e}") from None
    return types.SimpleNamespace(FAMILY=reg.family, REGISTRY=reg.to_json(), REGISTRY_HASH=reg.hash)


def buffer_bytes(num_regions: int, capacity: int) -> int:
    """Same expression as epscope::buffer_bytes in recorder.cuh, from the generated sizes."""
    return L.BUFFERHEADER_SIZE + num_regions * (L.REGIONHEADER_SIZE + capacity * L.RECORD_SIZE)


def make_header(*, registry_hash: int, num_regions: int, capacity: int, rank: int, launch_id: int,
                warps_per_block: int, hires: bool) -> np.ndarray:
    """The BufferHeader as bytes (uint8[64]), from the generated dtype only."""
    h = np.zeros(1, L.BUFFERHEADER_DTYPE)
    h["magic"], h["version"] = L.MAGIC, L.VERSION
    h["flags"] = L.FLAGS_HIRES  # format 2: every record is clock64 cycles, whatever `hires` asks
    h["registry_hash"], h["num_regions"], h["region_capacity"] = registry_hash, num_regions, capacity
    h["rank"], h["launch_id"], h["warps_per_block"] = rank, launch_id, warps_per_block
    return h.view(np.uint8)


def git_info(root: Path = REPO_ROOT) -> dict:
    """Branch, commit and dirty flag of the checkout; EPSCOPE_GIT_{BRANCH,COMMIT,DIRTY} override
    (the GPU machine receives a copy of the working tree without .git), 'unknown' otherwise."""
    env = {k: os.environ.get(f"EPSCOPE_GIT_{k.upper()}") for k in ("branch", "commit", "dirty")}
    if env["commit"]:
        return {"branch": env["branch"] or "unknown", "commit": env["commit"],
                "dirty": (env["dirty"] or "").lower() in ("1", "true", "yes")}

    def git(*args):
        r = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
        if r.returncode != 0:
            raise RuntimeError(r.stderr.strip())
        return r.stdout.strip()

    try:
        return {"branch": git("rev-parse", "--abbrev-ref", "HEAD"), "commit": git("rev-parse", "HEAD"),
                "dirty": bool(git("status", "--porcelain", "--untracked-files=no"))}
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return {"branch": "unknown", "commit": "unknown", "dirty": False}


def gpu_info() -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"name": "none", "count": 0, "driver": "none"}
    driver = "unknown"
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0 and r.stdout.strip():
            driver = r.stdout.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    return {"name": torch.cuda.get_device_name(), "count": torch.cuda.device_count(), "driver": driver,
            "cuda": torch.version.cuda, "torch": torch.__version__}


class _Launch:
    """A launch given a standalone buffer (`buffer()`); pool launches live in their slab's arrays."""

    __slots__ = ("kernel", "family", "iteration", "device", "host", "host_begin", "host_end")

    def __init__(self, kernel: str, family: str, iteration: int, device, host_begin: int = -1):
        self.kernel, self.family, self.iteration = kernel, family, int(iteration)
        self.device, self.host = device, None          # torch tensor while on the GPU, numpy after collect
        self.host_begin, self.host_end = host_begin, -1


class _Pool:
    """Profile buffers of one launch geometry, handed out as slots of slabs (POOL_SLOTS each)."""

    __slots__ = ("kernel", "family", "grid", "warps", "capacity", "slot_bytes", "registry_hash", "slab")

    def __init__(self, kernel, family, grid, warps, capacity, registry_hash):
        self.kernel, self.family, self.grid, self.warps, self.capacity = kernel, family, grid, warps, capacity
        self.slot_bytes = buffer_bytes(grid * warps, capacity)
        self.registry_hash = registry_hash
        self.slab = None


class _Slab:
    """One device allocation of `count` zeroed, header-stamped slots, `used` of them handed out.
    The iteration of each slot's launch sits in an int64 array: a profiled call allocates no
    Python object that outlives it (a run of thousands of calls would otherwise grow the heap the
    garbage collector walks, a pause every few thousand calls)."""

    __slots__ = ("pool", "device", "base", "count", "used", "iteration", "host", "code")

    def __init__(self, pool: _Pool, device, count: int, code: int):
        self.pool, self.device, self.count = pool, device, count
        self.base = int(device.data_ptr())
        self.used = 0
        self.iteration = np.full(count, -1, np.int64)
        self.host = None
        self.code = code               # slab number << _SLAB_SHIFT: the launch-order code of slot 0

    @property
    def nbytes(self) -> int:
        return self.count * self.pool.slot_bytes if self.device is not None else 0


# Launch order codes (Session._order, an array of int64): slab number << _SLAB_SHIFT | slot for a
# pool launch, -1 - k for the k-th standalone launch.
_SLAB_SHIFT = 24


class Session:
    """One recording session per process/rank (see the module docstring)."""

    def __init__(self, out_dir, *, name: str, description: str, rank: int = 0, world_size: int = 1, group=None,
                 capacity: int = 4096, hires: bool = False, workload: dict | None = None, config: dict | None = None,
                 device=None, host_pairs: int = 64, max_device_bytes: int = DEFAULT_MAX_DEVICE_BYTES,
                 raw_dir=None, overwrite: bool = False):
        import torch

        if not name or "/" in name or name.startswith("."):
            raise SessionError(f"run name {name!r} must be a plain directory name")
        if not (0 <= rank < world_size):
            raise SessionError(f"rank {rank} outside world_size {world_size}")
        if capacity <= 0:
            raise SessionError(f"capacity must be positive, got {capacity}")
        self.out_dir = Path(out_dir)
        self.name, self.description = name, description
        self.rank, self.world_size, self.group = rank, world_size, group
        self.capacity, self.hires = int(capacity), bool(hires)
        self.workload = dict(workload or {"kind": "unknown"})
        self.config = dict(config or {})
        self.device = torch.device(device) if device is not None else (
            torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
        self.n_host_pairs = int(host_pairs)
        self.max_device_bytes = int(max_device_bytes)
        self.created = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        self.start_host_ns = time.perf_counter_ns()
        self._launches: list[_Launch] = []            # standalone launches (buffer())
        self._order = array("q")                        # every launch, in launch-id order (codes above)
        self._pools: dict[tuple, _Pool] = {}
        self._slabs: list[_Slab] = []                   # every slab ever made (device memory freed by collect)
        self._reserved = 0                              # launches per geometry announced by reserve()
        self._calls = array("q")                        # host_call: (first launch, end launch, begin, end) ...
        self._families: set[str] = set()
        self._clock: dict[int, dict[str, list[np.ndarray]]] = {}
        self._host_pairs: list[tuple[int, int, int]] = []
        self._host_spans: list[tuple[str, int, int, int]] = []   # (name, iteration, begin, end)
        self._open_spans: list[list] = []
        self._notes: list[dict] = []
        self._clock_seq = 0
        self._saved = False
        # Measured numbers a driver wants in the manifest's headline (e.g. the timer step).
        self.headline_extra: dict = {}
        # When set, rank 0 also keeps the gathered raw buffers as <raw_dir>/<name>.rawbuf (pickle;
        # *.rawbuf is git-ignored) so a run can be re-decoded with write_from_raw().
        self.raw_dir = Path(raw_dir) if raw_dir is not None else None
        # An existing run of this name is replaced only when asked; otherwise the run is written
        # as <name>-2, ... (profiler.runstore.write_run). `path` is where it went (rank 0, saved).
        self.overwrite = bool(overwrite)
        self.path: Path | None = None

    # -- context manager ------------------------------------------------------------------------
    def __enter__(self) -> "Session":
        if self.n_host_pairs and self.device.type == "cuda":
            self.pair_host_clock()
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if not self._saved:
            if exc is None:
                self.save()
            else:
                from .clocks import ClockSyncTimeout

                status = "timeout" if isinstance(exc, (TimeoutError, ClockSyncTimeout)) else "error"
                try:
                    self.save(status=status, error=f"{type(exc).__name__}: {exc}")
                except Exception as e:  # the original exception matters more; say why no trace
                    _warnings.warn(f"epscope: could not save the partial run: {e}")
        return False

    # -- buffers -------------------------------------------------------------------------------
    def buffer(self, kernel: str, family: str, grid: int, warps_per_block: int, iteration: int,
               capacity: int | None = None):
        """A zeroed uint8 device tensor with its header filled, for one launch of `kernel`."""
        import torch

        if self._saved:
            raise SessionError("buffer() after save()")
        if grid <= 0 or warps_per_block <= 0:
            raise SessionError(f"{kernel}: grid ({grid}) and warps_per_block ({warps_per_block}) must be positive")
        reg = registry_module(family)
        cap = int(capacity or self.capacity)
        regions = grid * warps_per_block
        self._make_room(buffer_bytes(regions, cap))
        launch_id = len(self._order)
        hdr = make_header(registry_hash=reg.REGISTRY_HASH, num_regions=regions, capacity=cap, rank=self.rank,
                          launch_id=launch_id, warps_per_block=warps_per_block, hires=self.hires)
        buf = torch.zeros(buffer_bytes(regions, cap), dtype=torch.uint8, device=self.device)
        src = torch.from_numpy(hdr.copy())
        if buf.is_cuda:
            # A copy from pageable memory blocks the host until the stream drains; a pinned
            # source keeps profiled calls asynchronous (torch's caching host allocator keeps the
            # block alive until the copy has run).
            src = src.pin_memory()
        buf[: hdr.size].copy_(src, non_blocking=buf.is_cuda)
        span = self._open_spans[-1] if self._open_spans else None
        self._order.append(-1 - len(self._launches))
        self._launches.append(_Launch(kernel, family, iteration, device=buf, host_begin=span[2] if span else -1))
        if span is not None:
            span[4].append(launch_id)
        self._families.add(family)
        return buf

    def launch_slot(self, kernel: str, family: str, grid: int, warps_per_block: int, iteration: int,
                    capacity: int | None = None) -> int:
        """Device address of a profile buffer for one launch of `kernel`: a slot of a pool that
        holds the buffers of this launch geometry. The slots of a slab are zeroed and their
        headers stamped when the slab is made (one fill and one copy, both asynchronous, per
        slab of POOL_SLOTS launches, or of the launches reserved with `reserve`), so a profiled
        call only takes an address: no allocation, no copy, no synchronisation, except the call
        that needs a new slab. Inside a CUDA graph capture the slot is part of the graph's
        arguments (every replay rewrites it; the last replay's records are saved); a capture
        that needs a new slab raises, so take one profiled call of the same op before capturing.
        Record the host time of the call with `host_call`."""
        key = (kernel, family, grid, warps_per_block, capacity)
        pool = self._pools.get(key)
        if pool is None:
            pool = self._new_pool(key)
        return self.pool_slot(pool, iteration)

    def pool(self, kernel: str, family: str, grid: int, warps_per_block: int, capacity: int | None = None):
        """The pool of one launch geometry (made on first use, no device memory yet): a caller
        that launches the same geometry many times keeps it and takes slots with `pool_slot`,
        skipping launch_slot's lookup."""
        key = (kernel, family, grid, warps_per_block, capacity)
        pool = self._pools.get(key)
        return pool if pool is not None else self._new_pool(key)

    def pool_slot(self, pool: "_Pool", iteration: int) -> int:
        """launch_slot for a pool from `pool()`."""
        slab = pool.slab
        if slab is None or slab.used == slab.count:
            slab = self._new_slab(pool, self._reserved)
        i = slab.used
        slab.used = i + 1
        slab.iteration[i] = iteration
        if self._open_spans:
            self._open_spans[-1][4].append(len(self._order))
        self._order.append(slab.code + i)
        return slab.base + i * pool.slot_bytes

    def reserve(self, launches: int) -> None:
        """Announce `launches` more profiled launches of each geometry: every pool that has
        fewer free slots than that gets its next slab now (allocated, zeroed and stamped here,
        outside the profiled calls), and a geometry first launched later gets a slab of that
        many slots at its first launch. Slabs stay capped at a quarter of max_device_bytes
        (more launches than fit take further slabs, as without a reserve). Not inside a CUDA
        graph capture."""
        launches = int(launches)
        if launches < 0:
            raise SessionError(f"reserve: launches must be >= 0, got {launches}")
        if self._saved:
            raise SessionError("reserve() after save()")
        self._reserved = launches
        for pool in self._pools.values():
            slab = pool.slab
            free = 0 if slab is None else slab.count - slab.used
            if launches > free:
                self._new_slab(pool, launches)

    def host_call(self, name: str, iteration: int, begin_ns: int, end_ns: int, first_launch: int) -> None:
        """The host's enqueue of one call (perf_counter_ns), whose launches are those taken since
        `first_launch` (= `num_launches` before the call); a call without launches is kept as a
        host row, like `host_span`."""
        n = len(self._order)
        if first_launch >= n:
            self._host_spans.append((name, int(iteration), begin_ns, end_ns))
        else:
            self._calls.extend((first_launch, n, begin_ns, end_ns))

    @property
    def num_launches(self) -> int:
        return len(self._order)

    def _new_pool(self, key) -> _Pool:
        kernel, family, grid, warps, capacity = key
        if self._saved:
            raise SessionError("launch_slot() after save()")
        if grid <= 0 or warps <= 0:
            raise SessionError(f"{kernel}: grid ({grid}) and warps_per_block ({warps}) must be positive")
        reg = registry_module(family)
        pool = _Pool(kernel, family, int(grid), int(warps), int(capacity or self.capacity), reg.REGISTRY_HASH)
        self._pools[key] = pool
        self._families.add(family)
        return pool

    def _new_slab(self, pool: _Pool, want: int = 0) -> _Slab:
        import torch

        if self._saved:
            raise SessionError("launch_slot() after save()")
        cuda = self.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            raise SessionError(f"{pool.kernel}: the profile pool needs a new slab inside a CUDA graph capture; "
                               f"run one profiled call of the same op before capturing")
        count = max(1, min(max(POOL_SLOTS, want), (self.max_device_bytes // 4) // pool.slot_bytes))
        self._make_room(count * pool.slot_bytes)
        dev = torch.zeros(count * pool.slot_bytes, dtype=torch.uint8, device=self.device)
        first = len(self._order)
        hdr = np.tile(make_header(registry_hash=pool.registry_hash, num_regions=pool.grid * pool.warps,
                                  capacity=pool.capacity, rank=self.rank, launch_id=first,
                                  warps_per_block=pool.warps, hires=self.hires), (count, 1))
        # provisional launch ids (the host's LaunchInfo is authoritative, profiler.decode)
        hdr.view(L.BUFFERHEADER_DTYPE).reshape(count)["launch_id"] = first + np.arange(count)
        src = torch.from_numpy(hdr)
        if cuda:
            src = src.pin_memory()  # asynchronous copy; torch keeps the pinned block until it ran
        dev.view(count, pool.slot_bytes)[:, : L.BUFFERHEADER_SIZE].copy_(src, non_blocking=cuda)
        if len(self._slabs) >= 1 << (63 - _SLAB_SHIFT) or count > 1 << _SLAB_SHIFT:
            raise SessionError("too many profile pool slabs in one session")
        slab = _Slab(pool, dev, count, len(self._slabs) << _SLAB_SHIFT)
        self._slabs.append(slab)
        pool.slab = slab
        return slab

    def _device_bytes(self) -> int:
        return (sum(int(l.device.numel()) for l in self._launches if l.device is not None)
                + sum(s.nbytes for s in self._slabs))

    def _make_room(self, need: int) -> None:
        if self._device_bytes() + need > self.max_device_bytes:
            self.collect()

    def collect(self) -> None:
        """Copy every buffer handed out so far to host memory and free its device memory
        (synchronises the device: call it outside timed regions). Pool slabs are copied whole,
        one copy per slab; later launch_slot calls start new slabs."""
        import torch

        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        for slab in self._slabs:
            if slab.device is not None:
                slab.host = slab.device.cpu().numpy()
                slab.device = None
        for pool in self._pools.values():
            pool.slab = None
        for l in self._launches:
            if l.device is not None:
                l.host = l.device.cpu().numpy()
                l.device = None

    def _launch_list(self) -> list[tuple[LaunchInfo, np.ndarray]]:
        """(LaunchInfo, raw buffer) of every launch in launch-id order, host times applied."""
        n = len(self._order)
        hb = np.full(n, -1, np.int64)
        he = np.full(n, -1, np.int64)
        calls = np.frombuffer(self._calls, dtype=np.int64).reshape(-1, 4) if len(self._calls) else ()
        for first, end, b, e in calls:
            hb[first:end], he[first:end] = b, e
        out = []
        for lid, code in enumerate(self._order):
            if code < 0:
                l = self._launches[-1 - code]
                b, e = (l.host_begin, l.host_end) if hb[lid] < 0 else (int(hb[lid]), int(he[lid]))
                out.append((LaunchInfo(self.rank, lid, l.kernel, l.iteration, l.family, b, e), l.host))
            else:
                slab, i = self._slabs[code >> _SLAB_SHIFT], code & ((1 << _SLAB_SHIFT) - 1)
                pool, size = slab.pool, slab.pool.slot_bytes
                out.append((LaunchInfo(self.rank, lid, pool.kernel, int(slab.iteration[i]), pool.family,
                                       int(hb[lid]), int(he[lid])), slab.host[i * size: (i + 1) * size]))
        return out

    # -- host side -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def host_span(self, name: str, iteration: int = -1):
        """perf_counter_ns around the host's enqueue of one call; buffers taken inside it get
        these host times (their launch's host row), and the span itself is kept as a host row."""
        rec = [name, int(iteration), time.perf_counter_ns(), -1, []]
        self._open_spans.append(rec)
        try:
            yield
        finally:
            rec[3] = time.perf_counter_ns()
            self._open_spans.remove(rec)
            for lid in rec[4]:
                code = self._order[lid]
                if code < 0:
                    l = self._launches[-1 - code]
                    l.host_begin, l.host_end = rec[2], rec[3]
                else:  # a pool launch inside a host_span: recorded like a host_call of its own
                    self._calls.extend((lid, lid + 1, rec[2], rec[3]))
            if not rec[4]:
                self._host_spans.append((name, rec[1], rec[2], rec[3]))

    # -- clocks --------------------------------------------------------------------------------
    def add_clock_samples(self, peer_rank: int, samples, when: str) -> None:
        """NTP samples (t0, t1, t2, t3) against `peer_rank`, taken on rank 0; when: start | end."""
        if when not in ("start", "end"):
            raise SessionError(f"when must be 'start' or 'end', got {when!r}")
        a = np.asarray(samples, dtype=np.int64).reshape(-1, 4)
        self._clock.setdefault(int(peer_rank), {"start": [], "end": []})[when].append(a)

    def add_host_pairs(self, pairs) -> None:
        """(host_before_ns, gpu_globaltimer_ns, host_after_ns) triples of this rank's GPU."""
        self._host_pairs += [tuple(int(x) for x in p) for p in np.asarray(pairs, dtype=np.int64).reshape(-1, 3)]

    def pair_host_clock(self, n: int | None = None) -> None:
        from .clocks import host_gpu_pairs

        self.add_host_pairs(host_gpu_pairs(n or self.n_host_pairs))

    def sync_clocks(self, my_slots: int, peer_slots: dict[int, int] | int, when: str, n: int = 32,
                    timeout_ns: int = 5_000_000_000) -> None:
        """Ping-pong with every rank (rank 0) or with rank 0 (rank k) through mapped ClockSlots
        areas (pointers as integers; peer_slots maps rank -> that rank's area mapped here).
        Every rank must call it, with the same n, in the same order."""
        from .clocks import ping_pong

        base = self._clock_seq
        self._clock_seq += n * self.world_size
        out = ping_pong(self.rank, self.world_size, my_slots, peer_slots, n=n, seq_base=base, timeout_ns=timeout_ns)
        if self.rank == 0:
            for peer, s in out.items():
                self.add_clock_samples(peer, s, when)

    def note(self, type_: str, detail: str, count: int = 1) -> None:
        """A warning for the manifest (e.g. a kernel's own timeout flag)."""
        self._notes.append({"type": type_, "count": int(count), "detail": detail})

    # -- save ----------------------------------------------------------------------------------
    def _payload(self, status: str, error: str | None) -> dict:
        if status == "ok" and self.n_host_pairs and self.device.type == "cuda":
            # a second set of host pairs at the end gives fit_host_clock its slope over the run
            try:
                self.pair_host_clock()
            except Exception as e:  # a trace without end pairs is still a trace; say so
                self.note("ClockFallback", f"rank {self.rank}: end-of-run host pairing failed: {e}")
        self.collect()
        if self._host_spans and not self._host_pairs:
            self.note("ClockFallback", f"rank {self.rank}: {len(self._host_spans)} host spans without host clock "
                                       "pairs are not placed on the timeline", len(self._host_spans))
        return {
            "rank": self.rank, "status": status, "error": error,
            "launches": self._launch_list(),
            "clock": {k: {w: [a for a in v] for w, v in d.items()} for k, d in self._clock.items()},
            "host_pairs": list(self._host_pairs), "host_spans": list(self._host_spans),
            "families": sorted(self._families), "notes": list(self._notes),
            "start_host_ns": self.start_host_ns,
        }

    def save(self, *, status: str = "ok", error: str | None = None) -> Path | None:
        """Gather on rank 0 and write the run directory; returns its path on rank 0, else None."""
        if self._saved:
            raise SessionError("save() called twice")
        self._saved = True
        payload = self._payload(status, error)
        if self.world_size > 1:
            import torch.distributed as dist

            gathered = [None] * self.world_size if self.rank == 0 else None
            dist.gather_object(payload, gathered, dst=0, group=self.group)
            if self.rank != 0:
                return None
        else:
            gathered = [payload]
        if self.raw_dir is not None:
            self.raw_dir.mkdir(parents=True, exist_ok=True)
            with gzip.open(self.raw_dir / f"{self.name}.rawbuf", "wb", compresslevel=3) as f:
                pickle.dump({"session": self._meta(), "payloads": gathered, "status": status, "error": error}, f)
        return self._write(gathered, status, error)

    def _meta(self) -> dict:
        return {"out_dir": str(self.out_dir), "name": self.name, "description": self.description,
                "world_size": self.world_size, "capacity": self.capacity, "hires": self.hires,
                "workload": self.workload, "config": self.config, "created": self.created,
                "headline_extra": self.headline_extra}

    def _write(self, payloads: list[dict], status: str, error: str | None) -> Path:
        notes = [n for p in payloads for n in p["notes"]]
        errors = [f"rank {p['rank']}: {p['error']}" for p in payloads if p["error"]]
        statuses = [p["status"] for p in payloads]
        status = next((s for s in statuses if s != "ok"), status)
        model, clock_notes = build_clock_model(payloads, self.world_size)
        model = model.calibrated(default_calibration())   # this GPU's `epscope calibrate`, when it ran
        notes += clock_notes
        items = [(host, info) for p in payloads for info, host in p["launches"]]
        families = sorted({f for p in payloads for f in p["families"]})
        registries = {f: registry_module(f).REGISTRY for f in families}
        with _warnings.catch_warnings():
            _warnings.simplefilter("ignore")  # the decoder's warnings come back in .warnings too
            decoded = decode_launches(items, registries, model)
        events = concat_events([decoded.events, host_span_rows(payloads, model)])
        launches = decoded.launches
        gpu = gpu_info()
        gpu["count_used"] = self.world_size
        manifest = {
            "name": self.name, "description": self.description, "created": self.created,
            "status": status, "error": "; ".join(errors) if errors else error,
            "git": git_info(), "host": socket.gethostname(),
            "workload": self.workload, "config": {**self.config, "capacity": self.capacity, "hires": self.hires},
            "gpu": gpu, "world_size": self.world_size,
            "clock": clock_manifest(model) | {"host_pairs": sum(len(p["host_pairs"]) for p in payloads),
                                              "gpu_time": decoded.conversion,
                                              "sync_samples": {str(k): {w: int(sum(len(a) for a in v)) for w, v in d.items()}
                                                               for k, d in payloads[0]["clock"].items()}},
            "registry": registries,
            "warnings": [w.to_json() for w in decoded.warnings] + notes,
            "headline": headline(launches) | self.headline_extra,
        }
        self.path = write_run(self.out_dir / self.name, events, launches, manifest, perfetto=None,
                              overwrite=self.overwrite)
        return self.path


def write_from_raw(raw_path, out_dir=None, overwrite: bool = False) -> Path:
    """Re-decode a run kept with Session(raw_dir=...) and write its run directory (on any machine;
    no GPU needed). out_dir defaults to the session's."""
    with gzip.open(raw_path, "rb") as f:
        d = pickle.load(f)
    m = d["session"]
    s = Session.__new__(Session)
    s.out_dir = Path(out_dir) if out_dir is not None else Path(m["out_dir"])
    s.name, s.description, s.world_size = m["name"], m["description"], m["world_size"]
    s.capacity, s.hires, s.workload, s.config = m["capacity"], m["hires"], m["workload"], m["config"]
    s.created, s.headline_extra = m["created"], m.get("headline_extra", {})
    s.overwrite, s.path = overwrite, None
    return s._write(d["payloads"], d["status"], d["error"])


def build_clock_model(payloads: list[dict], world_size: int) -> tuple[ClockModel, list[dict]]:
    """Rank clocks from rank 0's ping-pong samples, the host clock from rank 0's pairs (all ranks
    of one host share perf_counter_ns), t0 = the earliest of session start and any GPU start."""
    notes = []
    p0 = next(p for p in payloads if p["rank"] == 0)
    ranks = {0: fit_rank_clock(0, [], [])}
    for r in range(1, world_size):
        d = p0["clock"].get(r, {"start": [], "end": []})
        win = {w: [ClockSample(*map(int, row)) for a in d.get(w, []) for row in a if row[0] >= 0 and row[3] > 0]
               for w in ("start", "end")}
        if not win["start"] and not win["end"]:
            from ..align import RankClock

            ranks[r] = RankClock(r, 0.0, 0.0, float("inf"))
            notes.append(E.ClockFallback(1, f"rank {r}: no clock-sync samples; its globaltimer is taken as "
                                            "rank 0's (uncertainty unknown)").to_json())
        else:
            ranks[r] = fit_rank_clock(r, win["start"], win["end"])
    host = None
    pairs = [p for pl in payloads if pl["rank"] == 0 for p in pl["host_pairs"]]
    if pairs:
        host = fit_host_clock(pairs, rank=0)
    starts = []
    for pl in payloads:
        for info, buf in pl["launches"]:
            g = first_gpu_start(buf)
            if g is not None:
                starts.append(int(ranks[info.rank].to_ref(np.array([g]))[0]))
    if host is not None:
        starts.append(int(host.to_gpu(np.array([p0["start_host_ns"]]))[0]))
    t0 = min(starts) if starts else 0
    return ClockModel(ranks, t0, host), notes


def first_gpu_start(buf) -> int | None:
    """Earliest gt_start of the started regions of a raw buffer (None if none or unreadable)."""
    a = np.asarray(buf).view(np.uint8)
    if a.size < L.BUFFERHEADER_SIZE:
        return None
    h = a[: L.BUFFERHEADER_SIZE].view(L.BUFFERHEADER_DTYPE)[0]
    if int(h["magic"]) != L.MAGIC:
        return None
    n, cap = int(h["num_regions"]), int(h["region_capacity"])
    stride = L.REGIONHEADER_SIZE + cap * L.RECORD_SIZE
    if n == 0 or a.size < L.BUFFERHEADER_SIZE + n * stride:
        return None
    regs = a[L.BUFFERHEADER_SIZE: L.BUFFERHEADER_SIZE + n * stride].reshape(n, stride)[:, : L.REGIONHEADER_SIZE]
    rh = np.ascontiguousarray(regs).view(L.REGIONHEADER_DTYPE).reshape(n)
    started = rh["gt_start"][rh["state"] != L.REGION_STATE_UNUSED]
    return int(started.min()) if started.size else None


def host_span_rows(payloads: list[dict], model: ClockModel):
    """kind='host' rows for host spans that took no profile buffer (launch = -1)."""
    rows = [(p["rank"], *s) for p in payloads for s in p["host_spans"]]
    if not rows or model.host is None:
        return coerce_events(_empty_host_frame())
    import pandas as pd

    rank, name, it, b, e = zip(*rows)
    begin = model.host_to_run_timeline(np.array(b, np.int64))
    end = model.host_to_run_timeline(np.array(e, np.int64))
    n = len(rows)
    return coerce_events(pd.DataFrame({
        "rank": rank, "launch": np.full(n, -1), "kernel": list(name), "iteration": it,
        "sm": np.full(n, -1), "block": np.full(n, -1), "warp": np.full(n, -1), "role": ["host"] * n,
        "kind": ["host"] * n, "phase": list(name), "begin_ns": begin, "end_ns": end,
        "payload": np.zeros(n, np.int64), "open": np.zeros(n, bool)}))


def _empty_host_frame():
    import pandas as pd

    from ..schema import COLUMNS

    return pd.DataFrame({c: pd.Series([], dtype="object") for c in COLUMNS})


def headline(launches) -> dict:
    """Median GPU time per kernel (first warp start to last warp finish), in microseconds."""
    if launches is None or not len(launches):
        return {}
    ok = launches[launches["gpu_begin_ns"] >= 0]
    dur = (ok["gpu_end_ns"] - ok["gpu_begin_ns"]) / 1e3
    med = dur.groupby(ok["kernel"].astype(str)).median()
    return {"median_kernel_us": {k: round(float(v), 3) for k, v in med.items()},
            "launches": int(len(launches)), "dropped": int(launches["dropped"].sum())}
