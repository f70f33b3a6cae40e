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

The run directory is `out_dir / name` (profiler.store.runstore layout). Raw device buffers are never
written there; they are decoded (profiler.decode.decode) against the clock model fitted from the
session's samples (profiler.decode.align). The GPU machine has no perfetto package, so the trace file is
made later on a CPU machine with `epscope export RUN -o RUN/trace.perfetto-trace` (write_run's perfetto=None does that
automatically where perfetto imports).

torch is the only heavy import (no dash / plotly / perfetto): this runs on the recording path.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import gzip
import os
import pickle
import time
import warnings as _warnings
from array import array
from pathlib import Path

import numpy as np

from .pool import (_SLAB_SHIFT, SessionBuffers, SessionError, _Launch, _Pool, _Slab, buffer_bytes,  # noqa: F401
                   make_header, registry_module)
from .session_clocks import SessionClocks, build_clock_model, first_gpu_start  # noqa: F401
from ..torchtrace.labels import launch_label
from .session_save import REPO_ROOT, SessionSave, git_info, gpu_info, headline, host_span_rows  # noqa: F401

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


class Session(SessionBuffers, SessionClocks, SessionSave):
    """One recording session per process/rank (see the module docstring). Its parts: profile
    buffers and pool slots (pool.py), clocks (session_clocks.py), gathering and writing the run
    (session_save.py); this file holds the state, the host spans and calls, and the slab size."""

    def __init__(self, out_dir, *, name: str, description: str, rank: int = 0, world_size: int = 1, group=None,
                 capacity: int = 4096, hires: bool = False, workload: dict | None = None, config: dict | None = None,
                 device=None, host_pairs: int = 64, max_device_bytes: int = DEFAULT_MAX_DEVICE_BYTES,
                 raw_dir=None, overwrite: bool = False, analyze: bool = True, torch_profiler: bool = False):
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
        # as <name>-2, ... (profiler.store.runstore.write_run). `path` is where it went (rank 0, saved).
        self.overwrite = bool(overwrite)
        # Saving computes the run's analyses and stores them in it (profiler.analysis.stored: the
        # viewer then opens it without analysing); analyze=False or EPSCOPE_NO_ANALYZE=1 skips it
        # (`epscope analyze RUN` does it later).
        self.analyze = bool(analyze) and os.environ.get("EPSCOPE_NO_ANALYZE", "") in ("", "0")
        self.path: Path | None = None
        # torch_profiler=True: the PyTorch profiler (CPU ops, Python stacks, CUDA kernels) runs from
        # the session's entry to its save; each rank's trace is stored in the run (torch/, checksummed
        # in the manifest) and joined to the launches by the labels ep_core writes (launch_label).
        self.torch_profiler = bool(torch_profiler)
        self._torch_prof = None

    # -- context manager ------------------------------------------------------------------------
    def __enter__(self) -> "Session":
        if self.n_host_pairs and self.device.type == "cuda":
            self.pair_host_clock()
        if self.torch_profiler:
            self.start_torch_profiler()
        return self

    def launch_label(self, first_launch: int) -> str:
        """The record_function name of a launcher call whose launches start at `first_launch`
        (profiler/torchtrace/labels.py; ep_core opens it while torch's profiler records)."""
        return launch_label(self.name, self.rank, first_launch)

    def start_torch_profiler(self) -> None:
        """Run torch.profiler (CPU + CUDA activities, Python stacks) until save()."""
        import torch

        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        self._torch_prof = torch.profiler.profile(activities=acts, with_stack=True, record_shapes=False)
        self._torch_prof.__enter__()

    def stop_torch_profiler(self) -> bytes | None:
        """Stop the PyTorch profiler and return its Kineto trace, gzipped (None when not running)."""
        prof, self._torch_prof = self._torch_prof, None
        if prof is None:
            return None
        import tempfile

        if self.device.type == "cuda":
            import torch
            torch.cuda.synchronize(self.device)
        prof.__exit__(None, None, None)
        with tempfile.TemporaryDirectory(prefix="epscope-torch-") as d:
            path = Path(d) / "trace.json"
            prof.export_chrome_trace(str(path))
            return gzip.compress(path.read_bytes(), compresslevel=6)

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

    def _new_slab(self, pool: _Pool, want: int = 0) -> _Slab:
        """The next slab of `pool`: POOL_SLOTS slots, or the `want` a reserve announced if more."""
        return self._make_slab(pool, max(POOL_SLOTS, want))


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


    def note(self, type_: str, detail: str, count: int = 1) -> None:
        """A warning for the manifest (e.g. a kernel's own timeout flag)."""
        self._notes.append({"type": type_, "count": int(count), "detail": detail})


def write_from_raw(raw_path, out_dir=None, overwrite: bool = False, analyze: bool = True) -> Path:
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
    s.overwrite, s.path, s.analyze = overwrite, None, analyze
    return s._write(d["payloads"], d["status"], d["error"])

