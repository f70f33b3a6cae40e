"""Synthetic runs: schema, size, causality (every wait ends after its release), run directory."""
import numpy as np
import pytest

from profiler.store.schema import validate_events
from profiler.groundtruth.synthetic import SCENARIOS, make_events, make_run


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_schema_and_launches(scenario):
    ev, lt, man = make_events(ranks=3, blocks=4, chunks=2, iterations=2, scenario=scenario,
                              active_blocks=1, seed=1)
    validate_events(ev)
    assert set(ev["rank"]) == {0, 1, 2} and man["synthetic"]["scenario"] == scenario
    assert len(lt) == 3 * 3 * 2          # ranks x kernels x iterations
    assert (lt["gpu_end_ns"] >= lt["gpu_begin_ns"]).all()


def test_event_count_follows_the_target():
    ev, _, _ = make_events(ranks=4, events=300_000, seed=0)
    assert 0.8 * 300_000 < len(ev) < 1.2 * 300_000


def test_waits_end_after_their_release():
    ev, _, _ = make_events(ranks=3, blocks=2, chunks=5, iterations=1, seed=2)
    d = ev[ev["kernel"] == "dispatch"]
    tails = d[d["phase"] == "publish_tail"]
    waits = d[d["phase"] == "wait_data"]
    # chunk k from src s on channel b: k-th tail of (s -> rank) on block b, k-th wait of rank from s
    for (s, dst, b), t in tails.groupby(["rank", "payload", "block"]):
        w = waits[(waits["rank"] == dst) & (waits["payload"] == s) & (waits["block"] == b)]
        assert len(w) == len(t)
        assert np.all(w["end_ns"].to_numpy() >= t["begin_ns"].to_numpy())


def test_rejects_unknown_scenario():
    with pytest.raises(ValueError, match="scenario"):
        make_events(scenario="nope")


def test_make_run_writes_a_loadable_run(tmp_path):
    from profiler.store.runstore import load_run
    p = make_run(tmp_path / "run", ranks=2, blocks=2, chunks=2, iterations=1, scenario="late_arriver", perfetto=False)
    run = load_run(p)
    assert run.manifest["synthetic"]["scenario"] == "late_arriver"
    assert len(run.events) > 0 and list(run.manifest["registry"]) == ["synthetic_ep"]


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_synthetic_registry_declares_every_simulated_phase(scenario):
    from profiler.analysis import critical_path
    ev, _, man = make_events(ranks=2, blocks=2, chunks=2, iterations=1, scenario=scenario, active_blocks=1, seed=1)
    assert critical_path(ev, registry=man["registry"]).warnings == ()
