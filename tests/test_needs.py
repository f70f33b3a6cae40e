"""tests/needs.py: a test that needs a tool CI's machine has fails when the tool is missing, and
skips only where EPSCOPE_TESTS_WITHOUT says the machine lacks it on purpose (issue 34: three nvcc
tests skipped silently on a machine without nvcc)."""
from __future__ import annotations

import pytest

from profiler.record import build
from tests import needs as N
from tests.ep_core import kernel_builds as KB
from tests.ep_core import test_low_latency_build as LL


def test_a_missing_tool_fails_naming_the_install_and_the_variable(monkeypatch):
    monkeypatch.delenv(N.WITHOUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match=r"g\+\+ is missing \(apt-get install g\+\+\).*"
                                                    r"EPSCOPE_TESTS_WITHOUT=g\+\+"):
        N.needs(False, "g++", "apt-get install g++", tool="g++")
    N.needs(True, "g++", "apt-get install g++", tool="g++")   # present: nothing happens


@pytest.mark.parametrize("value", ["nvcc", " chromium , nvcc", "all"])
def test_the_variable_turns_the_failure_into_a_skip_that_names_it(monkeypatch, value):
    monkeypatch.setenv(N.WITHOUT, value)
    with pytest.raises(pytest.skip.Exception, match="EPSCOPE_TESTS_WITHOUT says this machine lacks nvcc"):
        N.needs(False, "nvcc", N.NVCC_INSTALL, tool="nvcc")
    if value != "all":
        with pytest.raises(pytest.fail.Exception):
            N.needs(False, "g++", "apt-get install g++", tool="g++")


def test_an_unknown_name_in_the_variable_fails(monkeypatch):
    monkeypatch.setenv(N.WITHOUT, "nvc")
    with pytest.raises(pytest.fail.Exception, match=r"names \['nvc'\]"):
        N.needs(False, "nvcc", N.NVCC_INSTALL, tool="nvcc")


def test_a_missing_module_fails(monkeypatch):
    monkeypatch.delenv(N.WITHOUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="the Python package 'numba_that_is_not_installed' is missing.*EPSCOPE_TESTS_WITHOUT=numba"):
        N.needs_module("numba_that_is_not_installed", "pip install -e '.[fast]'", tool="numba")
    assert N.needs_module("json", "stdlib", tool="torch").dumps(1) == "1"


def test_the_kernel_compiles_and_the_low_latency_checks_fail_without_nvcc(monkeypatch, tmp_path):
    """The nvcc compiles every kernel test reads (tests/ep_core/kernel_builds.py: the session
    fixture kernel_builds) and the low-latency bindings check fail where nvcc is missing."""
    def missing():
        raise build.NvccNotFound("nvcc not found (test)")
    monkeypatch.setattr(build, "nvcc_path", missing)
    monkeypatch.delenv(N.WITHOUT, raising=False)
    with pytest.raises(pytest.fail.Exception, match="nvcc is missing"):
        KB.compile_all(tmp_path / "a")
    with pytest.raises(pytest.fail.Exception, match="nvcc is missing"):
        LL.test_low_latency_bindings_syntax_check()
    monkeypatch.setenv(N.WITHOUT, "nvcc")
    with pytest.raises(pytest.skip.Exception, match="EPSCOPE_TESTS_WITHOUT"):
        KB.compile_all(tmp_path / "b")
