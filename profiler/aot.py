"""Compiled loops without numba at run time: an ahead-of-time (numba.pycc) build per source file.

Made for the decoder's record loop (profiler/decode/decode_fast.py) and shared with the graph
build's per-lane passes (profiler/analysis/graph_fast.py). Why ahead of time: a fresh process pays
~0.15 s CPU to import numba and ~0.4 s more for its first call of any function, even one loaded from
numba's on-disk cache (benchmarks/NOTES.md, the decoder's sections); an AOT extension module loads
in under a millisecond without importing numba.

`Compiled(module, source, exports)`: `exports` maps an exported name to (python function, numba
signature). The module is built on first use after installing or changing `source` into a per-user
cache directory keyed by the source's bytes and the Python / numpy / platform (`where`), then loaded
by every later process. Where the build cannot run (no C compiler, a numba without pycc) it is tried
once per machine and source version (a `.failed` marker beside it) and each function runs under
numba's JIT with its on-disk cache instead. numba itself is optional (the `fast` / `dev` extras):
`available()` says whether either route can run, so callers keep a numpy path.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

from .store.cachedir import cache_root


def build_dir(source: Path, sub: str) -> Path:
    """Where the ahead-of-time build of `source` lives: keyed by its bytes and the Python, numpy and
    platform it was built for (under cachedir.cache_root() / sub)."""
    key = hashlib.sha256(Path(source).read_bytes())
    key.update(f"{sys.implementation.cache_tag} {np.__version__} {platform.machine()} {sys.platform}".encode())
    return cache_root() / sub / key.hexdigest()[:16]


def load(where: Path, module: str):
    """The extension module `module` built into `where`, or None if there is none."""
    paths = sorted(where.glob(f"{module}*.so")) + sorted(where.glob(f"{module}*.pyd"))
    if not paths:
        return None
    spec = importlib.util.spec_from_file_location(module, paths[0])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def build(where: Path, module: str, exports: dict) -> Path:
    """Compile `exports` ({name: (function, signature)}) ahead of time into `where`; its path.
    Built in a temporary directory beside it and renamed into place, so concurrent first uses never
    load a half-written module."""
    with warnings.catch_warnings():   # pycc is pending deprecation since numba 0.57, still shipped (0.68)
        warnings.simplefilter("ignore")
        from numba.pycc import CC
    where.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=where.parent))
    cc = CC(module)
    cc.output_dir = str(tmp)
    cc.verbose = False
    for name, (fn, sig) in exports.items():
        cc.export(name, sig)(fn)
    cc.compile()
    try:
        os.replace(tmp, where)
    except OSError:   # another process got there first: use its build
        import shutil
        shutil.rmtree(tmp, ignore_errors=True)
    return where


class Compiled:
    """The exported functions of one source file: the AOT module's, else numba's JIT (cached)."""

    def __init__(self, module: str, source: Path, sub: str, exports: dict, what: str, jit_only: bool = False,
                 builder=None):
        """builder(where) -> where: the build (default: `build` of the exports; the decoder passes its
        own build_aot, which its tests replace)."""
        self.module, self.source, self.sub, self.exports, self.what = module, Path(source), sub, exports, what
        self.builder = builder or (lambda where: build(where, module, exports))
        self.aot, self.how, self.build_error = None, "jit", ""
        self._jit: dict = {}
        if not jit_only:
            self._load_or_build()

    def where(self) -> Path:
        return build_dir(self.source, self.sub)

    def _load_or_build(self) -> None:
        where = self.where()
        self.aot = load(where, self.module)
        failed = where.parent / (where.name + ".failed")   # tried once per machine and source version
        if self.aot is None and failed.exists():
            self.build_error = failed.read_text()
        elif self.aot is None:
            try:
                self.aot = load(self.builder(where), self.module)
            except Exception as e:  # noqa: BLE001  (no C compiler, no pycc: the JIT still works)
                self.build_error = f"{type(e).__name__}: {e}"
                try:
                    failed.parent.mkdir(parents=True, exist_ok=True)
                    failed.write_text(self.build_error)
                except OSError:
                    pass
        if self.aot is not None:
            self.how = "aot"
        else:
            warnings.warn(f"epscope: no ahead-of-time build of {self.what} ({self.build_error}); numba's JIT "
                          "runs it instead, ~0.5 s more per fresh process", RuntimeWarning, stacklevel=4)

    def get(self, name: str, fn=None):
        """Exported `name` (AOT), else `fn` (default: the exported function) under numba's JIT."""
        if self.aot is not None and name in self.exports:
            return getattr(self.aot, name)
        fn = fn or self.exports[name][0]
        jit = self._jit.get(fn)
        if jit is None:
            import numba
            jit = self._jit[fn] = numba.njit(cache=True, nogil=True, boundscheck=False)(fn)
        return jit


def available(where: Path, module: str) -> bool:
    """Can this process run the compiled loops (an AOT build on disk, or numba to make one)?"""
    try:
        if load(where, module) is not None:
            return True
    except (OSError, RuntimeError, ImportError):   # no home directory, an unreadable cache: numba decides
        pass
    return importlib.util.find_spec("numba") is not None


class Loops:
    """One source file's compiled loops, made on first use (the graph build's and the what-if
    solver's modules: `compiled()` for the functions, `enabled(engine)` for whether to run them)."""

    def __init__(self, module: str, source: Path, sub: str, exports: dict, what: str):
        self.module, self.source, self.sub, self.exports, self.what = module, Path(source), sub, exports, what
        self._compiled: Compiled | None = None

    def compiled(self) -> Compiled:
        if self._compiled is None:
            self._compiled = Compiled(self.module, self.source, self.sub, self.exports, self.what)
        return self._compiled

    def enabled(self, engine: str) -> bool:
        """Run the compiled loops? (engine "auto", and an AOT build on disk or numba to make one)"""
        if engine == "numpy":
            return False
        return self._compiled is not None or available(build_dir(self.source, self.sub), self.module)

