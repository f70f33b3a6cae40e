"""viewer.jobs: one job per key, priorities, a worker kept free for the page the user opens,
failures as messages, bounded threads and records. Jobs are held on events, never on sleeps."""
from __future__ import annotations

import threading
import time

import pytest

from viewer import jobs as J

T = 30   # seconds a test waits for a state before failing


def _gate():
    go, started = threading.Event(), threading.Event()

    def fn():
        started.set()
        assert go.wait(T)
    return go, started, fn


def test_one_job_per_key_while_it_is_active():
    jobs = J.Jobs(workers=2)
    go, started, fn = _gate()
    calls = []
    a = jobs.submit(("r", "x"), lambda: (calls.append(1), fn()), "x")
    assert started.wait(T)
    assert jobs.submit(("r", "x"), lambda: calls.append(2), "x") is a and a.state == J.RUNNING
    go.set()
    assert jobs.wait([("r", "x")], T)
    assert calls == [1] and jobs.get(("r", "x")).state == J.DONE
    b = jobs.submit(("r", "x"), lambda: calls.append(3), "x")   # finished: asking again runs it again
    assert b is not a and jobs.wait([("r", "x")], T) and calls == [1, 3]


def test_wanted_jobs_run_before_jobs_computed_ahead():
    jobs = J.Jobs(workers=1)
    go, started, fn = _gate()
    order = []
    jobs.submit("block", fn)
    assert started.wait(T)
    jobs.submit("a", lambda: order.append("a"), priority=J.AHEAD)
    jobs.submit("b", lambda: order.append("b"), priority=J.AHEAD)
    jobs.submit("c", lambda: order.append("c"), priority=J.WANTED)
    jobs.submit("b", lambda: order.append("never"), priority=J.WANTED)   # asked again by a page: moves up
    go.set()
    assert jobs.wait(["a", "b", "c"], T)
    assert order == ["b", "c", "a"]


def test_one_worker_stays_free_of_jobs_computed_ahead():
    jobs = J.Jobs(workers=2)
    go1, started1, fn1 = _gate()
    go2, started2, fn2 = _gate()
    jobs.submit("ahead-1", fn1, priority=J.AHEAD)
    jobs.submit("ahead-2", fn2, priority=J.AHEAD)
    assert started1.wait(T)
    done = threading.Event()
    jobs.submit("page", done.set, priority=J.WANTED)
    assert done.wait(T)                        # ran beside ahead-1 ...
    assert jobs.get("ahead-2").state == J.QUEUED and not started2.is_set()   # ... ahead-2 waits its turn
    go1.set()
    assert started2.wait(T)
    go2.set()
    assert jobs.wait(["ahead-1", "ahead-2"], T)


def test_a_failure_is_a_message_and_the_worker_goes_on():
    jobs = J.Jobs(workers=1)

    def boom():
        raise ValueError("no phase 'x'\n  in this run")
    jobs.submit("bad", boom, "critical path")
    assert jobs.wait(["bad"], T)
    bad = jobs.get("bad")
    assert bad.state == J.FAILED and bad.error == "ValueError: no phase 'x' in this run"
    assert jobs.submit("bad", boom) is not bad            # a new ask tries again
    ok = threading.Event()
    jobs.submit("next", ok.set)
    assert ok.wait(T) and jobs.threads == 1


def test_threads_and_records_are_bounded():
    jobs = J.Jobs(workers=2, keep=5, max_queued=40)   # the queue's own bound: test_a_flood_is_refused_busy
    for i in range(40):
        jobs.submit(i, lambda: None, priority=i % 2)
    assert jobs.wait(range(40), T)
    assert jobs.threads == 2
    assert len(jobs._finished) == 5 and not jobs.active()
    assert jobs.get(39).state == J.DONE and jobs.get(0) is None


def test_wait_gives_up_at_its_timeout_and_a_job_reports_its_step():
    jobs = J.Jobs(workers=1)
    go, started = threading.Event(), threading.Event()

    def fn():
        J.current().step = "reading 10 events"
        started.set()
        assert go.wait(T)
    job = jobs.submit("slow", fn, "timeline index")
    assert started.wait(T)
    assert jobs.wait(["slow"], 0.01) is False
    assert job.step == "reading 10 events" and job.elapsed() >= 0 and J.current() is None
    go.set()
    assert jobs.wait(["slow"], T)


def test_a_flood_is_refused_busy_not_queued():
    """Issue 19: the what-if queue was never bounded (a 30 s flood kept the server busy 75 s
    after its clients left)."""
    jobs = J.Jobs(workers=1, max_queued=3)
    go, started, fn = _gate()
    jobs.submit("running", fn)
    assert started.wait(T)
    for i in range(3):
        jobs.submit(("what-if", i), lambda: None)
    with pytest.raises(J.Busy, match="busy"):
        jobs.submit(("what-if", 99), lambda: None)
    assert jobs.submit(("what-if", 1), lambda: None).state == J.QUEUED   # asking again for a queued one is fine
    assert jobs.submit("ahead", lambda: None, priority=J.AHEAD).state == J.QUEUED   # ahead-of-time work is bounded per run
    go.set()
    assert jobs.wait(["running", ("what-if", 0), ("what-if", 1), ("what-if", 2), "ahead"], T)


def test_queued_jobs_nobody_asks_for_are_dropped_before_they_run():
    """Polls stop (the tab closed, another value picked): the job is cancelled, not computed."""
    jobs = J.Jobs(workers=1, abandon_s=0.2)
    go, started, fn = _gate()
    ran = []
    jobs.submit("running", fn)
    assert started.wait(T)
    jobs.submit("left", lambda: ran.append("left"))
    kept = jobs.submit("polled", lambda: ran.append("polled"))
    deadline = time.monotonic() + 0.6
    while time.monotonic() < deadline:      # one page keeps polling, the other has gone
        jobs.submit("polled", lambda: ran.append("again"))
        time.sleep(0.05)
    go.set()
    assert jobs.wait(["running", "polled", "left"], T)
    assert ran == ["polled"] and kept.state == J.DONE and jobs.cancelled == 1
