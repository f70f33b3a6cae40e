"""The Timeline page's PyTorch panel (viewer/pages/timeline/torch_logic.py, Dash-free) on the
merged two-rank run: rows per rank (thread depths, streams), the instrumented kernels named by
their launch, the window honoured, and the sentence naming the planted GEMM."""
from __future__ import annotations

import numpy as np
import pytest

from profiler.store.runstore import load_run
from profiler.torchtrace.report import run_blame
from profiler.torchtrace.attach import attach
from viewer.pages.timeline import torch_logic as T


@pytest.fixture(scope="module")
def merged_blame(upstream):
    attach(upstream["run"], upstream["traces"])
    return run_blame(load_run(upstream["run"]))


def test_rows_per_rank_threads_by_depth_and_streams(merged_blame):
    merged, _ = merged_blame
    df = T.rows(merged, -1e12, 1e12)
    labels = df.attrs["labels"]
    assert labels[0] == "rank 0 · thread 4242" and "rank 0 · stream 7" in labels and "rank 1 · stream 7" in labels
    assert "rank 1 · thread 4242 · 2" in labels            # moe.py frame > module plumbing > aten::mm
    inst = df[df["group"] == "epscope"]
    assert len(inst) == len(merged.ranks[0].joined) + len(merged.ranks[1].joined)
    assert inst["name"].str.startswith("epscope launch ").all()
    assert (df[df["group"] == "kernel"]["name"] == "nvjet_tst_128x256_64x4_2x1_v_bz_coopA_NNT").all()
    fig = T.figure(df, -1e12, 1e12)
    assert {t["name"] for t in fig["data"]} == {"cpu", "python", "kernel", "epscope"}
    assert fig["layout"]["yaxis"]["ticktext"] == labels


def test_the_window_and_the_limit(merged_blame):
    merged, _ = merged_blame
    full = T.rows(merged, -1e12, 1e12)
    k = full[full["group"] == "kernel"].iloc[0]
    part = T.rows(merged, float(k["begin_ns"]) + 10, float(k["begin_ns"]) + 20)
    assert ((part["end_ns"] >= k["begin_ns"] + 10) & (part["begin_ns"] <= k["begin_ns"] + 20)).all()
    few = T.rows(merged, -1e12, 1e12, limit=3)
    assert len(few) == 3 and (few["end_ns"] - few["begin_ns"]).min() >= np.sort(
        (full["end_ns"] - full["begin_ns"]).to_numpy())[-3]


def test_sentences_lead_with_the_late_entries(merged_blame):
    _, blame = merged_blame
    s = T.sentences(blame)
    assert s and "rank 1 entered dispatch" in s[0] and "aten::mm" in s[0] and "moe.py:112" in s[0]


def test_depths():
    b = np.array([0, 1, 2, 10, 10])
    e = np.array([9, 8, 3, 12, 11])
    assert T.depths(b, e).tolist() == [0, 1, 2, 0, 1]


def test_the_timeline_page_shows_the_panel_and_its_callback_names_the_op(upstream, merged_blame, tmp_path):
    from tests.viewer.dashclient import call, text_of
    from viewer.app import NAV, PAGE, RUN_SELECT, URL, create_app
    from viewer.pages.timeline.ids import Ids
    app = create_app([upstream["root"]], cache_dir=tmp_path / "cache", ready_wait_s=600)
    r = call(app, [(PAGE, "children"), (NAV, "children"), (RUN_SELECT, "value"), (URL, "search")],
             [(URL, "pathname", "/timeline"), (URL, "search", "?run=run"), (RUN_SELECT, "value", None)],
             changed=["url.pathname"])
    assert "The step's PyTorch ops" in text_of(r[PAGE]["children"])
    out = call(app, [(Ids.TORCH_GRAPH, "figure"), (Ids.TORCH_NOTES, "children")], [(Ids.WINDOW, "data", [0, 2000])],
               state=[(Ids.RUN, "data", "run")])
    assert "its GPU was running aten::mm" in text_of(out[Ids.TORCH_NOTES]["children"])
    assert out[Ids.TORCH_GRAPH]["figure"]["data"]
