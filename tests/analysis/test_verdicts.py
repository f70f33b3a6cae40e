"""Every page's headline verdict names the planted cause of every run that declares one.

Runs: every run directory under traces/ whose manifest has an `expect` block (profiler.groundtruth.expect;
the ground-truth catalogue writes them), the bundled runs recorded before that (their truth is in
tests/analysis/expectations.py), and runs outside the repository: directories named by
EPSCOPE_VERDICT_RUNS (os.pathsep-separated) or `pytest --verdict-runs DIR[,DIR]`, searched
recursively for run directories with an expect block. Synthetic runs with planted truths (their
own registry, profiler.groundtruth.synthetic) and hand-made timeouts check the same verdicts on known tables.

Checks compare fields (cause, rank, peer, kernel, phase, direction), never sentences. Which page
must name which cause, and with which fields ("-": the page cannot see it and is not checked):

    expected cause      critical path                idle warps                   barriers
    none                no alarm                     no alarm                     no alarm
    timeout             timeout + rank peer k/p      timeout + rank peer k/p      timeout + rank peer k/p
    rank_imbalance      an alarm is rank_imbalance   rank_imbalance + rank,       an alarm names the rank
                        naming the rank              kernel/phase among named
    host_bound          host_bound + rank            an alarm names the rank      barrier_straggler + rank
                                                                                  (when the run has
                                                                                  cross-rank barriers and
                                                                                  one rank is planted)
    starved_warps       -                            starved_warps + rank,        -
                                                     kernel among those named
    barrier_straggler   an alarm names the rank      an alarm names the rank      barrier_straggler + rank
                                                                                  kernel phase
    useless_arrivals    -                            -                            useless_arrivals + kernel
                                                                                  phase
    late entry, material (expect.late_entry 'host' with host_bound, 'gpu' with rank_imbalance):
                        cause + rank + the same      an alarm names the rank      an alarm naming the rank
                        late_entry side                                           (when the run has
                                                                                  cross-rank barriers)
    late entry under the alarm share (cause none, late_entry set): any alarm of any page names that
                        rank and side (a page may name it; nothing else may be called)

The timeout's fields are those of the stalled wait that started it (profiler.analysis.timeouts):
every page leads with it. A straggler is seen by the critical path only through the time the
others wait on it: at 2 ranks the catalogue's skews (1.5x and 2x the rows) leave the exchange no
longer (both ranks' dispatch kernels end together) and cost 3-19% of an iteration, under the 25%
alarm; the idle page, which sees the work itself, must name it, and the critical path must not
name anything else. Host-bound names no kernel: the others wait for a late host at the
next rendezvous, wherever the delay was planted. A late entry (issue 24: a random host delay
before every op, an upstream GEMM on one rank) is decided by late_entry.py for every page alike;
its side says where the lateness came from, so a host delay named 'gpu' (or the reverse) fails.
Upstream GPU work is rank_imbalance, not host_bound: the late rank's own work, not its host, made
the others wait; it names no kernel (the others wait at whichever rendezvous comes next). Comparisons (runs whose expect has a
`comparison`, grouped by its group): same_code -> the Compare verdict raises no alarm; knob_change
-> a knob_change verdict whose row for the planted kernel/phase (the kernel's time when the phase
is null, end-to-end when both are) has the planted direction; with one run on a side nothing may
be called (run-to-run noise cannot be estimated).
"""
from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest

from profiler.analysis import barrier_contention, compare, critical_path, idle_warps
from profiler.analysis import stats as S
from profiler.groundtruth.expect import Cause, Expect, from_manifest
from profiler.store.runstore import load_run
from profiler.store import validate
from profiler.groundtruth.synthetic import make_events
from tests.analysis.expectations import BUNDLED
from tests.analysis.tables import TEST_REGISTRY, barrier, span, table

TRACES = Path(__file__).resolve().parents[2] / "traces"
ENV = "EPSCOPE_VERDICT_RUNS"


# -- the runs -------------------------------------------------------------------------------
def _run_dirs(root: Path):
    return sorted(p.parent for p in root.rglob("manifest.json") if (p.parent / "events.parquet").exists())


def _expect_of(path: Path, bundled: bool) -> Expect | None:
    try:
        manifest = json.loads((path / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    e = from_manifest(manifest)
    if e is None and bundled:
        e = BUNDLED.get(str(manifest.get("name") or path.name))
    return e


def collect_runs(extra: list[str]) -> list[tuple[str, Path, Expect]]:
    out = []
    roots = [(TRACES, True)] + [(Path(p), False) for p in extra if p]
    for root, bundled in roots:
        if not root.exists():
            raise FileNotFoundError(f"verdict runs: {root} does not exist")
        for d in _run_dirs(root):
            e = _expect_of(d, bundled)
            if e is not None:
                out.append((str(d.relative_to(root)) if bundled else str(d), d, e))
    return out


def _extra_roots(config) -> list[str]:
    raw = [os.environ.get(ENV, "")] + [config.getoption("verdict_runs", default=None) or ""]
    return [p for r in raw for p in r.replace(",", os.pathsep).split(os.pathsep) if p]


def pytest_generate_tests(metafunc):
    if "recorded" in metafunc.fixturenames or "group" in metafunc.fixturenames:
        runs = collect_runs(_extra_roots(metafunc.config))
    if "recorded" in metafunc.fixturenames:
        metafunc.parametrize("recorded", [(p, e) for _, p, e in runs], ids=[n for n, _, _ in runs])
    if "group" in metafunc.fixturenames:
        groups = defaultdict(list)
        for _, p, e in runs:
            if e.comparison is not None:
                groups[e.comparison.group].append((p, e))
        items = sorted(groups.items())
        metafunc.parametrize("group", [g for _, g in items], ids=[k for k, _ in items])


# -- the matrix -----------------------------------------------------------------------------
def _fields(v, e: Expect, *names):
    for n in names:
        want = getattr(e, n)
        if want is not None:
            assert getattr(v, n) == want, f"{v.page}: {n} {getattr(v, n)!r} != planted {want!r}: {v.headline}"


def _names_place(v, e: Expect, phase: bool):
    if e.kernel is not None:
        assert v.names(e.kernel, e.phase if phase else None), f"{v.page} names {v.where}, planted {e.kernel}/{e.phase}"


def _alarm_names_rank(v, e: Expect):
    if v.alarm and e.rank is not None:
        assert v.rank == e.rank, f"{v.page} raised an alarm about rank {v.rank}, planted rank {e.rank}: {v.headline}"


def check_late_entry(e: Expect, cp, iw, bc, has_rank_barriers: bool):
    """A planted late entry (the matrix's last two rows)."""
    if e.cause is Cause.NONE:
        for v in (cp, iw, bc):
            if v.alarm:
                assert v.rank == e.rank and v.late_entry == e.late_entry, \
                    f"{v.page} called something other than the planted late entry (rank {e.rank}, " \
                    f"{e.late_entry}) under the alarm share: {v.headline}"
        return
    assert cp.alarm and cp.cause is e.cause and cp.late_entry == e.late_entry, \
        f"critical path: {cp.cause.value}, late_entry {cp.late_entry!r}, planted {e.cause.value} " \
        f"{e.late_entry!r}: {cp.headline}"
    _fields(cp, e, "rank")
    _alarm_names_rank(iw, e)
    if has_rank_barriers:
        assert bc.alarm and bc.rank == e.rank, f"barriers: {bc.headline}"


def check_verdicts(e: Expect, cp, iw, bc, has_rank_barriers: bool):
    c = e.cause
    if e.late_entry is not None:
        check_late_entry(e, cp, iw, bc, has_rank_barriers)
        return
    if c is Cause.NONE:
        for v in (cp, iw, bc):
            assert not v.alarm, f"{v.page} raised an alarm on a run with nothing planted: {v.headline}"
        return
    if c is Cause.TIMEOUT:
        for v in (cp, iw, bc):
            assert v.alarm and v.cause is Cause.TIMEOUT, f"{v.page}: {v.headline}"
            _fields(v, e, "rank", "peer", "kernel", "phase")
        return
    if c is Cause.RANK_IMBALANCE:
        if cp.alarm:
            assert cp.cause is Cause.RANK_IMBALANCE, cp.headline
            _fields(cp, e, "rank")
        assert iw.alarm and iw.cause is Cause.RANK_IMBALANCE, iw.headline
        _fields(iw, e, "rank")
        _names_place(iw, e, phase=True)
        _alarm_names_rank(bc, e)
        return
    if c is Cause.HOST_BOUND:
        assert cp.alarm and cp.cause is Cause.HOST_BOUND, cp.headline
        _fields(cp, e, "rank")
        _alarm_names_rank(iw, e)
        if has_rank_barriers and e.rank is not None:     # every rank's host: no one rank arrives last
            assert bc.alarm and bc.cause is Cause.BARRIER_STRAGGLER, bc.headline
            _fields(bc, e, "rank")
        return
    if c is Cause.STARVED_WARPS:
        assert iw.alarm and iw.cause is Cause.STARVED_WARPS, iw.headline
        _fields(iw, e, "rank")
        _names_place(iw, e, phase=False)
        return
    if c is Cause.BARRIER_STRAGGLER:
        _alarm_names_rank(cp, e)
        _alarm_names_rank(iw, e)
        assert bc.alarm and bc.cause is Cause.BARRIER_STRAGGLER, bc.headline
        _fields(bc, e, "rank", "kernel", "phase")
        return
    if c is Cause.USELESS_ARRIVALS:
        assert bc.alarm and bc.cause is Cause.USELESS_ARRIVALS, bc.headline
        _fields(bc, e, "kernel", "phase")
        return
    raise AssertionError(f"no verdict rule for planted cause {c}")


def analyse(events, registry, launches=None):
    cp = critical_path(events, registry=registry, launches=launches)
    iw = idle_warps(events, registry=registry, launches=launches)
    bc = barrier_contention(events, registry=registry, launches=launches)
    # cross-rank barriers with someone to wait: on one rank nobody arrives last at them
    rank_barriers = (bool(len(bc.occurrences)) and bool((bc.occurrences["scope"] == "rank").any())
                     and events["rank"].nunique() > 1)
    return cp.verdict, iw.verdict, bc.verdict, rank_barriers


# -- recorded runs --------------------------------------------------------------------------
def test_recorded_run_verdicts(recorded):
    path, e = recorded
    run = load_run(path)
    cp, iw, bc, rb = analyse(run.events, run.manifest.get("registry"), run.launches)
    check_verdicts(e, cp, iw, bc, rb)


def check_comparison(runs: list[tuple[object, Expect]]):
    a = [r for r, e in runs if e.comparison.side == "A"]
    b = [r for r, e in runs if e.comparison.side == "B"]
    assert a and b, "a comparison group needs runs on both sides"
    c = compare(a, b)
    assert not c.refused, c.refused
    v, ce = c.verdict, runs[0][1].comparison
    if min(len(a), len(b)) < 2:
        assert not v.alarm and v.direction is None, v.headline     # one run a side: noise unknown
        return
    if ce.outcome is Cause.SAME_CODE:
        assert not v.alarm and v.cause is Cause.SAME_CODE, v.headline
        return
    assert v.alarm and v.cause is Cause.KNOB_CHANGE, v.headline
    rows = (c.end_to_end if ce.kernel is None else
            c.per_phase[(c.per_phase["kernel"] == ce.kernel) & (c.per_phase["phase"] == (ce.phase or ""))])
    assert len(rows) == 1 and rows.iloc[0]["verdict"] == ce.direction.value, rows.to_dict("records")


def test_recorded_comparison_verdicts(group):
    check_comparison([(load_run(p), e) for p, e in group])


# -- synthetic runs with planted truths (their own registry) ------------------------------------
SYNTHETIC = {
    "balanced": (dict(scenario="balanced"), Expect(cause=Cause.NONE)),
    "slow_rank": (dict(scenario="slow_rank", slow_rank=2), Expect(cause=Cause.RANK_IMBALANCE, rank=2)),
    "starvation": (dict(scenario="starvation", starved_rank=1, active_blocks=1, blocks=6),
                   Expect(cause=Cause.STARVED_WARPS, rank=1, kernel="dispatch")),
    "late_arriver": (dict(scenario="late_arriver", late_rank=2, late_block=1, late_warp=3, late_ns=60_000),
                     Expect(cause=Cause.BARRIER_STRAGGLER, rank=2, kernel="dispatch", phase="grid")),
    "late_host": (dict(scenario="late_host", late_rank=1, late_ns=60_000), Expect(cause=Cause.HOST_BOUND, rank=1)),
    # issue 24's plants, synthetic until the two-GPU recordings land (profiler.groundtruth.synthetic): a random
    # host delay before every kernel (host side), unrecorded GPU work before every dispatch (GPU side)
    "synthetic_late_host_random": (dict(scenario="late_host_random", late_rank=1, late_ns=120_000),
                                   Expect(cause=Cause.HOST_BOUND, rank=1, late_entry="host")),
    "synthetic_upstream_gpu": (dict(scenario="upstream_gpu", late_rank=2, late_ns=60_000),
                               Expect(cause=Cause.RANK_IMBALANCE, rank=2, late_entry="gpu")),
    # the same random host delay, small (a 10 µs bound: ~6 % of an iteration on the critical path): nothing called
    "synthetic_late_host_random_small": (dict(scenario="late_host_random", late_rank=1, late_ns=10_000),
                                         Expect(cause=Cause.NONE)),
}


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_synthetic_run_verdicts(name):
    kw, e = SYNTHETIC[name]
    ev, launches, man = make_events(**{"ranks": 3, "blocks": 4, "chunks": 6, "iterations": 3, "seed": 3, **kw})
    check_verdicts(e, *analyse(ev, man["registry"], launches))


def test_synthetic_comparisons():
    kw = dict(ranks=2, blocks=2, chunks=6, iterations=6, scenario="ab")
    from profiler.groundtruth.expect import ComparisonExpect, Direction
    knob = [(make_events(seed=s, variant=v, ab_factor=1.5, **kw)[0],
             Expect(cause=Cause.NONE, comparison=ComparisonExpect(
                 group="ab", side=side, replicate=s, outcome=Cause.KNOB_CHANGE, knob="ab_factor",
                 kernel="dispatch", phase="send_chunk", direction=Direction.SLOWER)))
            for s in range(3) for v, side in (("a", "A"), ("b", "B"))]
    check_comparison(knob)
    same = [(make_events(seed=10 + s, variant="a", **kw)[0],
             Expect(cause=Cause.NONE, comparison=ComparisonExpect(group="aa", side="AB"[s % 2], replicate=s // 2,
                                                                   outcome=Cause.SAME_CODE)))
            for s in range(6)]
    check_comparison(same)
    check_comparison(knob[:2])          # one run a side: nothing called


# -- a hand-made timeout --------------------------------------------------------------------------
def test_a_rank_that_never_sends_is_a_timeout_on_every_page():
    # rank 1's receivers get rank 0's rows; rank 0's receivers wait for rank 1's, which never come
    # (open wait_data, payload 1); rank 1 then waits at the next op's rank_start for rank 0, which
    # never arrives; both kernels stop at their 1 ms timeout
    rows = [span(0, 0, 0, "send_chunk", 0, 100, launch=0), span(1, 0, 1, "copy_out", 120, 200, launch=0),
            span(0, 0, 1, "wait_data", 50, 50, 1, launch=0)]
    rows += barrier(1, 0, 0, "rank_start", 300, 300, kernel="combine", launch=1)
    ev = table(rows)
    ev = ev[~((ev["kind"] == "depart") & (ev["rank"] == 1))].reset_index(drop=True)   # never departed
    ev.loc[ev["phase"] == "wait_data", "open"] = True
    import pandas as pd
    launches = pd.DataFrame({"rank": [0, 1, 1], "launch": [0, 0, 1], "kernel": ["dispatch", "dispatch", "combine"],
                             "iteration": [0, 0, 0], "host_begin_ns": -1, "host_end_ns": -1,
                             "gpu_begin_ns": [0, 100, 300], "gpu_end_ns": [1_000_050, 200, 1_000_300],
                             "regions": 1, "dropped": 0})
    cp, iw, bc, rb = analyse(ev, TEST_REGISTRY, launches)
    e = Expect(cause=Cause.TIMEOUT, rank=0, peer=1, kernel="dispatch", phase="wait_data")
    check_verdicts(e, cp, iw, bc, rb)
    assert cp.magnitude_ns == 1_000_000           # from its begin (50) to the kernel's stop (1,000,050)
    assert any("then rank 1 waited" in f for f in cp.facts)   # the barrier wait that followed, on rank 0


def test_every_annotated_run_is_bundled():
    names = {json.loads((d / "manifest.json").read_text()).get("name") for d in _run_dirs(TRACES)}
    assert set(BUNDLED) <= names


def test_the_verdict_test_finds_runs_outside_the_repository(tmp_path):
    from profiler.groundtruth.synthetic import make_run
    from profiler.store.runstore import load_run as _load
    p = make_run(tmp_path / "outside" / "late", ranks=2, blocks=2, chunks=3, iterations=2, scenario="late_host",
                 late_rank=1, late_ns=60_000, perfetto=False)
    m = json.loads((p / "manifest.json").read_text())
    m["expect"] = Expect(cause=Cause.HOST_BOUND, rank=1).to_json()
    (p / "manifest.json").write_text(json.dumps(validate.sealed(m)))   # what is planted is sealed with the run
    found = collect_runs([str(tmp_path / "outside")])
    mine = [x for x in found if x[1] == p]
    assert len(mine) == 1 and mine[0][2].cause is Cause.HOST_BOUND
    run = _load(p)
    check_verdicts(mine[0][2], *analyse(run.events, run.manifest["registry"], run.launches))
