"""Issue 32's findings, one test each (every one failed on the commit before the issue's changes:
benchmarks/NOTES.md, issue 32, names the run): stale results shown as current, stored analyses
without integrity, an unprotected manifest and its downgrade, tables inconsistent with each other,
special and oversized files, the overwrite fallback, and paths that broke the commands' output.
The tests use the APIs that existed before the changes (write_run, load_run, check_run,
update_manifest, stored/summary load and store_run, the CLI)."""
from __future__ import annotations

import json
import os
import random
import shutil
import threading
from pathlib import Path

import pandas as pd
import pytest

from profiler.commands import cli
from profiler.store import runstore as RS
from profiler.analysis import stored, summary
from profiler.errors import EpscopeError
from profiler.groundtruth.synthetic import make_events, make_run

from .damage import RESEALED, _rewritten, as_written_before_checksums, flip_bit, readers

T = 30


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A run as this epscope writes it, its analyses stored."""
    p = make_run(tmp_path_factory.mktemp("integrity") / "base", ranks=2, events=800, perfetto=False)
    stored.store_run(p)
    return p


@pytest.fixture
def run(base, tmp_path) -> Path:
    return Path(shutil.copytree(base, tmp_path / "run"))


def _edit_manifest(run: Path, edit) -> None:
    m = json.loads((run / RS.MANIFEST).read_text())
    edit(m)
    (run / RS.MANIFEST).write_text(json.dumps(m))


def _refused_everywhere(run: Path, tmp_path: Path) -> None:
    res = readers(run, tmp_path / "out.pftrace")
    assert all(state not in ("ok", "UNTYPED") for state, _ in res.values()), res


# -- stale results shown as current -----------------------------------------------------------------
def test_a_run_rewritten_while_analyze_runs_does_not_get_the_old_results_marked_current(run, monkeypatch):
    """`epscope analyze` took the data hashes when it wrote its results: a run re-recorded while it
    ran showed the old run's verdicts for the new data (2 of 3 trials)."""
    for f in ("analysis", summary.FILE):
        p = run / f
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    other = make_events(ranks=2, events=800, scenario="slow_rank", seed=3)
    real = summary.analyze

    def analyze_then_rewrite(r, **kw):
        res = real(r, **kw)
        RS.write_run(run, *other, perfetto=False, overwrite=True)   # re-recorded before the results are stored
        return res
    monkeypatch.setattr(summary, "analyze", analyze_then_rewrite)
    stored.store_run(run)
    monkeypatch.undo()
    assert summary.load(run) is None and stored.load(run) is None


def test_a_registry_changed_through_update_manifest_makes_stored_results_stale(run):
    assert stored.load(run) is not None and summary.load(run) is not None
    reg = json.loads((run / RS.MANIFEST).read_text())["registry"]
    fam = sorted(reg)[0]
    reg[fam]["phases"] = [{**p, "wait": not p.get("wait", False)} if i == 0 else p
                          for i, p in enumerate(reg[fam]["phases"])]
    RS.update_manifest(run, {"registry": reg})
    assert stored.load(run) is None and summary.load(run) is None


# -- stored analyses without integrity ------------------------------------------------------------------
def _change_json(p: Path, edit) -> None:
    doc = json.loads(p.read_text())
    edit(doc)
    p.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")


def test_an_edited_summary_is_not_served_and_check_reports_it(run, capsys):
    _change_json(run / summary.FILE, lambda d: d.update(op_latency_ns=(d.get("op_latency_ns") or 0) * 2 + 1))
    assert summary.load(run) is None
    assert cli.main(["check", str(run)]) == cli.EXIT_DAMAGED
    assert summary.FILE in capsys.readouterr().out


def test_an_edited_stored_verdict_is_not_served_and_check_reports_it(run, capsys):
    def edit(d):
        v = d["reports"]["critical_path"]["verdict"]
        v["alarm"] = not v["alarm"]
    _change_json(run / stored.DIR / stored.INDEX, edit)
    assert stored.load(run) is None
    assert cli.main(["check", str(run)]) == cli.EXIT_DAMAGED
    assert stored.DIR in capsys.readouterr().out


def test_bit_flips_in_stored_results_are_never_served(run, tmp_path):
    rng = random.Random(32)
    for i in range(12):
        d = Path(shutil.copytree(run, tmp_path / f"c{i}"))
        target = d / summary.FILE if i % 2 else d / stored.DIR / stored.INDEX
        flip_bit(target, rng)
        assert (summary.load(d) if i % 2 else stored.load(d)) is None, i


# -- the manifest, unprotected ------------------------------------------------------------------------------
@pytest.mark.parametrize("edit", [
    lambda m: m.update(world_size=m.get("world_size", 2) + 6),
    lambda m: m["clock"]["ranks"][1].update(offset_ns=m["clock"]["ranks"][1].get("offset_ns", 0) + 5e5),
    lambda m: m.update(name="another-run"),
    lambda m: m["registry"][sorted(m["registry"])[0]]["phases"][0].update(kind="instant"),
    lambda m: m["drops"].update(per_rank=[0] * 8),
], ids=["ranks", "clock", "name", "registry", "drops"])
def test_a_valid_but_lying_manifest_is_refused(run, tmp_path, edit):
    """85 of 114 valid-but-lying manifests passed with "checksums verified"."""
    _edit_manifest(run, edit)
    _refused_everywhere(run, tmp_path)


def test_a_sealed_run_edited_back_to_format_1_is_not_read_as_unverified(run, tmp_path):
    """format_version 1 and the checksums deleted turned verification off: 62 of 150 flips of
    events.parquet were silent, and the viewer listed such runs as plain "ok"."""
    def downgrade(m):
        m["format_version"] = 1
        for k in ("checksums", "seal"):
            m.pop(k, None)
    _edit_manifest(run, downgrade)
    _refused_everywhere(run, tmp_path)


def test_runs_written_before_checksums_are_listed_as_not_verified(tmp_path):
    from viewer.catalog import Catalog
    from viewer.pages.runs import logic as runs_logic
    traces = Path(__file__).resolve().parents[2] / "traces"
    as_written_before_checksums(shutil.copytree(traces / "ep-balanced", tmp_path / "ep-balanced"))
    status = runs_logic.runs_table(Catalog([tmp_path], workers=1).entries())["status"].iloc[0]
    assert "NOT VERIFIED" in status


# -- tables inconsistent with each other ---------------------------------------------------------------------
@pytest.mark.parametrize("kind", list(RESEALED))
def test_tables_rewritten_inconsistent_with_valid_checksums_are_refused(run, tmp_path, kind):
    """34 of 130 rewritten with valid checksums were accepted although inconsistent; duplicate
    launch keys crashed report and analyze."""
    name, change = RESEALED[kind]
    _rewritten(name, change)(run, random.Random(kind))
    _refused_everywhere(run, tmp_path)


# -- special and oversized files -------------------------------------------------------------------------------
def _returns(fn, timeout=T):
    out = {}

    def go():
        try:
            out["value"] = fn()
        except Exception as e:   # noqa: BLE001
            out["error"] = e
    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), "hung (a FIFO opened for reading blocks until a writer comes)"
    return out


def test_a_fifo_as_the_summary_or_the_index_does_not_hang_its_readers(run):
    """A FIFO analysis-summary.json hung the Runs page, then every request got 503; a FIFO
    analysis/results.json blocked both job workers."""
    (run / summary.FILE).unlink()
    os.mkfifo(run / summary.FILE)
    os.unlink(run / stored.DIR / stored.INDEX)
    os.mkfifo(run / stored.DIR / stored.INDEX)
    assert _returns(lambda: summary.load(run)).get("value") is None
    assert _returns(lambda: stored.load(run)).get("value") is None


def test_a_summary_linked_out_of_the_viewer_roots_is_not_read(run, tmp_path):
    from viewer.catalog import Catalog
    from viewer.pages.runs import logic as runs_logic
    outside = tmp_path / "outside"
    outside.mkdir()
    shutil.move(run / summary.FILE, outside / summary.FILE)
    os.symlink(outside / summary.FILE, run / summary.FILE)
    root = tmp_path / "root"
    root.mkdir()
    shutil.move(run, root / "run")
    row = runs_logic.runs_table(Catalog([root], workers=1).entries()).iloc[0]
    assert row["op_latency"] == runs_logic.NOT_ANALYSED


def test_an_oversized_summary_is_not_read(run):
    """A 90 MB summary added 2.2 GB kept by the Runs page's cache (this one: 2 MB, valid JSON)."""
    _change_json(run / summary.FILE, lambda d: d.update(padding="x" * (2 << 20)))
    assert summary.load(run) is None


def test_a_kernel_name_of_a_megabyte_is_refused(run, tmp_path):
    """A 1 MB kernel name made report and analyze ask for 4 GB."""
    def long_name(df, rng):
        k = df["kernel"].astype(str)
        long = "k" * (1 << 20)
        df["kernel"] = pd.Categorical(k.where(k != k.iat[0], long))
        return df
    _rewritten("events.parquet", long_name)(run, random.Random(0))
    _rewritten("launches.parquet", long_name)(run, random.Random(0))
    _refused_everywhere(run, tmp_path)


def test_a_manifest_of_megabytes_is_refused(run, tmp_path):
    """A 4 MB manifest cost 94 MB for the viewer's lifetime (this one: 1 MB, valid, sealed as a
    writer would)."""
    from .damage import reseal
    _edit_manifest(run, lambda m: m.update(description="d" * (1 << 20)))
    reseal(run)
    _refused_everywhere(run, tmp_path)


# -- the overwrite fallback --------------------------------------------------------------------------------------
def test_a_crash_between_the_two_renames_of_an_overwrite_loses_no_run(run, tmp_path, monkeypatch):
    """Where the atomic swap is not available, a crash between the two renames, then the next
    write, deleted both the old and the new copy."""
    from profiler.store import atomic
    before = RS.load_run(run).events
    monkeypatch.setattr(atomic, "rename_exchange", lambda a, b: False)
    real_rename = os.rename
    calls = []

    def crash_on_second(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise SystemExit("killed between the two renames")   # the writer dies: nothing cleans up after it
        return real_rename(src, dst)
    monkeypatch.setattr(os, "rename", crash_on_second)
    monkeypatch.setattr(shutil, "rmtree", lambda *a, **k: None)   # a killed writer removes nothing
    ev, la, man = make_events(ranks=2, events=800, scenario="slow_rank", seed=5)
    with pytest.raises(SystemExit):
        RS.write_run(run, ev, la, man, perfetto=False, overwrite=True)
    monkeypatch.undo()
    RS.write_run(run.parent / run.name, ev, la, man, perfetto=False)   # the next write to that name
    runs = [p for p in run.parent.iterdir() if (p / RS.MANIFEST).exists() and not p.name.startswith(".")]
    assert any(RS.load_run(p).events.equals(before) for p in runs), "the only complete copy of the old run was deleted"
    assert (run / RS.MANIFEST).exists()


# -- paths --------------------------------------------------------------------------------------------------------
def test_a_directory_name_of_undecodable_bytes_gives_no_traceback(tmp_path, capsys, monkeypatch):
    p = os.fsdecode(bytes(tmp_path) + b"/run-\xff")
    make_run(p, ranks=2, events=800, perfetto=False)
    monkeypatch.setenv("EPSCOPE_EXPORT_DIR", str(tmp_path / "exports"))
    for cmd in (["report", p], ["export", p], ["analyze", p], ["check", p]):
        assert cli.main(cmd) == 0, cmd
    capsys.readouterr()


def test_a_newline_in_a_run_path_does_not_forge_a_line_of_check(tmp_path, capsys):
    make_run(tmp_path / "a\nb: ok (forged)", ranks=2, events=800, perfetto=False)
    make_run(tmp_path / "good", ranks=2, events=800, perfetto=False)
    assert cli.main(["check", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and all(line.startswith(str(tmp_path)) for line in lines), lines


def test_readers_refuse_with_a_typed_error_not_a_traceback(run, tmp_path):
    """What every test above refuses, it refuses typed (an EpscopeError), never a traceback."""
    (run / RS.EVENTS).unlink()
    os.mkfifo(run / RS.EVENTS)
    res = _returns(lambda: readers(run, tmp_path / "o.pftrace"))["value"]
    assert all(s not in ("ok", "UNTYPED") for s, _ in res.values()), res
    assert issubclass(type(RS.CorruptRun("x")), EpscopeError)
