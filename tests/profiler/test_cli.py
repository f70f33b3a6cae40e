"""profiler.cli (`epscope`): commands, lazily imported subcommands, and one-line errors with exit 2."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from profiler import cli
from profiler.decode import LaunchInfo, decode_launches
from profiler.registry import load_all
from profiler.runstore import FORMAT_VERSION, write_run
from profiler.schema import empty_events

from .bufbuild import random_buffer

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


def test_export_default_and_explicit_out(run_dir, tmp_path, capsys):
    pytest.importorskip("perfetto", reason="perfetto package not installed")
    assert cli.main(["export", str(run_dir)]) == 0
    assert (run_dir / "trace.perfetto-trace").stat().st_size > 0
    out = tmp_path / "x.perfetto-trace"
    assert cli.main(["export", str(run_dir), "-o", str(out)]) == 0
    assert out.read_bytes() == (run_dir / "trace.perfetto-trace").read_bytes()
    assert "wrote" in capsys.readouterr().out


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


@pytest.mark.parametrize("cmd", ["report", "export"])
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
    (ROOT / "traces").mkdir(exist_ok=True)
    assert cli.main(["view"]) == 0
    assert calls == [([ROOT / "traces"], "127.0.0.1", 8050)]
    assert cli.main(["view", str(tmp_path), "--port", "9000", "--host", "0.0.0.0"]) == 0
    assert calls[-1] == ([tmp_path.resolve()], "0.0.0.0", 9000)


def test_view_missing_root_is_clear(tmp_path, capsys):
    assert cli.main(["view", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err


@pytest.mark.parametrize("sub, module", [("trace", "ep_core.trace"), ("selftest", "profiler.record.selftest")])
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
