"""The `epscope` console command.

    epscope export RUN [-o OUT [--force]]  write RUN's Perfetto trace (default: under ~/.cache/epscope/exports)
    epscope report RUN [RUN ...]           text summary of runs
    epscope check RUN|ROOT [...]           verify runs (seal, checksums, every field and row, stored analyses); exit 1 if any is damaged
    epscope merge RUN TRACE [TRACE ...]    attach PyTorch profiler (Kineto) traces to a run, one per rank, aligned
    epscope seal RUN [RUN ...]             seal runs written before format 3 in place (checked first)
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
outputs print one line on stderr and exit 2. `export` without -o writes to $EPSCOPE_EXPORT_DIR
(default ~/.cache/epscope/exports), never into the run: a run may lie in a checkout (traces/), which
must stay clean. `export -o` never writes inside a run directory (but RUN/trace.perfetto-trace, the
run's own trace) and replaces an existing file only with --force, and then only a regular file. `view` serves on loopback; another --host needs
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

from ..store.atomic import is_regular
from ..errors import EpscopeError
from ..store.cachedir import cache_root

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
                   help="output file outside any run directory, or RUN/trace.perfetto-trace (default: "
                        "$EPSCOPE_EXPORT_DIR/RUN-<hash>.perfetto-trace, EPSCOPE_EXPORT_DIR defaulting to "
                        "~/.cache/epscope/exports)")
    p.add_argument("--force", action="store_true", help="replace OUT if it exists")
    p = sub.add_parser("report", help="text summary of a run")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory")
    p = sub.add_parser("check", help="verify runs: seal, checksums, manifest, every row, stored analyses; say what "
                                      "is wrong with each")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory, or a directory of runs")
    p = sub.add_parser("merge", help="attach PyTorch profiler (Kineto) traces to a run: one per rank, JSON or .json.gz")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("traces", type=Path, nargs="+", metavar="TRACE", help="Kineto trace (rank from distributedInfo "
                   "or from the launch labels ep_core writes)")
    p = sub.add_parser("seal", help="seal runs written before format 3 in place (their data checked whole first)")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory")
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
    from ..store.runstore import MANIFEST
    for d in (p, *p.parents):
        if (d / MANIFEST).is_file():
            return d
    return None


EXPORT_DIR_ENV = "EPSCOPE_EXPORT_DIR"


def export_dir() -> Path:
    """Where `epscope export RUN` writes without -o: $EPSCOPE_EXPORT_DIR, else ~/.cache/epscope/exports
    (beside the build and calibration caches). Never the run directory: a run may lie in a checkout
    (the bundled traces/ do), and an untracked trace there dirtied it (issue 34)."""
    env = os.environ.get(EXPORT_DIR_ENV)
    return Path(env) if env else cache_root() / "exports"


def default_export_path(run) -> Path:
    """export_dir()/<run directory name>-<8 hex of its real path>.perfetto-trace: two runs of one
    name in different folders do not overwrite each other's export."""
    import hashlib
    tag = hashlib.sha256(os.fsencode(os.path.realpath(run.path))).hexdigest()[:8]   # fsencode: any name bytes
    return export_dir() / f"{Path(run.path).name}-{tag}.perfetto-trace"


def export_target(run, out: Path | None, force: bool) -> tuple[Path, bool]:
    """Where `epscope export` writes and whether it may replace a file there. Without -o: its
    place under export_dir() (created; an earlier export of the run is replaced). An explicit -o
    must not be a directory, must have an existing parent, must not lie inside a run directory
    (`-o RUN/events.parquet` would destroy the run) unless it is the run's own trace
    (RUN/trace.perfetto-trace, derived from its data), and replaces an existing file only with
    --force. Only regular files are ever replaced."""
    from ..store.runstore import TRACE
    own = run.path / TRACE
    if out is None:
        out, force = default_export_path(run), True
        out.parent.mkdir(parents=True, exist_ok=True)
    real = Path(os.path.realpath(out))   # through symlinks: a link into a run is refused too
    if real == Path(os.path.realpath(own)):
        return own, True
    if real.is_dir():
        raise Refused(f"-o {out}: is a directory; name the trace file to write")
    if not real.parent.is_dir():
        raise Refused(f"-o {out}: directory {real.parent} does not exist")
    inside = _inside_run(real.parent)
    if inside is not None:
        raise Refused(f"-o {out}: inside the run directory {inside}; write the trace elsewhere "
                      f"(or -o {inside / TRACE}, the run's own trace)")
    if os.path.lexists(out):
        if not force:
            raise Refused(f"-o {out}: exists; add --force to replace it")
        if not is_regular(out):
            raise Refused(f"{out}: exists and is not a regular file (a link, FIFO or device); "
                          "--force replaces only regular files")
    return out, force


def _export(args) -> int:
    from .progress import Activity
    from ..store.runreader import load_run
    run = load_run(args.run)   # run errors before the perfetto import
    out, replace = export_target(run, args.out, args.force)
    exp = _lazy("profiler.export.perfetto", "epscope export")
    partial = []   # the export's temporary file, once open: its size is the progress
    with Activity("epscope export", watch=lambda: partial[0].size() if partial else 0,
                  unit="B", what="written") as act:
        act.step("checking events and writing the trace")
        out = exp.export_perfetto(run, out, force=replace, opened=partial.append)
    print(f"wrote {shown(out)} ({out.stat().st_size / 1e6:.1f} MB); open it at https://ui.perfetto.dev")
    return 0


def shown(p) -> str:
    """A path as one printable line: control characters (a newline in a directory name forged a
    line of check's output, issue 32) and undecodable bytes escaped."""
    s = os.fspath(p)
    return s if s.isprintable() and s.encode("utf-8", "surrogateescape").decode("utf-8", "replace") == s \
        else ascii(s)[1:-1]


def _check(args) -> int:
    """One line per run: ok (and what was verified, what was not) or what is wrong; exit 1 if any
    is damaged (its stored analyses included: they are not shown, but their bytes changed)."""
    from ..analysis import stored
    from ..store.runreader import MANIFEST, check_run, list_runs
    runs = []
    for r in args.runs:   # a directory of runs (no manifest of its own) stands for the runs under it
        under = list_runs(r) if r.is_dir() and not (r / MANIFEST).exists() else []
        runs += under or [r]
    damaged = 0
    for r in runs:
        c = check_run(r, deep=True)
        if not c.damaged:   # the attached PyTorch traces (issue 30): checksummed in the manifest too
            from ..torchtrace.store import verify
            torch_problems = verify(r)
            if torch_problems:
                c = type(c)(c.path, c.manifest, "corrupt", "; ".join(torch_problems), c.num_events, c.note)
        if c.damaged:
            damaged += 1
            print(f"{shown(r)}: {c.status.upper()}: {' '.join(c.problem.split())}")
            continue
        analyses = stored.verify(r)
        if analyses and not analyses.startswith("stale"):
            damaged += 1
            print(f"{shown(r)}: STORED ANALYSES DAMAGED (not shown; `epscope analyze` stores them again): {analyses}")
            continue
        what = f"{c.num_events:,} events" + (f", recorded status {c.status}" if c.status != "ok" else "")
        verified = c.note or "manifest seal and checksums verified"
        print(f"{shown(r)}: ok ({what}; {verified}" + (f"; {analyses}" if analyses else "") + ")")
    if damaged:
        print(f"epscope check: {damaged} of {len(runs)} runs damaged", file=sys.stderr)
    return EXIT_DAMAGED if damaged else 0


def _seal(args) -> int:
    from ..store.runstore import seal_run
    for r in args.runs:
        done = seal_run(r)
        print(f"{shown(r)}: " + ("sealed (format 3); its stored analyses, if any, were left out: `epscope analyze` "
                                "stores them again" if done else "sealed already"))
    return 0


def _report(args) -> int:
    from .progress import Activity
    from .report import report
    texts = []
    with Activity("epscope report") as act:
        for r in args.runs:
            texts.append(report(r, step=lambda label, r=r: act.step(f"{r}: {label}")))
    sys.stdout.write("\n".join(texts))
    return 0


def _merge(args) -> int:
    """Attach the traces (profiler.torchtrace.store.attach: refused, nothing written, when one
    cannot be aligned); then the stored summary, when the run has one, gains the named op."""
    from ..torchtrace.report import alignment_line
    from ..torchtrace.attach import attach
    from ..torchtrace.align import Alignment
    missing = [str(t) for t in args.traces if not t.is_file()]
    if missing:
        return _fail(f"no such trace file: {', '.join(missing)}")
    done = attach(args.run, args.traces)
    for a in done:
        print(alignment_line(Alignment.from_json(a)))
    from ..analysis import summary
    if summary.load(args.run) is not None:
        from ..store.runreader import load_run
        summary.store(load_run(args.run))
        print(f"updated {Path(args.run) / summary.FILE}")
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
    from ..analysis import stored, summary
    from .progress import Activity
    engine = _engine(args)
    try:
        with Activity("epscope analyze") as act:
            for r in args.runs:
                act.step(f"{r}: loading")
                out = stored.store_run(r, step=lambda label, r=r: act.step(f"{r}: {label}"), engine=engine)
                print(f"wrote {shown(out)} and {shown(Path(r) / summary.FILE)}")
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
    for stream in (sys.stdout, sys.stderr):   # a path of undecodable bytes printed, not a traceback
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in PASSTHROUGH:
        # everything after the subcommand, --help included, belongs to it
        mod = _lazy(PASSTHROUGH[argv[0]][0], f"epscope {argv[0]}")
        try:
            return int(mod.main(argv[1:]) or 0)
        except EpscopeError as e:
            return _fail(str(e))
    args = _parser().parse_args(argv)
    commands = {"export": _export, "report": _report, "check": _check, "merge": _merge, "seal": _seal,
                "analyze": _analyze, "view": _view}
    try:
        return commands[args.cmd](args)
    except EpscopeError as e:
        return _fail(str(e))
    except BrokenPipeError:  # `epscope report RUN | head`
        return 0
    except OSError as e:   # a file the command writes (disk full, permissions): one line, not a traceback
        return _fail(f"{e.filename}: {e.strerror or e}" if e.filename else str(e))
