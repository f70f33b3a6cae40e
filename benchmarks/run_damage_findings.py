"""Issue 19's findings, reproduced against a checkout given as the first argument, through APIs
every version has (load_run, check_run, report, export_perfetto, the CLI): the before/after
table in benchmarks/results/run-damage-findings-*.md comes from running it on the commit before
issue 19 and after.

    python3 benchmarks/run_damage_findings.py CHECKOUT
"""
import sys, os, json, shutil, subprocess, tempfile, traceback
from pathlib import Path
ROOT = sys.argv[1]
sys.path.insert(0, ROOT)
import pyarrow as pa, pyarrow.parquet as pq, numpy as np
from profiler.store import runstore as RS
from profiler.commands import cli
from profiler.errors import EpscopeError
from profiler.groundtruth.synthetic import make_run
from profiler.commands.report import report
from profiler.export.perfetto import export_perfetto
tmp = Path(tempfile.mkdtemp())
base = make_run(tmp / "base", ranks=2, events=800, perfetto=False)

def copy(name):
    return Path(shutil.copytree(base, tmp / name))

def reseal(p):
    m = json.loads((p / "manifest.json").read_text())
    if "checksums" in m:
        import hashlib
        m["checksums"] = {f: "sha256:" + hashlib.sha256((p / f).read_bytes()).hexdigest() for f in m["checksums"]}
        (p / "manifest.json").write_text(json.dumps(m))

def outcome(fn):
    try:
        fn(); return "ok"
    except EpscopeError as e:
        return "typed " + type(e).__name__
    except SystemExit as e:
        return f"exit {e.code}"
    except Exception as e:
        return "UNTYPED " + type(e).__name__

def rewrite(p, name, change):
    t = pq.read_table(p / name); t, m = change(t, dict(t.schema.metadata)); pq.write_table(t.replace_schema_metadata(m), p / name); reseal(p)

def null_first(t, col):
    arr = t.column(col).combine_chunks(); mask = np.zeros(len(arr), bool); mask[0] = True
    return t.set_column(t.column_names.index(col), col, pa.array(arr.to_pylist(), type=arr.type, mask=mask))

res = {}
p = copy("pandas"); rewrite(p, "launches.parquet", lambda t, m: (t, {**m, b"pandas": b'{"index_columns": ['}))
res["damaged pandas metadata: load_run"] = outcome(lambda: RS.load_run(p))
res["damaged pandas metadata: check_run"] = outcome(lambda: RS.check_run(p))
p = copy("nullphase"); rewrite(p, "events.parquet", lambda t, m: (null_first(t, "phase"), m))
res["null phase: load_run().events"] = outcome(lambda: RS.load_run(p).events)
res["null phase: export"] = outcome(lambda: export_perfetto(p, tmp / "np.pt"))
p = copy("int64min"); rewrite(p, "events.parquet", lambda t, m: (t.set_column(t.column_names.index("begin_ns"), "begin_ns", pa.array([np.iinfo(np.int64).min] + t.column("begin_ns").to_pylist()[1:], pa.int64())), m))
res["begin_ns int64 min: load_run().events"] = outcome(lambda: RS.load_run(p).events)
res["begin_ns int64 min: export"] = outcome(lambda: export_perfetto(p, tmp / "im.pt"))
p = copy("nullwarp"); rewrite(p, "events.parquet", lambda t, m: (null_first(t, "warp"), m))
res["null warp: load_run().events"] = outcome(lambda: RS.load_run(p).events)
res["null warp: export"] = outcome(lambda: export_perfetto(p, tmp / "nw.pt"))
p = copy("nolaunches"); (p / "launches.parquet").unlink()
res["missing launches.parquet: load_run"] = outcome(lambda: RS.load_run(p))
p = copy("clocknull"); m = json.loads((p / "manifest.json").read_text()); m["clock"] = {"ranks": [{"rank": 0, "uncertainty_ns": None}, {"rank": 1, "uncertainty_ns": 3}]}; (p / "manifest.json").write_text(json.dumps(m))
res["clock rank uncertainty null: load_run"] = outcome(lambda: RS.load_run(p))
res["clock rank uncertainty null: report"] = outcome(lambda: report(p))
p = copy("flip"); b = bytearray((p / "events.parquet").read_bytes()); b[len(b) // 2] ^= 1; (p / "events.parquet").write_bytes(bytes(b))
ref = RS.load_run(base).events
def flipped():
    e = RS.load_run(p).events
    if e.equals(ref): return
    raise RuntimeError("SILENT: other data, no error")
res["bit flip mid events.parquet"] = outcome(flipped)
p = copy("tmp-out"); out = tmp / "x.pftrace"; (tmp / "x.pftrace.tmp").write_bytes(b"mine")
outcome(lambda: cli.main(["export", str(p), "-o", str(out)]))
res["export -o X over an existing X.tmp"] = "X.tmp kept" if (tmp / "x.pftrace.tmp").exists() and (tmp / "x.pftrace.tmp").read_bytes() == b"mine" else "X.TMP DESTROYED"
elsewhere = tmp / "elsewhere"; elsewhere.write_bytes(b"outside"); os.symlink(elsewhere, p / "trace.perfetto-trace.tmp")
outcome(lambda: cli.main(["export", str(p)]))
res["default export, RUN/trace.perfetto-trace.tmp -> outside file"] = "kept" if elsewhere.read_bytes() == b"outside" else "OUTSIDE FILE OVERWRITTEN"
fifo = tmp / "fifo"; os.mkfifo(fifo)
outcome(lambda: cli.main(["export", str(p), "-o", str(fifo), "--force"]))
res["export -o FIFO --force"] = "FIFO kept" if os.path.exists(fifo) and __import__("stat").S_ISFIFO(os.lstat(fifo).st_mode) else "FIFO REPLACED"
r = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r}); from profiler.commands.cli import main; sys.exit(main(['view', {str(tmp)!r}, '--port', '99999']))"], capture_output=True, text=True, timeout=120)
res["view --port 99999"] = "TRACEBACK" if "Traceback" in r.stderr else f"exit {r.returncode}: {r.stderr.strip().splitlines()[-1][:80]}"
for k, v in res.items():
    print(f"{k:62s} {v}")
shutil.rmtree(tmp, ignore_errors=True)
