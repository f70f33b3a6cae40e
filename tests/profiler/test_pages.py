"""profiler.pages: numpy's huge-page advice off within small_pages(), restored after; a numpy
without the switch allocates as it does."""
from __future__ import annotations

import numpy as np
import pytest

from profiler import pages

needs_switch = pytest.mark.skipif(pages._toggle() is None, reason="this numpy has no _set_madvise_hugepage")


def _advised() -> bool:
    toggle = pages._toggle()
    was = toggle(True)
    toggle(was)
    return bool(was)


@needs_switch
@pytest.mark.parametrize("before", [True, False])
def test_small_pages_switches_the_advice_off_and_restores_it(before):
    toggle = pages._toggle()
    keep = toggle(before)
    try:
        with pages.small_pages():
            assert _advised() is False
            with pages.small_pages():
                assert _advised() is False
            assert _advised() is False           # the inner exit restores the outer's setting
            np.ones(8 << 20, np.uint8)           # allocating inside works as ever
        assert _advised() is before
    finally:
        toggle(keep)


@needs_switch
def test_small_pages_restores_the_advice_when_the_body_raises():
    before = _advised()
    with pytest.raises(RuntimeError):
        with pages.small_pages():
            raise RuntimeError("boom")
    assert _advised() is before


def test_a_numpy_without_the_switch_just_runs_the_body(monkeypatch):
    monkeypatch.setattr(pages, "_toggle", lambda: None)
    ran = []
    with pages.small_pages():
        ran.append(True)
    assert ran == [True]
