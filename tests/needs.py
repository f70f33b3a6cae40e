"""Tests that need a tool a developer's machine may lack (Chromium, nvcc, g++, CUDA headers).

CI's machine has every one of them (.ci/run installs what the image lacks), so there a missing
tool is a broken setup and the test fails; elsewhere it skips and says what to install. A skip
that CI could hit would let a broken CI pass silently.
"""
from __future__ import annotations

import os

import pytest


def needs(available: bool, what: str, install: str) -> None:
    if available:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{what} is missing on the CI machine ({install})")
    pytest.skip(f"{what} is not available here ({install})")
