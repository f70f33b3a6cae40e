"""The `epscope` console command.

    epscope export RUN [-o OUT]      write RUN's Perfetto trace (default RUN/trace.perfetto-trace)
    epscope report RUN [RUN ...]     text summary of runs
    epscope view [RUN_DIR ...]       the web viewer (default: the repo's bundled traces/)
    epscope trace ...                record a profiled EP workload (ep_core.trace)
    epscope selftest ...             record the recorder self-test kernels (profiler.record.selftest)

Bad runs (missing, corrupt, newer format, empty) print one line on stderr and exit 2.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from .errors import EpscopeError

EXIT_USAGE = 2
PASSTHROUGH = {"trace": ("ep_core.trace", "record a profiled EP workload on the local GPUs"),
               "selftest": ("profiler.record.selftest", "record the recorder self-test kernels on a GPU")}


def default_trace_root() -> Path:
    import profiler
    return Path(profiler.__file__).resolve().parents[1] / "traces"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epscope", description="See inside expert-parallel communication kernels.")
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    p = sub.add_parser("export", help="write a run's Perfetto trace")
    p.add_argument("run", type=Path, help="run directory")
    p.add_argument("-o", "--out", type=Path, default=None, help="output file (default RUN/trace.perfetto-trace)")
    p = sub.add_parser("report", help="text summary of a run")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run directory")
    p = sub.add_parser("view", help="serve the web viewer")
    p.add_argument("roots", type=Path, nargs="*", metavar="RUN_DIR", help="run directories or roots (default: traces/)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8050)
    for name, (_, helptext) in PASSTHROUGH.items():
        q = sub.add_parser(name, help=helptext, add_help=False)
        q.add_argument("args", nargs=argparse.REMAINDER)
    return ap


def _fail(msg: str) -> int:
    print(f"epscope: error: {msg}", file=sys.stderr)
    return EXIT_USAGE


def _lazy(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise SystemExit(_fail(f"{what} needs the Python package {e.name!r}, which is not installed here "
                               f"(pip install -e '.[dev]' from the repository root)")) from None


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
    try:
        if args.cmd == "export":
            from .runstore import load_run
            run = load_run(args.run)  # run errors before the perfetto import
            exp = _lazy("profiler.perfetto_export", "epscope export")
            out = exp.export_perfetto(run, args.out)
            print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB); open it at https://ui.perfetto.dev")
            return 0
        if args.cmd == "report":
            from .report import report
            texts = [report(r) for r in args.runs]
            sys.stdout.write("\n".join(texts))
            return 0
        if args.cmd == "view":
            roots = [p.resolve() for p in args.roots] or [default_trace_root()]
            missing = [str(p) for p in roots if not p.exists()]
            if missing:
                return _fail(f"no such run directory or root: {', '.join(missing)}")
            app = _lazy("viewer.app", "epscope view")
            return int(app.serve(roots, args.host, args.port) or 0)
    except EpscopeError as e:
        return _fail(str(e))
    except BrokenPipeError:  # `epscope report RUN | head`
        return 0
    return _fail(f"unknown command {args.cmd!r}")
