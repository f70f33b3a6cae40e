"""The Dash-free logic modules of the pages, on hand-made tables and analysis results."""
from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np
import pandas as pd

from profiler import analysis
from viewer import format as F
from viewer.catalog import RunEntry
from viewer.pages.barriers import logic as BL
from viewer.pages.compare import logic as CL
from viewer.pages.critical_path import logic as PL
from viewer.pages.idle import logic as IL
from viewer.pages.runs import logic as RL
from tests.analysis.tables import SELFTEST_REGISTRY, barrier, span, table


def test_format():
    assert F.ns(850) == "850 ns" and F.ns(12_300) == "12.3 µs" and F.ns(4_560_000) == "4.56 ms"
    assert F.ns(float("nan")) == "—" and F.ns(None) == "—" and F.ns(float("inf")) == "∞"
    assert F.signed_ns(1500) == "+1.5 µs" and F.pct(-3.14159, 2, True) == "-3.14%" and F.share(0.25) == "25.0%"
    assert F.ratio(float("inf")) == "∞" and F.ratio(1.5) == "1.50×"


def test_runs_table_from_manifests(tmp_path):
    good = {"format": "epscope-run", "format_version": 1, "name": "a", "git": {"branch": "main", "commit": "0123456789abcdef", "dirty": True},
            "workload": {"kind": "ep"}, "config": {"tokens": 4096, "hidden": 7168},
            "gpu": {"name": "NVIDIA H200", "count": 2}, "drops": {"total": 12},
            "clock": {"ranks": [{"rank": 0, "uncertainty_ns": 0}, {"rank": 1, "uncertainty_ns": 96}]},
            "headline": {"dispatch_us": 180.25}}
    timeout = dict(good, name="a", status="timeout", error="rank 0 waited for rank 1")
    entries = [RunEntry("a", tmp_path / "a", tmp_path, good),
               RunEntry("b", tmp_path / "b", tmp_path, None, "run format version 99 is newer than this epscope's 1",
                        "newer format"),
               RunEntry("c", tmp_path / "c", tmp_path, None, "manifest.json unreadable: boom", "unreadable"),
               RunEntry("d", tmp_path / "d", tmp_path, timeout, None, "timeout")]
    df = RL.runs_table(entries).set_index("run_id")
    assert df.loc["a", "commit"] == "0123456789 (dirty)" and df.loc["a", "gpu"] == "2× NVIDIA H200"
    assert df.loc["a", "clock"] == 96 and df.loc["a", "drops"] == 12 and df.loc["a", "ok"]
    assert "tokens=4096" in df.loc["a", "config"] and "dispatch_us=180.2" in df.loc["a", "headline"]
    assert df.loc["b", "status"].startswith("newer format: run format version 99") and not df.loc["b", "ok"]
    assert df.loc["c", "status"].startswith("unreadable: ") and df.loc["c", "name"] == "c"
    assert df.loc["d", "status"] == "TIMEOUT: rank 0 waited for rank 1" and not df.loc["d", "ok"]
    assert df.loc["a", "shared_name"] and df.loc["d", "shared_name"] and df.loc["d", "directory"] == "d"
    assert not df.loc["c", "shared_name"]
    assert df.loc["a", "op_latency"] == RL.NOT_ANALYSED     # no stored summary: the page says so


def test_runs_table_knobs_and_stored_headline(tmp_path):
    import shutil
    from profiler.analysis import summary
    from profiler.store.runstore import load_run
    traces = Path(__file__).resolve().parents[2] / "traces"
    d = tmp_path / "ep-host-late"
    shutil.copytree(traces / "ep-host-late", d)
    (d / summary.FILE).unlink(missing_ok=True)
    run = load_run(d)
    summary.store(run)
    df = RL.runs_table([RunEntry("h", d, tmp_path, run.manifest)]).set_index("run_id")
    assert (df.loc["h", "sms"], df.loc["h", "path"], df.loc["h", "dtype"]) == ("24", "direct", "bf16")
    assert df.loc["h", "verdict"].startswith("host_bound rank 1 (host side late entry)")
    assert df.loc["h", "op_latency"].endswith("µs")
    # a summary of other data is stale: never shown as current
    (d / "launches.parquet").write_bytes((d / "launches.parquet").read_bytes() + b"\0")
    df = RL.runs_table([RunEntry("h", d, tmp_path, run.manifest)]).set_index("run_id")
    assert df.loc["h", "op_latency"] == RL.NOT_ANALYSED


def test_runs_grid_query_sorts_and_filters_as_the_grid_shows():
    """query.answer on a hand-made table: a text column of numbers sorts by the number (SMs 24
    before 128), missing values last both ways, inRange excludes its bounds (AG Grid's default),
    text filters ignore case, and the count is of the rows that pass, not of the block."""
    from viewer.pages.runs import query as Q
    df = pd.DataFrame({"sms": ["128", "24", "", "64"], "clock": [5.0, None, 1.0, 3.0],
                       "name": ["b", "A", "c", "a"]})
    kinds = {"sms": "text", "clock": "number", "name": "text"}

    def ask(**raw):
        rows, n = Q.answer(df, Q.parse_request({"startRow": 0, "endRow": 100, **raw}, kinds, set(kinds)), kinds)
        return list(rows["name"]), n
    assert ask(sortModel=[{"colId": "sms", "sort": "asc"}]) == (["A", "a", "b", "c"], 4)
    assert ask(sortModel=[{"colId": "clock", "sort": "asc"}])[0] == ["c", "a", "b", "A"]
    assert ask(sortModel=[{"colId": "clock", "sort": "desc"}])[0] == ["b", "a", "c", "A"]
    assert ask(filterModel={"clock": {"filterType": "number", "type": "inRange", "filter": 1, "filterTo": 5}}) == (["a"], 1)
    assert ask(filterModel={"name": {"filterType": "text", "type": "equals", "filter": "A"}}) == (["A", "a"], 2)
    assert ask(filterModel={"sms": {"filterType": "text", "type": "blank"}}) == (["c"], 1)
    rows, n = Q.answer(df, Q.parse_request({"startRow": 1, "endRow": 2}, kinds, set(kinds)), kinds)
    assert list(rows["name"]) == ["A"] and n == 4


def _starved():
    """rank 0: warp 0 of block 0 works, block 1 idles; a grid barrier that block 0 warp 0 reaches last."""
    rows = [span(0, 0, 0, "work", 0, 100, role="worker"), span(0, 0, 1, "work", 0, 10, role="worker"),
            span(0, 1, 0, "idle", 0, 100, role="worker"), span(0, 1, 1, "idle", 0, 100, role="worker")]
    for b, w, t in ((0, 0, 100), (0, 1, 10), (1, 0, 5), (1, 1, 6)):
        rows += barrier(0, b, w, "grid", t, 110, role="worker")
    return table(rows)


def test_idle_heatmap_and_headline():
    rep = analysis.idle_warps(_starved(), registry=SELFTEST_REGISTRY)
    fig = IL.heatmap_figure(rep, IL.kernels(rep)[0])
    z = fig["data"][0]["z"]
    assert len(z) == 2 and len(z[0]) == 2          # rows r0 b0, r0 b1; columns warps 0, 1
    assert z[1] == [0.0, 0.0] and z[0][0] > 0.5
    h = IL.headline(rep)
    assert h["idle_warps"] == 2 and h["idle_blocks"] == 1 and h["warps"] == 4
    assert not IL.imbalance_first(rep) and not IL.evidence(rep)["did_work"].iloc[0]
    assert IL.evidence_columns(rep, {"w": 1}, {"r": 1}) == {"w": 1}


def test_barrier_sentences_name_the_last_arriver():
    rep = analysis.barrier_contention(_starved(), registry=SELFTEST_REGISTRY)
    lines = BL.sentences(rep)
    assert lines[0].startswith("grid (dispatch, grid scope): last arriver rank 0 block 0 warp 0 in 100% of 1")
    assert "useless arrival" in lines[0]           # block 1 did no work in the launch
    assert BL.who(-1, 3, -1) == "block 3" and BL.who(-1, -1, -1) == "?"
    fig = BL.occurrences_figure(rep)
    # spread 5 -> 100 ns: an axis of a few ns is in ns (issue 29: one unit per axis, chosen by its values)
    assert fig["data"][0]["y"] == [95.0] and fig["layout"]["yaxis"]["title"]["text"] == "first → last arrival (ns)"
    assert fig["data"][0]["x"] == [0.0]             # since the iteration's first barrier arrival, not the run's start


def test_what_if_sentence():
    s = pd.DataFrame({"iteration": [0, 1], "before_ns": [1000, 1000], "after_ns": [990, 990], "change_ns": [-10, -10],
                      "change_pct": [-1.0, -1.0], "local_saving_ns": [100, 100], "absorbed_pct": [90.0, 90.0]})
    text = PL.what_if_sentence(s, "copy_out", 1, 20)
    # per iteration, as the table beside it (issue 29: the sentence summed over iterations beside a
    # per-iteration table)
    assert text.startswith("If copy_out on rank 1 were 20% faster, per iteration (mean over 2 iterations): the "
                           "iteration (wall time, host included) -10 ns (-1.00%)")
    s2 = s.assign(op_before_ns=[500, 500], op_after_ns=[490, 490], op_change_ns=[-10, -10])
    text2 = PL.what_if_sentence(s2, "copy_out", 1, 20)
    assert "the op latency after entry -10 ns (-2.00%)" in text2 and "the iteration (wall time" in text2
    assert "90.0% of the local saving is absorbed" in text
    assert "No iteration" in PL.what_if_sentence(s.iloc[0:0], "x", None, 5)


def test_phase_options_reads_categories():
    ev = _starved()
    assert PL.phase_options(ev) == ["idle", "work"]


def test_critical_path_headline_and_tables():
    cp = analysis.critical_path(_starved(), registry=SELFTEST_REGISTRY)
    h = PL.headline(cp)
    assert h["pacing_rank"] == 0 and h["iterations"] == 1 and h["total_ns"] == 110 and h["unfinished_ns"] == 0
    assert PL.median_label(h) == "median iteration (n = 1)"
    seg = PL.segments_table(cp)
    assert list(seg["duration_ns"]) == sorted(seg["duration_ns"], reverse=True)
    assert {"peer", "unfinished"} <= set(seg.columns)
    assert PL.largest_segments(cp).startswith("Largest on the path (summed over iterations): rank 0 work")
    assert PL.path_by_rank_figure(cp)["data"]


def test_verdict_box_shows_the_fields_with_their_definitions():
    from profiler.analysis import glossary
    from viewer import components as C
    v = analysis.idle_warps(_starved(), registry=SELFTEST_REGISTRY).verdict
    box = C.verdict_box(v, id="x")
    flag, _, text = box.children[0].children
    assert flag.children == "ALARM" and text.children == v.headline and text.title == glossary.TERMS["starved_warps"]
    chips = {c.children[0].children: c.children[2].children for c in box.children[1].children}
    assert chips["cause"] == "starved_warps" and chips["rank"] == "0"


def test_table_headers_that_are_glossary_terms_get_their_definition():
    from profiler.analysis import glossary
    from viewer import components as C
    long = pd.DataFrame({"a": range(C.GRID_MIN_ROWS + 1), "b": 2})
    defs = C.df_table(long, {"a": "slack", "b": "zz"}, tips={"b": "lateness"}).children[0].columnDefs
    assert [d["headerName"] for d in defs] == ["slack", "zz"]
    assert defs[0]["headerTooltip"] == glossary.TERMS["slack"] and defs[1]["headerTooltip"] == glossary.TERMS["lateness"]
    short = C.df_table(long.head(3), {"a": "slack", "b": "zz"}, tips={"b": "lateness"}).children[0].children
    assert f'<th title="{html.escape(glossary.TERMS["slack"])}">slack</th>' in short
    assert f'<th title="{html.escape(glossary.TERMS["lateness"])}">zz</th>' in short


def test_long_tables_are_grids_that_sort_by_value_and_show_the_formatted_text():
    from viewer import components as C
    pad = C.GRID_MIN_ROWS
    df = pd.DataFrame({"d": [1500, 20, None] + [0] * pad, "k": ["b", "a", "c"] + ["z"] * pad,
                       "n": [1.0, float("nan"), 3.0] + [0.0] * pad})
    t = C.df_table(df, {"d": "duration", "k": "kernel", "n": "n"}, {"d": lambda v: "?" if pd.isna(v) else f"{v:g} ns"},
                   row_class=lambda r: "row-bad" if r["k"] == "a" else None, max_rows=pad + 1)
    grid, more = t.children
    expect = [{"c0": 1500.0, "c0_t": "1500 ns", "c1": "b", "c1_t": "b", "c2": 1.0, "c2_t": "1.0"},
                            {"c0": 20.0, "c0_t": "20 ns", "c1": "a", "c1_t": "a", "c2": None, "c2_t": "nan",
                             "_class": "row-bad"}]
    filters = [d["filter"] for d in grid.columnDefs]
    assert filters == ["agNumberColumnFilter", "agTextColumnFilter", "agNumberColumnFilter"]
    assert grid.rowClassRules == {"row-bad": "params.data && params.data._class === 'row-bad'"}
    assert grid.rowData[:2] == expect
    assert f"2 more rows not shown (first {pad + 1} of {pad + 3})" in more.children


def test_short_tables_are_one_escaped_html_block():
    from viewer import components as C
    df = pd.DataFrame({"k": ["<b>x</b>", "y"], "v": [1, 2]})
    t = C.df_table(df, row_class=lambda r: "row-bad" if r["v"] == 2 else None)
    block = t.children[0]
    assert block.dangerously_allow_html is True
    assert "<td>&lt;b&gt;x&lt;/b&gt;</td>" in block.children and "<b>x</b>" not in block.children
    assert '<tr class="row-bad"><td>y</td><td class="num">2</td></tr>' in block.children


def test_every_column_and_card_of_the_analysis_pages_is_in_the_glossary():
    from profiler.analysis import glossary
    from viewer.pages.barriers import layout as BLay
    from viewer.pages.compare import callbacks as CCb
    from viewer.pages.critical_path import callbacks as PCb, layout as PLay
    from viewer.pages.idle import layout as ILay
    plain = {"rank", "kernel", "block", "warp", "role", "phase", "barrier", "begin", "duration", "change", "change %",
             "before", "after", "warps", "occurrences", "critical path", "verdict", "iteration", "side"}
    tables = [(PLay.SEG_COLS, PLay.SEG_TIPS), (PLay.SLACK_COLS, {}), (PCb.SUMMARY_COLS, PCb.SUMMARY_TIPS),
              (ILay.WARP_COLS, ILay.TIPS), (ILay.BLOCK_COLS, ILay.TIPS), (ILay.IMB_COLS, ILay.TIPS),
              (ILay.RANK_COLS, {}), (BLay.SUMMARY_COLS, BLay.TIPS), (BLay.RANK_COLS, BLay.TIPS),
              (BLay.OCC_COLS, BLay.TIPS), (CCb.PHASE_COLS, CCb.TIPS), (CCb.RANK_COLS, CCb.TIPS),
              (CCb.CP_COLS, CCb.CP_TIPS), (CCb.WARM_COLS, CCb.WARM_TIPS)]
    missing = [h for cols, tips in tables for c, h in cols.items()
               if h not in plain and tips.get(c, h) not in glossary.TERMS]
    assert missing == []


def test_compare_side_samples_and_plot_phases():
    def run(d):
        return table([span(0, 0, 0, "copy_out", 0, d[0], iteration=0, launch=0),
                      span(0, 0, 0, "copy_out", 100, 100 + d[1], iteration=1, launch=1)])
    c = analysis.compare([run((10, 30)), run((12, 28))], [run((20, 40)), run((22, 38))])
    s = CL.side_samples(c.samples, "A")
    e2e = s[s["phase"] == "end-to-end"].sort_values(["run", "iteration"])["value_ns"].tolist()
    co = s[s["phase"] == "copy_out"].sort_values(["run", "iteration"])["value_ns"].tolist()
    assert e2e == [10, 30, 12, 28] and co == [10, 30, 12, 28]
    assert not s["phase"].str.startswith("rank ").any()
    # the chart shows the rows that decided: the verdict's, in its order (issue 29: it showed the
    # nine largest |B - A %| rows, noisy entry-skew and host rows), never the largest change
    pp = pd.DataFrame({"kernel": ["d", "d", "d", "d"], "phase": ["", "a", "b", "entry skew"], "n_a": [3, 3, 3, 3],
                       "n_b": [3, 3, 3, 3], "diff_pct": [1.0, 1.0, -9.0, 4000.0]})
    assert CL.plot_phases((("", "end-to-end"), ("d", "b"), ("d", None)), pp) == [("", "end-to-end"), ("d", "b"), ("d", "")]
    assert CL.plot_phases((("d", "a"),), pp) == [("", "end-to-end"), ("d", "a")]
    assert CL.plot_phases((), pp) == [("", "end-to-end"), ("d", "")]          # within noise: end-to-end, kernels
    fig = CL.distribution_figure(s, s, [("", "end-to-end")])
    assert [t["name"] for t in fig["data"]] == ["A", "B"]
    assert np.allclose(sorted(fig["data"][0]["y"]), np.array([10, 12, 28, 30]) / 20)
    assert CL.sides_ok([], ["x"]) and CL.sides_ok(["x"], ["x"]) and CL.sides_ok(["x"], ["y"]) is None


def test_what_if_sentence_when_the_projection_ends_later():
    s = pd.DataFrame({"iteration": [0], "before_ns": [1000], "after_ns": [1050], "change_ns": [50],
                      "change_pct": [5.0], "local_saving_ns": [100], "absorbed_pct": [150.0]})
    text = PL.what_if_sentence(s, "copy_out", None, 20)
    assert "+50 ns" in text and "ends +50 ns later than recorded" in text and "%" in text


def test_idle_ignores_kernels_without_any_work():
    from types import SimpleNamespace
    # what idle_warps reports for ep_core's barrier kernel: its warps only wait, none did work
    pw = pd.DataFrame({"kernel": ["dispatch"] * 3 + ["barrier"] * 2, "rank": 0, "block": [0, 0, 1, 0, 1],
                       "warp": [0, 1, 0, 0, 0], "did_work": [True, False, False, False, False],
                       "busy_share": [0.9, 0.0, 0.0, 0.0, 0.0]})
    pb = pd.DataFrame({"kernel": ["dispatch", "dispatch", "barrier", "barrier"], "rank": 0, "block": [0, 1, 0, 1],
                       "did_work": [True, False, False, False]})
    imb = pd.DataFrame({"kernel": ["dispatch", "barrier"], "ratio": [np.inf, np.nan]})
    rep = SimpleNamespace(per_warp=pw, per_block=pb, imbalance=imb)
    assert IL.kernels(rep) == ["dispatch", "barrier"]
    h = IL.headline(rep)
    assert (h["warps"], h["idle_warps"], h["blocks"], h["idle_blocks"]) == (3, 2, 2, 1)
    assert h["worst_ratio"] == float("inf")


def test_axes_never_print_si_suffixes_beside_units():
    """issue 18: an axis in µs read '1M µs'; every figure's axes print numbers in full."""
    from viewer import theme
    lay = theme.figure_layout(xaxis=dict(title=dict(text="time (µs)")), yaxis2=dict(title=dict(text="x")))
    for k in ("xaxis", "yaxis", "yaxis2"):
        assert lay[k]["exponentformat"] == "none" and lay[k]["separatethousands"]


def test_verdict_sentences_have_no_doubled_words():
    """issue 18: 'the the' style repeats in verdict boxes; checked on every bundled run's stored headlines."""
    import json
    import re
    traces = Path(__file__).resolve().parents[2] / "traces"
    pat = re.compile(r"\b(\w+) \1\b", re.I)
    for f in traces.glob("*/analysis-summary.json"):
        for page, v in json.loads(f.read_text())["verdicts"].items():
            assert not pat.search(v["headline"]), (f.parent.name, page, v["headline"])


# -- units (issue 29): one unit per axis and card, summed-over-warps said, relative positions ------
def test_a_time_unit_is_chosen_per_axis_and_card():
    assert [F.time_unit(v).name for v in (850, 12_300, 4_560_000, 30_000_000_000)] == ["ns", "µs", "ms", "s"]
    # an axis takes its largest magnitude: 30,000,000 µs reads 30 s, never "30,000,000 µs"
    assert F.time_unit([5, 800, 2_500_000]).name == "ms" and F.time_unit([float("nan")]).name == "ns"
    assert F.time_unit(-124_000, 914).name == "µs"
    u = F.time_unit(30_000_000_000)
    assert u.of([30_000_000_000, 1_500_000_000]) == [30.0, 1.5] and F.in_unit(1_500_000_000, u) == "1.50"
    # a card in one unit, named once (issue 29: "-9,882 to +914 ns" beside µs cards)
    assert F.times(-9_882, 914, signed=True) == "-9.88 … +0.914 µs"
    assert F.times(-124_050, -109_606) == "-124 … -110 µs" and F.times(float("nan")) == "—"
    assert F.axis_title("wait", F.time_unit(3e9), "summed over warps") == "wait (s, summed over warps)"


def test_a_position_far_into_a_run_is_stated_to_the_window_s_resolution():
    # issue 29's "25,151,000 µs since run start": 25 s in, a 2 ms window resolves 20 µs
    assert F.position(25_151_000_000, 20_000) == "25.15100 s"
    assert F.position(1_876_841, 20_324) == "1.88 ms"


def test_timeline_axis_reads_time_since_the_window_s_start():
    from viewer.pages.timeline import logic as TL
    ax = TL.time_axis(25_151_000_000, 25_153_000_000)          # a 2 ms window 25 s into the run
    assert ax["ticktext"] == ["0.0", "0.5", "1.0", "1.5", "2.0"]     # 1, 2 or 5 x 10^k a step
    assert ax["tickvals"][0] == 25_151_000.0                   # positions stay in µs since the run's start
    assert ax["title"]["text"] == "time since the window's start, 25.15100 s into the run (ms)"
    step = ax["tickvals"][1] - ax["tickvals"][0]
    assert abs(float(ax["ticktext"][1]) * 1e3 - step) < 1e-6     # a label is its tick's distance from the start


def test_figures_state_their_unit_and_what_they_sum():
    cp = analysis.critical_path(_starved(), registry=SELFTEST_REGISTRY)
    fig = PL.path_by_rank_figure(cp)
    assert fig["layout"]["xaxis"]["title"]["text"] == "time on the critical path (ns, summed over iterations)"
    g = PL.path_gantt_figure(cp)
    assert g["layout"]["xaxis"]["title"]["text"].endswith("time since it began (ns)")
    assert min(b for t in g["data"] for b in t["base"]) == 0.0             # from the iteration's start
    assert PL.segments_table(cp)["begin_ns"].min() == 0                     # the table too
    rep = analysis.barrier_contention(_starved(), registry=SELFTEST_REGISTRY)
    w = BL.wait_by_arriver_figure(rep)
    assert w["layout"]["xaxis"]["title"]["text"].endswith("summed over warps)")


def test_compare_cards_flags_and_table_formatting():
    from profiler.analysis.verdict import Verdict
    from profiler.groundtruth.expect import Cause, Direction
    from viewer import components as C
    e2e = {"median_a_ns": 562_322.0, "median_b_ns": 447_000.0, "diff_ns": -115_322.0, "diff_pct": -20.5,
           "ci_low_ns": -124_125.0, "ci_high_ns": -109_606.0, "noise_ns": 9_323.0, "mde_ns": 12_600.0}
    k = CL.cards(e2e)
    assert (k.median_a, k.median_b, k.diff) == ("562 µs", "447 µs", "-115 µs (-20.5%)")
    assert k.ci == "-124 … -110 µs" and k.spread == "9.32 µs" and k.mde == "12.6 µs"
    assert k.mde_sub.startswith("2.2% of A's median, 80% power")
    assert CL.runs_needed(101) == "more than 100" and CL.runs_needed(7) == "7" and CL.runs_needed(0) == ""
    pp = pd.DataFrame({"kernel": ["d", "d"], "phase": ["entry skew", "copy_out"], "median_a_ns": [200.0, 90_000.0],
                       "diff_pct": [41_671.4, -20.0]})
    shown = CL.phase_table(pp, 562_322.0)
    assert math.isnan(shown["diff_pct"].iloc[0]) and shown["diff_pct"].iloc[1] == -20.0   # a near-zero base: no %
    # an improvement is green and says so; a regression red (issue 29: an improvement was a red ALARM)
    v = Verdict(page="compare", alarm=True, cause=Cause.KNOB_CHANGE, direction=Direction.FASTER)
    assert C.verdict_flag(v) == ("IMPROVEMENT", "good")
    assert C.verdict_flag(Verdict(page="compare", alarm=True, cause=Cause.KNOB_CHANGE,
                                  direction=Direction.SLOWER)) == ("REGRESSION", "bad")
    assert C.verdict_flag(Verdict(page="idle", alarm=True, cause=Cause.STARVED_WARPS)) == ("ALARM", "bad")
