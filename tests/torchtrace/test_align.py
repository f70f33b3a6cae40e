"""Join and alignment on hand-made traces with known offsets and drifts: the offset found is the
planted one within the stated width; launches missing from the trace are skipped; a trace of
another run, of another rank, or whose kernels cannot hold the run's warps is refused."""
from __future__ import annotations

import numpy as np
import pytest

from profiler.store.runstore import load_run
from profiler.torchtrace import align as A
from profiler.torchtrace.kineto import read_kineto, write_kineto

from .fake import BASE, POST, PRE, fake_events

SLACK = 64.0


def _align(tmp_path, up, rank, **kw):
    tr = fake_events(up["launches"], rank, up["manifest"]["name"], **kw)
    p = write_kineto(tmp_path / f"r{rank}.json", tr.events, base_ns=BASE, rank=rank, world_size=2)
    k = read_kineto(p)
    r = A.trace_rank(k, A.labels_of(k.events), up["manifest"]["name"])
    joined, unmatched = A.join(k, r, up["manifest"]["name"], up["launches"])
    return joined, A.align(joined, up["launches"], r, SLACK, unmatched, str(p))


@pytest.mark.parametrize("offset", [5_000_000, -3_000_000, 0, 123_456_789_012])
def test_the_planted_offset_is_found_within_the_stated_width(tmp_path, upstream, offset):
    joined, al = _align(tmp_path, upstream, 0, offset_ns=offset)
    n = int(((upstream["launches"]["rank"] == 0) & (upstream["launches"]["gpu_begin_ns"] >= 0)).sum())
    assert (al.launches, al.unmatched, len(joined)) == (n, 0, n)
    # every launch's bounds are [offset - PRE, offset + POST] widened by the slack: the intersection is exact
    assert al.width_ns == pytest.approx(PRE + POST + 2 * SLACK, abs=2)
    assert abs(al.offset_ns - BASE - offset) <= al.width_ns / 2      # Kineto times are absolute (base added)
    assert al.offset_ns - BASE == pytest.approx(offset + (POST - PRE) / 2, abs=2)
    assert al.drift_ppm == 0.0


def test_kernels_that_pytorch_operators_launch_inside_a_label_are_not_the_runs(tmp_path, upstream):
    """A profiled call that makes the session's pool slab launches aten::zeros' fill and aten::copy_'s
    kernel inside its label before its own launch (the first H100 recording): they are skipped, every
    launch still joins to its own kernel, and the offset is the one planted."""
    joined, al = _align(tmp_path, upstream, 0, offset_ns=5_000_000, operator_kernels=True)
    n = int(((upstream["launches"]["rank"] == 0) & (upstream["launches"]["gpu_begin_ns"] >= 0)).sum())
    assert (al.launches, al.unmatched) == (n, 0)
    assert joined["kernel_name"].str.startswith("void ep_core::").all()
    assert al.width_ns == pytest.approx(PRE + POST + 2 * SLACK, abs=2)
    assert al.offset_ns - BASE == pytest.approx(5_000_000 + (POST - PRE) / 2, abs=2)


def test_a_drift_is_measured_and_leaves_the_width_of_one_launch(tmp_path, upstream):
    joined, al = _align(tmp_path, upstream, 1, offset_ns=2_000_000, drift_ppm=150.0)
    assert al.drift_ppm == pytest.approx(150.0, abs=2.0)
    assert al.width_ns <= PRE + POST + 2 * SLACK + 5
    ks = joined["kernel_ts_ns"].to_numpy()
    la = upstream["launches"].set_index(["rank", "launch"]).loc[1]
    first = la.loc[joined["launch"], "gpu_begin_ns"].to_numpy()
    # every joined first warp, mapped into Kineto time, lies inside its kernel (up to the width)
    back = al.offset_ns + al.drift_ppm * 1e-6 * (first - al.ref_ns) + first
    assert np.all(back >= ks - al.width_ns)


def test_a_trace_drifting_more_than_clocks_do_is_refused(tmp_path, upstream):
    # 2,000 ppm over the run's 1.5 ms moves the kernels 3 µs against the warps: no clock drifts so
    with pytest.raises(A.AlignmentError, match="exclude each other"):
        _align(tmp_path, upstream, 1, offset_ns=0, drift_ppm=2000.0)


def test_missing_launches_are_skipped(tmp_path, upstream):
    la = upstream["launches"]
    ids = la.loc[la["rank"] == 0, "launch"].astype(int).tolist()
    joined, al = _align(tmp_path, upstream, 0, skip=set(ids[::2]))
    assert set(joined["launch"]) == set(ids[1::2]) and al.launches == len(ids[1::2])


def test_a_trace_of_another_run_is_refused(tmp_path, upstream):
    with pytest.raises(A.AlignmentError, match="another run"):
        _align(tmp_path, upstream, 0, label_run="some-other-run")


def test_a_trace_whose_labels_name_another_rank_than_its_distributed_info_is_refused(tmp_path, upstream):
    with pytest.raises(A.AlignmentError, match="distributedInfo says rank 0"):
        _align(tmp_path, upstream, 0, label_rank=1)


def test_kernels_that_cannot_hold_the_warps_are_refused(tmp_path, upstream):
    # the same labels, but the kernels of rank 1's recording: times of another recording
    la = upstream["launches"].copy()
    tr = fake_events(la, 0, upstream["manifest"]["name"])
    kern = [e for e in tr.events if e.get("cat") == "kernel"]
    kern[3]["ts"] += 300_000   # one launch's kernel 300 µs later than its warps
    p = write_kineto(tmp_path / "bad.json", tr.events, base_ns=BASE, rank=0, world_size=2)
    k = read_kineto(p)
    joined, un = A.join(k, 0, upstream["manifest"]["name"], la)
    with pytest.raises(A.AlignmentError, match="not of this run and rank"):
        A.align(joined, la, 0, SLACK, un, str(p))


def test_a_trace_without_labels_says_how_to_record_one(tmp_path, upstream):
    tr = fake_events(upstream["launches"], 0, upstream["manifest"]["name"])
    events = [e for e in tr.events if e.get("cat") != "user_annotation"]
    p = write_kineto(tmp_path / "nolabels.json", events, base_ns=BASE, rank=0)
    k = read_kineto(p)
    with pytest.raises(A.AlignmentError, match="no epscope launch labels"):
        A.trace_rank(k, A.labels_of(k.events), upstream["manifest"]["name"])


def test_labels_round_trip():
    from profiler.torchtrace.labels import Label, launch_label, parse_label
    assert parse_label(launch_label("ep-x", 3, 17)) == Label("ep-x", 3, 17)
    assert parse_label("aten::mm") is None and parse_label("epscope|x|r1") is None
    with pytest.raises(ValueError):
        launch_label("a|b", 0, 0)


def test_stored_run_loads(upstream):
    assert load_run(upstream["run"]).launches is not None
