"""profiler.commands.cli (`epscope`): commands, lazily imported subcommands, and one-line errors with exit 2."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from profiler.commands import cli
from profiler.decode.decode import LaunchInfo, decode_launches
from profiler.registry.registry import load_all
from profiler.store.runstore import FORMAT_VERSION, load_run, write_run
from profiler.store.schema import empty_events

from tests.needs import needs_module

from .bufbuild import random_buffer
from .damage import as_written_before_checksums, reseal

REG = load_all()["selftest"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    rng = np.random.default_rng(11)
    items = [(random_buffer(rng, REG, n_regions=4, capacity=32), LaunchInfo(r, 0, "selftest.imbalance", 0, "selftest"))
             for r in range(2)]
    d = decode_launches(items, {"selftest": REG})
    return write_run(tmp_path_factory.mktemp("cli") / "run", d.events, d.launches,
                     {"name": "cli-run", "registry": {"selftest": REG.to_json()}}, perfetto=False)


def test_report(run_dir, capsys):
    assert cli.main(["report", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "run cli-run" in out and "selftest.imbalance" in out and "% warp time" in out
    assert "slowest rank" in out and "dropped records: 0" in out


def test_analyze_stores_the_analyses_and_the_summary(run_dir, tmp_path, capsys):
    import shutil

    from profiler.analysis import stored, summary
    d = tmp_path / "run"
    shutil.copytree(run_dir, d)
    assert cli.main(["analyze", str(d)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert stored.load(d) is not None and summary.load(d) is not None


def test_export_default_and_explicit_out(run_dir, tmp_path, capsys, monkeypatch):
    """Without -o the trace goes to the export directory, never into the run (a run may lie in a
    checkout, which must stay clean: issue 34), and the path is printed."""
    needs_module("perfetto", "pip install -e . (a base dependency)")
    monkeypatch.setenv("EPSCOPE_EXPORT_DIR", str(tmp_path / "exports" / "made"))   # made when missing
    before = sorted(p.name for p in run_dir.iterdir())
    assert cli.main(["export", str(run_dir)]) == 0
    (default,) = (tmp_path / "exports" / "made").iterdir()
    assert default == cli.default_export_path(load_run(run_dir)) and default.name.startswith("run-")
    assert f"wrote {default} (" in capsys.readouterr().out
    assert sorted(p.name for p in run_dir.iterdir()) == before
    assert cli.main(["export", str(run_dir)]) == 0   # a second export replaces the first
    out = tmp_path / "x.perfetto-trace"
    assert cli.main(["export", str(run_dir), "-o", str(out)]) == 0
    assert out.read_bytes() == default.read_bytes() and default.stat().st_size > 0


def test_export_default_place_is_outside_any_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("EPSCOPE_EXPORT_DIR")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert cli.export_dir() == tmp_path / ".cache" / "epscope" / "exports"
    a, b = (types.SimpleNamespace(path=tmp_path / d / "run") for d in ("x", "y"))
    assert cli.default_export_path(a) != cli.default_export_path(b), "same-named runs of two folders collide"


def _bad_runs(tmp_path, run_dir):
    import shutil
    corrupt = tmp_path / "corrupt"
    shutil.copytree(run_dir, corrupt)
    (corrupt / "events.parquet").write_bytes(b"nope")
    newer = tmp_path / "newer"
    shutil.copytree(run_dir, newer)
    m = json.loads((newer / "manifest.json").read_text())
    m["format_version"] = FORMAT_VERSION + 1
    (newer / "manifest.json").write_text(json.dumps(m))
    import pandas as pd
    empty = write_run(tmp_path / "empty", empty_events(), pd.DataFrame(columns=["rank"]).iloc[:0].reindex(
        columns=["rank", "launch", "kernel", "iteration", "host_begin_ns", "host_end_ns", "gpu_begin_ns", "gpu_end_ns",
                 "regions", "dropped"]), {}, perfetto=False)
    return {"missing": tmp_path / "missing", "corrupt": corrupt, "newer": newer, "empty": empty}


@pytest.mark.parametrize("cmd", ["report", "export", "analyze"])
@pytest.mark.parametrize("which, words", [("missing", "no such run"), ("corrupt", "parquet"),
                                          ("newer", "newer"), ("empty", "no events")])
def test_bad_runs_one_line_exit_2(run_dir, tmp_path, capsys, cmd, which, words):
    path = _bad_runs(tmp_path, run_dir)[which]
    assert cli.main([cmd, str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("epscope: error: ") and words in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_bad_run_via_python_m_has_no_traceback(tmp_path):
    p = subprocess.run([sys.executable, "-m", "profiler", "report", str(tmp_path / "nothing")], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2
    assert p.stderr.strip().startswith("epscope: error:") and "Traceback" not in p.stderr


def test_python_m_profiler_help():
    p = subprocess.run([sys.executable, "-m", "profiler", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0
    for c in ("export", "report", "view", "trace", "selftest"):
        assert c in p.stdout


def test_usage_error_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["frobnicate"])
    assert e.value.code == 2


def fake_module(monkeypatch, name, **attrs):
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    monkeypatch.setitem(sys.modules, name, mod)
    return mod


def test_view_defaults_to_repo_traces(monkeypatch, tmp_path):
    calls = []
    fake_module(monkeypatch, "viewer.app", serve=lambda roots, host, port: calls.append((roots, host, port)))
    assert (ROOT / "traces").is_dir()
    assert cli.main(["view"]) == 0
    assert calls == [([ROOT / "traces"], "127.0.0.1", 8050)]
    assert cli.main(["view", str(tmp_path), "--port", "9000", "--host", "::1"]) == 0
    assert calls[-1] == ([tmp_path.resolve()], "::1", 9000)


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.7", "::", "example.org"])
def test_view_on_the_network_needs_allow_remote_and_warns(monkeypatch, tmp_path, capsys, host):
    calls = []
    fake_module(monkeypatch, "viewer.app", serve=lambda roots, host, port: calls.append(host))
    assert cli.main(["view", str(tmp_path), "--host", host]) == 2
    err = capsys.readouterr().err
    assert calls == [] and "--allow-remote" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["view", str(tmp_path), "--host", host, "--allow-remote"]) == 0
    assert calls == [host] and "without authentication" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
def test_loopback_hosts(host):
    assert cli.is_loopback(host)


def test_view_missing_root_is_clear(tmp_path, capsys):
    assert cli.main(["view", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.parametrize("sub, module", [("trace", "profiler.workflows.trace"), ("selftest", "profiler.record.selftest")])
def test_passthrough_subcommands(monkeypatch, sub, module):
    seen = []
    fake_module(monkeypatch, module, main=lambda argv: seen.append(argv) or 3)
    assert cli.main([sub, "--ranks", "2", "--help"]) == 3
    assert seen == [["--ranks", "2", "--help"]]


def test_passthrough_missing_dependency_is_clear(monkeypatch, capsys):
    def boom(name, *a, **k):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")
    monkeypatch.setattr(cli.importlib, "import_module", boom)
    with pytest.raises(SystemExit) as e:
        cli.main(["trace"])
    assert e.value.code == 2
    assert "'torch'" in capsys.readouterr().err


# -- export's output is never destructive ------------------------------------------------------
@pytest.fixture()
def own_run(run_dir, tmp_path):
    """A copy of the module's run for tests that write into or around it."""
    import shutil
    own = Path(shutil.copytree(run_dir, tmp_path / "own"))
    (own / "trace.perfetto-trace").unlink(missing_ok=True)
    return own


def _one_line_exit_2(capsys, argv, *words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("epscope: error: ") and len(err.strip().splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def _snapshot(d: Path) -> dict:
    return {p.relative_to(d): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_export_refuses_to_write_inside_a_run(own_run, tmp_path, capsys):
    needs_module("perfetto", "pip install -e . (a base dependency)")
    before = _snapshot(own_run)
    for target in (own_run / "events.parquet", own_run / "manifest.json", own_run / "x.perfetto-trace"):
        _one_line_exit_2(capsys, ["export", str(own_run), "-o", str(target), "--force"], "inside the run directory")
    link = tmp_path / "link"
    link.symlink_to(own_run / "events.parquet")
    _one_line_exit_2(capsys, ["export", str(own_run), "-o", str(link), "--force"], "inside the run directory")
    assert _snapshot(own_run) == before


def test_export_replaces_a_file_only_with_force(run_dir, tmp_path, capsys):
    needs_module("perfetto", "pip install -e . (a base dependency)")
    out = tmp_path / "mine.txt"
    out.write_text("precious")
    _one_line_exit_2(capsys, ["export", str(run_dir), "-o", str(out)], "exists; add --force")
    assert out.read_text() == "precious"
    assert cli.main(["export", str(run_dir), "-o", str(out), "--force"]) == 0
    assert out.stat().st_size > 100


@pytest.mark.parametrize("where, words", [("dir", "is a directory"), ("missing/x.perfetto-trace", "does not exist")])
def test_export_to_a_directory_or_missing_parent_is_one_line(run_dir, tmp_path, capsys, where, words):
    (tmp_path / "dir").mkdir()
    before = sorted(p.name for p in tmp_path.rglob("*"))
    _one_line_exit_2(capsys, ["export", str(run_dir), "-o", str(tmp_path / where)], words)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before   # no .tmp left anywhere


def test_export_rewrites_the_runs_own_trace_when_asked(own_run, capsys):
    needs_module("perfetto", "pip install -e . (a base dependency)")
    for _ in range(2):   # the run's own trace, derived from its data, is replaced without --force
        assert cli.main(["export", str(own_run), "-o", str(own_run / "trace.perfetto-trace")]) == 0
    assert (own_run / "trace.perfetto-trace").stat().st_size > 0


# -- malformed runs: one line, exit 2, for report and export alike -----------------------------
def _manifest_change(p: Path, **changes):
    m = json.loads((p / "manifest.json").read_text())
    m.update(changes)
    (p / "manifest.json").write_text(json.dumps(m))


def _events_change(p: Path, col, make):
    import pyarrow as pa
    import pyarrow.parquet as pq
    t = pq.read_table(p / "events.parquet")
    meta = t.schema.metadata
    values = make(t.column(col).to_pylist(), t)
    t = t.set_column(t.column_names.index(col), col, pa.array(values))
    pq.write_table(t.replace_schema_metadata(meta), p / "events.parquet")
    reseal(p)   # malformed tables under matching checksums: the schema checks must catch them


MALFORMED = {
    "git-string": (lambda p: _manifest_change(p, git="abc"), "field 'git'"),
    "clock-list": (lambda p: _manifest_change(p, clock=[1, 2]), "field 'clock'"),
    "drops-total-string": (lambda p: _manifest_change(p, drops={"total": "many"}), "field 'drops.total'"),
    "format-version-true": (lambda p: _manifest_change(p, format_version=True), "format_version"),
    "format-version-0": (lambda p: _manifest_change(p, format_version=0), "format_version"),
    "format-version-minus-5": (lambda p: _manifest_change(p, format_version=-5), "format_version"),
    "deep-nesting": (lambda p: (p / "manifest.json").write_text('{"a": ' + "[" * 5000 + "]" * 5000 + "}"),
                     "nested deeper"),
    "string-timestamps": (lambda p: _events_change(p, "begin_ns", lambda v, t: [str(x) for x in v]), "begin_ns"),
    "nan-timestamps": (lambda p: _events_change(p, "end_ns", lambda v, t: [float("nan")] * len(v)), "end_ns"),
    "unknown-kind": (lambda p: _events_change(p, "kind", lambda v, t: ["teleport"] * len(v)), "kind"),
    "end-before-begin": (lambda p: _events_change(p, "end_ns", lambda v, t: [x - 1 for x in
                                                                            t.column("begin_ns").to_pylist()]),
                         "end before they begin"),
}


@pytest.mark.parametrize("cmd", ["report", "export"])
@pytest.mark.parametrize("case", list(MALFORMED))
def test_malformed_runs_one_line_exit_2(own_run, capsys, cmd, case):
    needs_module("perfetto", "pip install -e . (a base dependency)")
    breakage, words = MALFORMED[case]
    breakage(own_run)
    _one_line_exit_2(capsys, [cmd, str(own_run)], words)
    assert not (own_run / "trace.perfetto-trace").exists()    # export wrote nothing
    assert not cli.default_export_path(types.SimpleNamespace(path=own_run)).exists()


def test_malformed_run_via_python_m_has_no_traceback(own_run):
    _manifest_change(own_run, clock=[1, 2])
    p = subprocess.run([sys.executable, "-m", "profiler", "export", str(own_run)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


# -- progress ----------------------------------------------------------------------------------
def test_progress_is_quiet_when_stderr_is_not_a_terminal(run_dir, capsys):
    assert cli.main(["report", str(run_dir)]) == 0
    assert capsys.readouterr().err == ""


def test_progress_shows_on_a_terminal():
    import io
    import time

    from profiler.commands.progress import Activity

    class Tty(io.StringIO):
        def isatty(self):
            return True
    out = Tty()
    n = [0]
    with Activity("epscope export", watch=lambda: n[0], unit="B", what="written", stream=out) as a:
        a.step("writing the trace")
        n[0] = 2_500_000
        time.sleep(0.5)
    text = out.getvalue()
    assert "epscope export: writing the trace (2.50MB written)" in text


# -- issue 19: export's temporary files, FIFOs, `epscope check`, bad values ------------------------
def test_export_never_touches_a_file_or_link_at_the_old_temporary_name(own_run, tmp_path, capsys):
    """`export -o X` overwrote an existing X.tmp without --force and followed a symlink there
    (a user's file destroyed, a file outside the run overwritten); the default export did the
    same through RUN/trace.perfetto-trace.tmp."""
    out = tmp_path / "x.perfetto-trace"
    mine = tmp_path / "x.perfetto-trace.tmp"
    mine.write_bytes(b"a user's file")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"outside the run")
    os.symlink(elsewhere, own_run / "trace.perfetto-trace.tmp")
    assert cli.main(["export", str(own_run), "-o", str(out)]) == 0
    assert cli.main(["export", str(own_run), "-o", str(own_run / "trace.perfetto-trace")]) == 0
    assert mine.read_bytes() == b"a user's file" and elsewhere.read_bytes() == b"outside the run"
    assert out.stat().st_size > 0 and (own_run / "trace.perfetto-trace").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []   # no temporaries left


def test_export_force_replaces_only_regular_files(run_dir, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    _one_line_exit_2(capsys, ["export", str(run_dir), "-o", str(fifo), "--force"], "not a regular file")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    link = tmp_path / "link"
    (tmp_path / "target").write_bytes(b"t")
    os.symlink(tmp_path / "target", link)
    _one_line_exit_2(capsys, ["export", str(run_dir), "-o", str(link), "--force"], "not a regular file")
    assert (tmp_path / "target").read_bytes() == b"t" and link.is_symlink()


def test_export_leftovers_of_a_killed_export_are_cleaned(own_run, tmp_path, capsys):
    left = own_run / ".trace.perfetto-trace.0123456789ab.tmp"
    left.write_bytes(b"half a trace")
    assert cli.main(["export", str(own_run), "-o", str(own_run / "trace.perfetto-trace")]) == 0
    assert not left.exists()


def test_check_says_what_is_wrong_with_each_run(run_dir, tmp_path, capsys):
    import shutil
    good = Path(shutil.copytree(run_dir, tmp_path / "good"))
    flipped = Path(shutil.copytree(run_dir, tmp_path / "flipped"))
    b = bytearray((flipped / "events.parquet").read_bytes())
    b[len(b) // 2] ^= 1
    (flipped / "events.parquet").write_bytes(bytes(b))
    assert cli.main(["check", str(good)]) == 0
    assert "checksums verified" in capsys.readouterr().out
    assert cli.main(["check", str(good), str(flipped), str(tmp_path / "nope")]) == 1
    out = capsys.readouterr()
    lines = out.out.strip().splitlines()
    assert len(lines) == 3 and "ok" in lines[0]
    assert "CORRUPT" in lines[1] and "events.parquet" in lines[1] and "checksum" in lines[1]
    assert "no such run directory" in lines[2] and "2 of 3 runs damaged" in out.err
    old = as_written_before_checksums(shutil.copytree(run_dir, tmp_path / "old"))
    assert cli.main(["check", str(old)]) == 0
    assert "no checksums" in capsys.readouterr().out


@pytest.mark.parametrize("port", ["99999", "0", "-1", "http"])
def test_a_bad_port_is_a_usage_error_not_a_traceback(port, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["view", str(tmp_path), "--port", port])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "--port" in err


def test_view_of_a_fifo_or_file_is_one_line(tmp_path, capsys):
    os.mkfifo(tmp_path / "fifo")
    _one_line_exit_2(capsys, ["view", str(tmp_path / "fifo")], "not a directory")


def test_check_of_a_root_checks_every_run_under_it(tmp_path, run_dir, capsys):
    import shutil
    for name in ("a", "b"):
        shutil.copytree(run_dir, tmp_path / "root" / name)
    (tmp_path / "root" / "notes.txt").write_text("not a run")
    assert cli.main(["check", str(tmp_path / "root")]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 2
