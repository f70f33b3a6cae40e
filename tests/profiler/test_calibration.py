"""profiler.decode.calibration: the calibration file round-trips, refuses what it cannot use naming the
field, fits per-SM clocks from anchor samples, and feeds alignment and the manifest."""
from __future__ import annotations

import json

import numpy as np
import pytest

from profiler.decode.align import ClockModel, RankClock, clock_from_manifest, clock_manifest
from profiler.decode.calibration import Calibration, SmClock, default_calibration, fit_sm_clocks, load_calibration
from profiler.errors import CalibrationError

T0 = 1_764_000_000_000_000_000


def _samples(ghz=(1.98, 1.98, 1.98), n=97, ms=10.0, offsets=(0, 7_400_000, 3_000_000), step=32, skew=20, change=None):
    """Anchor samples as sm_clocks takes them: clock64 before/after a globaltimer read floored to `step`."""
    out = np.zeros((len(ghz), n, 4), np.int64)
    for b, (g, off) in enumerate(zip(ghz, offsets)):
        t = T0 + np.linspace(0, ms * 1e6, n).astype(np.int64) + 7 * b
        c = (9_000_000_000 + off + (t - T0) * g).astype(np.int64)
        if change is not None and b == 0:   # this SM's clock slows by `change` halfway
            half = n // 2
            c[half:] = c[half] + ((t[half:] - t[half]) * g * change).astype(np.int64)
        out[b, :, 0], out[b, :, 2] = c - skew, c + skew
        out[b, :, 1], out[b, :, 3] = t // step * step, b
    return out


def test_fit_recovers_rates_offsets_and_the_two_anchor_error():
    fit = fit_sm_clocks(_samples(), reference_gt_ns=T0)
    assert [s.sm for s in fit["sms"]] == [0, 1, 2]
    assert fit["sm_ghz"] == pytest.approx(1.98, rel=1e-5) and fit["sm_drift_ppm"] < 10
    offs = [s.offset_cycles - fit["sms"][0].offset_cycles for s in fit["sms"]]
    assert offs[1] == pytest.approx(7_400_000, abs=100) and offs[2] == pytest.approx(3_000_000, abs=100)
    # globaltimer floored to 32 ns: an intermediate anchor is at most one step off the line
    assert 0 < fit["alignment_ns"] <= 32 + 1
    assert fit["anchor_skew_cycles"] == 20 and fit["anchor_skew_ns"] == pytest.approx(20 / 1.98)
    assert fit["kernel_ms"] == pytest.approx(10.0, rel=1e-3)


def test_fit_shows_a_clock_change_as_a_large_alignment_error():
    fit = fit_sm_clocks(_samples(change=0.9))
    assert fit["alignment_ns"] > 1000   # 10 % slower for 5 ms: the two-anchor line is microseconds off


def test_fit_refuses_samples_that_do_not_advance():
    s = _samples()
    s[1, :, :3] = s[1, 0, :3]
    with pytest.raises(CalibrationError, match="SM 1"):
        fit_sm_clocks(s)
    with pytest.raises(CalibrationError, match="shape"):
        fit_sm_clocks(np.zeros((2, 1, 4)))


def _cal(**kw) -> Calibration:
    fit = fit_sm_clocks(_samples())
    base = dict(gpu="NVIDIA H200", created="2026-12-01T14:00:00+00:00", git_commit="abc", globaltimer_step_ns=32.0,
                globaltimer_mean_step_ns=35.6, clock64_read_cycles=2.0, globaltimer_read_cycles=40.0,
                record_cycles={"1x1": {"format 2": 12.5}}, **fit)
    return Calibration(**(base | kw))


def test_round_trip_and_summary(tmp_path):
    cal = _cal()
    path = cal.save(tmp_path / "c" / "cal.json")
    again = load_calibration(path)
    assert again == cal
    assert again.anchor_error_ns == pytest.approx(32 + 20 / 1.98)
    assert again.summary()["sms"] == 3 and again.summary()["gpu"] == "NVIDIA H200"


@pytest.mark.parametrize("field,value,match", [
    ("format", "nope", "format"), ("format_version", 99, "newer"), ("format_version", True, "format_version"),
    ("globaltimer", {"step_ns": -1, "mean_step_ns": 1}, "globaltimer_step_ns"),
    ("sm_clock", None, "sm_clock"), ("gpu", 3, "gpu")])
def test_a_bad_file_names_its_field(tmp_path, field, value, match):
    d = _cal().to_json()
    d[field] = value
    p = tmp_path / "cal.json"
    p.write_text(json.dumps(d))
    with pytest.raises(CalibrationError, match=match):
        load_calibration(p)


def test_a_missing_field_is_named(tmp_path):
    d = _cal().to_json()
    del d["sm_clock"]["ghz"]
    with pytest.raises(CalibrationError, match="ghz"):
        Calibration.from_json(d)
    with pytest.raises(CalibrationError, match="sm_clock.sms"):
        SmClock(sm=0, ghz=0.0, offset_cycles=0, max_residual_ns=0.0)


def test_default_calibration_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("EPSCOPE_CALIBRATION", str(tmp_path / "none.json"))
    assert default_calibration() is None
    _cal().save(tmp_path / "cal.json")
    monkeypatch.setenv("EPSCOPE_CALIBRATION", str(tmp_path / "cal.json"))
    assert default_calibration() == _cal()
    (tmp_path / "bad.json").write_text("{}")
    monkeypatch.setenv("EPSCOPE_CALIBRATION", str(tmp_path / "bad.json"))
    with pytest.warns(UserWarning, match="not used"):
        assert default_calibration() is None


def test_alignment_uses_the_calibration_and_the_manifest_quotes_it():
    model = ClockModel({0: RankClock(0, 0.0, 0.0, 0.0)}, t0_ns=0).calibrated(_cal(globaltimer_step_ns=31.0))
    assert model.step_ns == 31 and model.sm_ghz == pytest.approx(1.98, rel=1e-5)
    assert model.anchor_error_ns == pytest.approx(31 + 20 / 1.98)
    sec = clock_manifest(model)
    assert sec["calibration"]["gpu"] == "NVIDIA H200" and sec["step_ns"] == 31
    back = clock_from_manifest(sec)
    assert back.sm_ghz == model.sm_ghz and back.anchor_error_ns == model.anchor_error_ns
    assert back.calibration == sec["calibration"]
    # an old manifest without the new keys still reads, with the defaults
    old = {k: v for k, v in sec.items() if k not in ("sm_ghz", "anchor_error_ns", "calibration")}
    assert clock_from_manifest(old).calibration is None


def test_anchors_every_millisecond_bound_a_bending_clock():
    # the slow SM pairs of run 2 bent by ~300 ns from their two-anchor line over 10 ms; a clock
    # whose rate drifts linearly shows the same, and an anchor every ms takes most of it away
    s = _samples(n=101)
    t = (s[0, :, 1] - s[0, 0, 1]).astype(np.float64)
    bend = (2e-5 * t * (1 - t / t[-1]) * 1.98).astype(np.int64)   # up to ~100 ns of cycles
    s[0, :, 0] += bend
    s[0, :, 2] += bend
    fit = fit_sm_clocks(s, anchor_every=10)
    assert fit["alignment_ns"] > 40 and fit["anchored_alignment_ns"] < fit["alignment_ns"] / 2
    assert fit["anchor_every_ms"] == pytest.approx(1.0, rel=1e-2)


# -- issue 24: the two-GPU link figures --------------------------------------------------------------
def _link():
    from profiler.record.calibrate_link import link_figures

    # rank 0 raises at t0, the peer sees it at t1 (its own clock, 5 ms ahead) and answers at t2,
    # rank 0 sees the answer at t3: 1.2 µs of crossings around a 0.3 µs turnaround; one unfinished
    s = np.array([[1000, 5_000_600, 5_000_900, 2200], [5000, 5_004_700, 5_005_000, 6300], [-1, 0, 0, 0]])
    copies = {"copy engine": {"0->1": [2e-3, 2.2e-3, 2.1e-3], "1->0": [2.2e-3]},
              "SM copy": {"0->1": [4e-3], "1->0": [4e-3]}}
    return link_figures(s, copies, copy_bytes=256 << 20)


def test_link_figures_from_ping_pong_samples_and_timed_copies():
    from profiler.record.calibrate_link import round_trips_ns

    assert round_trips_ns([[1000, 5_000_600, 5_000_900, 2200]]).tolist() == [900]
    link = _link()
    assert (link["flag_round_trip_us"], link["flag_round_trip_min_us"], link["round_trips"]) == (0.95, 0.9, 2)
    assert link["copy_gbps"]["copy engine"] == {"0->1": round((256 << 20) / 2.1e-3 / 1e9, 1),
                                                "1->0": round((256 << 20) / 2.2e-3 / 1e9, 1)}
    assert link["copy_gbps"]["SM copy"]["1->0"] == 67.1
    with pytest.raises(ValueError, match="no complete ping-pong"):
        from profiler.record.calibrate_link import link_figures
        link_figures([[-1, 0, 0, 0]], {})


def test_the_link_record_round_trips_in_the_calibration_file_and_is_validated(tmp_path):
    cal = _cal(link=_link())
    again = load_calibration(cal.save(tmp_path / "cal.json"))
    assert again == cal and again.link["copy_gbps"]["SM copy"]["0->1"] == 67.1
    assert "link" not in _cal().to_json()           # one GPU: the file is as before
    d = cal.to_json()
    d["link"]["copy_gbps"]["SM copy"]["0->1"] = -1
    with pytest.raises(CalibrationError, match="link.copy_gbps.SM copy.0->1"):
        Calibration.from_json(d)


def test_the_link_measurement_skips_with_a_reason_on_one_gpu():
    from profiler.record.calibrate import describe
    from profiler.record.calibrate_link import skip_reason

    assert skip_reason(1, None) == "needs 2 GPUs of one host, this machine has 1"
    assert "no peer access" in skip_reason(2, False)
    assert skip_reason(2, True) is None and skip_reason(8, None) is None
    text = describe(_cal(link=_link()))
    assert "flag round trip over the link 0.95 µs" in text and "SM copy: 0->1 67.1 GB/s, 1->0 67.1 GB/s" in text
