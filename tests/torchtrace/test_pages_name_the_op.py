"""Every page, `epscope report` and the stored summary name the op before a late entry in the same
sentence (issue 30 item 4, with issue 29's one sentence per quantity): on the upstream-GEMM run of
conftest.py with its traces merged, where rank 1's GPU runs aten::mm before every dispatch."""
from __future__ import annotations

from profiler.analysis import summary
from profiler.commands.cli import main
from profiler.commands.report import report
from profiler.store.runstore import load_run, write_run
from profiler.torchtrace.report import LEAD_FACT, STEP_FACT


def _lines(v):
    return [v.headline, *v.facts, *v.notes]


def test_every_page_the_report_and_the_summary_name_the_op(upstream, tmp_path, capsys):
    from viewer import analyses
    from viewer.catalog import Catalog
    run = write_run(tmp_path / "run", upstream["events"], upstream["launches"], upstream["manifest"], perfetto=False)
    assert main(["merge", str(run), *map(str, upstream["traces"])]) == 0
    capsys.readouterr()
    cat = Catalog([run])
    loaded = cat.load(cat.ids()[0])
    pages = {p: analyses.verdict(loaded, p) for p in ("critical_path", "idle", "barriers")}
    said = {p: [x for x in _lines(v) if x.startswith(STEP_FACT)] for p, v in pages.items()}
    assert all(len(s) == 1 for s in said.values()), said
    sentence = said["critical_path"][0]
    assert all(s == [sentence] for s in said.values())
    assert "rank 1 entered dispatch" in sentence and "aten::mm" in sentence and "moe.py:112" in sentence
    assert sentence in report(load_run(run))
    sm = summary.summarize(load_run(run))
    for p in pages:
        assert sentence in sm["verdicts"][p]["facts"] + sm["verdicts"][p]["notes"], p
    # the run's longest lead-in: one sentence, the same on every page, in the report and the summary
    lead = {p: [x for x in _lines(v) if x.startswith(LEAD_FACT)] for p, v in pages.items()}
    assert all(len(s) == 1 for s in lead.values()), lead
    lead_sentence = lead["critical_path"][0]
    assert all(s == [lead_sentence] for s in lead.values())
    top = sm["op_before_entry"]["lead_in"]
    assert top["clause"] in lead_sentence and lead_sentence in report(load_run(run))
    for p in pages:
        assert lead_sentence in sm["verdicts"][p]["notes"], p
