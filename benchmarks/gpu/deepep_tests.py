"""DeepEP's own test scripts against ep_core (issue 35): a DeepEP checkout the developer supplies
runs with `import deep_ep` resolving to ep_core, its files untouched.

    python benchmarks/gpu/deepep_tests.py --deepep /path/to/DeepEP [--ranks 1,2] [--out DIR]
    (or EPSCOPE_DEEPEP_DIR=/path/to/DeepEP; the DeepEP V1 checkout, its tests/ directory at least)

How: a shim package directory (a temporary `deep_ep/__init__.py` that re-exports ep_core's
Buffer, Config, EventOverlap and topk_idx_t) goes first on PYTHONPATH, the repository second;
each script runs from the checkout's tests/ directory (its `from utils import ...` and `import
test_low_latency` find their files there) with `--num-processes N`, for every N from 1 to the
GPU count that the script's default expert count divides (test_intranode 256, test_low_latency
288). Nothing is fetched: the scripts are DeepEP's (MIT) and stay in the developer's checkout.
A script passes when it exits 0 (DeepEP's scripts assert their results). Each run's output goes
to `<out>/<script>-n<N>.log`; a summary table is printed and written to `<out>/deepep_tests.md`.
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from ep_core.launch import NO_MULTICAST_ENV

ENV_DIR = "EPSCOPE_DEEPEP_DIR"
# The scripts and the expert count each uses by default (their argparse defaults at DeepEP
# 567632d); a rank count must divide it (both scripts assert num_experts % num_ranks == 0).
SCRIPTS = {"test_intranode.py": 256, "test_low_latency.py": 288}
SHIM = '''"""deep_ep resolving to ep_core (epscope benchmarks/gpu/deepep_tests.py writes this file)."""
from ep_core import Buffer, Config, EventOverlap, topk_idx_t  # noqa: F401
'''
# never NVLink multicast on the lent machines (ep_core.launch's variables, the ones its rank
# processes get); output unbuffered
SAFE_ENV = {**NO_MULTICAST_ENV, "PYTHONUNBUFFERED": "1"}


@dataclass(frozen=True)
class ScriptRun:
    script: str
    ranks: int
    returncode: int | None   # None: not run (the reason says why)
    seconds: float
    log: Path | None
    reason: str = ""

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def tests_dir(deepep: str | os.PathLike | None) -> Path:
    """The checkout's tests/ directory, checked for the two scripts and their utils.py."""
    if not deepep:
        raise FileNotFoundError(f"no DeepEP checkout given (--deepep or env {ENV_DIR})")
    d = Path(deepep).expanduser().resolve()
    d = d / "tests" if (d / "tests").is_dir() else d
    missing = [f for f in (*SCRIPTS, "utils.py") if not (d / f).is_file()]
    if missing:
        raise FileNotFoundError(f"{d} lacks {', '.join(missing)}: give a DeepEP checkout (or its tests/ directory)")
    return d


def write_shim(root: Path) -> Path:
    pkg = root / "deep_ep"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(SHIM)
    return root


def rank_counts(script: str, gpus: int, wanted: list[int] | None = None) -> list[tuple[int, str]]:
    """(N, reason not to run or "") for every N the script is run or skipped at."""
    out = []
    for n in (wanted or range(1, gpus + 1)):
        if n > gpus:
            out.append((n, f"needs {n} GPUs, {gpus} visible"))
        elif SCRIPTS[script] % n:
            out.append((n, f"{script} routes {SCRIPTS[script]} experts, not a multiple of {n} ranks"))
        else:
            out.append((n, ""))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(tdir: Path, shim: Path, script: str, ranks: int, out: Path, timeout_s: float,
               extra: list[str] = ()) -> ScriptRun:
    """One script at `ranks` processes; its output (stdout and stderr) to `<out>/<script>-n<ranks>.log`."""
    env = dict(os.environ, **SAFE_ENV, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    env["PYTHONPATH"] = os.pathsep.join([str(shim), str(REPO)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    log = out / f"{Path(script).stem}-n{ranks}.log"
    cmd = [sys.executable, script, "--num-processes", str(ranks), *extra]
    t0 = time.monotonic()
    with open(log, "w") as f:
        f.write(f"$ (cd {tdir} && {' '.join(cmd)})\n")
        f.flush()
        try:
            rc = subprocess.run(cmd, cwd=tdir, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s).returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[deepep_tests] timed out after {timeout_s:.0f} s\n")
            rc = -9
    return ScriptRun(script, ranks, rc, time.monotonic() - t0, log)


def run_all(deepep, out: Path, ranks: list[int] | None = None, scripts=tuple(SCRIPTS), timeout_s: float = 600,
            gpus: int | None = None) -> list[ScriptRun]:
    import torch

    tdir = tests_dir(deepep)
    out.mkdir(parents=True, exist_ok=True)
    gpus = torch.cuda.device_count() if gpus is None else gpus
    runs = []
    with tempfile.TemporaryDirectory(prefix="deep_ep_shim_") as tmp:
        shim = write_shim(Path(tmp))
        for script in scripts:
            for n, reason in rank_counts(script, gpus, ranks):
                runs.append(ScriptRun(script, n, None, 0.0, None, reason) if reason
                            else run_script(tdir, shim, script, n, out, timeout_s))
    return runs


def summary(runs: list[ScriptRun]) -> str:
    lines = ["| script | ranks | result | seconds | log |", "| --- | --- | --- | --- | --- |"]
    for r in runs:
        result = ("passed" if r.passed else f"FAILED (exit {r.returncode})") if r.returncode is not None \
            else f"not run: {r.reason}"
        lines.append(f"| {r.script} | {r.ranks} | {result} | {r.seconds:.1f} | {r.log.name if r.log else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--deepep", default=os.environ.get(ENV_DIR), help=f"DeepEP checkout (default: env {ENV_DIR})")
    ap.add_argument("--ranks", default="", help="comma-separated rank counts (default: 1..GPU count)")
    ap.add_argument("--scripts", default=",".join(SCRIPTS), help="which of DeepEP's scripts")
    ap.add_argument("--out", default="deepep_tests_out", help="directory for the logs and the summary")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per script run")
    a = ap.parse_args(argv)
    ranks = [int(v) for v in a.ranks.split(",") if v] or None
    scripts = [s for s in a.scripts.split(",") if s]
    unknown = [s for s in scripts if s not in SCRIPTS]
    if unknown:
        ap.error(f"unknown scripts {unknown}; choose from {list(SCRIPTS)}")
    runs = run_all(a.deepep, Path(a.out), ranks, scripts, a.timeout)
    table = summary(runs)
    Path(a.out, "deepep_tests.md").write_text(table + "\n")
    print(table)
    return 0 if all(r.passed for r in runs if r.returncode is not None) and any(r.returncode is not None for r in runs) \
        else 1


if __name__ == "__main__":
    sys.exit(main())
