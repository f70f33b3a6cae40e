"""A trace written by the installed torch.profiler (CPU activities; CI has torch), read back: the
launch label ep_core opens (ep_core.buffer_profile.labelled) is there with its run, rank and launch,
the named range and the op keep their times and thread, the Python frames parse to file:line, and
the innermost range at an instant of the planted sleep is the planted range."""
from __future__ import annotations

import time

import numpy as np
import pytest

from tests.needs import needs_module

torch = needs_module("torch", "pip install torch==2.13.0 (the CPU build is enough)", module_level=True)

from profiler.torchtrace import blame as B  # noqa: E402
from profiler.torchtrace import kineto as K  # noqa: E402
from profiler.torchtrace.align import labels_of  # noqa: E402
from profiler.torchtrace.labels import launch_label  # noqa: E402

SLEEP_S = 0.004


class _Session:
    """What ep_core asks of a recording session for the label."""
    num_launches = 17

    @staticmethod
    def launch_label(first):
        return launch_label("real-run", 3, first)


@pytest.fixture(scope="module")
def trace(tmp_path_factory):
    from ep_core.buffer_profile import labelled
    a = torch.randn(64, 64)
    with labelled(_Session()):
        pass                                  # the profiler is off: no range, nothing recorded
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
        with labelled(_Session()):
            a @ a
        with torch.profiler.record_function("planted_host_delay"):
            time.sleep(SLEEP_S)
    p = tmp_path_factory.mktemp("real") / "t.pt.trace.json.gz"
    prof.export_chrome_trace(str(p))
    return K.read_kineto(p)


def test_the_launch_label_and_its_op(trace):
    ev = trace.events
    lab = labels_of(ev)
    assert len(lab) == 1 and (lab["run"].iloc[0], lab["rank"].iloc[0], lab["launch"].iloc[0]) == ("real-run", 3, 17)
    mm = ev[(ev["kind"] == K.CPU_OP) & (ev["name"] == "aten::mm")]
    assert len(mm) == 1
    m, lb = mm.iloc[0], lab.iloc[0]
    assert lb["ts_ns"] <= m["ts_ns"] and m["ts_ns"] + m["dur_ns"] <= lb["end_ns"]
    assert (m["pid"], m["tid"]) == (lb["pid"], lb["tid"])


def test_the_planted_range_is_innermost_during_the_sleep(trace):
    ev = trace.events
    host = ev[ev["kind"].isin([K.CPU_OP, K.USER])].rename(columns={"ts_ns": "begin_ns"})
    host = host.assign(end_ns=host["begin_ns"] + host["dur_ns"])
    r = host[host["name"] == "planted_host_delay"].iloc[0]
    assert r["dur_ns"] >= SLEEP_S * 1e9
    th = B._Thread(host[(host["pid"] == r["pid"]) & (host["tid"] == r["tid"])])
    mid = int(r["begin_ns"] + r["dur_ns"] // 2)
    assert th.name[th.covering(mid)[0]] == "planted_host_delay"


def test_python_frames_name_this_file(trace):
    py = trace.events[trace.events["kind"] == K.PYTHON]["name"].astype(str)
    frames = {B.frame_of(n) for n in py}
    assert any(f.startswith("test_real_torch_trace.py:") for f in frames)
    assert np.all(trace.events["ts_ns"] > 1e18)      # absolute ns: base added
