"""profiler/analysis/distributed.py: `epscope analyze` with its chunks analysed on dask.distributed
workers stores the same results as the single-process analysis, byte for byte (every table, the
index, the what-if inputs, the Runs page's summary), on every bundled run and on synthetic runs
cut into chunks of one iteration. A LocalCluster of two workers (threads, processes=False: CI's
2-core box; `epscope analyze --workers N` starts processes, tested once below)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install -e '.[dask]')")

from profiler.commands import cli                                          # noqa: E402
from profiler.analysis import chunked, stored, summary           # noqa: E402
from profiler.analysis.distributed import DaskEngine             # noqa: E402
from profiler.store.runstore import write_run                          # noqa: E402
from profiler.groundtruth.synthetic import make_events                       # noqa: E402

# a second cluster while the module's is up (the --workers test) warned "Port 8787 is already in use"
pytestmark = pytest.mark.filterwarnings("error::UserWarning")

TRACES = Path(__file__).resolve().parents[2] / "traces"
RUNS = sorted(p.parent.name for p in TRACES.glob("*/events.parquet"))


@pytest.fixture(scope="module")
def engine():
    with DaskEngine.local(2, processes=False) as e:
        yield e


def _files(run: Path) -> dict[str, bytes]:
    """Every file of the stored results and the summary, by path inside the run."""
    out = {summary.FILE: (run / summary.FILE).read_bytes()}
    for p in sorted((run / stored.DIR).rglob("*")):
        if p.is_file():
            out[str(p.relative_to(run))] = p.read_bytes()
    return out


def _assert_same_stored(run: Path, engine) -> None:
    stored.store_run(run)
    alone = _files(run)
    stored.store_run(run, engine=engine)
    spread = _files(run)
    assert sorted(alone) == sorted(spread)
    for k in alone:
        assert alone[k] == spread[k], f"{run.name}: {k} differs between one process and the Dask workers"
    assert [p.name for p in run.iterdir() if p.name.startswith(".")] == []     # no work directory left


@pytest.mark.parametrize("name", RUNS)
def test_bundled_runs_store_the_same_results_on_dask_workers(name, engine, tmp_path, monkeypatch):
    run = tmp_path / name
    shutil.copytree(TRACES / name, run, ignore=shutil.ignore_patterns(stored.DIR, summary.FILE, "*.perfetto-trace"))
    monkeypatch.setattr(chunked, "MAX_EVENTS", 1)            # one iteration a chunk: the most chunks
    _assert_same_stored(run, engine)


@pytest.mark.parametrize("scenario", ["slow_rank", "late_host", "starvation"])
def test_synthetic_runs_store_the_same_results_on_dask_workers(scenario, engine, tmp_path, monkeypatch):
    ev, la, man = make_events(ranks=4, events=50_000, scenario=scenario, iterations=5, seed=11)
    run = write_run(tmp_path / "r", ev, la, man, perfetto=False)
    monkeypatch.setattr(chunked, "MAX_EVENTS", 1)
    _assert_same_stored(run, engine)
    got = stored.load(run)
    assert got.what_if is not None and len(got.what_if.chunks) == 5


def test_epscope_analyze_workers_starts_a_local_cluster_of_processes(tmp_path, monkeypatch, capsys):
    ev, la, man = make_events(ranks=2, events=20_000, scenario="slow_rank", iterations=3, seed=12)
    run = write_run(tmp_path / "r", ev, la, man, perfetto=False)
    monkeypatch.setattr(chunked, "MAX_EVENTS", 1)
    stored.store_run(run)
    alone = _files(run)
    # the worker processes read the run's chunks as the CLI process cuts them: MAX_EVENTS is passed
    # as a chunk plan (iterations), not read by the workers
    assert cli.main(["analyze", str(run), "--workers", "2"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert _files(run) == alone


def test_workers_below_one_are_refused(tmp_path, capsys):
    assert cli.main(["analyze", str(tmp_path), "--workers", "0"]) == cli.EXIT_USAGE
    assert "at least one worker" in capsys.readouterr().err
