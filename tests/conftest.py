"""Shared markers of the whole suite: `gpu` tests skip with the reason "needs a CUDA GPU" when
torch sees no CUDA device; `multigpu` tests skip when fewer than 2 GPUs are visible.

The markers are declared in pyproject.toml; this hook only turns them into skips, so a test
module needs no skip boilerplate of its own."""
from __future__ import annotations

import gc
import os
import sys

import pytest

# Code runs from the checkout, not an install (team rule): make `import ep_core` / `profiler`
# work whatever directory pytest was started from.
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)


def _gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_addoption(parser):
    # tests/analysis/test_verdicts.py: recordings outside the repository whose verdicts to check
    parser.addoption("--verdict-runs", dest="verdict_runs", default=None,
                     help="directories (comma- or os.pathsep-separated) searched for runs with an expect block")


# Modules whose tests share a session fixture too costly to build twice: one group, one worker.
SHARED_GROUPS = {
    "tests/ep_core/test_kernels_compile.py": "kernel_builds",     # tests/ep_core/conftest.py: every kernel
    "tests/ep_core/test_low_latency_build.py": "kernel_builds",   # file compiled, ~45 s on CI's 2 cores
}


@pytest.hookimpl(tryfirst=True)   # before pytest-xdist reads the groups (its own modifyitems)
def pytest_collection_modifyitems(config, items):
    """CI runs the suite on pytest-xdist workers (`.ci/run`: -n auto --dist loadgroup): each
    module is one group, so a module's fixtures are built on one worker only, as in a plain run."""
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            module = item.nodeid.split("::", 1)[0]
            item.add_marker(pytest.mark.xdist_group(SHARED_GROUPS.get(module, module)))
    _skip_without_gpus(items)


def _skip_without_gpus(items):
    gpus = None
    for item in items:
        wants_gpu = item.get_closest_marker("gpu") is not None
        wants_multi = item.get_closest_marker("multigpu") is not None
        if not (wants_gpu or wants_multi):
            continue
        if gpus is None:
            gpus = _gpu_count()
        if gpus == 0:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))
        elif wants_multi and gpus < 2:
            item.add_marker(pytest.mark.skip(reason=f"needs 2 or more CUDA GPUs, {gpus} visible"))


@pytest.fixture(autouse=True, scope="session")
def _hash_cache_in_tmp(tmp_path_factory):
    """profiler.store.hashcache remembers data files' hashes in the user's cache directory, and
    `epscope export RUN` writes there without -o: the suite's go to temporary ones (subprocesses
    inherit them through the environment)."""
    os.environ["EPSCOPE_HASH_CACHE"] = str(tmp_path_factory.mktemp("hashcache") / "file-hashes.json")
    os.environ["EPSCOPE_EXPORT_DIR"] = str(tmp_path_factory.mktemp("exports"))
    yield


@pytest.fixture(autouse=True, scope="module")
def _survivors_out_of_the_collectors_way():
    """What earlier modules left alive (imported libraries, session fixtures, caches) is frozen out
    of the cyclic collector at each module's start, as `epscope view` does after its start-up
    (viewer.app.serve). Without it every full collection of a late test walked everything the
    suite had made before: in one CI run test_every_page_on_every_bundled_trace took 373 s against
    60 s alone, 55 % of that in the collector (tests/conftest.py's note in benchmarks/NOTES.md,
    issue 34). Collected first, so only live objects are frozen."""
    gc.collect()
    gc.freeze()
    yield
