"""Every cache and default output follows one setting (profiler/store/cachedir.py); each keeps its
own narrower override."""
from __future__ import annotations

from pathlib import Path

import pytest

from profiler.commands import cli
from profiler.decode import calibration, decode_fast
from profiler.record import build
from profiler.store import cachedir, hashcache
from viewer import results

# each user of the cache root: where it puts its file or folder under the root, its own override
USERS = {
    "file hashes": (hashcache.cache_path, "file-hashes.json", hashcache.ENV),
    "viewer results": (results.cache_root, "results", results.CACHE_ENV),
    "decode build": (lambda: decode_fast.aot_dir().parent, "decode", None),
    "kernel builds": (build.build_root, "", "EPSCOPE_BUILD_DIR"),
    "calibration": (calibration.default_path, "calibration.json", calibration.ENV),
    "exports": (cli.export_dir, "exports", cli.EXPORT_DIR_ENV),
}


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in {cachedir.ENV, "XDG_CACHE_HOME"} | {u[2] for u in USERS.values() if u[2]}:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return monkeypatch


def _under(root: Path, sub: str) -> Path:
    return root / sub if sub else root


@pytest.mark.parametrize("name", USERS)
def test_every_cache_lies_under_the_one_root(name, clean_env, tmp_path):
    where, sub, _ = USERS[name]
    assert where() == _under(tmp_path / "home" / ".cache" / "epscope", sub)
    clean_env.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert where() == _under(tmp_path / "xdg" / "epscope", sub)
    clean_env.setenv("XDG_CACHE_HOME", "relative/xdg")          # invalid per the XDG spec: ignored
    assert where() == _under(tmp_path / "home" / ".cache" / "epscope", sub)
    clean_env.setenv(cachedir.ENV, str(tmp_path / "mine"))
    assert where() == _under(tmp_path / "mine", sub)


@pytest.mark.parametrize("name", [n for n, u in USERS.items() if u[2]])
def test_a_narrower_override_wins(name, clean_env, tmp_path):
    where, _, env = USERS[name]
    clean_env.setenv(cachedir.ENV, str(tmp_path / "mine"))
    clean_env.setenv(env, str(tmp_path / "narrow"))
    assert where() == tmp_path / "narrow"


def test_nothing_else_computes_the_cache_directory():
    """The six places that each built ~/.cache/epscope now ask cachedir (a seventh would drift)."""
    root = Path(__file__).resolve().parents[2]
    found = [str(p.relative_to(root)) for pkg in ("profiler", "viewer", "ep_core")
             for p in (root / pkg).rglob("*.py")
             if p.name != "cachedir.py" and '".cache"' in p.read_text()]
    assert found == []
