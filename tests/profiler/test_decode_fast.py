"""profiler.decode.decode_fast: the compiled record loop, how it is chosen, built and loaded.

Its results are held equal to the reference decoder by the differential tests (every engine in
tests/profiler/differential.ENGINES); these tests cover what those cannot see: engine choice,
the wider code variants, the JIT fallback and the cold load without numba.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from profiler.decode import decode as D
from profiler.generated import layout as L

from tests.needs import needs_module

from .bufbuild import Region, anchor, build
from .differential import ENGINES, REG, REGISTRIES, T0, check

numba = needs_module("numba", "the compiled loop needs the `fast` extra: pip install -e '.[fast]'", module_level=True)
from profiler.decode import decode_fast as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _unknown_ids_buffer(first_id: int, count: int) -> bytes:
    """One region of `count` INSTANTs with ids the selftest registry does not declare."""
    recs = [(T0 + 10 * k, L.KIND_INSTANT, first_id + k, k) for k in range(count)]
    return build([Region(recs)], registry_hash=REG.hash, capacity=count)


def test_engines_are_checked_against_the_reference():
    assert ENGINES == ("numpy", "numba", "numba-jit")


def test_unknown_engine_names_the_choices():
    buf = _unknown_ids_buffer(1000, 2)
    with pytest.raises(ValueError, match="numba-jit"):
        D.decode_launches([(buf, D.LaunchInfo(0, 0, "k", 0, "selftest"))], REGISTRIES, engine="fast")


def test_phase_codes_past_int8():
    """130 unknown names widen the phase column to int16 after the first launch: the next launch
    is decoded by the int16 variant, and every engine agrees with the reference."""
    items = [(_unknown_ids_buffer(1000, 130), D.LaunchInfo(0, 0, "k", 0, "selftest")),
             (_unknown_ids_buffer(2000, 3), D.LaunchInfo(0, 1, "k", 1, "selftest"))]
    check(items)
    d = D.decode_launches(items, REGISTRIES, engine="numba")
    assert d.events["phase"].cat.codes.dtype == np.int16
    assert d.events["phase"].iloc[-1] == "phase_2002"


def _format_2_launch(anchors: bool) -> bytes:
    """One format-2 region of two spans at 1.98 GHz, with an ANCHOR between them or without."""
    c0, work = 9_000_000_000, REG.phase("work").id
    recs = [(c0 + c, L.KIND_BEGIN if k % 2 == 0 else L.KIND_END, work, 0) for k, c in enumerate((0, 198, 990, 1980))]
    if anchors:
        recs.insert(2, anchor(T0 + 505, c0 + 1000))
    r = Region(recs, gt_start=T0, clk_start=c0, gt_end=T0 + round(2000 / 1.98), clk_end=c0 + 2000)
    return build([r], registry_hash=REG.hash, capacity=8, version=2)


def test_the_anchor_search_runs_only_for_launches_whose_loop_met_an_anchor(monkeypatch):
    """The compiled engine plans a launch's clocks without format 2's anchor search; a launch where
    the loop met an ANCHOR is planned again with it and decoded again (the numpy engine searches
    every launch). Both agree with the reference decoder either way."""
    items = [(_format_2_launch(anchors=k == 1), D.LaunchInfo(0, k, "k", k, "selftest")) for k in range(3)]
    searched = []
    real = D._Plan._anchored
    monkeypatch.setattr(D._Plan, "_anchored", lambda self, *a: (searched.append(self.info.launch), real(self, *a))[1])
    d = D.decode_launches(items, REGISTRIES, engine="numba")
    assert searched == [1] and d.conversion["anchors"] == 1
    searched.clear()
    assert D.decode_launches(items, REGISTRIES, engine="numpy").conversion["anchors"] == 1
    assert searched == [0, 1, 2]
    check(items)


def test_jit_runs_when_the_ahead_of_time_build_cannot(monkeypatch, tmp_path):
    """A failed build is tried once per machine and source version, then the JIT runs."""
    tries = []

    def no_compiler(where=None):
        tries.append(where)
        raise OSError("no C compiler")
    monkeypatch.setenv("EPSCOPE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(F, "build_aot", no_compiler)
    for _ in range(2):
        with pytest.warns(RuntimeWarning, match="no C compiler"):
            k = F.Kernels()
        assert (k.how, k.build_error) == ("jit", "OSError: no C compiler")
    assert len(tries) == 1
    assert k.get(np.int8, np.int8) is k.get(np.int16, np.int8)  # one dispatcher, compiled per width


def test_a_fresh_process_decodes_without_importing_numba():
    """With the ahead-of-time build on disk, the cold decode does not pay numba's import and
    first-call setup (~0.5 s CPU on the dev VM, benchmarks/NOTES.md)."""
    F.kernels()  # builds it if this machine has none yet
    code = "\n".join([
        "import sys",
        "from profiler.decode import decode as D",
        "from profiler.generated import layout as L",
        "from profiler.registry.registry import load_all",
        "from tests.profiler.bufbuild import Region, build",
        "reg = load_all()['selftest']",
        f"buf = build([Region([({T0} + k, L.KIND_INSTANT, 1000 + k, 0) for k in range(4)])], registry_hash=reg.hash, capacity=4)",
        "d = D.decode_launches([(buf, D.LaunchInfo(0, 0, 'k', 0, 'selftest'))], {'selftest': reg}, engine='numba')",
        "assert len(d.events) == 4",
        "print('numba' in sys.modules)"])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False", out.stderr


def test_the_build_is_keyed_on_this_file(monkeypatch, tmp_path):
    monkeypatch.setenv("EPSCOPE_CACHE_DIR", str(tmp_path))
    a = F.aot_dir()
    assert a.parent == tmp_path / "decode"
    monkeypatch.setattr(F, "__file__", str(ROOT / "profiler" / "decode" / "decode_records.py"))
    assert F.aot_dir() != a


def _clock_model(rng: np.random.Generator):
    """Ranks 0 and 1 with fractional offsets (ties of rint among them), and drifts of zero, of a
    real GPU's size and far past it, anchored near the buffers' times."""
    from profiler.decode.align import ClockModel, RankClock
    clocks = {}
    for r in (0, 1):
        offset = float(rng.choice([0.0, 0.5, -0.5, 1.5, -1234.25, float(rng.normal(0, 5e4))]))
        drift = float(rng.choice([0.0, -0.0, 3.7, -12.5, 1e3, float(rng.normal(0, 50))]))
        clocks[r] = RankClock(r, offset_ns=offset, drift_ppm=drift, uncertainty_ns=40.0,
                              anchor_ns=T0 + int(rng.integers(-10**6, 10**6)))
    return ClockModel(clocks, t0_ns=T0 - int(rng.integers(0, 10**9)))


def _table(items, clock, engine):
    from .differential import REGISTRIES
    try:
        d = D.decode_launches(items, REGISTRIES, clock, engine=engine)
    except Exception as e:  # noqa: BLE001  (the same error from every engine)
        return type(e).__name__
    ev = d.events
    return ({c: ev[c].astype(object).tolist() for c in ev.columns}, d.launches.astype(object).to_dict("records"),
            sorted((type(w).__name__, w.count) for w in d.warnings))


@pytest.mark.parametrize("seed", range(40))
def test_the_loop_maps_times_as_the_clock_model_does(seed):
    """With a clock model the compiled loop writes run-timeline times itself (decode_fast.time_map);
    the numpy loop's table maps raw times with ClockModel.to_run_timeline afterwards: equal."""
    from .differential import random_case
    rng = np.random.default_rng(seed)
    items, clock = random_case(rng), _clock_model(rng)
    want = _table(items, clock, "numpy")
    for engine in ENGINES[1:]:
        assert _table(items, clock, engine) == want, engine


def test_time_map_is_rank_clock_arithmetic():
    from profiler.decode.align import RankClock
    t = np.array([T0 - 7, T0, T0 + 1, T0 + 123_456_789, 1, 2**62 - 1], np.int64)
    for off, drift in ((0.5, 0.0), (-0.5, 0.0), (2.5, 0.0), (-1234.75, 7.3), (0.25, -1e3)):
        rc = RankClock(0, off, drift, 1.0, anchor_ns=T0 + 1000)
        add, frac, k, anchor, on = F.time_map(-T0 + 5, rc)
        got = t + add + np.rint(frac + k * (t - anchor).astype(np.float64)).astype(np.int64) if k else t + add
        assert on and got.tolist() == (rc.to_ref(t) - np.int64(T0 - 5)).tolist()
    assert F.time_map(0)[-1] is False and F.time_map(-5)[0] == -5
