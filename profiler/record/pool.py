"""The profile buffers of a recording session (Session's buffer seam): a standalone buffer per
launch (`buffer()`), or a slot of a pool slab per launch (`launch_slot`: slabs of one launch
geometry, zeroed and header-stamped once, so a profiled call only takes an address), moved to host
memory by `collect` and listed in launch order for the decoder. `SessionBuffers` is a part of
profiler.record.session.Session; how many slots a slab gets is the session's (POOL_SLOTS there).
"""
from __future__ import annotations

import functools
import types

import numpy as np

from ..decode.decode import LaunchInfo
from ..generated import layout as L


# The PyTorch profiler range around the making of a pool slab (SessionBuffers._make_slab).
SLAB_RANGE = "epscope: profile buffers"


class SessionError(RuntimeError):
    """Misuse of a Session (unknown family, buffer after save, ...); the message says what."""


@functools.lru_cache(maxsize=None)
def registry_module(family: str):
    """The registry of `family` as the generated tables carry it: REGISTRY (canonical JSON) and
    REGISTRY_HASH (what every buffer header holds), read from the family's TOML wherever it
    lives (profiler.registry.registry's search path), so the recorder names no kernel family."""
    from ..registry.registry import RegistryError, Registry, find_registry

    try:
        reg = Registry.load(find_registry(family))
    except RegistryError as e:
        raise SessionError(f"unknown kernel family {family!r}: {e}") from None
    return types.SimpleNamespace(FAMILY=reg.family, REGISTRY=reg.to_json(), REGISTRY_HASH=reg.hash)


def buffer_bytes(num_regions: int, capacity: int) -> int:
    """Same expression as epscope::buffer_bytes in recorder.cuh, from the generated sizes: format 3's
    8-byte record slots, half the bytes of format 2 for the same capacity."""
    return L.BUFFERHEADER_SIZE + num_regions * (L.REGIONHEADER_SIZE + capacity * L.RECORD8_SIZE)


def region_capacity(requested: int) -> int:
    """The slots a region gets for `requested` records: format 3's region is a 64-byte
    RegionHeader then 8-byte slots, and the header is a 16-byte aligned struct whose paired 8-byte
    fields the compiler stores as one 16-byte STG (init's gt_start/clk_start), so the region stride
    64 + 8 * capacity must be a multiple of 16: an odd request gets one slot more. (ep_core's
    bound (R + 4) * units + 32 is odd at one rank: the first format-3 GPU run faulted with a
    misaligned address at 1024 tokens, benchmarks/NOTES.md issue 33.)"""
    requested = int(requested)
    return requested + (requested & 1)


def make_header(*, registry_hash: int, num_regions: int, capacity: int, rank: int, launch_id: int,
                warps_per_block: int, hires: bool) -> np.ndarray:
    """The BufferHeader as bytes (uint8[64]), from the generated dtype only."""
    if capacity % 2:
        raise SessionError(f"region capacity {capacity} is odd: its regions' 16-byte headers would sit 8 bytes off "
                           "(region_capacity rounds a request up)")
    h = np.zeros(1, L.BUFFERHEADER_DTYPE)
    h["magic"], h["version"] = L.MAGIC, L.VERSION
    h["flags"] = L.FLAGS_HIRES  # formats 2-3: every record is clock64 cycles, whatever `hires` asks
    h["registry_hash"], h["num_regions"], h["region_capacity"] = registry_hash, num_regions, capacity
    h["rank"], h["launch_id"], h["warps_per_block"] = rank, launch_id, warps_per_block
    return h.view(np.uint8)


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


class SessionBuffers:
    """Profile buffers and pool slots of a Session (see the module docstring)."""

    def buffer(self, kernel: str, family: str, grid: int, warps_per_block: int, iteration: int,
               capacity: int | None = None):
        """A zeroed uint8 device tensor with its header filled, for one launch of `kernel`."""
        import torch

        if self._saved:
            raise SessionError("buffer() after save()")
        if grid <= 0 or warps_per_block <= 0:
            raise SessionError(f"{kernel}: grid ({grid}) and warps_per_block ({warps_per_block}) must be positive")
        reg = registry_module(family)
        cap = region_capacity(capacity or self.capacity)
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

    def _new_pool(self, key) -> _Pool:
        kernel, family, grid, warps, capacity = key
        if self._saved:
            raise SessionError("launch_slot() after save()")
        if grid <= 0 or warps <= 0:
            raise SessionError(f"{kernel}: grid ({grid}) and warps_per_block ({warps}) must be positive")
        reg = registry_module(family)
        pool = _Pool(kernel, family, int(grid), int(warps), region_capacity(capacity or self.capacity),
                     reg.REGISTRY_HASH)
        self._pools[key] = pool
        self._families.add(family)
        return pool

    def _make_slab(self, pool: _Pool, slots: int) -> _Slab:
        """A new slab of `slots` slots (capped at a quarter of max_device_bytes) for `pool`, under
        a PyTorch profiler range named SLAB_RANGE: inside a profiled call, the host time it takes
        is then blamed on the recorder by name, not on "Python code outside any op"."""
        import torch

        with torch.profiler.record_function(SLAB_RANGE):
            return self._make_slab_now(pool, slots)

    def _make_slab_now(self, pool: _Pool, slots: int) -> _Slab:
        import torch

        if self._saved:
            raise SessionError("launch_slot() after save()")
        cuda = self.device.type == "cuda"
        if cuda and torch.cuda.is_current_stream_capturing():
            raise SessionError(f"{pool.kernel}: the profile pool needs a new slab inside a CUDA graph capture; "
                               f"run one profiled call of the same op before capturing")
        count = max(1, min(slots, (self.max_device_bytes // 4) // pool.slot_bytes))
        self._make_room(count * pool.slot_bytes)
        dev = torch.zeros(count * pool.slot_bytes, dtype=torch.uint8, device=self.device)
        first = len(self._order)
        hdr = np.tile(make_header(registry_hash=pool.registry_hash, num_regions=pool.grid * pool.warps,
                                  capacity=pool.capacity, rank=self.rank, launch_id=first,
                                  warps_per_block=pool.warps, hires=self.hires), (count, 1))
        # provisional launch ids (the host's LaunchInfo is authoritative, profiler.decode.decode)
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
