"""Saving a recording session (Session's save seam): every rank's payload (its launches' raw
buffers, clock samples, host spans, notes) gathered on rank 0, decoded against the fitted clock
model and written as a run directory (profiler.store.runstore) with its manifest: git, host, GPU,
headline. `SessionSave` is a part of profiler.record.session.Session.
"""
from __future__ import annotations

import gzip
import os
import pickle
import socket
import subprocess
import warnings as _warnings
from pathlib import Path

import numpy as np

from ..decode.align import ClockModel, clock_manifest
from ..decode.calibration import default_calibration
from ..decode.decode import concat_events, decode_launches
from ..store.runstore import write_run
from ..store.schema import coerce_events
from .pool import SessionError, registry_module
from .session_clocks import build_clock_model

REPO_ROOT = Path(__file__).resolve().parents[2]


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


class SessionSave:
    """Gathering and writing a Session's run (see the module docstring)."""

    def _payload(self, status: str, error: str | None) -> dict:
        if status == "ok" and self.n_host_pairs and self.device.type == "cuda":
            # a second set of host pairs at the end gives fit_host_clock its slope over the run
            try:
                self.pair_host_clock()
            except Exception as e:  # a trace without end pairs is still a trace; say so
                self.note("ClockFallback", f"rank {self.rank}: end-of-run host pairing failed: {e}")
        torch_trace = None
        try:
            torch_trace = self.stop_torch_profiler() if hasattr(self, "stop_torch_profiler") else None
        except Exception as e:  # noqa: BLE001 (the run matters more than the PyTorch trace; say why none)
            self.note("TorchProfiler", f"rank {self.rank}: the PyTorch profiler's trace was not kept: {e}")
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
            "start_host_ns": self.start_host_ns, "torch_trace": torch_trace,
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
        del events, decoded
        traces = {p["rank"]: p["torch_trace"] for p in payloads if p.get("torch_trace")}
        if traces:
            attach_recorded(self.path, traces)
        if getattr(self, "analyze", True):
            store_analyses(self.path)
        return self.path


def attach_recorded(path: Path, traces: dict[int, bytes]) -> None:
    """Store each rank's PyTorch profiler trace in the saved run (profiler.torchtrace.store); a
    trace that cannot be joined or aligned is kept with the reason in the manifest, and never costs
    the run just saved."""
    from ..torchtrace.attach import attach_bytes
    try:
        attach_bytes(path, traces, require_alignment=False)
    except Exception as e:  # noqa: BLE001 (the run is saved; `epscope merge` can attach the traces later)
        _warnings.warn(f"epscope: saved {path} but could not attach its PyTorch traces ({type(e).__name__}: {e})")


def store_analyses(path: Path) -> Path | None:
    """Compute the saved run's analyses and store them in it (profiler.analysis.stored); a failure
    is a warning, never the loss of the run just saved (`epscope analyze RUN` can do it later)."""
    from ..analysis.stored import store_run
    try:
        return store_run(path)
    except Exception as e:  # noqa: BLE001 (the run is saved; its analyses can be made again)
        _warnings.warn(f"epscope: saved {path} but could not store its analyses "
                       f"({type(e).__name__}: {e}); run `epscope analyze {path}`")
        return None


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

    from ..store.schema import COLUMNS

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
