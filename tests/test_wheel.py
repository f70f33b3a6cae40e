"""`pip install .` (not editable) works: the wheel built from a copy of the checkout, installed into
a fresh venv, runs `epscope --help`, `epscope ab|tune|trace --help` and `epscope view` (started,
probed over HTTP, stopped) from another directory, importing only what the wheel installed. The
package data the library reads by default travel with it: the kernel sources (csrc/), the phase
registries, the binary layout, the tuned table, the viewer's assets, and the bundled runs (under
<venv>/share/epscope/traces, setup.py).

Installed with `--no-deps --no-index` into a venv that sees the system's packages (torch, dash,
pandas: what the dependencies name; .ci/run installs them), as tests/test_readme.py does. Built
with pip's isolated build environment on CI (it downloads setuptools), elsewhere without downloads
(`--no-build-isolation`, the system's setuptools)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile

import pytest

from tests.as_user import copy_checkout, free_port, serve_and_probe
from tests.needs import needs

PACKAGE_DATA = ("ep_core/tuned.json", "ep_core/csrc/bindings.cpp", "ep_core/csrc/generated/ep_intranode_phases.cuh",
                "ep_core/phases/ep_intranode.toml", "profiler/layout.toml", "profiler/csrc/recorder.cuh",
                "profiler/phases/selftest.toml", "viewer/assets/epscope.css", "profiler/workflows/ab_worker.py",
                "viewer/assets/plotly_early.js", "viewer/plotlyjs/plotly-cartesian.min.js", "viewer/plotlyjs/LICENSE",
                "viewer/plotlyjs/README.md", "viewer/regenerator/runtime.js", "viewer/regenerator/LICENSE",
                "viewer/regenerator/README.md")


def _run(cmd, cwd, env=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_runs_from_another_directory(tmp_path):
    needs(_run([sys.executable, "-c", "import ensurepip, venv"], tmp_path).returncode == 0,
          "python3's venv module", "sudo apt-get install -y python3-venv", tool="venv")
    offline = [] if os.environ.get("CI") else ["--no-build-isolation"]
    src = copy_checkout(tmp_path / "src")   # the build writes build/ and *.egg-info: never in the checkout
    p = _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", *offline, "-q", "-w", str(tmp_path / "dist")],
             src)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("epscope-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(PACKAGE_DATA) <= names, sorted(set(PACKAGE_DATA) - names)
    assert not any(n.startswith(("benchmarks/", "tests/")) for n in names)

    venv = tmp_path / "venv"
    p = _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)], tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    py = venv / "bin" / "python"
    p = _run([str(py), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], tmp_path)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # no PYTHONPATH: only the venv's site-packages (and the system's third-party packages) import
    env = {"PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", "HOME": str(tmp_path),
           "LANG": "C.UTF-8"}
    p = _run([str(py), "-c", "import ep_core, profiler, viewer; print(ep_core.__file__, profiler.__file__, "
                             "viewer.__file__)"], elsewhere, env)
    assert p.returncode == 0 and all(f.startswith(str(venv)) for f in p.stdout.split()), p.stdout + p.stderr
    epscope = str(venv / "bin" / "epscope")
    for args, says in ((["--help"], "COMMAND"), (["ab", "--help"], "REF_A"), (["tune", "--help"], "--ll"),
                       (["trace", "--help"], "--ranks")):
        p = _run([epscope, *args], elsewhere, env, timeout=300)
        assert p.returncode == 0 and says in p.stdout, (args, p.stdout[-2000:], p.stderr[-3000:])
    port = free_port()
    out = serve_and_probe([epscope, "view", "--port", str(port)], cwd=elsewhere, env=env, port=port,
                          expect_run="selftest-grid-barrier")
    assert str(venv / "share" / "epscope" / "traces") in out, out[-2000:]
