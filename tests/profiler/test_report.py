"""profiler.commands.report on decoded runs: sections, per-rank rows or slowest-rank rows, losses, clock."""
from __future__ import annotations

import numpy as np

from profiler.decode.decode import LaunchInfo, decode_launches
from profiler.registry.registry import load_all
from profiler.commands.report import PER_RANK_ROWS_MAX_RANKS, report
from profiler.store.runstore import load_run, write_run

from .bufbuild import B, E, Region, build

REG = load_all()["selftest"]
WORK, ITER = REG.phase("work").id, REG.phase("iteration").id
T0 = 1_764_000_000_000_000_000


def make_run(tmp_path, ranks: int, slow_rank: int, drop_rank: int | None = None, open_rank: int | None = None):
    items = []
    for r in range(ranks):
        dur = 10_000 if r == slow_rank else 1_000
        recs = [(T0, B, ITER, 0), (T0 + 32, B, WORK, 0), (T0 + 32 + dur, E, WORK, 0)]
        if r != open_rank:
            recs.append((T0 + 64 + dur, E, ITER, 0))
        attempted = len(recs) + (5 if r == drop_rank else 0)
        buf = build([Region(recs, attempted=attempted)], registry_hash=REG.hash, capacity=4)
        items.append((buf, LaunchInfo(r, 0, "selftest.imbalance", 0, "selftest")))
    d = decode_launches(items, {"selftest": REG})
    man = {"name": "rep", "git": {"branch": "main", "commit": "0123456789abcdef", "dirty": False},
           "gpu": {"name": "NVIDIA H200", "count": ranks},
           "clock": {"source": "globaltimer", "step_ns": 32,
                     "ranks": [{"rank": r, "offset_ns": 0.0, "drift_ppm": 12.5 * r, "uncertainty_ns": 40.0 * r}
                               for r in range(ranks)]},
           "warnings": [w.to_json() for w in d.warnings]}
    return write_run(tmp_path / f"r{ranks}", d.events, d.launches, man, perfetto=False)


def test_small_run_has_per_rank_rows(tmp_path):
    text = report(make_run(tmp_path, 2, slow_rank=1, drop_rank=0, open_rank=1))
    assert "run rep" in text and "git main@0123456789" in text and "2 x NVIDIA H200" in text
    assert "rank alignment ±40 ns (worst: rank 1), drift up to 12.5 ppm" in text
    assert "DROPPED RECORDS: 5" in text and "rank 0 launch 0" in text
    assert "OPEN SPANS: 1" in text and "warning UnmatchedBegin: 1" in text
    kern = next(line for line in text.splitlines() if line.startswith("selftest.imbalance") and "x" in line.split()[-1])
    assert kern.split()[-2] == "1"  # the slowest rank
    phase_rows = [line.split() for line in text.splitlines() if line.startswith("selftest.imbalance") and "work" in line]
    assert [row[2] for row in phase_rows] == ["0", "1"]  # one row per rank
    assert phase_rows[1][4] == "10.0"  # total us of rank 1


def test_many_ranks_name_the_slowest(tmp_path):
    n = PER_RANK_ROWS_MAX_RANKS + 2
    text = report(load_run(make_run(tmp_path, n, slow_rank=3)))
    assert "slowest rank" in text and "dropped records: 0" in text
    work = next(line.split() for line in text.splitlines() if line.startswith("selftest.imbalance") and " work " in line)
    assert work[2] == str(n)  # spans
    assert work[-2] == "3" and work[-1] == "10.0"  # slowest rank and its total us


def test_host_to_gpu_start_column(tmp_path):
    run = load_run(make_run(tmp_path, 2, slow_rank=0))
    assert "host->GPU start" not in report(run)  # no host times recorded
    run.launches["host_begin_ns"] = run.launches["gpu_begin_ns"] - 5_000
    line = next(x for x in report(run).splitlines() if x.startswith("selftest.imbalance") and x.rstrip().endswith("5.0"))
    assert line


def test_timed_out_wait_is_shown_as_the_pages_show_it():
    """issue 18: `epscope report ep-timeout` showed rank 0's 1 s timed-out wait as 0.0 µs."""
    from pathlib import Path
    traces = Path(__file__).resolve().parents[2] / "traces"
    text = report(traces / "ep-timeout")
    assert "OPEN SPANS: 144" in text and "longest: rank 0 dispatch/wait_data 1 s" in text
    row = next(l for l in text.splitlines() if l.startswith("dispatch  wait_data      0"))
    assert "1,000,015.1" in row                      # its median span: 1 s, not 0.0 µs
    assert "critical path: ALARM timeout: rank 0 waited 1 s in dispatch/wait_data on rank 1" in text


def test_report_names_the_late_entry_like_the_pages():
    from pathlib import Path
    traces = Path(__file__).resolve().parents[2] / "traces"
    text = report(traces / "ep-host-late")
    notify = next(l for l in text.splitlines() if l.startswith("notify ") and "rank 1 (host)" in l)
    assert notify
    for page in ("critical path", "idle warps", "barriers"):
        line = next(l for l in text.splitlines() if l.startswith(f"  {page}: ALARM"))
        assert "late entry" in line and "rank 1 entered the op late (host side" in line


def test_a_stored_run_is_reported_from_its_stored_results_without_reading_events(tmp_path, monkeypatch):
    """issue 31: `epscope report` of an analysed run reads RUN/analysis/, not the event table, and
    prints what the computation prints; a run analysed in several chunks prints what the whole
    table gives (the report's medians selected exactly over the chunks)."""
    import shutil
    from pathlib import Path

    from profiler.analysis import chunked, stored
    from profiler.store.runreader import Run
    from profiler.groundtruth.synthetic import make_events
    ev, la, man = make_events(ranks=4, events=40_000, scenario="late_host", iterations=4, seed=6)
    d = write_run(tmp_path / "r", ev, la, man, perfetto=False)
    whole = report(d)                                    # computed, one chunk (no stored results)
    monkeypatch.setattr(chunked, "MAX_EVENTS", len(ev) // 4)
    assert report(d) == whole                            # computed in chunks of one iteration
    stored.store_run(d)
    monkeypatch.setattr(Run, "events", property(lambda self: (_ for _ in ()).throw(AssertionError("events read"))))
    assert report(d) == whole                            # from the stored results
    traces = Path(__file__).resolve().parents[2] / "traces"
    shutil.copytree(traces / "ep-timeout", tmp_path / "t", ignore=shutil.ignore_patterns("*.perfetto-trace"))
    assert stored.load(tmp_path / "t") is not None       # the bundled run's stored results are current
    assert "OPEN SPANS: 144" in report(tmp_path / "t")
