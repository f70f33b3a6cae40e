"""The light install: `epscope view/report/export` run without torch (torch and the kernel
build are the `gpu` extra), and the README's first command installs into a venv. CI installs
torch for the kernel tests, so the torch-free path is checked here in a process where
`import torch` fails, as it does in a venv made by the README's command."""
from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO / "traces"
NO_TORCH = "import sys; sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"


def _pyproject() -> dict:
    with open(REPO / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _name(req: str) -> str:
    return req.split(";")[0].split(">")[0].split("=")[0].split("<")[0].strip()


def test_core_dependencies_have_no_torch_and_the_gpu_extra_has_it():
    p = _pyproject()
    core = {_name(r) for r in p["dependencies"]}
    assert "torch" not in core and {"dash", "pandas", "pyarrow", "perfetto", "tqdm"} <= core
    assert {"torch", "ninja"} <= {_name(r) for r in p["optional-dependencies"]["gpu"]}


def test_numba_is_the_fast_extra_only():
    """The compiled decode loop is optional: the viewer's install never pulls numba (and LLVM)."""
    p = _pyproject()
    assert "numba" not in {_name(r) for r in p["dependencies"]}
    assert "numba" in {_name(r) for r in p["optional-dependencies"]["fast"]}


def test_decode_without_numba_takes_the_numpy_loop(tmp_path):
    """The GPU machine has no numba: `auto` decodes with numpy there (HOME is empty: no AOT build)."""
    code = ("sys.modules['numba'] = None\n"
            "import numpy as np\n"
            "from profiler.decode import decode as D\n"
            "from profiler.registry.registry import load_all\n"
            "from tests.profiler.bufbuild import random_buffer\n"
            "reg = load_all()['selftest']\n"
            "buf = random_buffer(np.random.default_rng(0), reg, n_regions=4, capacity=16)\n"
            "items = [(buf, D.LaunchInfo(0, 0, 'k', 0, 'selftest'))]\n"
            "assert D._engine('auto') is None\n"
            "d = D.decode_launches(items, {'selftest': reg})\n"
            "assert len(d.events) and d.events.equals(D.decode_launches(items, {'selftest': reg}, engine='numpy').events)\n"
            "print('numpy ok')\n")
    p = _run_without_torch(code, tmp_path)
    assert p.returncode == 0 and "numpy ok" in p.stdout, p.stderr[-3000:]


def _run_without_torch(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", NO_TORCH + code], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})


def test_report_and_export_run_without_torch(tmp_path):
    run = TRACES / "selftest-grid-barrier"
    out = tmp_path / "t.perfetto-trace"
    p = _run_without_torch(
        "from profiler.commands.cli import main\n"
        f"assert main(['report', {str(run)!r}]) == 0\n"
        f"assert main(['export', {str(run)!r}, '-o', {str(out)!r}]) == 0\n", tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "selftest.grid_barrier" in p.stdout and out.stat().st_size > 1000


def test_every_viewer_page_runs_without_torch(tmp_path):
    code = (
        "from viewer.app import PAGES, create_app\n"
        f"app = create_app([{str(TRACES)!r}], cache_dir={str(tmp_path / 'cache')!r})\n"
        "c = app.server.test_client()\n"
        "rid = next(e.run_id for e in app.catalog.entries() if e.path.name == 'selftest-grid-barrier')\n"
        "for path in PAGES:\n"
        "    body = {'output': '..page.children...nav.children...run-select.value...url.search..',\n"
        "            'outputs': [{'id': i, 'property': p} for i, p in (('page', 'children'), ('nav', 'children'),\n"
        "                        ('run-select', 'value'), ('url', 'search'))],\n"
        "            'inputs': [{'id': 'url', 'property': 'pathname', 'value': path},\n"
        "                       {'id': 'url', 'property': 'search', 'value': '?run=' + rid},\n"
        "                       {'id': 'run-select', 'property': 'value', 'value': None}],\n"
        "            'changedPropIds': ['url.pathname']}\n"
        "    r = c.post('/_dash-update-component', json=body)\n"
        "    assert r.status_code == 200, (path, r.status_code)\n"
        "    text = r.get_data(as_text=True)\n"
        "    assert 'Cannot show' not in text and 'This page failed' not in text, (path, text[:500])\n"
        "assert c.get('/download/' + rid + '.perfetto-trace').status_code == 200\n"
        "print('pages ok')\n")
    p = _run_without_torch(code, tmp_path)
    assert p.returncode == 0 and "pages ok" in p.stdout, p.stderr[-3000:]


def test_readme_first_command_installs_into_a_venv_without_torch():
    """Debian's python3 refuses a bare `pip install` (externally-managed-environment): the README's
    first command makes a venv, and installs no torch for the viewer."""
    text = (REPO / "README.md").read_text()
    first = text.split("```bash\n", 1)[1].split("\n", 1)[0]
    assert "python3 -m venv" in first and ". .venv/bin/activate" in first and "pip install -e ." in first
    assert "torch" not in first.split("#")[0] and "epscope view" in first
