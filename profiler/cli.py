"""The `epscope` console command.

    epscope export RUN [-o OUT [--force]]  write RUN's Perfetto trace (default RUN/trace.perfetto-trace)
    epscope report RUN [RUN ...]           text summary of runs
    epscope check RUN|ROOT [...]           verify runs (checksums, every field and row); exit 1 if any is damaged
    epscope analyze RUN [RUN ...] [--dask SCHEDULER | --workers N]
                                           compute and store each run's analyses (RUN/analysis/, RUN/analysis-summary.json),
                                           the chunks of a big run on Dask workers with --dask / --workers
    epscope view [RUN_DIR ...]             the web viewer (default: the repo's bundled traces/)
    epscope trace ...                      record a profiled EP workload (profiler.workflows.trace)
    epscope selftest ...                   record the recorder self-test kernels (profiler.record.selftest)
    epscope calibrate ...                  measure this GPU's clocks and record costs (profiler.record.calibrate)
    epscope ab REF_A REF_B ...             build two git refs, run them interleaved, verdict with CIs (profiler.workflows.ab)
    epscope tune [--ll] ...                sweep a shape's geometry, save the re-checked winners (profiler.workflows.tune)

Bad runs (missing, corrupt, malformed manifest or events, newer format, empty) and refused
outputs print one line on stderr and exit 2. `export -o` never writes inside a run directory and
replaces an existing file only with --force, and then only a regular file. `view` serves on loopback; another --host needs
--allow-remote (every run under the roots is then readable by anyone who can reach the port).
Long work shows progress on stderr when it is a terminal.
"""
from __future__ import annotations

import argparse
import importlib
import ipaddress
import os
import sys
from pathlib import Path

from .atomic import is_regular
from .errors import EpscopeError

EXIT_USAGE = 2
PASSTHROUGH = {"trace": ("profiler.workflows.trace", "record a profiled EP workload on the local GPUs"),
               "selftest": ("profiler.record.selftest", "record the recorder self-test kernels on a GPU"),
               "calibrate": ("profiler.record.calibrate", "measure this GPU's timers, SM clocks and record costs "
                                                         "into a calibration file"),
               "ab": ("profiler.workflows.ab", "compare two git refs' kernels on the local GPUs, interleaved"),
               "tune": ("profiler.workflows.tune", "tune a shape's dispatch/combine geometry (--ll: the low-latency kernels) into "
                                        "the tuned table")}


def default_trace_root() -> Path:
    """The bundled runs: the checkout's traces/, else the copy an installed epscope keeps under
    <prefix>/share/epscope/traces (setup.py), else the checkout path (view then says it is missing)."""
    import site
    import sysconfig

    import profiler
    checkout = Path(profiler.__file__).resolve().parents[1] / "traces"
    installed = [Path(sysconfig.get_path("data")) / "share/epscope/traces",
                 Path(site.getuserbase()) / "share/epscope/traces"]
    return next((p for p in (checkout, *installed) if p.is_dir()), checkout)


EXIT_DAMAGED = 1   # `epscope check`: at least one run is damaged


def _port(v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{v!r} is not a port number") from None
    if not 1 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{n} is outside 1-65535")
    return n


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epscope", description="See inside expert-parallel communication kernels.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser("export", help="write a run's Perfetto trace")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--out", type=Path, default=None,
                   help="output file outside any run directory (default RUN/trace.perfetto-trace)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p = sub.add_parser("report", help="text summary of a run")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory")
    p = sub.add_parser("check", help="verify runs: checksums, manifest, every row; say what is wrong with each")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory, or a directory of runs")
    p = sub.add_parser("analyze", help="compute and store runs' analyses (the viewer reads them instead of computing)")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory")
    eng = p.add_mutually_exclusive_group()
    eng.add_argument("--dask", metavar="SCHEDULER", default=None,
                     help="analyse the chunks of each run on this dask.distributed scheduler's workers (e.g. "
                          "tcp://host:8786; the runs must be at the same path on every worker; pip install "
                          "'epscope[dask]')")
    eng.add_argument("--workers", type=int, default=None, metavar="N",
                     help="analyse the chunks on a local Dask cluster of N worker processes (pip install 'epscope[dask]')")
    p = sub.add_parser("view", help="serve the web viewer")
    p.add_argument("roots", type=Path, nargs="*", metavar="RUN_DIR", help="run directories or roots (default: traces/)")
    p.add_argument("--host", default="127.0.0.1", help="address to serve on (default loopback only)")
    p.add_argument("--port", type=_port, default=8050, help="TCP port, 1-65535 (default 8050)")
    p.add_argument("--allow-remote", action="store_true",
                   help="serve on a non-loopback --host: the viewer has no authentication, so anyone who "
                        "can reach the port reads every run under the roots")
    for name, (_, helptext) in PASSTHROUGH.items():
        q = sub.add_parser(name, help=helptext, add_help=False)
        q.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def _fail(msg: str) -> int:
    print(f"epscope: error: {' '.join(str(msg).split())}", file=sys.stderr)   # one line, always
    return EXIT_USAGE


def _lazy(module: str, what: str, install: str = "pip install -e . from the repository root"):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise SystemExit(_fail(f"{what} needs the Python package {e.name!r}, which is not installed here "
                               f"({install})")) from None


class Refused(EpscopeError):
    """A command line asks for something epscope will not do (the message says what to do)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _inside_run(p: Path) -> Path | None:
    """The run directory that p lies in (p itself or an ancestor holding manifest.json)."""
    from .runstore import MANIFEST
    for d in (p, *p.parents):
        if (d / MANIFEST).is_file():
            return d
    return None


def export_target(run, out: Path | None, force: bool) -> Path:
    """Where `epscope export` writes: RUN/trace.perfetto-trace by default; an explicit -o must
    not be a directory, must have an existing parent, must not lie inside a run directory
    (`-o RUN/events.parquet` would destroy the run), and replaces an existing file only with
    --force."""
    from .runstore import TRACE
    default = run.path / TRACE
    if out is None:
        return default
    real = Path(os.path.realpath(out))   # through symlinks: a link into a run is refused too
    if real == Path(os.path.realpath(default)):
        return default
    if real.is_dir():
        raise Refused(f"-o {out}: is a directory; name the trace file to write")
    if not real.parent.is_dir():
        raise Refused(f"-o {out}: directory {real.parent} does not exist")
    inside = _inside_run(real.parent)
    if inside is not None:
        raise Refused(f"-o {out}: inside the run directory {inside}; write the trace elsewhere "
                      f"(or leave out -o to write {TRACE} of the run itself)")
    if os.path.lexists(out):
        if not force:
            raise Refused(f"-o {out}: exists; add --force to replace it")
        if not is_regular(out):
            raise Refused(f"-o {out}: exists and is not a regular file (a link, FIFO or device); "
                          "--force replaces only regular files")
    return out


def _export(args) -> int:
    from .progress import Activity
    from .runreader import load_run
    run = load_run(args.run)   # run errors before the perfetto import
    out = export_target(run, args.out, args.force)
    exp = _lazy("profiler.perfetto_export", "epscope export")
    partial = []   # the export's temporary file, once open: its size is the progress
    with Activity("epscope export", watch=lambda: partial[0].size() if partial else 0,
                  unit="B", what="written") as act:
        act.step("checking events and writing the trace")
        out = exp.export_perfetto(run, out, force=args.force, opened=partial.append)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); open it at https://ui.perfetto.dev")
    return 0


def _check(args) -> int:
    """One line per run: ok (and what was verified) or what is wrong; exit 1 if any is damaged."""
    from .runreader import MANIFEST, check_run, list_runs
    runs = []
    for r in args.runs:   # a directory of runs (no manifest of its own) stands for the runs under it
        under = list_runs(r) if r.is_dir() and not (r / MANIFEST).exists() else []
        runs += under or [r]
    damaged = 0
    for r in runs:
        c = check_run(r, deep=True)
        if c.damaged:
            damaged += 1
            print(f"{r}: {c.status.upper()}: {c.problem}")
        else:
            what = f"{c.num_events:,} events" + (f", recorded status {c.status}" if c.status != "ok" else "")
            print(f"{r}: ok ({what}; " + (c.note or "checksums verified") + ")")
    if damaged:
        print(f"epscope check: {damaged} of {len(runs)} runs damaged", file=sys.stderr)
    return EXIT_DAMAGED if damaged else 0


def _report(args) -> int:
    from .progress import Activity
    from .report import report
    texts = []
    with Activity("epscope report") as act:
        for r in args.runs:
            texts.append(report(r, step=lambda label, r=r: act.step(f"{r}: {label}")))
    sys.stdout.write("\n".join(texts))
    return 0


def _engine(args):
    """The distributed engine `--dask` / `--workers` ask for (None: this process analyses)."""
    if args.dask is None and args.workers is None:
        return None
    if args.workers is not None and args.workers < 1:
        raise Refused(f"--workers {args.workers}: a local cluster needs at least one worker")
    dist = _lazy("profiler.analysis.distributed", "epscope analyze --dask/--workers",
                 "pip install -e '.[dask]' from the repository root")
    return dist.DaskEngine.connect(args.dask) if args.dask is not None else dist.DaskEngine.local(args.workers)


def _analyze(args) -> int:
    from .analysis import stored, summary
    from .progress import Activity
    engine = _engine(args)
    try:
        with Activity("epscope analyze") as act:
            for r in args.runs:
                act.step(f"{r}: loading")
                out = stored.store_run(r, step=lambda label, r=r: act.step(f"{r}: {label}"), engine=engine)
                print(f"wrote {out} and {Path(r) / summary.FILE}")
    finally:
        if engine is not None:
            engine.close()
    return 0


def _view(args) -> int:
    roots = [p.resolve() for p in args.roots] or [default_trace_root()]
    missing = [str(p) for p in roots if not p.exists()]
    if missing:
        return _fail(f"no such run directory or root: {', '.join(missing)}")
    not_dirs = [str(p) for p in roots if not p.is_dir()]
    if not_dirs:
        return _fail(f"not a directory (a run directory or a root of runs): {', '.join(not_dirs)}")
    if not is_loopback(args.host):
        if not args.allow_remote:
            return _fail(f"--host {args.host} would serve every run under {', '.join(map(str, roots))} to the "
                         "network with no authentication; add --allow-remote to do it anyway, or use "
                         "--host 127.0.0.1 and an SSH tunnel")
        print(f"epscope: warning: serving on {args.host}:{args.port} without authentication: anyone who can "
              "reach this port reads every run under the roots", file=sys.stderr)
    app = _lazy("viewer.app", "epscope view")
    return int(app.serve(roots, args.host, args.port) or 0)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        # everything after the subcommand, --help included, belongs to it
        mod = _lazy(PASSTHROUGH[argv[0]][0], f"epscope {argv[0]}")
        try:
            return int(mod.main(argv[1:]) or 0)
        except EpscopeError as e:
            return _fail(str(e))
    args = _parser().parse_args(argv)
    commands = {"export": _export, "report": _report, "check": _check, "analyze": _analyze, "view": _view}
    try:
        return commands[args.cmd](args)
    except EpscopeError as e:
        return _fail(str(e))
    except BrokenPipeError:  # `epscope report RUN | head`
        return 0
    except OSError as e:   # a file the command writes (disk full, permissions): one line, not a traceback
        return _fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e))
