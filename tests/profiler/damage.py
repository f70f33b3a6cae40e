"""Damaging runs on purpose, for the tests of the reader and the corruption harness.

`reseal(run)` recomputes a run's checksums after a test rewrote a data file: the run then looks
as a buggy or hostile writer would leave it (checksums that match malformed tables), so the
schema checks, not the checksum, must catch it. `flip_bit` and `MANIFEST_MUTATIONS` are the
harness's single-bit flips and manifest edits (tests/profiler/test_corruption.py,
benchmarks/fuzz_runs.py)."""
from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path

from profiler.store import validate
from profiler.store.runreader import DATA_FILES, MANIFEST, file_hash


def reseal(run: Path) -> Path:
    """Recompute the run's checksums (where it has them) and its manifest's seal (where it has
    one): what a buggy or hostile writer that knows the format leaves."""
    run = Path(run)
    m = json.loads((run / MANIFEST).read_text())
    if "checksums" in m:
        sums = {}
        for name in DATA_FILES:
            with open(run / name, "rb") as f:
                sums[name] = file_hash(f)
        m["checksums"] = sums
    if "seal" in m:
        m = validate.sealed(m)
    (run / MANIFEST).write_text(json.dumps(m))
    return run


def as_written_before_checksums(run: Path) -> Path:
    """The run as epscope wrote runs before issue 19 (format 1): no checksums, no seal, no format
    in its data files' footers (its rows as they are)."""
    import pyarrow.parquet as pq
    run = Path(run)
    m = json.loads((run / MANIFEST).read_text())
    for k in ("checksums", "seal"):
        m.pop(k, None)
    m["format_version"] = 1
    (run / MANIFEST).write_text(json.dumps(m))
    for name in DATA_FILES:
        t = pq.read_table(run / name)
        meta = {k: v for k, v in (t.schema.metadata or {}).items() if k != validate.FOOTER_FORMAT_KEY}
        pq.write_table(t.replace_schema_metadata(meta), run / name)
    return run


def flip_bit(path: Path, rng: random.Random) -> int:
    """Flip one random bit of the file; returns the bit's index."""
    b = bytearray(path.read_bytes())
    bit = rng.randrange(len(b) * 8)
    b[bit // 8] ^= 1 << (bit % 8)
    path.write_bytes(bytes(b))
    return bit


# Replacement values of a manifest field: null, a value of the wrong type, one out of range.
WRONG_VALUES = {"null": None, "string": "x", "number": -1.5, "list": [1, "a"], "object": {"a": None},
                "bool": True, "huge": 1 << 70, "negative": -7}


def _paths(v, prefix=()):
    """Every path (tuple of keys / list indices) into a JSON value, containers included."""
    yield prefix
    if isinstance(v, dict):
        for k, x in v.items():
            yield from _paths(x, prefix + (k,))
    elif isinstance(v, list):
        for i, x in enumerate(v[:3]):   # the first items of a list stand for the rest
            yield from _paths(x, prefix + (i,))


def _set(m, path, value, delete=False):
    m = json.loads(json.dumps(m))
    d = m
    for k in path[:-1]:
        d = d[k]
    if delete:
        del d[path[-1]]
    else:
        d[path[-1]] = value
    return m


def manifest_mutations(m: dict):
    """(label, manifest) for every field of m (nested ones included): missing, and set to each
    of WRONG_VALUES."""
    for path in _paths(m):
        if not path:
            continue
        label = ".".join(map(str, path))
        yield f"{label}=missing", _set(m, path, None, delete=True)
        for name, v in WRONG_VALUES.items():
            yield f"{label}={name}", _set(m, path, v)


# -- the differential corruption harness ------------------------------------------------------------
READERS = ("load", "report", "export", "check")


@dataclass
class Reference:
    """What the undamaged run holds (the data a damaged copy must either equal or refuse)."""
    events: "object"
    launches: "object"

    @classmethod
    def of(cls, run: Path) -> "Reference":
        from profiler.store.runreader import load_run
        r = load_run(run)
        return cls(r.events, r.launches)


def readers(run: Path, out: Path) -> dict[str, tuple[str, object]]:
    """Each reader on the run: ("ok", value), (typed error class name, message) or
    ("UNTYPED", "<class>: <message>") for anything else (a traceback a user would see)."""
    from profiler.errors import EpscopeError
    from profiler.export.perfetto import export_perfetto
    from profiler.commands.report import report
    from profiler.store.runreader import check_run, load_run

    def load():
        r = load_run(run)
        return r.events, r.launches
    res = {}
    for name, fn in (("load", load), ("report", lambda: report(run)),
                     ("export", lambda: export_perfetto(run, out, force=True)),
                     ("check", lambda: check_run(run, deep=True))):
        try:
            v = fn()
            if name == "check" and v.damaged:
                res[name] = ("damaged", v.problem)
            else:
                res[name] = ("ok", v)
        except EpscopeError as e:
            res[name] = (type(e).__name__, str(e))
        except Exception as e:   # noqa: BLE001 -- what the harness is looking for
            res[name] = ("UNTYPED", f"{type(e).__name__}: {e}")
    return res


def failures(res: dict, ref: Reference | None, checksummed: bool) -> list[str]:
    """What is wrong with one case's results: tracebacks, untyped errors, multi-line messages,
    readers that disagree on whether the run is readable, data changed without an error in a
    run that carries checksums."""
    bad = []
    for name, (state, detail) in res.items():
        if state == "UNTYPED":
            bad.append(f"{name}: untyped {detail[:300]}")
        elif state not in ("ok", "damaged") and "\n" in str(detail):
            bad.append(f"{name}: message of several lines")
    # TooWideToAnalyse: the run was read, its analyses cannot index it (lanes x time range past
    # 62 bits: a flipped timestamp far from the rest); a typed refusal of the analysis, not of the run
    accepted = {name: state in ("ok", "TooWideToAnalyse") for name, (state, _) in res.items()}
    if len(set(accepted.values())) != 1:
        bad.append("readers disagree: " + ", ".join(f"{n}={s}" for n, (s, _) in res.items()))
    if checksummed and ref is not None and res["load"][0] == "ok":
        ev, la = res["load"][1]
        if not (ev.equals(ref.events) and la.equals(ref.launches)):
            bad.append("silent change: the damaged run opened with other data")
    return bad


def viewer_serves_the_others(root: Path, damaged: str, good: str) -> list[str]:
    """The viewer's catalog starts on a root holding the damaged run and a good one, lists the
    damaged run (with its problem when it has one), loads the good one, and the Runs and
    progress pages' logic reads every entry."""
    bad = []
    try:
        from viewer.catalog import Catalog, ViewerError
        from viewer.pages.progress import logic as progress_logic
        from viewer.pages.runs import logic as runs_logic
        cat = Catalog([root], workers=1)
        ids = set(cat.ids())
        if damaged not in ids or good not in ids:
            bad.append(f"viewer: runs missing from the list ({sorted(ids)})")
        if cat.load(good).events.empty:
            bad.append("viewer: the good run loads empty")
        runs_logic.runs_table(cat.entries())
        for e in cat.entries():
            progress_logic.run_summary(e)
        try:
            cat.load(damaged)
        except ViewerError:
            pass
    except Exception as e:   # noqa: BLE001
        bad.append(f"viewer: {type(e).__name__}: {str(e)[:300]}")
    return bad


# -- issue 32: what surrounds the data files ---------------------------------------------------------
# Each class yields cases (label, damage(run_dir)); `judge` runs the readers and says whether a
# case was silent (a reader accepted what the damage made wrong) or gave a traceback. Cases are
# generated from a seeded rng, so a count per class is a choice (tests/test_corruption.py: a CI
# sample; benchmarks/damage_classes.py: >= 100 a class).
def _table(run: Path, name: str):
    import pyarrow.parquet as pq
    t = pq.read_table(run / name)
    return t.to_pandas(ignore_metadata=True), t.schema.metadata


def _write_table(run: Path, name: str, df, meta) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(meta), run / name)


def _rewritten(name: str, change):
    """A damage that rewrites a table through change(df, rng) -> df and reseals the run (checksums
    and manifest seal recomputed: a buggy writer's output, not a damaged file)."""
    def damage(run: Path, rng: random.Random) -> None:
        df, meta = _table(run, name)
        df = change(df, rng)
        _write_table(run, name, df, meta)
        if name == "events.parquet":   # the writer counts what it wrote
            m = json.loads((run / MANIFEST).read_text())
            if "num_events" in m:
                m["num_events"] = len(df)
                (run / MANIFEST).write_text(json.dumps(m))
        reseal(run)
    return damage


def _row(df, rng):
    return rng.randrange(len(df))


def _orphan(df, rng):
    i = _row(df, rng)
    df.loc[i, "launch"] = int(df["launch"].max()) + 1 + rng.randrange(1000)
    return df


def _iteration_off(df, rng):
    i = _row(df, rng)
    df.loc[i, "iteration"] = int(df.loc[i, "iteration"]) + 1 + rng.randrange(5)
    return df


def _kernel_off(df, rng):
    import pandas as pd
    i = _row(df, rng)
    k = df["kernel"].astype(str)
    others = sorted(set(k) - {k.iat[i]}) or ["not-a-kernel"]
    k.iat[i] = rng.choice(others)
    df["kernel"] = pd.Categorical(k)
    return df


def _duplicate_row(df, rng):
    import pandas as pd
    i, j = _row(df, rng), _row(df, rng)
    return pd.concat([df.iloc[:j], df.iloc[[i]], df.iloc[j:]], ignore_index=True)


def _launch_dropped(df, rng):
    return df.drop(index=_row(df, rng)).reset_index(drop=True)


def _launch_key_repeated(df, rng):
    i, j = rng.sample(range(len(df)), 2)
    df.loc[j, ["rank", "launch"]] = df.loc[i, ["rank", "launch"]].to_numpy()
    return df


def _drops_off(df, rng):
    i = _row(df, rng)
    df.loc[i, "dropped"] = int(df.loc[i, "dropped"]) + 1 + rng.randrange(100)
    return df


RESEALED = {"event of no launch": ("events.parquet", _orphan), "event's iteration is not its launch's":
            ("events.parquet", _iteration_off), "event's kernel is not its launch's": ("events.parquet", _kernel_off),
            "event row repeated": ("events.parquet", _duplicate_row), "launch of events removed":
            ("launches.parquet", _launch_dropped), "launch key repeated": ("launches.parquet", _launch_key_repeated),
            "dropped records disagree with the manifest": ("launches.parquet", _drops_off)}


def resealed_table_cases(n: int, seed: int):
    """Tables rewritten inconsistent (every case by construction) with valid checksums and seal."""
    kinds = list(RESEALED)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        name, change = RESEALED[kind]
        yield f"{kind} #{i}", (lambda run, name=name, change=change, i=i:
                               _rewritten(name, change)(run, random.Random(f"{seed}-resealed-{i}")))


def _other_value(v, rng: random.Random):
    """A valid value of the same type that differs from v (what a lying manifest holds)."""
    if isinstance(v, bool):
        return not v
    if isinstance(v, int):
        return v + rng.choice([1, 2, 7, 100])
    if isinstance(v, float):
        return v * 1.5 + 1.0 if v == v else 0.0
    if isinstance(v, str):
        if v.startswith("sha256:") and len(v) == 71:
            return "sha256:" + "".join(rng.choice("0123456789abcdef") for _ in range(64))
        return v + rng.choice(["x", "-2", " (edited)"])
    return None


def lying_manifest_cases(m: dict, n: int, seed: int):
    """Every leaf of the manifest set to another valid value of its type (a count, a clock, a
    registry's phase kind, a name, a checksum value, the seal itself), one at a time, not resealed."""
    rng = random.Random(f"{seed}-lying")
    leaves = [p for p in _paths(m) if p and not isinstance(_get(m, p), (dict, list))]
    leaves = [p for p in leaves if _other_value(_get(m, p), rng) is not None]
    for i in range(n):
        path = leaves[i % len(leaves)]
        new = _set(m, path, _other_value(_get(m, path), random.Random(f"{seed}-lying-{i}")))
        yield f"{'.'.join(map(str, path))} #{i}", (lambda run, new=new:
                                                   (run / MANIFEST).write_text(json.dumps(new)))


def _get(m, path):
    for k in path:
        m = m[k]
    return m


DOWNGRADES = {"format 1, checksums and seal deleted": (1, ("checksums", "seal")),
              "format 2, seal deleted": (2, ("seal",)),
              "format 1, seal deleted, checksums kept": (1, ("seal",)),
              "seal deleted, format 3 kept": (None, ("seal",))}


def downgrade_cases(n: int, seed: int):
    """A sealed run's manifest edited back to an older format (seal and checksums deleted), and one
    bit of a data file flipped: never read as an unverified old run."""
    kinds = list(DOWNGRADES)
    for i in range(n):
        kind = kinds[i % len(kinds)]
        version, drop = DOWNGRADES[kind]
        name = DATA_FILES[(i // len(kinds)) % 2]

        def damage(run: Path, version=version, drop=drop, name=name, i=i):
            m = json.loads((run / MANIFEST).read_text())
            for k in drop:
                m.pop(k, None)
            if version is not None:
                m["format_version"] = version
            (run / MANIFEST).write_text(json.dumps(m))
            flip_bit(run / name, random.Random(f"{seed}-downgrade-{i}"))
        yield f"{kind}, {name} flipped #{i}", damage


STORED_FILES = ("analysis-summary.json", "analysis/results.json", "analysis/*.parquet")


def stored_flip_cases(run: Path, n: int, seed: int):
    """One bit flipped in the run's stored analyses: the summary, the index, or one of its tables."""
    tables = sorted(p.relative_to(run).as_posix() for p in (run / "analysis").glob("*.parquet"))
    for i in range(n):
        what = STORED_FILES[i % len(STORED_FILES)]
        rng = random.Random(f"{seed}-stored-{i}")
        rel = rng.choice(tables) if what.endswith("*.parquet") else what
        yield f"{rel} #{i}", (lambda r, rel=rel, rng=rng: flip_bit(r / rel, rng))


SPECIAL_TARGETS = ("manifest.json", "events.parquet", "launches.parquet", "trace.perfetto-trace",
                   "analysis-summary.json", "analysis/results.json", "analysis/critical_path.segments.parquet",
                   "analysis")
SPECIAL_KINDS = ("fifo", "link to /dev/zero", "link out of the root", "directory", "socket", "sparse 90 MB")


def special_file_cases(outside: Path):
    """Each file a run holds made a FIFO, a link to a device, a link out of the viewer's root (to a
    valid copy of itself), a directory, a socket, or an oversized file."""
    for target in SPECIAL_TARGETS:
        for kind in SPECIAL_KINDS:
            yield f"{target} as {kind}", (lambda run, target=target, kind=kind: _make_special(run, target, kind, outside))


def _make_special(run: Path, target: str, kind: str, outside: Path) -> None:
    import os
    import shutil
    import socket
    import uuid
    p = run / target
    keep = outside / f"{uuid.uuid4().hex[:8]}-{p.name}"
    if p.is_dir():
        shutil.move(p, keep)
    elif p.exists():
        shutil.move(p, keep)
    if kind == "fifo":
        os.mkfifo(p)
    elif kind == "link to /dev/zero":
        os.symlink("/dev/zero", p)
    elif kind == "link out of the root":
        os.symlink(keep, p)
    elif kind == "directory":
        p.mkdir()
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        try:
            s.bind(str(p))
        except OSError:   # a socket path too long for AF_UNIX: a FIFO stands in
            os.mkfifo(p)
        finally:
            s.close()
    elif kind == "sparse 90 MB":
        with open(p, "wb") as f:
            f.truncate(90 << 20)


def readers32(run: Path, out: Path, timeout_s: float = 60.0) -> dict[str, tuple[str, object]]:
    """readers() and `epscope analyze`'s store_run, each in a thread that must end within timeout_s
    (a FIFO hung readers before: ("HANG", ...))."""
    import threading
    from profiler.errors import EpscopeError
    res = {}

    def run_all():
        res.update(readers(run, out))
        try:
            from profiler.analysis import stored
            stored.store_run(run)
            res["analyze"] = ("ok", None)
        except EpscopeError as e:
            res["analyze"] = (type(e).__name__, str(e))
        except Exception as e:   # noqa: BLE001
            res["analyze"] = ("UNTYPED", f"{type(e).__name__}: {e}")
    t = threading.Thread(target=run_all, daemon=True)
    t.start()
    t.join(timeout_s)
    if t.is_alive():
        return {"all": ("HANG", f"the readers did not return within {timeout_s:.0f} s")}
    return res


def judge_refused(res: dict) -> tuple[bool, list[str]]:
    """(silent, tracebacks) of a case every reader must refuse: silent when any reader accepted."""
    bad = [f"{k}: {d[:300]}" for k, (s, d) in res.items() if s in ("UNTYPED", "HANG")]
    silent = any(s == "ok" for s, _ in res.values())
    return silent, bad


def stored_outcome(run: Path, roots, damaged: str) -> tuple[bool, list[str]]:
    """After damage to a run's stored analyses (`damaged`: the file's path in the run): (silent,
    tracebacks). Silent: the damaged result served as current (summary.load and the Runs page's
    cells for the summary, stored.load for analysis/) or `epscope check`'s verification not
    reporting it."""
    from profiler.analysis import stored, summary
    bad, silent = [], False
    try:
        if damaged == summary.FILE:
            silent |= summary.load(run, within=roots) is not None
        else:
            silent |= stored.load(run, within=roots) is not None
        v = stored.verify(run, within=roots)
        silent |= v is None or v.startswith("stale")
    except Exception as e:   # noqa: BLE001
        bad.append(f"{type(e).__name__}: {str(e)[:300]}")
    return silent, bad


def race_analyze_rewrite(path: Path, other, delay_s: float) -> tuple[bool, list[str], str]:
    """`epscope analyze` (stored.store_run) of the run at path while, delay_s after it starts, the
    run is re-recorded as `other` ((events, launches, manifest): write_run with overwrite). Then
    whatever the run directory holds as current results must be the analyses of the data it holds
    now. Returns (silent, tracebacks, what analyze did)."""
    import threading
    from profiler.store import runstore
    from profiler.analysis import stored, summary
    from profiler.errors import EpscopeError
    done = {}

    def analyze():
        try:
            stored.store_run(path)
            done["analyze"] = "ok"
        except EpscopeError as e:
            done["analyze"] = type(e).__name__
        except Exception as e:   # noqa: BLE001
            done["analyze"] = f"UNTYPED {type(e).__name__}: {e}"
    t = threading.Thread(target=analyze)
    t.start()
    time.sleep(delay_s)
    runstore.write_run(path, *other, perfetto=False, overwrite=True)
    t.join()
    bad = [done["analyze"]] if done["analyze"].startswith("UNTYPED") else []
    run = runstore.load_run(path)
    truth = summary.analyze(run)
    silent = False
    sm = summary.load(path)
    if sm is not None:
        want = summary.summarize(run, truth)
        silent |= {k: v for k, v in sm.items() if k != "seal"} != json.loads(json.dumps(want))
    st = stored.load(path, run=run)
    if st is not None:
        silent |= not (st.ranks == tuple(stored.ranks_of(run.events))
                       and _frames_equal(st.time_model.iterations, truth.time_model.iterations)
                       and _frames_equal(st.critical.total_ns, truth.critical.total_ns)
                       and _frames_equal(st.critical.path_ns, truth.critical.path_ns))
    return silent, bad, done["analyze"]


def _frames_equal(a, b) -> bool:
    import pandas as pd
    try:
        pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False)
        return True
    except AssertionError:
        return False


# -- running a class ---------------------------------------------------------------------------------
CLASSES = ("resealed tables", "lying manifests", "downgrades", "stored analyses", "special files",
           "analyze against a rewrite")


@dataclass
class ClassResult:
    """One class's cases: how many, each reader's verdicts counted, the silent ones, the tracebacks."""
    name: str
    cases: int = 0
    verdicts: dict = None
    silent: list = None
    tracebacks: list = None

    def __post_init__(self):
        self.verdicts, self.silent, self.tracebacks = {}, [], []

    def add(self, label: str, verdict: str, silent: bool, bad: list) -> None:
        self.cases += 1
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        if silent:
            self.silent.append(label)
        self.tracebacks += [f"{label}: {b}" for b in bad]


def make_base(d: Path, name: str = "base", events: int = 800, scenario: str = "balanced") -> Path:
    """A sealed synthetic run of two ranks with its analyses stored."""
    from profiler.analysis import stored
    from profiler.groundtruth.synthetic import make_run
    p = make_run(d / name, ranks=2, events=events, scenario=scenario, perfetto=False)
    stored.store_run(p)
    return p


def _verdict(res: dict) -> str:
    states = sorted({s for s, _ in res.values()})
    return "+".join(states)


def run_class(name: str, n: int, seed: int, tmp: Path) -> ClassResult:
    """n cases of class `name` (special files: every target and kind, n ignored; analyze against a
    rewrite: n races), each on a fresh copy of a sealed base run under tmp."""
    import shutil
    out = ClassResult(name)
    base = make_base(tmp / "bases") if not (tmp / "bases" / "base").exists() else tmp / "bases" / "base"
    if name == "analyze against a rewrite":
        return _run_races(out, n, seed, tmp, base)
    if name == "resealed tables":
        cases = resealed_table_cases(n, seed)
    elif name == "lying manifests":
        cases = lying_manifest_cases(json.loads((base / MANIFEST).read_text()), n, seed)
    elif name == "downgrades":
        cases = downgrade_cases(n, seed)
    elif name == "stored analyses":
        cases = stored_flip_cases(base, n, seed)
    else:
        (tmp / "outside").mkdir(exist_ok=True)
        cases = special_file_cases(tmp / "outside")
    for i, (label, damage) in enumerate(cases):
        root = tmp / f"case{i}"
        run = Path(shutil.copytree(base, root / "damaged"))
        damage(run)
        if name == "stored analyses":
            rel = label.split(" #")[0]
            silent, bad = stored_outcome(run, (root.resolve(),), "analysis-summary.json" if rel.endswith(".json")
                                         and "/" not in rel else rel)
            out.add(label, "refused" if not silent else "SERVED", silent, bad)
        elif name == "special files":
            silent, bad = _special_served(label, run, root)   # before analyze stores fresh results
            res = readers32(run, tmp / "out.pftrace", timeout_s=60)
            s2, b2 = _special_outcome(label, run, root, res, base)
            out.add(label, _verdict(res), silent or s2, bad + b2)
        else:
            res = readers32(run, tmp / "out.pftrace")
            silent, bad = judge_refused(res)
            out.add(label, _verdict(res), silent, bad)
        shutil.rmtree(root, ignore_errors=True)
    return out


_DATA = ("manifest.json", "events.parquet", "launches.parquet")


def _special_outcome(label: str, run: Path, root: Path, res: dict, base: Path) -> tuple[bool, list[str]]:
    """A special file in a run: no reader hangs or gives a traceback; the commands refuse a data file
    or manifest that is not a regular file (a link out of the root is the user's own file: read);
    the viewer, on a root holding the run and a good one, lists both, serves the good one, and
    never serves stored results or data through a special file or a link out of its root."""
    import shutil
    target, kind = label.split(" as ")
    bad = [f"{k}: {d[:300]}" for k, (s, d) in res.items() if s in ("UNTYPED", "HANG")]
    silent = False
    if target in _DATA and kind != "link out of the root":
        silent |= any(s == "ok" for k, (s, _) in res.items() if k != "analyze")
    shutil.copytree(base, root / "good")
    bad += viewer_serves_the_others(root, "damaged", "good")
    return silent, bad


def _special_served(label: str, run: Path, root: Path) -> tuple[bool, list[str]]:
    """The viewer's side of a special-file case, before anything rewrites the run: stored results
    read through the special file (summary.load, stored.load within the root) or a run listed as
    readable whose data file or manifest is one are silent."""
    target, kind = label.split(" as ")
    silent, bad = False, []
    try:
        from profiler.analysis import stored, summary
        from viewer.catalog import Catalog
        roots = (root.resolve(),)
        if target.startswith("analysis"):
            which = summary.load(run, within=roots) if target == "analysis-summary.json" else stored.load(run, within=roots)
            silent |= which is not None
        if target in _DATA:
            entry = Catalog([root], workers=1).entry("damaged")
            silent |= entry.problem is None
    except Exception as e:   # noqa: BLE001
        bad.append(f"viewer: {type(e).__name__}: {str(e)[:300]}")
    return silent, bad


def _run_races(out: ClassResult, n: int, seed: int, tmp: Path, base: Path) -> ClassResult:
    """n races of `epscope analyze` against a re-recording of the run (another scenario), the
    rewrite landing at delays spread over the analysis' own duration."""
    import shutil
    from profiler.analysis import stored
    from profiler.groundtruth.synthetic import make_events
    other = make_events(ranks=2, events=800, scenario="slow_rank", seed=seed)
    probe = Path(shutil.copytree(base, tmp / "probe"))
    t0 = time.perf_counter()
    stored.store_run(probe)
    took = time.perf_counter() - t0
    shutil.rmtree(probe)
    rng = random.Random(f"{seed}-races")
    for i in range(n):
        path = Path(shutil.copytree(base, tmp / f"race{i}" / "run"))
        for f in ("analysis", "analysis-summary.json"):   # analyze computes them now
            p = path / f
            shutil.rmtree(p) if p.is_dir() else p.unlink()
        delay = rng.uniform(0, 1.3 * took)
        silent, bad, what = race_analyze_rewrite(path, other, delay)
        out.add(f"rewrite {delay * 1e3:.0f} ms after analyze began #{i}", f"analyze {what}", silent, bad)
        shutil.rmtree(tmp / f"race{i}", ignore_errors=True)
    return out
