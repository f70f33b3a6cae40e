"""The event checks' compiled loops (profiler/store/checks_fast.py) against the numpy checks they
stand in for: "every row passes" only where the numpy check passes, and on the writer's layout
(every bundled run) they do answer it, so the numpy check is not what runs there."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from profiler.errors import InconsistentRun
from profiler.store import checks_fast, schema, validate
from profiler.store.runreader import EventReader, load_run

pytestmark = pytest.mark.skipif(not checks_fast.enabled(checks_fast.MIN_ROWS),
                                reason="no compiled loops here (numba absent)")
TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = sorted(p.parent.relative_to(TRACES).as_posix() for p in TRACES.rglob("manifest.json"))
HOST = schema.EVENT_KINDS.index("host")


def _table(rng, lanes: int, per_lane: int, values: int) -> pd.DataFrame:
    """Rows in the writer's layout: each lane (rank, launch, block, warp) in one run, begins
    non-decreasing within it (ties frequent), other columns drawn from `values` values (so rows
    equal in every column occur by chance)."""
    n_rows = rng.integers(1, per_lane + 1, lanes)
    lane = np.repeat(np.arange(lanes), n_rows)
    n = len(lane)
    begin = np.concatenate([np.sort(rng.integers(0, 3 * k, k)) for k in n_rows]).astype(np.int64)
    kind = rng.integers(0, len(schema.EVENT_KINDS) - 1, n)       # GPU rows (ids >= 0)
    df = pd.DataFrame({
        "rank": (lane % 3).astype(np.int16), "launch": (lane // 3 % 5).astype(np.int32),
        "kernel": pd.Categorical.from_codes(rng.integers(0, 2, n), ["a", "b"]),
        "iteration": rng.integers(0, values, n).astype(np.int32), "sm": rng.integers(0, values, n).astype(np.int16),
        "block": (lane // 15).astype(np.int32), "warp": (lane % 2).astype(np.int16),
        "role": pd.Categorical.from_codes(rng.integers(0, 2, n), ["r", "s"]),
        "kind": pd.Categorical.from_codes(kind, dtype=schema.KIND_DTYPE),
        "phase": pd.Categorical.from_codes(rng.integers(0, values, n), [f"p{i}" for i in range(values)]),
        "begin_ns": begin, "end_ns": begin + rng.integers(0, values, n), "payload": rng.integers(0, values, n),
        "open": rng.integers(0, 2, n).astype(bool)})
    return schema.coerce_events(df)


def _numpy_finds_repeats(df) -> bool:
    return bool(df.duplicated().any())


def _shuffled_runs(df, rng) -> pd.DataFrame:
    """Rows moved out of the writer's layout: a block of rows moved elsewhere (a lane in two runs,
    or begins out of order)."""
    i, j = sorted(rng.choice(len(df), 2, replace=False))
    order = np.r_[np.arange(i), np.arange(j, len(df)), np.arange(i, j)]
    return df.iloc[order].reset_index(drop=True)


@pytest.mark.parametrize("seed", range(60))
def test_no_repeats_says_none_only_where_there_are_none(seed):
    rng = np.random.default_rng(seed)
    df = _table(rng, lanes=int(rng.integers(1, 40)), per_lane=int(rng.integers(1, 12)), values=int(rng.integers(1, 4)))
    if seed % 4 == 1 and len(df) > 1:             # a row repeated right after itself or further down its lane
        i = int(rng.integers(0, len(df)))
        df = pd.concat([df.iloc[: i + 1], df.iloc[[i]], df.iloc[i + 1:]], ignore_index=True)
    if seed % 4 == 2 and len(df) > 2:
        df = _shuffled_runs(df, rng)
    got = checks_fast.no_repeats(df)
    if _numpy_finds_repeats(df):
        assert not got
    elif seed % 4 == 0:
        assert got, "the writer's layout without repeats: the compiled check answers"


def test_a_lane_split_in_two_runs_is_left_to_the_numpy_check():
    rng = np.random.default_rng(0)
    df = _table(rng, lanes=6, per_lane=5, values=50)
    assert checks_fast.no_repeats(df)
    # a copy of the first row appended at the end: its lane now has two runs, begins in order in each
    df = pd.concat([df, df.iloc[[0]]], ignore_index=True)
    assert not checks_fast.no_repeats(df)
    with pytest.raises(InconsistentRun, match=f"row {len(df) - 1} repeats row 0"):
        validate.no_duplicate_rows(df)


def test_a_long_block_of_one_lane_and_begin_is_left_to_the_numpy_check():
    rng = np.random.default_rng(1)
    df = _table(rng, lanes=1, per_lane=1, values=2)
    n = checks_fast.BLOCK_LIMIT + 1
    df = df.iloc[np.zeros(n, int)].reset_index(drop=True)
    df["payload"] = np.arange(n, dtype=np.int64)     # equal lane and begin, no two rows equal
    assert not checks_fast.no_repeats(df)
    validate.no_duplicate_rows(df)
    assert checks_fast.no_repeats(df.iloc[:-1])


def _damaged(df, rng, how: str) -> pd.DataFrame:
    df = df.copy()
    i = int(rng.integers(0, len(df)))
    col = df.columns.get_loc
    if how == "negative id":
        c = str(rng.choice(["rank", "launch", "iteration"]))
        df.iloc[i, col(c)] = -1
    elif how == "-1 on a GPU row":
        df.iloc[i, col(str(rng.choice(["sm", "block", "warp"])))] = -1
    elif how == "below -1":
        df.iloc[i, col(str(rng.choice(["sm", "block", "warp"])))] = -2
    elif how == "end before begin":
        df.iloc[i, col("end_ns")] = df["begin_ns"].iat[i] - 1
    elif how == "time out of range":
        df.iloc[i, col(str(rng.choice(["begin_ns", "end_ns"])))] = schema.TIME_LIMIT_NS + 1
        df.iloc[i, col("end_ns")] = max(df["end_ns"].iat[i], df["begin_ns"].iat[i])
    elif how == "host row":   # -1 ids are fine on host rows
        df.iloc[i, col("kind")] = "host"
        df.iloc[i, [col("sm"), col("block"), col("warp")]] = -1
    return df


DAMAGE = ["negative id", "-1 on a GPU row", "below -1", "end before begin", "time out of range", "host row", "none"]


@pytest.mark.parametrize("seed", range(42))
def test_rows_ok_passes_exactly_what_the_numpy_checks_pass(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    how = DAMAGE[seed % len(DAMAGE)]
    df = _damaged(_table(rng, lanes=int(rng.integers(1, 30)), per_lane=6, values=5), rng, how)
    monkeypatch.setattr(checks_fast, "ENGINE", "numpy")
    try:
        schema.validate_events(df)
        numpy_ok = True
    except schema.SchemaError:
        numpy_ok = False
    assert numpy_ok == (how in ("none", "host row")), how
    assert checks_fast.rows_ok(df, schema.MIN_VALUE, HOST, schema.TIME_LIMIT_NS) == numpy_ok, how


@pytest.mark.parametrize("name", RUNS)
def test_every_bundled_run_is_checked_by_the_compiled_loops(name):
    """The writer's layout holds on every bundled run (a read of it runs no numpy check), and the
    numpy checks agree that nothing is wrong."""
    run = load_run(TRACES / name)
    with EventReader(run) as r:
        ev = r.read()
    assert checks_fast.no_repeats(ev) and not _numpy_finds_repeats(ev)
    assert checks_fast.rows_ok(ev, schema.MIN_VALUE, HOST, schema.TIME_LIMIT_NS)


def test_other_code_widths_are_left_to_numpy():
    """A column of more than 127 names has int16 codes: no compiled variant, the numpy checks run."""
    df = _table(np.random.default_rng(3), lanes=4, per_lane=4, values=3)
    df["phase"] = df["phase"].cat.set_categories([f"p{i}" for i in range(200)])
    assert df["phase"].cat.codes.dtype == np.int16
    assert not checks_fast.no_repeats(df)
    validate.no_duplicate_rows(df)


def test_codes8_matches_numpy():
    """codes8 narrows dictionary indices as runreader's numpy code does, and answers None for an
    index outside [-1, n), for n past int8 codes and for indices of another width."""
    rng = np.random.default_rng(0)
    for seed in range(50):
        n = int(rng.integers(1, 127))
        parts = [rng.integers(-1, n, int(rng.integers(0, 2000))).astype(np.int32) for _ in range(int(rng.integers(1, 5)))]
        got = checks_fast.codes8(parts, n)
        want = np.concatenate(parts, dtype=np.int8, casting="unsafe")
        assert got.dtype == np.int8 and np.array_equal(got, want), f"seed {seed}"
        bad = [p.copy() for p in parts]
        j = max(range(len(bad)), key=lambda i: len(bad[i]))
        if len(bad[j]):
            bad[j][int(rng.integers(0, len(bad[j])))] = rng.choice([-2, n, n + 200, -300])
            assert checks_fast.codes8(bad, n) is None, f"seed {seed}"
    assert checks_fast.codes8([np.zeros(3, np.int32)], 127) is None
    assert checks_fast.codes8([np.zeros(3, np.int64)], 5) is None
