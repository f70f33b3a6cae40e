"""`epscope merge`, `check` and `report` on a run with PyTorch traces: aligned traces are attached
and named in the report; a trace of another run is refused with nothing written; a stored trace
changed afterwards makes `epscope check` report the run damaged."""
from __future__ import annotations

import shutil

from profiler.commands.cli import main
from profiler.store.runstore import write_run
from profiler.torchtrace.kineto import write_kineto

from .fake import BASE, fake_events


def _copy(upstream, tmp_path):
    return write_run(tmp_path / "run", upstream["events"], upstream["launches"], upstream["manifest"], perfetto=False)


def test_merge_then_report_names_the_gemm(upstream, tmp_path, capsys):
    run = _copy(upstream, tmp_path)
    assert main(["merge", str(run), *map(str, upstream["traces"])]) == 0
    out = capsys.readouterr().out
    assert "rank 0: 9 launches joined (0 labels unmatched)" in out and "rank 1: 9 launches joined" in out
    assert main(["check", str(run)]) == 0
    assert main(["report", str(run)]) == 0
    rep = capsys.readouterr().out
    assert "PyTorch profiler traces merged" in rep
    assert "rank 1 entered dispatch" in rep and "its GPU was running aten::mm" in rep and "moe.py:112" in rep


def test_a_trace_of_another_run_is_refused_and_nothing_written(upstream, tmp_path, capsys):
    run = _copy(upstream, tmp_path)
    tr = fake_events(upstream["launches"], 0, "another-run")
    p = write_kineto(tmp_path / "other.json", tr.events, base_ns=BASE, rank=0, world_size=2)
    assert main(["merge", str(run), str(p)]) == 2
    err = capsys.readouterr().err
    assert "another run" in err and "'another-run'" in err
    assert not (run / "torch").exists()
    assert "torch_profiler" not in (run / "manifest.json").read_text()


def test_check_finds_a_changed_trace(upstream, tmp_path, capsys):
    run = _copy(upstream, tmp_path)
    assert main(["merge", str(run), *map(str, upstream["traces"])]) == 0
    f = run / "torch" / "rank1.trace.json.gz"
    b = bytearray(f.read_bytes())
    b[-5] ^= 0xFF
    f.write_bytes(bytes(b))
    assert main(["check", str(run)]) == 1
    assert "checksum mismatch" in capsys.readouterr().out
    shutil.rmtree(run / "torch")
    assert main(["check", str(run)]) == 1
    assert "missing" in capsys.readouterr().out


def test_the_stored_summary_names_the_op_after_merge(upstream, tmp_path, capsys):
    from profiler.analysis import summary
    run = _copy(upstream, tmp_path)
    assert main(["analyze", str(run)]) == 0
    assert summary.load(run)["op_before_entry"] is None          # no traces yet
    assert main(["merge", str(run), *map(str, upstream["traces"])]) == 0
    assert "updated" in capsys.readouterr().out                   # merge refreshed the stored summary
    f = summary.load(run)["op_before_entry"]
    assert (f["late_entry"]["rank"], f["late_entry"]["kernel"], f["late_entry"]["side"], f["late_entry"]["op"]) == \
        (1, "dispatch", "gpu", "aten::mm")
    assert f["late_entry"]["stack"] == "moe.py:112" and set(f["ranks"]) == {"0", "1"}
