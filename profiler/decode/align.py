"""Clock alignment: per-SM clock64 -> globaltimer, per-rank globaltimer -> rank 0, host -> GPU.

Three clocks meet in a run (docs/design.md):
  * clock64, per SM, 1.98 GHz on H200 and NOT aligned across SMs (per-SM values spread over
    7.4 M cycles at one instant: /work/shared/reference/measured-facts.md). High-resolution
    regions carry a (globaltimer, clock64) pair at warp start and end; `sm_cycles_to_ns`
    interpolates between them.
  * %globaltimer, one per GPU, 32 ns steps on H200 (measured-facts.md). GPUs drift apart by
    10-100 ppm, so rank k is mapped to rank 0 with an offset AND a drift, fitted from NTP-style
    ping-pong samples taken at the start and at the end of the run (`fit_rank_clock`).
  * the host clock (time.perf_counter_ns), mapped to one GPU's globaltimer from
    (host_before, gpu, host_after) triples (`fit_host_clock`).

No torch / perfetto / dash imports: this runs on the recording path of the GPU machine.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

# %globaltimer step measured on H200 (measured-facts.md): every timestamp is floored to it.
GLOBALTIMER_STEP_NS = 32
# Nominal H200 SM clock (measured-facts.md: 1.98 GHz max); only used when a high-res region
# lacks its end clock pair (aborted kernel), and then the decoder says so with a warning.
NOMINAL_SM_GHZ = 1.98
# How far the clock64 value of a format-2 anchor can sit from the instant its %globaltimer read
# sampled: the recorder takes the mean of the clock64 reads around that read, so half the read's
# length, ~20 cycles of a ~40-cycle read (benchmarks/NOTES.md issue 9, run 4: a globaltimer read
# alone 40.5 cycles) = 10 ns at 1.98 GHz, rounded up. `epscope calibrate` measures it per GPU.
ANCHOR_SKEW_NS = 16


@dataclass(frozen=True)
class ClockSample:
    """One NTP exchange between rank 0 (ref) and a peer, all in ns of the clock that read them.

    t0: ref sends, t1: peer receives, t2: peer replies, t3: ref receives the reply.
    """

    t0: int
    t1: int
    t2: int
    t3: int

    @property
    def offset(self) -> float:
        """theta = peer clock - ref clock (NTP)."""
        return ((self.t1 - self.t0) + (self.t2 - self.t3)) / 2

    @property
    def delay(self) -> int:
        """delta = round trip minus the peer's turnaround."""
        return (self.t3 - self.t0) - (self.t2 - self.t1)

    @property
    def peer_mid(self) -> float:
        return (self.t1 + self.t2) / 2


@dataclass(frozen=True)
class RankClock:
    """Maps rank `rank`'s globaltimer to rank 0's: t_ref = t + offset_ns + drift_ppm*1e-6*(t - anchor_ns)."""

    rank: int
    offset_ns: float
    drift_ppm: float
    uncertainty_ns: float
    anchor_ns: int = 0

    def to_ref(self, t: np.ndarray) -> np.ndarray:
        """int64 ns on rank 0's globaltimer. Integer parts stay integer: globaltimer values are
        ~1e18 ns and a float64 would round them to 256 ns."""
        t = np.asarray(t).astype(np.int64, copy=False)
        whole = int(np.floor(self.offset_ns))
        frac = self.offset_ns - whole
        corr = frac + self.drift_ppm * 1e-6 * (t - np.int64(self.anchor_ns)).astype(np.float64)
        return t + np.int64(whole) + np.rint(corr).astype(np.int64)


def _best(samples: list[ClockSample]) -> tuple[float, float, float]:
    """(offset, peer time, uncertainty) from the min-delay samples of one sync window.

    Samples tied at the minimum delay (common with a 32 ns clock) are averaged. Uncertainty:
    the NTP bound delta/2, plus one globaltimer step for the quantisation of the four reads in
    theta, plus one more because delta itself is read on the same quantised clocks (without it
    the bound fails for up to 32 ns in the synthetic tests of tests/profiler/test_align.py).
    """
    if not samples:
        raise ValueError("no clock samples")
    delays = np.array([s.delay for s in samples], dtype=np.float64)
    if np.any(delays < -2 * GLOBALTIMER_STEP_NS):
        raise ValueError(f"clock sample with negative delay {delays.min():.0f} ns: t0..t3 out of order")
    best = [s for s, d in zip(samples, delays) if d == delays.min()]
    off = float(np.mean([s.offset for s in best]))
    mid = float(np.mean([s.peer_mid for s in best]))
    unc = max(float(delays.min()), 0.0) / 2 + 2 * GLOBALTIMER_STEP_NS
    return off, mid, unc


def fit_rank_clock(rank: int, start_samples: list[ClockSample], end_samples: list[ClockSample]) -> RankClock:
    """Offset and drift of rank `rank` against rank 0 from the start and end sync windows.

    Each window gives theta (peer - ref) at one peer time; the line through the two gives the
    drift. With one window only, drift is 0 and the uncertainty holds near that window only.
    Between the windows the error of the line is at most the larger window uncertainty.
    """
    if rank == 0:
        return RankClock(0, 0.0, 0.0, 0.0, 0)
    windows = [_best(s) for s in (start_samples, end_samples) if s]
    if not windows:
        raise ValueError(f"rank {rank}: no clock samples at all")
    (th0, m0, u0) = windows[0]
    anchor = int(round(m0))
    if len(windows) == 1 or abs(windows[1][1] - m0) < 1.0:
        return RankClock(rank, -th0 + 0.0, 0.0, u0, anchor)
    th1, m1, u1 = windows[1]
    # t_ref = t - theta(t); theta is linear in peer time between the windows
    slope = -(th1 - th0) / (m1 - m0)
    offset = -th0 + slope * (anchor - m0)
    return RankClock(rank, offset, slope * 1e6, max(u0, u1), anchor)


@dataclass(frozen=True)
class HostClock:
    """Linear map host ns (perf_counter_ns) -> globaltimer ns of GPU `rank`."""

    host_anchor: int
    gpu_anchor: int
    slope: float
    uncertainty_ns: float
    rank: int = 0

    def to_gpu(self, host_ns) -> np.ndarray:
        h = np.asarray(host_ns).astype(np.int64, copy=False)
        return np.int64(self.gpu_anchor) + np.rint((h - np.int64(self.host_anchor)) * self.slope).astype(np.int64)


def fit_host_clock(pairs: list[tuple[int, int, int]], rank: int = 0) -> HostClock:
    """Least-squares line through (host midpoint, gpu) of (host_before, gpu_ns, host_after) triples.

    The GPU read happened somewhere in [host_before, host_after], so a triple's error is at most
    half its width; the stated uncertainty is the worst |residual| + half-width, plus one
    globaltimer step.
    """
    if not pairs:
        raise ValueError("no host/gpu clock pairs")
    a = np.array(pairs, dtype=np.int64)
    if np.any(a[:, 2] < a[:, 0]):
        raise ValueError("host clock pair with host_after < host_before")
    h0, g0 = int(a[0, 0]), int(a[0, 1])
    mid = ((a[:, 0] - h0) + (a[:, 2] - h0)).astype(np.float64) / 2
    gpu = (a[:, 1] - g0).astype(np.float64)
    half = (a[:, 2] - a[:, 0]).astype(np.float64) / 2
    if len(a) >= 2 and np.ptp(mid) > 0:
        slope, icpt = np.polyfit(mid, gpu, 1)
    else:
        slope, icpt = 1.0, float(np.mean(gpu - mid))
    resid = gpu - (icpt + slope * mid)
    unc = float(np.max(np.abs(resid) + half)) + GLOBALTIMER_STEP_NS
    return HostClock(h0, g0 + int(round(icpt)), float(slope), unc, rank)


@dataclass(frozen=True)
class ClockModel:
    """Everything needed to put a raw timestamp of any rank on the run timeline."""

    ranks: dict[int, RankClock]
    t0_ns: int
    host: HostClock | None = None
    source: str = "globaltimer"
    step_ns: int = GLOBALTIMER_STEP_NS
    # SM clock for high-res regions without a usable clock pair, and the error of one format-2
    # anchor (timer step + skew): measured by `epscope calibrate` when a calibration is given
    sm_ghz: float = NOMINAL_SM_GHZ
    anchor_error_ns: float = GLOBALTIMER_STEP_NS + ANCHOR_SKEW_NS
    calibration: dict | None = None    # the calibration's summary(), quoted in the manifest

    def calibrated(self, cal) -> "ClockModel":
        """This model with a GPU's measured timer step, SM clock and anchor error
        (profiler.decode.calibration.Calibration); None leaves it as it is."""
        if cal is None:
            return self
        from dataclasses import replace
        return replace(self, step_ns=int(round(cal.globaltimer_step_ns)), sm_ghz=cal.sm_ghz,
                       anchor_error_ns=cal.anchor_error_ns, calibration=cal.summary())

    def clock(self, rank: int) -> RankClock:
        try:
            return self.ranks[rank]
        except KeyError:
            raise KeyError(f"clock model has no rank {rank} (ranks: {sorted(self.ranks)})") from None

    def to_run_timeline(self, rank: int, t_raw) -> np.ndarray:
        """ns since run start on rank 0's clock (int64)."""
        return self.clock(rank).to_ref(t_raw) - np.int64(self.t0_ns)

    def host_to_run_timeline(self, host_ns) -> np.ndarray:
        if self.host is None:
            raise ValueError("clock model has no host clock")
        return self.to_run_timeline(self.host.rank, self.host.to_gpu(host_ns))

    @property
    def uncertainty_ns(self) -> float:
        return max((c.uncertainty_ns for c in self.ranks.values()), default=0.0)


def sm_cycles_to_ns(clk, clk_start, gt_start, clk_end, gt_end) -> np.ndarray:
    """clock64 cycles -> globaltimer ns by linear interpolation between the region's clock pairs.

    All arguments broadcast (per record or per region). clock64 differences are taken in
    unsigned arithmetic and read as signed, so a wrap stays a small difference. Regions whose
    pair spans no cycles fall back to the nominal 1.98 GHz.
    """
    clk, cs, gs, ce, ge = (np.atleast_1d(np.asarray(a, dtype=np.uint64)) for a in (clk, clk_start, gt_start, clk_end, gt_end))
    dc = (clk - cs).view(np.int64).astype(np.float64)
    span_c = (ce - cs).view(np.int64).astype(np.float64)
    span_g = (ge - gs).view(np.int64).astype(np.float64)
    ok = span_c > 0
    rate = np.where(ok, span_g / np.where(ok, span_c, 1.0), 1.0 / NOMINAL_SM_GHZ)
    return gs.view(np.int64) + np.rint(dc * rate).astype(np.int64)


def clock_manifest(model: ClockModel) -> dict:
    """The manifest["clock"] section (docs/design.md)."""
    out = {
        "source": model.source,
        "step_ns": model.step_ns,
        "t0_ns": int(model.t0_ns),
        "uncertainty_ns": float(model.uncertainty_ns),
        "sm_ghz": float(model.sm_ghz),
        "anchor_error_ns": float(model.anchor_error_ns),
        "ranks": [
            {"rank": int(c.rank), "offset_ns": float(c.offset_ns), "drift_ppm": float(c.drift_ppm),
             "uncertainty_ns": float(c.uncertainty_ns), "anchor_ns": int(c.anchor_ns)}
            for c in sorted(model.ranks.values(), key=lambda c: c.rank)
        ],
    }
    if model.calibration is not None:
        out["calibration"] = dict(model.calibration)
    if model.host is not None:
        h = model.host
        out["host"] = {"rank": h.rank, "host_anchor": int(h.host_anchor), "gpu_anchor": int(h.gpu_anchor),
                       "slope": float(h.slope), "uncertainty_ns": float(h.uncertainty_ns)}
    return out


def clock_from_manifest(section: dict) -> ClockModel:
    """Inverse of clock_manifest (for re-decoding raw buffers against a saved calibration)."""
    ranks = {int(r["rank"]): RankClock(int(r["rank"]), float(r["offset_ns"]), float(r["drift_ppm"]),
                                       float(r["uncertainty_ns"]), int(r.get("anchor_ns", 0)))
             for r in section.get("ranks", [])}
    host = None
    if section.get("host") and "slope" in section["host"]:
        h = section["host"]
        host = HostClock(int(h["host_anchor"]), int(h["gpu_anchor"]), float(h["slope"]),
                         float(h["uncertainty_ns"]), int(h.get("rank", 0)))
    return ClockModel(ranks, int(section.get("t0_ns", 0)), host, section.get("source", "globaltimer"),
                      int(section.get("step_ns", GLOBALTIMER_STEP_NS)),
                      float(section.get("sm_ghz", NOMINAL_SM_GHZ)),
                      float(section.get("anchor_error_ns", GLOBALTIMER_STEP_NS + ANCHOR_SKEW_NS)),
                      section.get("calibration"))
