"""The op that made a rank late, named: two ranks with an upstream GEMM planted on one (its
Kineto kernel launched by aten::mm from moe.py:112), a host range planted on a rank's launching
thread, and a run with nothing planted before its entries."""
from __future__ import annotations

import pytest

from profiler.analysis import graph as G
from profiler.analysis.timemodel import time_model
from profiler.store.runstore import load_run
from profiler.torchtrace import blame as B
from profiler.torchtrace.kineto import write_kineto
from profiler.torchtrace.attach import attach
from profiler.torchtrace.store import load_merged

from .conftest import GEMM_NS
from .fake import BASE, fake_events, plant_host_range


def _tm(run):
    return time_model(G.build(run.events, run.manifest.get("registry"), run.launches))


@pytest.fixture(scope="module")
def merged(upstream):
    attach(upstream["run"], upstream["traces"])
    run = load_run(upstream["run"])
    return run, load_merged(run), _tm(run)


def test_every_late_dispatch_of_rank_1_is_blamed_on_the_gemm(merged):
    run, m, tm = merged
    bl = B.blame(tm.ops, tm.per_rank, m)
    late = bl.late_entry_clauses()
    disp = late[(late["kernel"] == "dispatch") & (late["rank"] == 1)]
    assert len(disp) == 3                                   # one per iteration
    assert (disp["cause"] == "gpu").all() and (disp["name"] == "aten::mm").all()
    assert (disp["stack"] == "moe.py:112").all()            # the user's frame, not torch's module plumbing
    assert disp["top_ns"].between(0.95 * GEMM_NS, GEMM_NS).all()
    c = disp["clause"].iloc[0]
    assert c.startswith("rank 1 entered dispatch ") and "its GPU was running aten::mm (" in c
    assert c.endswith("launched from moe.py:112")
    items = bl.items[(bl.items["scope"] == B.LATE) & (bl.items["kernel"] == "dispatch") & (bl.items["side"] == "gpu")]
    assert (items["name"] == "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT").any()   # the kernel, with its op


def test_the_alignment_is_stored_and_checked(upstream, merged):
    run, m, _ = merged
    assert sorted(m.ranks) == [0, 1] and not m.errors
    field = run.manifest["torch_profiler"]
    assert [t["rank"] for t in field["traces"]] == [0, 1]
    assert all(a["width_ns"] > 0 for a in field["alignment"])
    from profiler.torchtrace.store import verify
    assert verify(upstream["run"]) == []


def test_a_host_range_before_the_launch_is_named_on_the_host_side(tmp_path):
    # rank 0's host enters every iteration 50 µs late (profiler.groundtruth.synthetic 'late_host'); a named
    # range on its launching thread covers most of that wait before iteration 1's notify call
    from profiler.store.runstore import write_run
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=2, events=20_000, scenario="late_host", late_rank=0, late_ns=50_000, iterations=2)
    tr = fake_events(la, 0, man["name"], offset_ns=1_000_000)
    mine = la[la["rank"] == 0].sort_values("launch")
    prev_end = int(mine[mine["iteration"] == 0]["gpu_end_ns"].max())
    call = int(mine[(mine["iteration"] == 1) & (mine["kernel"] == "notify")]["host_begin_ns"].iloc[0])
    assert call - prev_end > 30_000
    plant_host_range(tr, prev_end + 2_000, call - 1_000)
    p = write_kineto(tmp_path / "r0.json", tr.events, base_ns=BASE, rank=0, world_size=2)
    run_dir = write_run(tmp_path / "run", ev, la, man, perfetto=False)
    attach(run_dir, [p])
    run = load_run(run_dir)
    tm = _tm(run)
    bl = B.blame(tm.ops, tm.per_rank, load_merged(run))
    c = bl.clauses[(bl.clauses["iteration"] == 1) & (bl.clauses["kernel"] == "notify") & (bl.clauses["rank"] == 0)]
    assert sorted(c["scope"]) == [B.LATE, B.LEAD]      # rank 0 entered notify late, and its lead-in
    for row in c.itertuples():
        assert (row.cause, row.name, row.stack) == ("host", "planted_host_delay", "moe.py:40")
        assert "its host was in planted_host_delay (" in row.clause
    lead = c[c["scope"] == B.LEAD].iloc[0]
    assert lead["top_ns"] == call - 1_000 - prev_end - 2_000   # the whole range: the lead-in holds it
    late = c[c["scope"] == B.LATE].iloc[0]
    assert late["clause"].startswith("rank 0 entered notify ")


def test_nothing_planted_names_nothing_long(tmp_path, upstream):
    # rank 0 of the upstream run has no planted op: its late entries are none, its lead-ins hold no op
    run = load_run(upstream["run"])
    tm = _tm(run)
    bl = B.blame(tm.ops, tm.per_rank, load_merged(run))
    r0 = bl.clauses[(bl.clauses["rank"] == 0)]
    assert (r0.loc[r0["scope"] == B.LATE, "window_ns"] < 1_000).all()     # rank 0 is never late by much
    assert (r0["name"].isin(["", B.NO_OP])).all(), r0[["kernel", "name"]].to_dict("records")


def test_frames():
    assert B.frame_of("/a/b/moe.py(112): forward") == "moe.py:112"
    assert B.frame_of("<built-in method sleep>") == ""
    assert B._user_frame(["torch/nn/modules/module.py(1736): _call_impl", "x/moe.py(3): f"]) == "moe.py:3"
