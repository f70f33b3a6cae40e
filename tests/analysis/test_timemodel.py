"""The time model (profiler.analysis.timemodel) on hand-made tables with known answers, and on
the bundled catalogue runs whose late entry was planted."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import graph as G
from profiler.analysis.timemodel import GPU, HOST, NEVER, time_model
from profiler.store.runstore import load_run
from tests.analysis.tables import TEST_REGISTRY, barrier, host, span, table

TRACES = Path(__file__).resolve().parents[2] / "traces"


def _tm(rows, launches=None):
    return time_model(G.build(table(rows), TEST_REGISTRY, launches))


def _op(tm, kernel="dispatch"):
    o = tm.ops[tm.ops["kernel"] == kernel]
    assert len(o) == 1
    return o.iloc[0]


def test_a_host_that_enters_late_is_named_and_its_wait_is_not_op_latency():
    # rank 0's host launches at 0, its kernel starts at 10 and waits at rank_start for rank 1,
    # whose host call begins at 1000 and whose kernel starts at 1010; both then work 100 ns
    rows = [host(0, "dispatch", 0, 20), host(1, "dispatch", 1000, 1020)]
    rows += barrier(0, 0, 0, "rank_start", 10, 1015)
    rows += barrier(1, 0, 0, "rank_start", 1010, 1015)
    rows += [span(0, 0, 0, "send_chunk", 1015, 1115), span(1, 0, 0, "send_chunk", 1015, 1115)]
    tm = _tm(rows)
    o = _op(tm)
    assert o["entry_skew_ns"] == 1000 and o["late_rank"] == 1 and o["late_cause"] == HOST
    assert o["op_latency_ns"] == 1115 - 1010            # last entry -> last warp end
    pr = tm.per_rank.set_index("rank")
    assert pr.loc[0, "late_wait_ns"] == 1000            # rank 0 waited 10 -> 1010 for rank 1 to enter ...
    assert pr.loc[0, "peer_wait_ns"] == 5               # ... and 1010 -> 1015 for it to arrive once in
    assert pr.loc[0, "kernel_ns"] == 1105 and pr.loc[0, "after_entry_ns"] == 105
    assert tm.iterations.iloc[0]["op_latency_ns"] == 105 and tm.iterations.iloc[0]["kernel_ns"] == 1105


def test_a_kernel_queued_behind_gpu_work_is_gpu_side():
    # both hosts launch at 0; rank 1's kernel starts at 1010 (its stream was busy with unrecorded
    # work: the host call had returned long before)
    rows = [host(0, "dispatch", 0, 20), host(1, "dispatch", 0, 20)]
    rows += barrier(0, 0, 0, "rank_start", 10, 1015)
    rows += barrier(1, 0, 0, "rank_start", 1010, 1015)
    o = _op(_tm(rows))
    assert o["late_rank"] == 1 and o["late_cause"] == GPU and o["late_gpu_ns"] >= 990


def test_a_rank_that_launches_after_its_peer_gave_up():
    # rank 0 waits for rank 1's data from 0 until its timeout stops the kernel at 1000 (unfinished);
    # rank 1 launches only at 5000 and works 100 ns
    rows = [span(0, 0, 0, "wait_data", 0, 0, 1), span(1, 0, 0, "send_chunk", 5000, 5100)]
    ev = table(rows)
    ev.loc[ev["phase"] == "wait_data", "open"] = True
    launches = pd.DataFrame({"rank": [0, 1], "launch": [0, 0], "kernel": ["dispatch", "dispatch"],
                             "iteration": [0, 0], "host_begin_ns": -1, "host_end_ns": -1,
                             "gpu_begin_ns": [0, 5000], "gpu_end_ns": [1000, 5100], "regions": 1, "dropped": 0})
    tm = time_model(G.build(ev, TEST_REGISTRY, launches))
    o = _op(tm)
    assert o["entry_skew_ns"] == 5000 and o["late_rank"] == 1 and o["unfinished"]
    assert o["op_latency_ns"] == 100                     # rank 1's own op, after everyone (rank 1) entered
    pr = tm.per_rank.set_index("rank")
    assert pr.loc[0, "late_wait_ns"] == 1000 and pr.loc[0, "after_entry_ns"] == 0


def test_a_rank_that_never_launches():
    # iteration 0: both ranks run dispatch; iteration 1: rank 1 never launches it
    rows = [span(0, 0, 0, "send_chunk", 0, 100), span(1, 0, 0, "send_chunk", 0, 100)]
    rows += [span(0, 0, 0, "wait_data", 200, 900, 1, launch=1, iteration=1),
             span(1, 0, 0, "send_chunk", 150, 190, kernel="combine", launch=1, iteration=1)]
    tm = _tm(rows)
    o = tm.ops[(tm.ops["iteration"] == 1) & (tm.ops["kernel"] == "dispatch")].iloc[0]
    assert o["missing"] == 1 and o["late_rank"] == 1 and o["late_cause"] == NEVER
    assert math.isnan(o["op_latency_ns"]) and math.isnan(o["last_entry_ns"])
    assert math.isnan(tm.iterations.set_index("iteration").loc[1, "op_latency_ns"])
    assert tm.iterations.set_index("iteration").loc[0, "op_latency_ns"] == 100


def test_empty_table():
    tm = time_model(G.build(table([]), TEST_REGISTRY))
    assert tm.ops.empty and tm.per_rank.empty and tm.iterations.empty


def _run_tm(name):
    r = load_run(TRACES / name)
    return time_model(G.build(r.events, r.manifest.get("registry"), r.launches))


def test_ep_host_late_names_rank_1_host_side_and_its_op_latency_is_unperturbed():
    tm = _run_tm("ep-host-late")
    le = tm.late_entries()
    top = le.groupby(["rank", "cause"])["waited_ns"].sum().idxmax()
    assert top == (1, HOST)
    # the op's own time once both ranks are in: within the spread of the unperturbed runs of the
    # same config (ep-balanced and the catalogue's A/A runs, every iteration of each)
    ref = np.concatenate([_run_tm(n).iterations["op_latency_ns"].to_numpy(float)
                          for n in ["ep-balanced"] + [f"ep-aa-{s}{i}" for s in "ab" for i in range(3)]])
    got = tm.iterations["op_latency_ns"].to_numpy(float)
    assert ref.min() <= np.median(got) <= ref.max(), (got, ref.min(), ref.max())
    # the figure that counts the wait for the late host as kernel time is 18x larger
    assert tm.iterations["kernel_ns"].median() > 10 * np.median(got)


def test_ep_barrier_straggler_is_gpu_side():
    # 5 ms of GPU work on rank 0's stream before each op, its host on time (the manifest's note)
    le = _run_tm("ep-barrier-straggler").late_entries()
    assert le.groupby(["rank", "cause"])["waited_ns"].sum().idxmax() == (0, GPU)


@pytest.mark.parametrize("name", ["ep-balanced", "ep-rank-skew", "ll-split-b0"])
def test_op_latency_after_entry_never_exceeds_the_slowest_ranks_kernel_time(name):
    it = _run_tm(name).iterations
    assert (it["op_latency_ns"] <= it["kernel_ns"] + 1).all()
