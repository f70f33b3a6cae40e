"""What Compare reads of a run (profiler.analysis.compare.RunInputs): computed from the whole
table, or from a run analysed in chunks of iterations (profiler.analysis.chunked) plus its events
chunk by chunk, the samples, the path and the workload are the same; and a comparison of stored
inputs is the comparison of the runs (issue 20: compare of 3 runs a side without their events)."""
from __future__ import annotations

import importlib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.analysis import chunked, unfinished
from profiler.analysis import graph as G
from profiler.store.runstore import load_run
from profiler.groundtruth.synthetic import make_events

C = importlib.import_module("profiler.analysis.compare")   # the package re-exports the function
TRACES = Path(__file__).resolve().parents[2] / "traces"
# runs of several iterations and ranks: a late host, a GPU straggler, a skewed rank, an A/B run, low latency
RUNS = ["ep-host-late", "ep-barrier-straggler", "ep-rank-skew", "ep-ab-sms-a0", "ll-host-b1", "ll-barrier-a0"]


def _sorted(df: pd.DataFrame, keys) -> pd.DataFrame:
    return df.sort_values(keys, kind="stable").reset_index(drop=True)


def _assert_same(a: C.RunInputs, b: C.RunInputs):
    assert (a.ranks, a.kernels, a.path_total_ns, a.waits) == (b.ranks, b.kernels, b.path_total_ns, b.waits)
    keys = ["iteration", "kernel", "phase"]
    sa, sb = _sorted(a.samples, keys), _sorted(b.samples, keys)
    pd.testing.assert_frame_equal(sa[keys], sb[keys])
    np.testing.assert_allclose(sa["value_ns"].to_numpy(float), sb["value_ns"].to_numpy(float), rtol=0, atol=1e-6)
    pd.testing.assert_frame_equal(_sorted(a.path, ["kernel", "phase"]), _sorted(b.path, ["kernel", "phase"]))


def _chunked_inputs(events, launches, manifest, max_events):
    """RunInputs as chunked.analyze computes them, a chunk of whole iterations at a time."""
    res = chunked.analyze(events, registry=manifest.get("registry"), launches=launches, max_events=max_events)
    assert res.chunks > 1, "the test wants a run cut into several chunks"
    return res.compare


@pytest.mark.parametrize("name", RUNS)
def test_inputs_of_chunks_equal_the_whole_table(name):
    r = load_run(TRACES / name)
    whole = C.run_inputs(r.events, manifest=r.manifest, launches=r.launches)
    per_it = int(pd.Series(r.events["iteration"]).value_counts().max())
    _assert_same(whole, _chunked_inputs(r.events, r.launches, r.manifest, per_it))


def test_inputs_of_chunks_equal_the_whole_table_synthetic():
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", seed=3)
    whole = C.run_inputs(ev, manifest=man, launches=la)
    per_it = int(pd.Series(ev["iteration"]).value_counts().max())
    _assert_same(whole, _chunked_inputs(ev, la, man, per_it))


def test_compare_of_inputs_is_the_compare_of_the_runs():
    a = [load_run(TRACES / f"ep-ab-sms-a{i}") for i in range(3)]
    b = [load_run(TRACES / f"ep-ab-sms-b{i}") for i in range(3)]
    ia = [C.run_inputs(r.events, manifest=r.manifest, launches=r.launches, name=r.name) for r in a]
    ib = [C.run_inputs(r.events, manifest=r.manifest, launches=r.launches, name=r.name) for r in b]
    from_runs, from_inputs = C.compare(a, b), C.compare(ia, ib)
    assert from_runs.verdict == from_inputs.verdict
    pd.testing.assert_frame_equal(from_runs.per_phase, from_inputs.per_phase)
    pd.testing.assert_frame_equal(from_runs.per_rank, from_inputs.per_rank)
    pd.testing.assert_frame_equal(from_runs.critical_path_changes, from_inputs.critical_path_changes)
    pd.testing.assert_frame_equal(from_runs.manifest_diff, from_inputs.manifest_diff)


def test_inputs_refuse_unnamed_columns():
    ev, la, man = make_events(ranks=2, events=2_000, seed=1)
    empty = C.run_inputs(ev, manifest=man, launches=la)
    with pytest.raises(ValueError, match="columns"):
        C.RunInputs(name="x", manifest={}, ranks=2, kernels=(), samples=empty.samples.rename(columns={"value_ns": "v"}),
                    path=empty.path, path_total_ns=0, waits=frozenset())


@pytest.mark.parametrize("name", ["ep-host-late", "ll-host-b1"])
def test_inputs_of_the_stored_analyses_equal_the_whole_table(name):
    """What `epscope analyze` stores (summary.analyze's chunks)."""
    from profiler.analysis import summary
    r = load_run(TRACES / name)
    _assert_same(C.run_inputs(r.events, manifest=r.manifest, launches=r.launches), summary.analyze(r).compare)


def test_a_late_peers_wait_is_clipped_at_the_last_entry():
    """The waits a peer releases lose their time before the occurrence's last entry (the entry
    skew row's); the test fails if they were taken whole."""
    r = load_run(TRACES / "ep-host-late")
    got = C.run_inputs(r.events, manifest=r.manifest, launches=r.launches)
    g = G.build(unfinished.close(r.events, r.launches), r.manifest.get("registry"))
    peer_waits = [w for w, rel in g.sem.waits.items() if rel]
    ev = r.events[(r.events["kind"] == "span").to_numpy() & r.events["phase"].isin(peer_waits).to_numpy()]
    assert len(ev)
    whole = ev.assign(d=ev["end_ns"] - ev["begin_ns"]).groupby(["iteration", "kernel", "phase"], observed=True)["d"].mean()
    s = got.samples[got.samples["phase"].isin(peer_waits)].set_index(["iteration", "kernel", "phase"])["value_ns"]
    assert len(s) and (s <= whole.reindex(s.index).to_numpy() + 1e-9).all()
    assert (s < whole.reindex(s.index).to_numpy() - 1e3).any()      # the late host's peers waited > 1 µs less
