"""The calibration file of one GPU, written by `epscope calibrate` (profiler.record.calibrate).

    cal = load_calibration(path)     # validated: CalibrationError names the field
    cal.save(path)
    default_calibration()            # $EPSCOPE_CALIBRATION, else ~/.cache/epscope/calibration.json, or None

What it holds (JSON, "format": "epscope-calibration", "format_version": 1), all measured on the
GPU named in it:
  * globaltimer: the %globaltimer step (smallest and mean increment a spinning warp sees);
  * read_cycles: the cost of one clock64 read and one %globaltimer read, back to back on one warp;
  * record_cycles: cycles per record of each record design on the recording warp (the recorder
    bench's design table, 1x1 and 132x4 grids);
  * anchor: the skew of a format-2 anchor (half the clock64 cycles around its globaltimer read),
    in cycles and ns;
  * sm_clock: per SM, the clock64 rate against the globaltimer (GHz), its offset (clock64 at the
    run's reference globaltimer instant) and the largest distance of an intermediate anchor from
    the line through the first and last anchor of a kernel of `kernel_ms` (what the decoder's
    two-anchor conversion would be off by), and over all SMs: the median rate, the rate spread
    (drift, ppm) and that largest distance (alignment_ns).
profiler.decode.align uses it (ClockModel.calibrated: timer step, SM clock, anchor error) and a run
recorded with one quotes `summary()` in manifest["clock"]["calibration"].
"""
from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..errors import CalibrationError
from ..store.cachedir import cache_root

FORMAT = "epscope-calibration"
FORMAT_VERSION = 1
ENV = "EPSCOPE_CALIBRATION"


def default_path() -> Path:
    env = os.environ.get(ENV)
    return Path(env) if env else cache_root() / "calibration.json"


def _num(v, name: str, lo: float = 0.0, strict: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < lo or (strict and v <= lo):
        raise CalibrationError(f"calibration field '{name}' must be a finite number {'>' if strict else '>='} {lo}, "
                               f"got {v!r}", name)
    return float(v)


def _int(v, name: str, lo: int | None = 0) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo):
        raise CalibrationError(f"calibration field '{name}' must be an integer{f' >= {lo}' if lo is not None else ''}, "
                               f"got {v!r}", name)
    return v


def _str(v, name: str) -> str:
    if not isinstance(v, str):
        raise CalibrationError(f"calibration field '{name}' must be a string, got {v!r}", name)
    return v


def _obj(v, name: str) -> dict:
    if not isinstance(v, dict):
        raise CalibrationError(f"calibration field '{name}' must be an object, got {type(v).__name__}", name)
    return v


@dataclass(frozen=True)
class SmClock:
    """One SM's clock64 against the globaltimer."""

    sm: int
    ghz: float              # clock64 cycles per globaltimer ns
    offset_cycles: int      # clock64 at the calibration's reference globaltimer instant
    max_residual_ns: float  # largest distance of an intermediate anchor from the first-last line

    def __post_init__(self):
        _int(self.sm, "sm_clock.sms[].sm")
        _num(self.ghz, "sm_clock.sms[].ghz", 0.0, strict=True)
        _int(self.offset_cycles, "sm_clock.sms[].offset_cycles", None)
        _num(self.max_residual_ns, "sm_clock.sms[].max_residual_ns")


@dataclass(frozen=True)
class Calibration:
    gpu: str
    created: str
    git_commit: str
    globaltimer_step_ns: float       # smallest increment of %globaltimer
    globaltimer_mean_step_ns: float
    clock64_read_cycles: float
    globaltimer_read_cycles: float
    anchor_skew_cycles: float        # half the clock64 cycles around an anchor's globaltimer read (median)
    anchor_skew_ns: float
    sm_ghz: float                    # median over SMs
    sm_drift_ppm: float              # largest |rate / median - 1| over SMs, in ppm
    alignment_ns: float              # largest max_residual_ns over SMs
    kernel_ms: float                 # length of the kernel the SM clocks were sampled over
    reference_gt_ns: int             # the globaltimer instant offsets are given at
    sms: tuple[SmClock, ...] = ()
    record_cycles: dict = field(default_factory=dict)   # grid ("1x1") -> {design: cycles per record}
    anchored_alignment_ns: float = 0.0   # alignment_ns with an extra anchor every anchor_every_ms (piecewise)
    anchor_every_ms: float = 0.0
    link: dict = field(default_factory=dict)   # two GPUs: profiler.record.calibrate_link.link_figures ({}: not measured)

    def __post_init__(self):
        for name in ("gpu", "created", "git_commit"):
            _str(getattr(self, name), name)
        for name in ("globaltimer_step_ns", "globaltimer_mean_step_ns", "sm_ghz", "kernel_ms"):
            _num(getattr(self, name), name, 0.0, strict=True)
        for name in ("clock64_read_cycles", "globaltimer_read_cycles", "anchor_skew_cycles", "anchor_skew_ns",
                     "sm_drift_ppm", "alignment_ns", "anchored_alignment_ns", "anchor_every_ms"):
            _num(getattr(self, name), name)
        _int(self.reference_gt_ns, "reference_gt_ns")
        if not all(isinstance(s, SmClock) for s in self.sms):
            raise CalibrationError("calibration field 'sm_clock.sms' must hold SmClock entries", "sm_clock.sms")
        link = _obj(self.link, "link")
        for name in ("flag_round_trip_us", "flag_round_trip_min_us"):
            if link:
                _num(link.get(name), f"link.{name}", 0.0, strict=True)
        for kind, per_dir in _obj(link.get("copy_gbps", {}), "link.copy_gbps").items():
            for d, v in _obj(per_dir, f"link.copy_gbps.{kind}").items():
                _num(v, f"link.copy_gbps.{kind}.{d}", 0.0, strict=True)
        for grid, designs in _obj(self.record_cycles, "record_cycles").items():
            for design, v in _obj(designs, f"record_cycles.{grid}").items():
                _num(v, f"record_cycles.{grid}.{design}", -1e9)

    @property
    def anchor_error_ns(self) -> float:
        """How far a format-2 anchor's globaltimer can be from its clock64 instant: one timer step
        (the value is floored to it) plus the anchor's skew."""
        return self.globaltimer_step_ns + self.anchor_skew_ns

    def to_json(self) -> dict:
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION, "gpu": self.gpu, "created": self.created,
            "git_commit": self.git_commit,
            "globaltimer": {"step_ns": self.globaltimer_step_ns, "mean_step_ns": self.globaltimer_mean_step_ns},
            "read_cycles": {"clock64": self.clock64_read_cycles, "globaltimer": self.globaltimer_read_cycles},
            "anchor": {"skew_cycles": self.anchor_skew_cycles, "skew_ns": self.anchor_skew_ns},
            "record_cycles": self.record_cycles,
            "sm_clock": {"ghz": self.sm_ghz, "drift_ppm": self.sm_drift_ppm, "alignment_ns": self.alignment_ns,
                         "kernel_ms": self.kernel_ms, "reference_gt_ns": self.reference_gt_ns,
                         "anchored_alignment_ns": self.anchored_alignment_ns, "anchor_every_ms": self.anchor_every_ms,
                         "sms": [asdict(s) for s in self.sms]},
            **({"link": self.link} if self.link else {}),
        }

    @classmethod
    def from_json(cls, d) -> "Calibration":
        d = _obj(d, "(file)")
        if d.get("format") != FORMAT:
            raise CalibrationError(f"not an {FORMAT} file (format={d.get('format')!r})", "format")
        v = _int(d.get("format_version"), "format_version", 1)
        if v > FORMAT_VERSION:
            raise CalibrationError(f"calibration format version {v} is newer than this epscope's {FORMAT_VERSION}",
                                   "format_version")
        try:
            gt, rd, an, sc = (_obj(d[k], k) for k in ("globaltimer", "read_cycles", "anchor", "sm_clock"))
            sms = tuple(SmClock(**_obj(s, "sm_clock.sms[]")) for s in sc.get("sms", []))
            return cls(gpu=d["gpu"], created=d["created"], git_commit=d["git_commit"],
                       globaltimer_step_ns=gt["step_ns"], globaltimer_mean_step_ns=gt["mean_step_ns"],
                       clock64_read_cycles=rd["clock64"], globaltimer_read_cycles=rd["globaltimer"],
                       anchor_skew_cycles=an["skew_cycles"], anchor_skew_ns=an["skew_ns"],
                       sm_ghz=sc["ghz"], sm_drift_ppm=sc["drift_ppm"], alignment_ns=sc["alignment_ns"],
                       kernel_ms=sc["kernel_ms"], reference_gt_ns=sc["reference_gt_ns"], sms=sms,
                       anchored_alignment_ns=sc.get("anchored_alignment_ns", 0.0),
                       anchor_every_ms=sc.get("anchor_every_ms", 0.0),
                       record_cycles=d.get("record_cycles", {}), link=d.get("link", {}))
        except KeyError as e:
            raise CalibrationError(f"calibration file lacks field {e.args[0]!r}", str(e.args[0])) from None
        except TypeError as e:
            raise CalibrationError(f"calibration file has an unexpected field: {e}", "sm_clock.sms") from None

    def summary(self) -> dict:
        """What a run's manifest quotes (manifest["clock"]["calibration"])."""
        return {"gpu": self.gpu, "created": self.created, "git_commit": self.git_commit,
                "globaltimer_step_ns": self.globaltimer_step_ns, "sm_ghz": self.sm_ghz,
                "sm_drift_ppm": self.sm_drift_ppm, "anchor_error_ns": self.anchor_error_ns,
                "alignment_ns": self.alignment_ns, "kernel_ms": self.kernel_ms,
                "anchored_alignment_ns": self.anchored_alignment_ns, "anchor_every_ms": self.anchor_every_ms,
                "sms": len(self.sms)}

    def save(self, path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=1) + "\n")
        tmp.replace(path)
        return path


def load_calibration(path) -> Calibration:
    try:
        d = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise CalibrationError(f"{path}: cannot read a calibration file ({e})") from None
    return Calibration.from_json(d)


def default_calibration() -> Calibration | None:
    """The calibration at default_path(), or None when there is none. A broken one is not used
    (a warning says why): a run's recording must not fail on it after its kernels ran."""
    p = default_path()
    if not p.exists():
        return None
    try:
        return load_calibration(p)
    except CalibrationError as e:
        warnings.warn(f"calibration {p} not used: {e}", stacklevel=2)
        return None


def fit_sm_clocks(samples, reference_gt_ns: int | None = None, anchor_every: int = 10) -> dict:
    """Per-SM clock64 rates, offsets and two-anchor conversion errors from anchor samples.

    samples: int64[blocks, n, 4] of (clock64 before, globaltimer, clock64 after, smid), each block
    one warp on one SM taking n anchors over a kernel (calibrate.cuh, sm_clocks). Per SM (its first
    block): the rate is the line through its first and last anchor (what the decoder does with a
    region's start and finish pairs), max_residual_ns the largest distance of its intermediate
    anchors from that line, offset_cycles its clock64 at `reference_gt_ns` (default: the median
    first anchor). anchored_alignment_ns: the same distance when every `anchor_every`-th sample is
    an anchor too (a kernel calling WarpRecorder::anchor() that often), the decoder's piecewise
    conversion. Returns the SmClock list and the summary fields of a Calibration.
    """
    a = np.asarray(samples, dtype=np.int64)
    if a.ndim != 3 or a.shape[2] != 4 or a.shape[1] < 2 or a.shape[0] < 1:
        raise CalibrationError(f"anchor samples must be int64[blocks, n >= 2, 4], got shape {a.shape}", "samples")
    clk = a[:, :, 0] + (a[:, :, 2] - a[:, :, 0]) // 2
    gt = a[:, :, 1]
    skew = float(np.median((a[:, :, 2] - a[:, :, 0]) / 2))
    if reference_gt_ns is None:
        reference_gt_ns = int(np.median(gt[:, 0]))
    sms, seen, anchored = [], set(), 0.0
    for b in range(a.shape[0]):
        sm = int(a[b, 0, 3])
        if sm in seen:
            continue
        seen.add(sm)
        dc, dg = float(clk[b, -1] - clk[b, 0]), float(gt[b, -1] - gt[b, 0])
        if dc <= 0 or dg <= 0:
            raise CalibrationError(f"SM {sm}: anchors do not advance (clock64 {dc:.0f} cycles, globaltimer {dg:.0f} ns)",
                                   "samples")
        ghz = dc / dg
        # relative to the first anchor: globaltimer values (~1.8e18 ns) lose 256 ns in a float64
        pred = (clk[b] - clk[b, 0]).astype(np.float64) / ghz
        resid = float(np.max(np.abs((gt[b] - gt[b, 0]).astype(np.float64) - pred)))
        off = int(clk[b, 0]) + int(round((reference_gt_ns - int(gt[b, 0])) * ghz))
        sms.append(SmClock(sm, ghz, off, resid))
        pts = sorted(set(range(0, a.shape[1], max(anchor_every, 1))) | {a.shape[1] - 1})
        rel_c = (clk[b] - clk[b, 0]).astype(np.float64)
        rel_g = (gt[b] - gt[b, 0]).astype(np.float64)
        piecewise = np.interp(rel_c, rel_c[pts], rel_g[pts])
        anchored = max(anchored, float(np.max(np.abs(rel_g - piecewise))))
    rates = np.array([s.ghz for s in sms])
    med = float(np.median(rates))
    kernel_ms = float(np.median(gt[:, -1] - gt[:, 0])) / 1e6
    return {"sms": tuple(sorted(sms, key=lambda s: s.sm)), "sm_ghz": med,
            "sm_drift_ppm": float(np.max(np.abs(rates / med - 1)) * 1e6),
            "alignment_ns": float(max(s.max_residual_ns for s in sms)), "kernel_ms": kernel_ms,
            "reference_gt_ns": int(reference_gt_ns), "anchor_skew_cycles": skew, "anchor_skew_ns": skew / med,
            "anchored_alignment_ns": anchored,
            "anchor_every_ms": kernel_ms * max(anchor_every, 1) / max(a.shape[1] - 1, 1)}
