"""Compare names the op before a late entry on each side (issue 30 item 4), in the sentence
`epscope report` prints for that run: runs of conftest.py's upstream-GEMM workload (rank 1's GPU
runs aten::mm before every dispatch), two with their PyTorch traces merged and two without."""
from __future__ import annotations

import pytest

from profiler.commands.cli import main
from profiler.commands.report import report
from profiler.store.runstore import load_run, write_run
from profiler.torchtrace import report as TR
from viewer.pages.compare import logic

from ..viewer.dashclient import call, text_of

TRACED, PLAIN = ("traced-a", "traced-b"), ("plain-a", "plain-b")


@pytest.fixture(scope="module")
def compared(upstream, tmp_path_factory):
    """(app, {directory: run id}, {traced directory: its report's before-entry sentence})."""
    from viewer.app import create_app
    from viewer.catalog import Catalog
    root = tmp_path_factory.mktemp("compare-op")
    said = {}
    for d in TRACED + PLAIN:
        run = write_run(root / d, upstream["events"], upstream["launches"], upstream["manifest"], perfetto=False)
        if d in TRACED:
            assert main(["merge", str(run), *map(str, upstream["traces"])]) == 0
            facts = [x.strip()[2:] for x in report(load_run(run)).splitlines() if x.strip().startswith("- " + TR.STEP_FACT)]
            said[d] = facts[0]
    ids = {e.path.name: e.run_id for e in Catalog([root]).entries()}
    app = create_app([root], cache_dir=tmp_path_factory.mktemp("compare-op-cache"), ready_wait_s=600)
    return app, ids, said


def _compare(app, ids, a, b):
    from viewer.pages.compare.ids import Ids
    out = [(Ids.RESULT, "children"), (Ids.TICK, "disabled"), (Ids.TICK, "max_intervals")]
    r = call(app, out, [(Ids.GO, "n_clicks", 1), (Ids.TICK, "n_intervals", None)],
             state=[(Ids.A, "value", [ids[d] for d in a]), (Ids.B, "value", [ids[d] for d in b])])
    assert r[Ids.TICK]["disabled"] is True
    return r[Ids.RESULT]["children"]


def _section(children, id_):
    """The component with id `id_` in a Dash response's children (dicts), else None."""
    if isinstance(children, dict):
        if children.get("props", {}).get("id") == id_:
            return children
        return _section(children.get("props", {}).get("children"), id_)
    if isinstance(children, list):
        return next((s for c in children if (s := _section(c, id_)) is not None), None)
    return None


def test_the_traced_side_is_named_with_the_reports_sentence(compared):
    from viewer.pages.compare.ids import Ids
    app, ids, said = compared
    sentence = said["traced-a"]
    assert "rank 1 entered dispatch" in sentence and "aten::mm" in sentence and "moe.py:112" in sentence
    got = _compare(app, ids, ["traced-a"], ["plain-a"])
    assert sentence in text_of(got)
    box = text_of(_section(got, Ids.BEFORE_ENTRY))
    assert sentence in box and box.count(TR.STEP_FACT) == 1
    differ = text_of(_section(got, Ids.BEFORE_DIFFER))
    assert differ.startswith("A: aten::mm before dispatch on rank 1 (") and differ.endswith("; B: none named")
    # and the other way round: B is the traced side
    got = _compare(app, ids, ["plain-b"], ["traced-a"])
    assert text_of(_section(got, Ids.BEFORE_DIFFER)).startswith("A: none named; B: aten::mm before dispatch")


def test_nothing_when_no_run_has_traces(compared):
    from viewer.pages.compare.ids import Ids
    app, ids, _ = compared
    got = _compare(app, ids, ["plain-a"], ["plain-b"])
    assert _section(got, Ids.BEFORE_ENTRY) is None
    text = text_of(got)
    assert "end-to-end" in text and "Before entry" not in text and TR.STEP_FACT not in text


def test_an_a_a_of_two_traced_runs_names_the_op_on_both_sides(compared):
    from viewer.pages.compare.ids import Ids
    app, ids, said = compared
    got = _compare(app, ids, ["traced-a"], ["traced-b"])
    assert text_of(got).count(said["traced-a"]) == 2
    box = text_of(_section(got, Ids.BEFORE_ENTRY))
    assert box.count(said["traced-a"]) == 2 and said["traced-a"] == said["traced-b"]
    assert _section(got, Ids.BEFORE_DIFFER) is None      # the same op on both sides: no line


def _be(op, ns=470_000.0, rank=1):
    return TR.BeforeEntry(run="r", rank=rank, kernel="dispatch", iteration=0, op=op, op_ns=ns, sentence=f"s {op}")


def test_sides_differ_only_on_different_ops():
    assert TR.sides_differ([_be("aten::mm")], [None]) == "A: aten::mm before dispatch on rank 1 (470 µs); B: none named"
    assert TR.sides_differ([_be("aten::mm")], [_be("aten::mm", 300_000.0)]) is None
    assert TR.sides_differ([None, None], [None]) is None
    two = TR.sides_differ([_be("aten::mm"), _be("aten::mm", 500_000.0)], [_be("aten::bmm")])
    assert two == "A: aten::mm before dispatch on rank 1 (500 µs); B: aten::bmm before dispatch on rank 1 (470 µs)"
    assert TR.sides_differ([_be("")], [None]).startswith("A: no op recorded before dispatch")


def test_the_view_lists_every_run_and_is_absent_without_a_named_op():
    assert logic.before_entry_view([("a", None)], [("b", None)]) is None
    v = logic.before_entry_view([("a", _be("aten::mm"))], [("b", None), ("c", _be("aten::mm"))])
    assert v.sides == {"A": ["a: s aten::mm"], "B": ["b: none named", "c: s aten::mm"]}
    assert v.differ == "A: aten::mm before dispatch on rank 1 (470 µs); B: aten::mm before dispatch on rank 1 (470 µs), none named"
