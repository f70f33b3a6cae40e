"""The glossary: docs/glossary.md is generated from profiler.analysis.glossary, and every segment
kind and verdict cause the analyses emit has a definition."""
from pathlib import Path

import pytest

from profiler.analysis import glossary
from profiler.analysis.intervals import SEG_KINDS
from profiler.groundtruth.expect import Cause

DOC = Path(__file__).resolve().parents[2] / "docs" / "glossary.md"


def test_docs_glossary_is_generated_from_the_module():
    assert DOC.read_text() == glossary.markdown(), \
        "docs/glossary.md is stale: python -m profiler.analysis.glossary > docs/glossary.md"


@pytest.mark.parametrize("term", [k for k in SEG_KINDS if k != "idle"] + [c.value for c in Cause])
def test_every_segment_kind_and_cause_is_defined(term):
    assert glossary.tip(term)


def test_an_unknown_term_names_itself():
    with pytest.raises(KeyError, match="no term 'nope'"):
        glossary.tip("nope")
