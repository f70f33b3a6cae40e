"""The analyses on the bundled H200 traces (traces/README.md says what each one plants)."""
from pathlib import Path

import numpy as np
import pytest

from profiler.analysis import barrier_contention, critical_path, idle_warps, what_if
from profiler.runstore import load_run

TRACES = Path(__file__).resolve().parents[2] / "traces"


def _run(name):
    p = TRACES / name
    assert (p / "manifest.json").exists(), f"bundled trace {name} is tracked in git and missing from this checkout"
    r = load_run(p)
    return r.events, r.manifest.get("registry")


def test_starved_warps_verdict_names_the_planted_idle_blocks_and_warps():
    ev, reg = _run("selftest-starved-warps")
    v = idle_warps(ev, registry=reg).verdict
    assert "blocks 16–127 did no work" in v
    assert "warps 1–3 of blocks 0–15" in v and "16 warps carried all work" in v


def test_grid_barrier_names_the_planted_last_arriver():
    ev, reg = _run("selftest-grid-barrier")
    s = barrier_contention(ev, registry=reg).summary.iloc[0]
    assert (s["last_block"], s["last_warp"], s["last_share"]) == (7, 2, 1.0)


@pytest.mark.parametrize("name", ["ep-balanced", "ep-rank-skew", "ep-timeout",
                                  "selftest-two-gpu-clock-sync"])
def test_ep_paths_are_contiguous_and_end_at_the_gpu_end(name):
    ev, reg = _run(name)
    cp = critical_path(ev, registry=reg)
    assert not cp.segments.empty
    gpu_end = ev[ev["block"] >= 0].groupby("iteration")["end_ns"].max()
    for it, seg in cp.segments.groupby("iteration"):
        b, e = seg["begin_ns"].to_numpy(), seg["end_ns"].to_numpy()
        assert np.all(b[1:] == e[:-1])
        assert e[-1] == gpu_end.loc[it]
        assert seg["share"].sum() <= 1.0 + 1e-9


def test_ep_what_if_on_the_path_phase_never_lengthens():
    ev, reg = _run("ep-balanced")
    w = what_if(ev, phase="reduce", speedup=0.5, registry=reg)
    assert (w.summary["change_ns"] <= 0).all() and (w.summary["change_ns"] < 0).any()
    assert (w.summary["absorbed_pct"].dropna() <= 100.0 + 1e-9).all()
