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
from profiler.analysis.semantics import semantics
from profiler.runstore import load_run
from profiler.synthetic import make_events

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
    reg = manifest.get("registry")
    res = chunked.analyze(events, registry=reg, launches=launches, max_events=max_events)
    closed = unfinished.close(events, launches)
    its = closed["iteration"].to_numpy()
    groups = chunked.iteration_chunks(pd.Series(its).value_counts(), max_events)
    assert len(groups) > 1, "the test wants a run cut into several chunks"
    parts = (closed.iloc[np.flatnonzero(np.isin(its, g))] for g in groups)
    return C.inputs_from(tm=res.time_model, cp=res.critical, chunks=parts, sem=semantics(reg), manifest=manifest)


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
    """What `epscope analyze` stores (compare.inputs_of_results over summary.analyze's chunks)."""
    from profiler.analysis import summary
    r = load_run(TRACES / name)
    whole = C.run_inputs(r.events, manifest=r.manifest, launches=r.launches)
    _assert_same(whole, C.inputs_of_results(summary.analyze(r), launches=r.launches, manifest=r.manifest))


def test_inputs_of_results_in_several_chunks_equal_the_whole_table():
    ev, la, man = make_events(ranks=4, events=40_000, scenario="slow_rank", seed=5)
    per_it = int(pd.Series(ev["iteration"]).value_counts().max())
    res = chunked.analyze(ev, registry=man.get("registry"), launches=la, max_events=per_it)
    assert res.chunks > 1
    _assert_same(C.run_inputs(ev, manifest=man, launches=la), C.inputs_of_results(res, launches=la, manifest=man))
