"""ep_core on a machine without CUDA (issue 34: the README's snippet ended in torch's `OSError:
CUDA_HOME environment variable is not set`). The size hints need no GPU, no toolkit and no
extension; whatever needs the extension or a GPU raises EPUnavailableError naming what is missing.
CI's machine is such a machine (torch's CPU build, no GPU); the cases it is not (a CUDA torch
without a toolkit, no ninja, no torch) are simulated."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ep_core
from ep_core import _ext
from ep_core import config as C
from ep_core.errors import EPUnavailableError
from profiler.record import build

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def no_extension(monkeypatch):
    def refuse(profile=False):
        raise AssertionError("a size hint loaded the extension")
    monkeypatch.setattr(_ext, "load", refuse)


def test_size_hints_need_no_extension(no_extension):
    T, H, R, K = 4096, 7168, 2, 16
    row = H * 2 + H // 128 * 4 + K * 12
    assert ep_core.Buffer.get_buffer_size_hint(T, H, R) == C.DATA_OFFSET + T * R * row + 8 * C.REGION_ALIGN
    assert ep_core.Buffer.get_hook_buffer_size_hint(T, H, R) == C.DATA_OFFSET + T * (2 * R - 1) * row + 8 * C.REGION_ALIGN
    assert C.Config().get_nvl_buffer_size_hint(H * 2, R) == ep_core.Buffer.get_buffer_size_hint(C.HINT_TOKENS_PER_RANK, H, R)
    assert C.Problem(tokens=T, hidden=H, topk=8, experts=256, ranks=R).nvl_bytes_needed() == \
        ep_core.Buffer.get_buffer_size_hint(T, H, R, 8)


def _cpu_python(code: str, **env) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter that sees no CUDA toolkit: no CUDA_HOME, no nvcc on PATH."""
    keep = {k: v for k, v in os.environ.items() if k not in ("CUDA_HOME", "CUDA_PATH")}
    path = os.pathsep.join([str(Path(sys.executable).parent), "/usr/bin", "/bin"])
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**keep, "PATH": path, "PYTHONPATH": str(REPO), **env})


def test_the_readme_snippet_runs_on_a_cpu_machine():
    p = _cpu_python("import ep_core as deep_ep\nprint(deep_ep.Buffer.get_buffer_size_hint(4096, 7168, 2))")
    assert p.returncode == 0, p.stderr[-3000:]
    assert int(p.stdout) == C.buffer_size_hint(4096, 7168, 2)


def test_without_torch_the_names_say_torch_is_missing():
    # sys.modules["torch"] = None: `import torch` fails as on a torch-free install
    p = _cpu_python("import sys; sys.modules['torch'] = None\n"
                    "from ep_core import config\nprint(config.buffer_size_hint(4096, 7168, 2))\n"
                    "from profiler.record import build\nprint(build.cuda_build_problem())\n"
                    "import ep_core\nep_core.Buffer")
    assert p.returncode == 1 and "Traceback" in p.stderr
    hint, problem = p.stdout.splitlines()
    assert int(hint) == C.buffer_size_hint(4096, 7168, 2) and problem.startswith("torch is not installed")
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("ep_core.errors.EPUnavailableError: ep_core.Buffer needs torch, which is not installed")


@pytest.mark.parametrize("case, words", [
    ("cpu torch", "is a CPU-only build, which cannot build CUDA extensions; on a GPU machine: pip install torch"),
    ("no toolkit", "no CUDA toolkit found (torch looked at $CUDA_HOME, nvcc on PATH and /usr/local/cuda)"),
    ("no ninja", "ninja is not installed (pip install ninja"),
])
def test_the_extension_says_what_is_missing(monkeypatch, case, words):
    from torch.utils import cpp_extension
    monkeypatch.setattr(torch.version, "cuda", None if case == "cpu torch" else "12.8")
    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None if case == "no toolkit" else "/usr/local/cuda")
    monkeypatch.setattr(cpp_extension, "is_ninja_available", lambda: case != "no ninja")
    _ext.load.cache_clear()
    with pytest.raises(EPUnavailableError, match="^ep_core: cannot build the CUDA extension ep_core: ") as e:
        _ext.load(profile=False)
    assert words in str(e.value)
    with pytest.raises(build.CudaBuildUnavailable, match="epscope_record"):   # the recorder's extension too
        build.load_record_extension(profile=True)


def test_a_buffer_without_a_gpu_says_so(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(EPUnavailableError, match="Buffer needs a CUDA GPU, and torch .* sees none"):
        ep_core.Buffer(None, num_nvl_bytes=ep_core.Buffer.get_buffer_size_hint(4096, 7168, 1))
    assert ep_core.EPUnavailableError is EPUnavailableError
