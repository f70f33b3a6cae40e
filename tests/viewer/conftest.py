from __future__ import annotations

import pytest

from viewer import results

from . import runs


@pytest.fixture(autouse=True)
def _viewer_keeps_results_in_a_temporary_cache(monkeypatch, tmp_path_factory):
    """What the viewer computes for a run nobody analysed goes to a cache of this test's own
    (viewer.results), never into a run directory unless a test asks: a test must not change the
    bundled runs in the checkout (a stale-results test analyses one), nor find another test's."""
    monkeypatch.setenv(results.STORE_ENV, "cache")
    monkeypatch.setenv(results.CACHE_ENV, str(tmp_path_factory.mktemp("results-cache")))


@pytest.fixture(scope="session")
def run_root(tmp_path_factory):
    """A root with a few small synthetic runs and every kind of broken run."""
    root = tmp_path_factory.mktemp("viewer-runs")
    good = runs.synthetic(root, "balanced")
    runs.synthetic(root, "starved", "starvation")
    runs.synthetic(root, "late", "late_arriver")
    runs.synthetic(root / "ab", "a1", "ab", variant="a", seed=1)
    runs.synthetic(root / "ab", "b1", "ab", variant="b", seed=2)
    bad = root / "bad"
    runs.broken_runs(bad, good)
    runs.empty_run(bad, good)
    runs.timeout_run(root, good)
    runs.same_name_copy(root, good)
    outside = tmp_path_factory.mktemp("outside-the-root")
    runs.synthetic(outside, "good-run")
    runs.linked_out(root / "links", outside)
    return root
