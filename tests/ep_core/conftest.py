"""Fixtures of the ep_core CPU tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kernel_builds(tmp_path_factory):
    """Every kernel file compiled in both builds, once a session (tests/ep_core/kernel_builds.py)."""
    from tests.ep_core.kernel_builds import compile_all
    return compile_all(tmp_path_factory.mktemp("kernel-builds"))
