"""profiler.decode.align on synthetic clocks with known truth: skew, drift, quantisation, asymmetric delays."""
from __future__ import annotations

import json

import numpy as np
import pytest

from profiler.decode.align import (GLOBALTIMER_STEP_NS, ClockModel, ClockSample, HostClock, RankClock, clock_from_manifest,
                            clock_manifest, fit_host_clock, fit_rank_clock, sm_cycles_to_ns)

STEP = GLOBALTIMER_STEP_NS
BASE = 1_764_000_000_000_000_000  # ref globaltimer at the run start (ns since the epoch)


class Peer:
    """peer(tau) = tau + theta0 + d * (tau - BASE): rank k's globaltimer as a function of rank 0's true time."""

    def __init__(self, theta0: int, drift_ppm: float):
        self.theta0, self.d = theta0, drift_ppm * 1e-6

    def read(self, tau: int) -> int:
        return tau + self.theta0 + int(round(self.d * (tau - BASE)))

    def truth_to_ref(self, p: int) -> float:
        """The true rank-0 time at which the peer's clock read p (inverse of read)."""
        return BASE + (p - self.theta0 - BASE) / (1 + self.d)


def q(t: int) -> int:
    return t - t % STEP  # globaltimer reads are floored to its 32 ns step


def exchange(rng, peer: Peer, tau: int) -> ClockSample:
    d1, d2 = (int(x) for x in rng.integers(300, 3000, 2))   # one-way latencies, asymmetric
    turn = int(rng.integers(100, 1000))
    tb = tau + d1
    tc = tb + turn
    return ClockSample(q(tau), q(peer.read(tb)), q(peer.read(tc)), q(tc + d2))


def window(rng, peer, tau, n=32):
    return [exchange(rng, peer, tau + 10_000 * i) for i in range(n)]


@pytest.mark.parametrize("theta0, drift", [(12_345_678_901, 37.0), (-5_000_000, -85.0), (0, 10.0), (777, 0.0)])
def test_offset_drift_and_uncertainty_cover_truth(theta0, drift):
    rng = np.random.default_rng(abs(theta0) % 1000)
    peer = Peer(theta0, drift)
    start = window(rng, peer, BASE + 1_000)
    end = window(rng, peer, BASE + 2_000_000_000)  # 2 s later
    c = fit_rank_clock(3, start, end)
    assert c.rank == 3
    # t_ref = t - theta(t): the fitted drift is minus the peer's rate error
    assert c.drift_ppm == pytest.approx(-drift, abs=0.5)
    assert c.uncertainty_ns >= 2 * STEP
    # the mapping error stays within the stated uncertainty over the whole run
    for tau in np.linspace(BASE, BASE + 2_000_000_000, 41).astype(np.int64):
        p = peer.read(int(tau))
        got = int(c.to_ref(np.array([p]))[0])
        assert abs(got - peer.truth_to_ref(p)) <= c.uncertainty_ns


def test_min_delay_samples_win():
    rng = np.random.default_rng(0)
    peer = Peer(1_000_000, 0.0)
    good = exchange(rng, peer, BASE)
    # a sample with a huge, one-sided delay would bias the offset by ~50 us
    bad = ClockSample(BASE, q(peer.read(BASE + 100_000)), q(peer.read(BASE + 100_200)), BASE + 100_500)
    c = fit_rank_clock(1, [bad, good, bad], [])
    assert abs(c.offset_ns + 1_000_000) <= c.uncertainty_ns
    assert c.uncertainty_ns < 3000


def test_single_window_has_no_drift_and_rank0_is_identity():
    rng = np.random.default_rng(1)
    c = fit_rank_clock(2, window(rng, Peer(500, 50.0), BASE), [])
    assert c.drift_ppm == 0.0
    z = fit_rank_clock(0, [], [])
    assert (z.offset_ns, z.drift_ppm, z.uncertainty_ns) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="no clock samples"):
        fit_rank_clock(1, [], [])


def test_ntp_formulas():
    s = ClockSample(t0=1000, t1=6000, t2=6500, t3=2000)
    assert s.offset == ((6000 - 1000) + (6500 - 2000)) / 2
    assert s.delay == (2000 - 1000) - (6500 - 6000)


def test_to_ref_keeps_integer_precision():
    t = np.array([BASE + 1, BASE + 3, BASE + 5], np.int64)  # float64 would round these to 256 ns
    c = RankClock(1, offset_ns=-7.0, drift_ppm=0.0, uncertainty_ns=0.0)
    assert (c.to_ref(t) - t).tolist() == [-7, -7, -7]
    m = ClockModel({1: c}, t0_ns=BASE)
    assert m.to_run_timeline(1, t).tolist() == [-6, -4, -2]
    with pytest.raises(KeyError, match="no rank 5"):
        m.to_run_timeline(5, t)


def test_host_clock_fit_covers_truth():
    rng = np.random.default_rng(7)
    h0, g0, rate = 5_000_000_000, BASE, 1 + 20e-6  # host runs 20 ppm fast against the GPU
    pairs = []
    truth = []
    for i in range(50):
        tau = i * 10_000_000 + int(rng.integers(0, 1000))
        before, after = int(rng.integers(500, 5000)), int(rng.integers(500, 5000))
        pairs.append((h0 + int((tau - before) * rate), q(g0 + tau), h0 + int((tau + after) * rate)))
        truth.append((h0 + int(tau * rate), g0 + tau))
    hc = fit_host_clock(pairs)
    assert hc.slope == pytest.approx(1 / rate, abs=2e-6)
    for host, gpu in truth:
        assert abs(int(hc.to_gpu(np.array([host]))[0]) - gpu) <= hc.uncertainty_ns
    assert hc.uncertainty_ns < 10_000
    with pytest.raises(ValueError):
        fit_host_clock([])
    with pytest.raises(ValueError, match="host_after < host_before"):
        fit_host_clock([(10, 5, 9)])


def test_model_host_to_run_timeline_goes_through_the_rank_clock():
    rc = RankClock(1, offset_ns=-100.0, drift_ppm=0.0, uncertainty_ns=0.0)
    m = ClockModel({0: RankClock(0, 0.0, 0.0, 0.0), 1: rc}, t0_ns=BASE,
                   host=HostClock(host_anchor=0, gpu_anchor=BASE + 1000, slope=1.0, uncertainty_ns=5.0, rank=1))
    assert m.host_to_run_timeline(np.array([0, 50])).tolist() == [900, 950]


def test_sm_cycles_to_ns_interpolates_and_handles_wrap():
    got = sm_cycles_to_ns(np.array([1000, 2000, 3000], np.uint64), 1000, 5_000, 3000, 6_000)
    assert got.tolist() == [5000, 5500, 6000]
    near = 2**64 - 500  # clock64 wraps inside the region
    got = sm_cycles_to_ns(np.array([near, (near + 1000) % 2**64], np.uint64), near, 10_000, (near + 2000) % 2**64, 11_000)
    assert got.tolist() == [10_000, 10_500]
    # a region whose pair spans no cycles falls back to the nominal 1.98 GHz
    assert sm_cycles_to_ns([1980], 0, 0, 0, 0).tolist() == [1000]


def test_clock_manifest_round_trip_is_json():
    m = ClockModel({0: RankClock(0, 0.0, 0.0, 0.0), 1: RankClock(1, -12.5, 33.0, 150.0, BASE)}, t0_ns=BASE,
                   host=HostClock(1, BASE, 0.99999, 2000.0, 0))
    sec = json.loads(json.dumps(clock_manifest(m)))
    assert sec["step_ns"] == STEP and sec["uncertainty_ns"] == 150.0
    assert [r["rank"] for r in sec["ranks"]] == [0, 1]
    assert clock_from_manifest(sec) == m
