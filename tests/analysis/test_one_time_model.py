"""One quantity, one computation (style.md rule 16), on every bundled run: the pages, Compare and
the report read their op latency, late entry and decisions from the one time model
(profiler.analysis.timemodel / late_entry / straggler / decision), so their numbers for the same
quantity are equal, the report prints every line a page's verdict shows, and the stored summary
holds the same; and repeated runs of one config get the same decision on every page."""
from __future__ import annotations

import functools
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from profiler.analysis import barrier_contention, critical_path, idle_warps
import importlib
from profiler.analysis import graph as G
from profiler.analysis import imbalance as IM
from profiler.analysis import summary
from profiler.analysis import late_entry as LE
from profiler.analysis.path_walk import iteration_totals
from profiler.analysis.timemodel import time_model
from profiler.torchtrace.report import with_steps
from profiler.analysis.decision import from_json as decision_from_json
from profiler.commands.report import report
from profiler.store.runstore import load_run
from tests.analysis import one_number

C = importlib.import_module("profiler.analysis.compare")   # the module (the package re-exports its function)
TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = sorted(p.parent.name for p in TRACES.glob("*/events.parquet"))


@functools.lru_cache(maxsize=None)
def _analysed(name: str):
    r = load_run(TRACES / name)
    reg = r.manifest.get("registry")
    cp = critical_path(r.events, registry=reg, launches=r.launches)
    iw = idle_warps(r.events, registry=reg, launches=r.launches)
    bc = barrier_contention(r.events, registry=reg, launches=r.launches)
    g = G.build(r.events, reg, r.launches)
    # a run with attached PyTorch traces: the verdicts as the pages state them, the op before entry
    # named (profiler.torchtrace.report.with_steps; unchanged for a run without traces)
    vs = with_steps(r, time_model(g), {"critical_path": cp.verdict, "idle": iw.verdict, "barriers": bc.verdict},
                    LE.decision(g, iteration_totals(g)))
    return r, g, vs["critical_path"], vs["idle"], vs["barriers"]


@pytest.mark.parametrize("name", RUNS)
def test_pages_read_one_time_model(name):
    r, g, cp, iw, bc = _analysed(name)
    tm = time_model(g)
    it = tm.iterations.set_index("iteration")
    # the op latency idle and barriers hold effects against is the time model's
    op = IM.op_latency(g).set_index("iteration")["op_ns"]
    defined = it["op_latency_ns"].dropna()
    assert np.allclose(op.reindex(defined.index).to_numpy(float), defined.to_numpy(float), atol=1)
    # Compare's end-to-end samples of this run are the same numbers
    s = C._inputs(r, None)[0].samples            # as Compare reads a run: unfinished waits closed
    e2e = s[s["phase"] == C.E2E]
    if len(defined):
        got = e2e.set_index("iteration")["value_ns"]
        assert np.allclose(got.reindex(defined.index).to_numpy(float), defined.to_numpy(float), atol=1)
    # a late entry named by one page is named the same (rank and side) by every page that names one
    late = {(v.rank, v.late_entry) for v in (cp, iw, bc) if v.alarm and v.late_entry}
    assert len(late) <= 1, [(v.page, v.headline) for v in (cp, iw, bc)]
    # the bundled run's stored summary (what the Runs page shows) is current and says the same
    sm = summary.load(TRACES / name)
    assert sm is not None, f"{name}: stale or missing {summary.FILE}: run `epscope analyze traces/{name}`"
    for page, v in (("critical_path", cp), ("idle", iw), ("barriers", bc)):
        assert (sm["verdicts"][page]["alarm"], sm["verdicts"][page]["cause"]) == (v.alarm, v.cause.value)
    if len(defined):
        assert abs(sm["op_latency_ns"] - float(np.median(defined))) <= 1


@pytest.mark.parametrize("name", RUNS)
def test_every_page_the_report_and_the_summary_state_one_number_per_quantity(name):
    r, g, cp, iw, bc = _analysed(name)
    one_number.check((cp, iw, bc))
    # the report prints every line the pages' verdict boxes show, word for word
    text = report(r)
    for v in (cp, iw, bc):
        for line in (v.headline, *v.facts, *v.notes):
            assert line in text, (v.page, line)
    # and the stored summary (the Runs page) holds the same sentences and decisions
    sm = summary.load(TRACES / name)
    assert sm is not None, f"{name}: stale or missing {summary.FILE}: run `epscope analyze traces/{name}`"
    for page, v in (("critical_path", cp), ("idle", iw), ("barriers", bc)):
        s = sm["verdicts"][page]
        assert (s["headline"], s["facts"], s["notes"]) == (v.headline, list(v.facts), list(v.notes)), page
        stored = [decision_from_json(d) for d in s["decisions"]]
        assert len(stored) == len(v.decisions) and all(map(one_number.same_decision, stored, v.decisions)), page


def _groups():
    g = defaultdict(list)
    for n in RUNS:
        m = re.fullmatch(r"(.+-[ab])\d+", n)
        if m:
            g[m.group(1)].append(n)
    return {k: v for k, v in sorted(g.items()) if len(v) > 1}


@pytest.mark.parametrize("group", list(_groups()))
def test_repeated_runs_of_one_config_get_the_same_decision(group):
    runs = _groups()[group]
    for page in range(3):
        decisions = {(_analysed(n)[2 + page].alarm, _analysed(n)[2 + page].cause) for n in runs}
        assert len(decisions) == 1, {n: _analysed(n)[2 + page].headline for n in runs}
    # and no quantity's decision is "alarm" on one run of the config and "none" on another
    bands = defaultdict(dict)
    for n in runs:
        for (quantity, _), d in one_number.check(_analysed(n)[2:]).items():
            if np.isfinite(d.threshold):
                bands[quantity][n] = d.band
    for quantity, by_run in bands.items():
        assert not {"alarm", "none"} <= set(by_run.values()), (quantity, by_run)
