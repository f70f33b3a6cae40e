"""benchmarks/gpu/deepep_tests.py on the CPU: it refuses a directory without DeepEP's scripts,
picks the rank counts each script can run at, and runs a script from the checkout's tests/
directory with `import deep_ep` resolving to ep_core, reporting its exit status (stand-in scripts
here; DeepEP's own run on the GPU, tests/gpu/test_deepep_scripts.py)."""
from __future__ import annotations

import pytest

from benchmarks.gpu import deepep_tests as D

# a stand-in for DeepEP's script: imports deep_ep and its sibling utils.py as the real ones do
STANDIN = '''import argparse, sys
import deep_ep, ep_core
from utils import VALUE
p = argparse.ArgumentParser(); p.add_argument("--num-processes", type=int); a = p.parse_args()
assert deep_ep.Buffer is ep_core.Buffer and deep_ep.Config is ep_core.Config and deep_ep.topk_idx_t is ep_core.topk_idx_t
print("ranks", a.num_processes, "value", VALUE)
sys.exit(EXIT)
'''


def _checkout(tmp_path, exits):
    tests = tmp_path / "DeepEP" / "tests"
    tests.mkdir(parents=True)
    (tests / "utils.py").write_text("VALUE = 42\n")
    for script, code in exits.items():
        (tests / script).write_text(STANDIN.replace("EXIT", str(code)))
    return tmp_path / "DeepEP"


def test_a_directory_without_the_scripts_is_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="EPSCOPE_DEEPEP_DIR"):
        D.tests_dir(None)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_intranode.py").write_text("")
    with pytest.raises(FileNotFoundError, match="test_low_latency.py, utils.py"):
        D.tests_dir(tmp_path)


def test_rank_counts_follow_the_gpus_and_the_expert_counts():
    assert D.rank_counts("test_intranode.py", 8) == [(n, "") if 256 % n == 0 else
                                                     (n, "test_intranode.py routes 256 experts, not a multiple of "
                                                         f"{n} ranks") for n in range(1, 9)]
    assert [n for n, why in D.rank_counts("test_low_latency.py", 8) if not why] == [1, 2, 3, 4, 6, 8]
    assert D.rank_counts("test_low_latency.py", 1, [1, 2]) == [(1, ""), (2, "needs 2 GPUs, 1 visible")]


def test_scripts_run_unchanged_with_deep_ep_resolving_to_ep_core(tmp_path):
    deepep = _checkout(tmp_path, {"test_intranode.py": 0, "test_low_latency.py": 3})
    runs = D.run_all(deepep, tmp_path / "out", ranks=[1, 2], timeout_s=120, gpus=1)
    by = {(r.script, r.ranks): r for r in runs}
    ok, bad = by[("test_intranode.py", 1)], by[("test_low_latency.py", 1)]
    assert ok.passed and "ranks 1 value 42" in ok.log.read_text()
    assert not bad.passed and bad.returncode == 3
    assert by[("test_intranode.py", 2)].returncode is None and "needs 2 GPUs" in by[("test_intranode.py", 2)].reason
    table = D.summary(runs)
    assert "| test_intranode.py | 1 | passed |" in table and "FAILED (exit 3)" in table and "not run" in table
    assert not (deepep / "tests" / "deep_ep").exists()  # the shim lives outside the checkout
