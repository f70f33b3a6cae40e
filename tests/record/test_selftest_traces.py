"""The bundled self-test traces (recorded on H200, traces/selftest-*) hold what their kernels
planted, as their manifests describe it; the analyses name it. CPU only: reads the run dirs."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from profiler.store.runstore import load_run

TRACES = Path(__file__).resolve().parents[2] / "traces"


def _run(name):
    path = TRACES / name
    assert (path / "manifest.json").exists(), f"{name} is tracked in git under traces/ and missing from this checkout"
    run = load_run(path)
    assert run.manifest["status"] == "ok" and run.manifest["gpu"]["name"].startswith("NVIDIA")
    assert run.manifest["drops"]["total"] == 0
    return run


def test_timer_resolution_trace():
    run = _run("selftest-timer-resolution")
    step = run.manifest["headline"]["globaltimer_min_step_ns"]
    assert step == run.manifest["clock"]["step_ns"] == 32  # measured-facts.md: 32 ns on H200
    ev = run.events
    ticks = ev[ev["phase"] == "tick"].sort_values(["launch", "block", "warp", "payload"])
    d = ticks.groupby(["launch", "block", "warp"])["begin_ns"].diff().dropna()
    assert (d % step == 0).all() and (d >= 0).all()


def test_starved_warps_trace_and_verdict():
    from profiler.analysis.idle import idle_warps

    run = _run("selftest-starved-warps")
    wl = run.manifest["workload"]
    ev = run.events
    work = ev[ev["phase"] == "work"]
    busy = {(b, w) for b in range(wl["busy_blocks"]) for w in range(wl["busy_warps"])}
    assert set(zip(work["block"], work["warp"])) == busy
    verdict = idle_warps(ev, registry=run.manifest["registry"]["selftest"]).verdict.headline
    assert f"blocks {wl['busy_blocks']}–{wl['grid'] - 1} did no work" in verdict, verdict
    assert f"warps {wl['busy_warps']}–{wl['warps'] - 1} of blocks 0–{wl['busy_blocks'] - 1}" in verdict, verdict
    assert f"{wl['busy_warp_count']} warps carried all work" in verdict, verdict


@pytest.mark.parametrize("name", ["selftest-grid-barrier", "selftest-two-gpu-clock-sync"])
def test_grid_barrier_last_arriver(name):
    run = _run(name)
    wl = run.manifest["workload"]
    arr = run.events[run.events["kind"] == "arrive"]
    last = arr.loc[arr.groupby(["rank", "launch", "payload"])["begin_ns"].idxmax()]
    assert set(zip(last["block"], last["warp"])) == {(wl["late_block"], wl["late_warp"])}


def test_two_gpu_trace_is_aligned():
    run = _run("selftest-two-gpu-clock-sync")
    clock = run.manifest["clock"]
    r1 = clock["ranks"][1]
    assert r1["rank"] == 1 and 0 < r1["uncertainty_ns"] < 5_000
    ev = run.events
    # the ranks started each iteration together (a host barrier): their launches overlap in time
    la = run.launches.sort_values(["iteration", "rank"])
    for _, g in la.groupby("iteration"):
        assert len(g) == 2
        assert g["gpu_begin_ns"].max() < g["gpu_end_ns"].min()
    host = ev[ev["kind"] == "host"]
    gpu = la.set_index(["rank", "launch"])
    for _, h in host.iterrows():  # each enqueue precedes its kernel's start (within the host clock's error)
        assert h["begin_ns"] <= gpu.loc[(h["rank"], h["launch"]), "gpu_begin_ns"] + clock["host"]["uncertainty_ns"]
    assert np.isfinite(r1["drift_ppm"])
