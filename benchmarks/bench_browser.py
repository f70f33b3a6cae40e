"""The viewer as a user meets it: a real browser (headless Chromium) against a fresh server, on a
synthetic 10-million-event run of 8 ranks (issue 14's targets).

    python benchmarks/bench_browser.py [--run RUN_DIR] [--repeat 5] [--app-root DIR] [--out FILE]
        [--skip-cold] [--skip-warm] [--sections switches,drags,deepdrags,zooms,drill,whatif] [--trace DIR]

Debian's /usr/bin/chromium through Playwright's Python API (never a downloaded browser). Measures:
  * cold: each page's first visit in a fresh server process (a new `viewer.app.serve` per sample),
    from navigation start to
      - first paint: the run header and either the page's content or its progress state drawn,
      - complete: the page's content drawn, no progress state left, no callback in flight;
  * warm (one server, the run's analyses computed): page switches by clicking the navigation
    links; timeline zooms driven as a person does (`drags`: a mouse drag across the plot from the
    whole run, then the "reset zoom" button, each timed from the mouse-up to the new figure
    painted; `deepdrags`: five such drags in a row, 1/5 to 1/3,125 of the run, one row a depth);
    the same zooms through `Plotly.relayout` (`zooms`, the older measurement, kept for
    comparison: it skips the drag, the browser's own redraw of the dragged range and dcc.Graph's
    re-plot of its synced figure); drill-downs (a mouse click on a rank row, timed to the block
    level painted, then the radio back to ranks); what-if projections (a new percentage each
    time), and the Runs page;
each as the browser's end-to-end time and the part of it spent waiting on the server (the union
of the Dash callback requests' request-to-response intervals, from the Resource Timing API).
Beside the wall times: the CPU seconds the server process and the browser's processes used (the
development machine is shared: wall time swings with its load, which is recorded too).
--app-root runs the server from another checkout (to measure an older commit with this script).
Writes a markdown table with the CPU, commit and date (benchmarks.machine) to --out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.machine import commit, cpu_name  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
FIRST_PAINT_S = 2.0     # issue 14: every page's first visit, to a useful first paint
INTERACT_MEDIAN_S = 0.5  # issue 14: page switches, zooms, drill-downs, what-if: median ...
INTERACT_P95_S = 1.0     # ... and 95th percentile
COLD_TIMEOUT_S = 600     # a cold page of the old viewer on a loaded machine took minutes
INTERACT_TIMEOUT_S = 60  # one zoom or click; what-if gets COLD_TIMEOUT_S
RUNS_PAGE_S = 2.0        # issue 31: the Runs page with 500 runs, complete, cold
retries = 0
notes: list[str] = []   # lines for the header (the server's memory)
TICK = os.sysconf("SC_CLK_TCK")

# What "drawn" means per page, as JavaScript predicates on the document (the same in the
# viewer before and after issue 14, so one script measures both).
CONTENT = {
    # the Runs page: its first run's link drawn (a grid's row since issue 31, a table's row before)
    "/": "!!document.querySelector('#runs-table .run-link')",
    "/timeline": "!!(document.querySelector('#tl-info') && document.querySelector('#tl-info').innerText.includes('level')"
                 " && document.querySelector('#tl-graph .main-svg'))",
    "/critical-path": "!!document.querySelector('#cp-summary')",
    "/idle": "!!(document.querySelector('#idle-verdict') && document.querySelector('#idle-heatmap .main-svg'))",
    "/barriers": "!!document.querySelector('#bar-verdict')",
    "/compare": "!!document.querySelector('#cmp-go')",
}
HEADER = "!!document.querySelector('#page .run-header, #page .page-head')"
PENDING = "!!document.querySelector('#page .pending')"
LOADING = "!!document.querySelector('[data-dash-is-loading=\"true\"]')"
NAV = {"/": "#nav-runs", "/timeline": "#nav-timeline", "/critical-path": "#nav-critical-path", "/idle": "#nav-idle-warps",
       "/barriers": "#nav-barriers", "/compare": "#nav-compare"}

# Resource Timing of the Dash callback requests since `t0` (performance.now() ms): the union of
# their [requestStart, responseEnd] intervals is the time the page waited on the server.
SERVER_WAIT_JS = """(t0) => {
  const xs = performance.getEntriesByType('resource')
    .filter(e => e.name.includes('_dash-update-component') && e.startTime >= t0)
    .map(e => [e.requestStart || e.startTime, e.responseEnd]).sort((a, b) => a[0] - b[0]);
  let total = 0, lo = null, hi = null;
  for (const [a, b] of xs) {
    if (hi === null || a > hi) { if (hi !== null) total += hi - lo; lo = a; hi = b; } else { hi = Math.max(hi, b); }
  }
  if (hi !== null) total += hi - lo;
  return [total, xs.length];
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pids) -> float:
    total = 0
    for pid in pids:
        try:
            f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
            total += int(f[11]) + int(f[12])       # utime, stime
        except (OSError, IndexError, ValueError):
            pass
    return total / TICK


def descendants(root: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, stack = [], [root]
    while stack:
        p = stack.pop()
        for c in kids.get(p, []):
            out.append(c)
            stack.append(c)
    return out


class Server:
    """`viewer.app.serve` in a fresh process, from `app_root`'s code."""

    def __init__(self, app_root: Path, runs_root: Path, port: int | None = None):
        self.port = port or free_port()
        code = ("import sys; sys.path.insert(0, %r); from viewer.app import serve; serve([%r], port=%d)"
                % (str(app_root), str(runs_root), self.port))
        env = dict(os.environ, PYTHONPATH=str(app_root))
        self.proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env, cwd=app_root)
        self.base = f"http://127.0.0.1:{self.port}"
        t0 = time.perf_counter()
        while True:
            try:
                urllib.request.urlopen(self.base + "/_dash-layout", timeout=60).read()
                break
            except OSError:
                if self.proc.poll() is not None or time.perf_counter() - t0 > 120:
                    raise RuntimeError("the viewer did not start")
                time.sleep(0.05)

    def cpu(self) -> float:
        return cpu_seconds([self.proc.pid])

    def peak_rss_gb(self) -> float:
        try:
            kb = next(int(x.split()[1]) for x in open(f"/proc/{self.proc.pid}/status") if x.startswith("VmHWM"))
        except (OSError, StopIteration, ValueError):
            return float("nan")
        return kb / 2**20

    def close(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)


@dataclass
class Sample:
    wall_s: float
    server_wait_s: float
    server_cpu_s: float
    browser_cpu_s: float
    requests: int = 0
    first_paint_s: float | None = None
    renderer_task_s: float = 0.0     # the page's renderer main thread busy (CDP Performance.TaskDuration)
    renderer_script_s: float = 0.0   # ... of it running JavaScript (ScriptDuration: Dash, React, Plotly)
    # the renderer main thread's CPU time (ThreadTime): busy and script above are wall time inside its
    # tasks, which stretches with the machine's load; this does far less (issue 31, session 5)
    renderer_cpu_s: float = 0.0
    gesture_s: float | None = None   # mouse rows: mouse-down to mouse-up as driven (the drag itself)
    redraws: int = 0                 # mouse rows: plotly redraws (afterplot events) after the mouse-up


@dataclass
class Row:
    name: str
    samples: list = field(default_factory=list)
    kind: str = "interaction"   # cold | interaction | info
    note: str = ""


class Browser:
    def __init__(self, pw):
        self.browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        self.driver = os.getpid()

    def cpu(self) -> float:
        return cpu_seconds([p for p in descendants(self.driver) if "chrom" in _comm(p)])

    def new_context(self):
        return self.browser.new_context(viewport={"width": 1440, "height": 900})

    def new_page(self, ctx=None):
        """A page in a fresh context, or a new tab of `ctx` (sharing its caches)."""
        ctx = ctx or self.new_context()
        pg = ctx.new_page()
        pg.set_default_timeout(COLD_TIMEOUT_S * 1000)
        pg.errors = []
        pg.on("pageerror", lambda e: pg.errors.append(str(e)))
        pg.cdp = ctx.new_cdp_session(pg)
        pg.cdp.send("Performance.enable")
        return pg


def renderer_times(pg) -> tuple[float, float, float]:
    """Seconds the page's renderer main thread has been busy so far, running script of it, and its
    CPU time."""
    m = {x["name"]: x["value"] for x in pg.cdp.send("Performance.getMetrics")["metrics"]}
    return m.get("TaskDuration", 0.0), m.get("ScriptDuration", 0.0), m.get("ThreadTime", 0.0)


def _comm(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/comm").read().strip()
    except OSError:
        return ""


def _now(pg) -> float:
    return pg.evaluate("performance.now()")


def settled(pg, content: str, timeout_s: float = COLD_TIMEOUT_S) -> None:
    """The page's content drawn, no progress state, no Dash callback in flight, two frames later."""
    pg.wait_for_function(f"({content}) && !({PENDING}) && !({LOADING})", timeout=timeout_s * 1000, polling="raf")
    pg.evaluate("new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)))")


def measure(pg, server, browser, action, content: str, first_paint: str | None = None,
            timeout_s: float = COLD_TIMEOUT_S) -> Sample:
    """Run `action()`, then wait until `content` is settled; times from just before the action.
    An action whose effect never shows within timeout_s (a relayout lost while plotly redraws:
    seen once in ~100) is done once more and counted in `retries`; the time is the second try's."""
    global retries
    for attempt in (1, 2):
        t_js = _now(pg)
        c_srv, c_br, c_rt = server.cpu(), browser.cpu(), renderer_times(pg)
        t = time.perf_counter()
        action()
        fp = None
        try:
            if first_paint:
                pg.wait_for_function(first_paint, timeout=timeout_s * 1000, polling="raf")
                fp = time.perf_counter() - t
            settled(pg, content, timeout_s)
            break
        except Exception:
            if attempt == 2:
                raise
            retries += 1
    wall = time.perf_counter() - t
    waited, n = pg.evaluate(SERVER_WAIT_JS, t_js)
    task, script, thread = renderer_times(pg)
    return Sample(wall, waited / 1e3, server.cpu() - c_srv, browser.cpu() - c_br, n, fp, task - c_rt[0], script - c_rt[1],
                  renderer_cpu_s=thread - c_rt[2])


def url(base, path, run_id):
    return base + path + ("?" + urlencode({"run": run_id}) if run_id else "")


COLD_PAGES = ("/timeline", "/critical-path", "/idle", "/barriers")
# --trace: the renderer's tasks, scripts, network and V8's CPU profile (samples with stacks): where
# a cold page's renderer time goes (benchmarks/NOTES.md, issue 31 session 5). Open a file in
# Chromium's DevTools (Performance) or ui.perfetto.dev.
TRACE_CATEGORIES = ["devtools.timeline", "disabled-by-default-devtools.timeline", "v8.execute", "v8",
                    "disabled-by-default-v8.cpu_profiler", "blink.user_timing", "loading", "toplevel"]


def cold_visits(args, browser, run_id, rows):
    fp_js = f"({HEADER}) && (({PENDING}) || %s)"
    for path in args.cold_pages:
        content = CONTENT[path] + (f" && !!document.querySelector('#page .main-svg')" if args.cold_figure else "")
        row = Row(f"cold first visit {path}" + (", its first figure drawn" if args.cold_figure else "")
                  + (", browser cache warm" if args.browser_cache == "warm" else ""), kind="cold")
        peaks = []
        # --browser-cache warm: a user who opened the viewer before (its scripts in the browser's
        # HTTP and code caches): one browser context for every sample, each fresh server on the same
        # port (one origin), and one unmeasured visit first. Default: a fresh context each sample.
        port = free_port() if args.browser_cache == "warm" else None
        shared = browser.new_context() if port else None
        if shared is not None:
            first = Server(args.app_root, args.run.parent, port)
            try:
                pg = browser.new_page(shared)
                pg.goto(url(first.base, path, run_id))
                settled(pg, content)
                pg.close()
            finally:
                first.close()
        for i in range(args.cold_repeat or args.repeat):
            server = Server(args.app_root, args.run.parent, port)
            try:
                pg = browser.new_page(shared)
                if args.trace:   # a Chromium performance trace of the visit (it slows the page down)
                    browser.browser.start_tracing(page=pg, path=args.trace / f"{path.strip('/')}-{i}.json",
                                                  categories=TRACE_CATEGORIES)
                s = measure(pg, server, browser, lambda: pg.goto(url(server.base, path, run_id), wait_until="commit"),
                            content, fp_js % CONTENT[path])
                if args.trace:
                    browser.browser.stop_tracing()
                row.samples.append(s)
                # the fresh server's peak RSS once the page is complete (issue 20: with one run open);
                # its background warming of the other results may still be running
                peaks.append(server.peak_rss_gb())
                print(f"  {row.name} #{i}: first paint {s.first_paint_s:.2f} s, complete {s.wall_s:.2f} s, "
                      f"server cpu {s.server_cpu_s:.1f} s, renderer main thread cpu {s.renderer_cpu_s:.2f} s, peak RSS {peaks[-1]:.2f} GB, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                assert not pg.errors, pg.errors
                pg.close() if shared is not None else pg.context.close()
            finally:
                server.close()
        if shared is not None:
            shared.close()
        rows.append(row)
        if peaks:
            notes.append(f"cold {path}: the fresh server's peak RSS when the page was complete: "
                         + ", ".join(f"{p:.2f}" for p in peaks) + " GB")


def make_runs_root(parent: Path, n: int) -> Path:
    """A root of n runs: the bundled runs (traces/) again and again, hard-linked (a copy where
    linking fails), each in its own directory (issue 31: the Runs page with 500 runs)."""
    import shutil
    bundled = sorted(p.parent for p in (ROOT / "traces").rglob("manifest.json"))
    root = parent / f"runs-{n}"
    for i in range(n):
        src = bundled[i % len(bundled)]
        dst = root / f"r{i:04d}-{src.name}"
        try:
            shutil.copytree(src, dst, copy_function=os.link)
        except OSError:
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
    return root


def runs_page(args, browser, rows):
    """Cold first visits of the Runs page of a root of args.runs_page runs: each a fresh server
    and a fresh browser context, timed from navigation to the first run's row drawn with no
    callback in flight. The first server is the root's first ever (its data files' hashes not yet
    in the hash cache, profiler.store.hashcache): measured and named apart."""
    first = Row(f"Runs page, {args.runs_page} runs: first server ever on the root (data files hashed)", kind="cold")
    later = Row(f"Runs page, {args.runs_page} runs: cold (fresh server and browser context)", kind="cold")
    for i in range(args.repeat + 1):
        t = time.perf_counter()
        server = Server(args.app_root, args.runs_root)
        started = time.perf_counter() - t
        try:
            pg = browser.new_page()
            s = measure(pg, server, browser, lambda: pg.goto(server.base + "/", wait_until="commit"), CONTENT["/"],
                        HEADER)
            (first if i == 0 else later).samples.append(s)
            n = pg.evaluate("document.querySelectorAll('#runs-table .run-link').length")
            print(f"  runs page #{i}: server up in {started:.1f} s; first paint {s.first_paint_s:.2f} s, complete "
                  f"{s.wall_s:.2f} s ({n} run links drawn), server wait {s.server_wait_s:.2f} s in {s.requests} "
                  f"requests, renderer {s.renderer_task_s:.2f} s (script {s.renderer_script_s:.2f} s), "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
            assert not pg.errors, pg.errors
            pg.context.close()
        finally:
            server.close()
    rows += [first, later]


WARM_SECTIONS = ("switches", "drags", "deepdrags", "zooms", "drill", "whatif")

# Where to click to drill down: the middle of the drawn x range on a row labelled "rank N" (rank
# level also has a "rank N host" row under each rank, which opens nothing), in pixels inside the
# plot area (`.nsewdrag`), from plotly's own axis mapping (l2p) of the figure on screen.
DRILL_TARGETS_JS = """() => {
  const gd = document.querySelector('#tl-graph .js-plotly-plot'), L = gd._fullLayout;
  const x = L.xaxis.l2p((L.xaxis.range[0] + L.xaxis.range[1]) / 2);
  return gd.layout.yaxis.ticktext.map((t, row) => [t, row]).filter(([t]) => /^rank \\d+$/.test(t))
    .map(([t, row]) => ({label: t, x: x, y: L.yaxis.l2p(row)}));
}"""
TL_INFO = "document.querySelector('#tl-info').innerText"


def warm_interactions(args, browser, run_id, rows):
    server = Server(args.app_root, args.run.parent)
    try:
        pg = browser.new_page()
        # warm: every page once, until complete (the run loaded, its analyses computed)
        for path in args.warm_pages:
            pg.goto(url(server.base, path, run_id))
            settled(pg, CONTENT[path])
        pg.goto(url(server.base, "/", run_id))
        settled(pg, CONTENT["/"])
        print("  warmed", flush=True)
        for name, section in (("switches", switches), ("drags", drags), ("deepdrags", deep_drags), ("zooms", zooms),
                              ("drill", drills), ("whatif", what_ifs)):
            if name in args.sections:
                section(args, pg, server, browser, run_id, rows)
                print(f"  {name} done", flush=True)
        assert not pg.errors, pg.errors
    finally:
        notes.append(f"warm server's peak RSS: {server.peak_rss_gb():.2f} GB")
        server.close()


def switches(args, pg, server, browser, run_id, rows):
    order = ["/timeline", "/critical-path", "/idle", "/barriers", "/compare", "/"]
    switch = {p: Row(f"page switch to {p}") for p in order}
    for i in range(args.repeat):
        for p in order:
            s = measure(pg, server, browser, lambda: pg.click(NAV[p]), CONTENT[p] + f" && location.pathname === '{p}'")
            switch[p].samples.append(s)
    rows.extend(switch.values())


def _relayout(pg, server, browser, arg_js, arg=None) -> Sample:
    before = pg.inner_text("#tl-info")
    return measure(pg, server, browser,
                   lambda: pg.evaluate(f"(a) => Plotly.relayout(document.querySelector('#tl-graph .js-plotly-plot'), {arg_js})", arg),
                   CONTENT["/timeline"] + f" && {TL_INFO} !== {json.dumps(before)}", timeout_s=INTERACT_TIMEOUT_S)


# Timestamps in the page (performance.now() ms) for the mouse rows: the last mouse-down and
# mouse-up, when #tl-info last changed (the callback's answer applied), and each plotly redraw:
# its afterplot event and the end of the task after the next frame (the redraw painted).
MOUSE_HOOK_JS = """() => {
  if (!window.__tl) {
    window.__tl = {down: null, up: null, info: null, painted: [], last: performance.now()};
    document.addEventListener('mousedown', () => { window.__tl.down = performance.now(); }, true);
    document.addEventListener('mouseup', () => { window.__tl.up = performance.now(); }, true);
  }
  const info = document.querySelector('#tl-info');
  if (info && !info.__tlObserved) {
    info.__tlObserved = true;
    new MutationObserver(() => { window.__tl.info = performance.now(); })
      .observe(info, {childList: true, characterData: true, subtree: true});
  }
  const gd = document.querySelector('#tl-graph .js-plotly-plot');
  if (gd && !gd.__tlHooked) {
    gd.__tlHooked = true;
    window.__tl.last = performance.now();
    gd.on('plotly_afterplot', () => { const t = window.__tl.last = performance.now();
      requestAnimationFrame(() => setTimeout(() => window.__tl.painted.push([t, performance.now()]))); });
  }
  window.__tl.down = window.__tl.up = window.__tl.info = null;
  window.__tl.painted = [];
}"""
# done: the answer applied (#tl-info changed and matches `done`), nothing loading, and a redraw
# that began after it has been painted
MOUSE_DONE_JS = ("(done) => window.__tl.info !== null && window.__tl.up !== null && (new Function('return ' + done))()"
                 " && !document.querySelector('[data-dash-is-loading=\"true\"]')"
                 " && window.__tl.painted.some(p => p[0] >= window.__tl.info)")


QUIET_MS = 300


def mouse(pg, server, browser, press, release, done: str, timeout_s: float = INTERACT_TIMEOUT_S) -> Sample:
    """A mouse gesture on the timeline: `press()` (moves, mouse-down, the drag's moves), then
    `release()` (the mouse-up). Times from the mouse-up to the new figure painted (browser clock);
    the renderer's and the processes' CPU over the same interval; the gesture's own time apart."""
    pg.evaluate(MOUSE_HOOK_JS)
    # a gesture on a figure being replaced is lost (a late resize redraw after a page load took
    # a click in ~1 of 3 tries): start when plotly has not redrawn for QUIET_MS
    pg.wait_for_function(f"performance.now() - window.__tl.last > {QUIET_MS}", polling="raf")
    pg.evaluate(MOUSE_HOOK_JS)
    press()
    t_js = _now(pg)
    c_srv, c_br, c_rt = server.cpu(), browser.cpu(), renderer_times(pg)
    release()
    try:
        pg.wait_for_function(MOUSE_DONE_JS, arg=done, timeout=timeout_s * 1000, polling="raf")
    except Exception as e:   # name what the page showed: the gesture's events, the info line
        raise RuntimeError(f"no answer to the gesture within {timeout_s} s: {pg.evaluate('window.__tl')}, "
                           f"info {pg.inner_text('#tl-info')!r}") from e
    tl = pg.evaluate("window.__tl")
    end = min(p[1] for p in tl["painted"] if p[0] >= tl["info"])
    task, script, thread = renderer_times(pg)
    waited, n = pg.evaluate(SERVER_WAIT_JS, t_js)
    gesture = (tl["up"] - tl["down"]) / 1e3 if tl["down"] is not None else None
    return Sample((end - tl["up"]) / 1e3, waited / 1e3, server.cpu() - c_srv, browser.cpu() - c_br, n, None,
                  task - c_rt[0], script - c_rt[1], gesture, sum(p[0] >= tl["up"] for p in tl["painted"]),
                  renderer_cpu_s=thread - c_rt[2])


CP_DRAWN = ("(() => { const gd = document.querySelector('#tl-graph .js-plotly-plot');"
            " return !!(gd && gd.data && gd.data.some(d => d.name === 'critical path')); })()")


def _timeline_whole_run(pg, server, run_id):
    """The Timeline of the whole run, all ranks, its critical path drawn (as a user finds it)."""
    pg.goto(url(server.base, "/timeline", run_id))
    settled(pg, CONTENT["/timeline"])
    pg.wait_for_function(CP_DRAWN, timeout=COLD_TIMEOUT_S * 1000)
    settled(pg, CONTENT["/timeline"])


def drags(args, pg, server, browser, run_id, rows):
    """Mouse drag-zooms from the whole run, as a person zooms: press inside the plot, drag a fifth
    of its width in 10 moves, release; then the "reset zoom" button (a mouse click) back."""
    _timeline_whole_run(pg, server, run_id)
    drag = Row("mouse drag-zoom from the whole run (a fifth of the plot; mouse-up to the new figure painted)")
    back = Row("'reset zoom' button back to the whole run (mouse-up to painted)")
    for i in range(args.repeat):
        box = pg.locator("#tl-graph .nsewdrag").first.bounding_box()
        y = box["y"] + box["height"] * (0.2 + 0.6 * (i % 3) / 2)
        x0 = box["x"] + box["width"] * (0.1 + 0.15 * (i % 5))
        x1 = x0 + box["width"] * 0.2
        before = pg.inner_text("#tl-info")

        def press():
            pg.mouse.move(x0, y)
            pg.mouse.down()
            pg.mouse.move(x1, y, steps=10)
        s = mouse(pg, server, browser, press, pg.mouse.up, f"{TL_INFO} !== {json.dumps(before)}")
        drag.samples.append(s)
        print(f"  drag-zoom: {_line(s)}", flush=True)
        zoomed = pg.inner_text("#tl-info")
        b = pg.locator("#tl-reset").bounding_box()
        bx, by = b["x"] + b["width"] / 2, b["y"] + b["height"] / 2
        s = mouse(pg, server, browser, lambda: (pg.mouse.move(bx, by), pg.mouse.down()), pg.mouse.up,
                  f"{TL_INFO} !== {json.dumps(zoomed)}")
        back.samples.append(s)
        print(f"  reset zoom: {_line(s)}", flush=True)
    rows += [drag, back]


DEEP_LEVELS = 5   # drags in a row, each a fifth of the plot: 1/5 ... 1/3,125 of the run


def deep_drags(args, pg, server, browser, run_id, rows):
    """Mouse drag-zooms in a row from the whole run, each a fifth of the plot (issue 20: a narrow
    window of a big run reads its events, a wide one is drawn from the stored overview): one row a
    depth, then the "reset zoom" button back (not timed)."""
    _timeline_whole_run(pg, server, run_id)
    levels = [Row(f"mouse drag-zoom, {k + 1} in a row (window 1/{5 ** (k + 1):,} of the run; mouse-up to painted)")
              for k in range(DEEP_LEVELS)]
    for i in range(args.repeat):
        for k in range(DEEP_LEVELS):
            box = pg.locator("#tl-graph .nsewdrag").first.bounding_box()
            y = box["y"] + box["height"] * 0.3
            x0 = box["x"] + box["width"] * (0.2 + 0.15 * ((i + k) % 4))
            x1 = x0 + box["width"] * 0.2
            before = pg.inner_text("#tl-info")

            def press():
                pg.mouse.move(x0, y)
                pg.mouse.down()
                pg.mouse.move(x1, y, steps=10)
            s = mouse(pg, server, browser, press, pg.mouse.up, f"{TL_INFO} !== {json.dumps(before)}")
            levels[k].samples.append(s)
            print(f"  drag {k + 1} in a row: {_line(s)} · {pg.inner_text('#tl-info')[:160]}", flush=True)
        zoomed = pg.inner_text("#tl-info")
        pg.click("#tl-reset")
        pg.wait_for_function(f"{TL_INFO} !== {json.dumps(zoomed)}", timeout=INTERACT_TIMEOUT_S * 1000)
        settled(pg, CONTENT["/timeline"])
    rows += levels


def zooms(args, pg, server, browser, run_id, rows):
    pg.goto(url(server.base, "/timeline", run_id))
    settled(pg, CONTENT["/timeline"])
    full = pg.evaluate("document.querySelector('#tl-graph .js-plotly-plot').layout.xaxis.range.slice()")
    zoom = Row("Plotly.relayout zoom, no mouse (x-axis window 1/2 … 1/10,000 of the run, rank level)")
    back = Row("Plotly.relayout autorange, no mouse (what a double-click asks)")
    span = full[1] - full[0]
    for i in range(args.repeat):
        for frac in (0.5, 0.1, 0.01, 0.001, 0.0001):
            mid = full[0] + span * (0.3 + 0.4 * ((i * 5 + frac * 1e4) % 7) / 7)
            zoom.samples.append(_relayout(pg, server, browser, "{'xaxis.range[0]': a[0], 'xaxis.range[1]': a[1]}",
                                          [mid - span * frac / 2, mid + span * frac / 2]))
        back.samples.append(_relayout(pg, server, browser, "{'xaxis.autorange': true}"))
    rows += [zoom, back]


def drills(args, pg, server, browser, run_id, rows):
    """A mouse click on a rank row (its blocks drawn), then the radio back to the rank rows; each
    click on a freshly loaded Timeline of the whole run, all ranks (a drill keeps its rank in the
    ranks filter)."""
    drill = Row("drill-down (mouse click on a rank row of the whole run: mouse-up to its blocks painted)")
    up = Row("back to the rank rows (radio; the ranks filter keeps the drilled rank)")
    graph = pg.locator("#tl-graph .nsewdrag").first
    for i in range(args.repeat):
        _timeline_whole_run(pg, server, run_id)
        targets = pg.evaluate(DRILL_TARGETS_JS)
        t = targets[i % len(targets)]
        box = graph.bounding_box()
        px, py = box["x"] + t["x"], box["y"] + t["y"]
        s = mouse(pg, server, browser, lambda: (pg.mouse.move(px, py), pg.mouse.down()), pg.mouse.up,
                  f"{TL_INFO}.startsWith('block level')")
        drill.samples.append(s)
        print(f"  drill into {t['label']}: {_line(s)}", flush=True)
        s = measure(pg, server, browser, lambda: pg.click("#tl-level input[value=rank]"),
                    CONTENT["/timeline"] + f" && {TL_INFO}.startsWith('rank level')", timeout_s=INTERACT_TIMEOUT_S)
        up.samples.append(s)
    rows += [drill, up]


def _line(s: Sample) -> str:
    mouse_part = (f"gesture {s.gesture_s:.2f} s, {s.redraws} redraws after the mouse-up; "
                  if s.gesture_s is not None else "")
    return (f"{s.wall_s:.2f} s ({mouse_part}server wait {s.server_wait_s:.2f} s in {s.requests} requests, server cpu "
            f"{s.server_cpu_s:.2f} s, browser cpu {s.browser_cpu_s:.2f} s, renderer main thread "
            f"{s.renderer_task_s:.2f} s of which script {s.renderer_script_s:.2f} s; load {os.getloadavg()[0]:.1f})")


def what_ifs(args, pg, server, browser, run_id, rows):
    pg.goto(url(server.base, "/critical-path", run_id))
    settled(pg, CONTENT["/critical-path"])
    what = Row("what-if (a new percentage each time, every rank): the exact answer")
    first = Row("what-if: its first answer (the bound from the critical path, or the exact answer if it came first)")
    for i in range(args.whatif_repeat):
        pct = 11 + 7 * i
        pg.fill("#cp-whatif-percent", str(pct))
        verdict = (f"(!!document.querySelector('#cp-whatif-verdict') && document.querySelector('#cp-whatif-verdict')"
                   f".innerText.includes('{pct}% faster'))")
        bound = (f"(!!document.querySelector('#cp-whatif-bound') && document.querySelector('#cp-whatif-bound')"
                 f".innerText.includes('{pct}%'))")
        t0 = [0.0]

        def click():
            t0[0] = time.perf_counter()
            pg.click("#cp-whatif-apply")
            pg.wait_for_function(f"{bound} || {verdict}", timeout=INTERACT_TIMEOUT_S * 1000, polling="raf")
            first.samples.append(Sample(time.perf_counter() - t0[0], float("nan"), float("nan"), float("nan")))
        s = measure(pg, server, browser, click, verdict, timeout_s=COLD_TIMEOUT_S)
        what.samples.append(s)
        print(f"  what-if {pct}%: first answer {first.samples[-1].wall_s:.2f} s; exact: {_line(s)}", flush=True)
    rows.append(first)
    rows.append(what)


def _fmt(s):
    return "—" if s is None else (f"{s * 1e3:.0f} ms" if s < 10 else f"{s:.1f} s")


def p95(xs):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(0.95 * (len(xs) - 1))))]


def table(rows) -> tuple[list[str], bool]:
    lines = ["| measurement | n | browser end-to-end median | p95 | waiting on the server (median) | "
             "server CPU (median) | browser CPU (median) | renderer main thread: busy / script / CPU (median) | target | ok |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    ok_all = True
    for r in rows:
        if not r.samples:
            continue
        w = [s.wall_s for s in r.samples]
        med, hi = statistics.median(w), p95(w)
        srv = statistics.median(s.server_wait_s for s in r.samples)
        sc = statistics.median(s.server_cpu_s for s in r.samples)
        bc = statistics.median(s.browser_cpu_s for s in r.samples)
        rt = (f"{statistics.median(s.renderer_task_s for s in r.samples):.2f} s / "
              f"{statistics.median(s.renderer_script_s for s in r.samples):.2f} s / "
              f"{statistics.median(s.renderer_cpu_s for s in r.samples):.2f} s")
        if r.kind == "cold":
            fps = [s.first_paint_s for s in r.samples]
            fmed, fhi = statistics.median(fps), max(fps)
            ok = fhi <= FIRST_PAINT_S
            ok_all &= ok
            lines.append(f"| {r.name}: first paint | {len(fps)} | {_fmt(fmed)} | {_fmt(fhi)} (worst) | — | — | — | — | "
                         f"≤ {_fmt(FIRST_PAINT_S)} | {'yes' if ok else 'NO'} |")
            lines.append(f"| {r.name}: complete | {len(w)} | {_fmt(med)} | {_fmt(max(w))} (worst) | {_fmt(srv)} | "
                         f"{sc:.1f} s | {bc:.1f} s | {rt} | — | |")
        else:
            gs = [s.gesture_s for s in r.samples if s.gesture_s is not None]
            if gs:
                r.name += (f" [gesture {statistics.median(gs):.2f} s; "
                           f"{statistics.median(s.redraws for s in r.samples):.0f} redraws after the mouse-up]")
            ok = med <= INTERACT_MEDIAN_S and hi <= INTERACT_P95_S
            ok_all &= ok
            lines.append(f"| {r.name} | {len(w)} | {_fmt(med)} | {_fmt(hi)} | {_fmt(srv)} | {sc:.2f} s | {bc:.2f} s | {rt} | "
                         f"≤ {_fmt(INTERACT_MEDIAN_S)} / {_fmt(INTERACT_P95_S)} | {'yes' if ok else 'NO'} |")
    return lines, ok_all


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", type=Path, help="a run directory (default: a new synthetic 10 M-event, 8-rank run)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cold-repeat", type=int, help="fresh servers per page (default: --repeat); each loads the run")
    ap.add_argument("--whatif-repeat", type=int, default=5)
    ap.add_argument("--app-root", type=Path, default=ROOT, help="checkout whose viewer is served")
    ap.add_argument("--skip-cold", action="store_true")
    ap.add_argument("--cold-pages", default=",".join(COLD_PAGES),
                    help="the pages whose cold first visit is measured (default: %(default)s)")
    ap.add_argument("--cold-figure", action="store_true",
                    help="a cold page is complete only once its first plotly figure is drawn too (the idle page's "
                         "content already waits for its heatmap; the others' does not)")
    ap.add_argument("--browser-cache", choices=("cold", "warm"), default="cold",
                    help="cold visits in a fresh browser context each (cold, the default) or in one context "
                         "whose HTTP and code caches hold the viewer's scripts from an earlier visit (warm)")
    ap.add_argument("--trace", type=Path, metavar="DIR",
                    help="write a Chromium performance trace of each cold visit to DIR/<page>-<n>.json (the "
                         "tracing and V8's profiler slow the page: its times are not comparable to untraced ones)")
    ap.add_argument("--skip-warm", action="store_true")
    ap.add_argument("--sections", default=",".join(WARM_SECTIONS),
                    help=f"which warm measurements, comma-separated, of {','.join(WARM_SECTIONS)}")
    ap.add_argument("--warm-pages", default="/timeline,/critical-path,/idle,/barriers,/",
                    help="pages visited once before the warm measurements (default: %(default)s; a 100 M-event run "
                         "without stored results computes for long on the analysis pages)")
    ap.add_argument("--runs-page", type=int, default=0, metavar="N",
                    help="measure only the Runs page's cold visits on a root of N runs (the bundled ones repeated)")
    ap.add_argument("--label", default="", help="a line saying what this measures (e.g. 'before: main at ...')")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / f"browser-cpu-{dt.date.today()}.md")
    args = ap.parse_args()
    args.app_root = args.app_root.resolve()
    args.sections = [x for x in args.sections.split(",") if x]
    args.warm_pages = [x for x in args.warm_pages.split(",") if x]
    args.cold_pages = [x for x in args.cold_pages.split(",") if x]
    if set(args.cold_pages) - set(COLD_PAGES):
        ap.error(f"unknown --cold-pages {sorted(set(args.cold_pages) - set(COLD_PAGES))}")
    unknown = set(args.sections) - set(WARM_SECTIONS)
    if unknown:
        ap.error(f"unknown --sections {sorted(unknown)}; known: {','.join(WARM_SECTIONS)}")
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)

    tmp = None
    if args.runs_page:
        return main_runs_page(args)
    if args.run is None:
        import tempfile

        from benchmarks.bench_viewer import make_synthetic
        tmp = tempfile.TemporaryDirectory(prefix="epscope-bench-browser-")
        args.run = make_synthetic(Path(tmp.name), 10_000_000, 8)
    args.run = args.run.resolve()
    man = json.loads((args.run / "manifest.json").read_text())
    run_id = args.run.name      # the catalog's id of a run directly under its root

    from playwright import sync_api
    load = [os.getloadavg()]
    t_start = time.perf_counter()
    rows: list[Row] = []
    failures = []
    try:
        with sync_api.sync_playwright() as pw:
            browser = Browser(pw)
            for name, section, skip in (("cold visits", cold_visits, args.skip_cold),
                                        ("warm interactions", warm_interactions, args.skip_warm)):
                if skip:
                    continue
                try:
                    section(args, browser, run_id, rows)
                except Exception as e:   # the rows measured so far are still written, the failure named
                    failures.append(f"{name} stopped: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                    print(failures[-1], flush=True)
                load.append(os.getloadavg())
            browser.browser.close()
    finally:
        if tmp is not None:
            tmp.cleanup()

    body, ok_all = table(rows)
    run_line = (f"run: {args.run.name}, {man.get('num_events', 0):,} events, {man.get('config', {}).get('ranks', '?')} "
                f"ranks; ")
    return write(args, rows, body, ok_all, failures, load, t_start, run_line)


def write(args, rows, body, ok_all, failures, load, t_start, run_line: str) -> int:
    """The results file: the table with the machine, the commits, the load and what was run."""
    app_commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=args.app_root, capture_output=True,
                                text=True).stdout.strip() or "(a tree without .git)"
    lines = [
        f"# Viewer in a browser ({cpu_name()}, {os.cpu_count()} cores)",
        "",
        f"script at commit {commit()}, viewer served from {args.app_root} ({app_commit}), "
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, "
        f"`python benchmarks/bench_browser.py {' '.join(sys.argv[1:])}`",
        *([args.label] if args.label else []),
        f"{run_line}Chromium {subprocess.run([CHROMIUM, '--version'], capture_output=True, text=True).stdout.split()[1]} headless",
        "1/5/15-minute load averages at the start, after the cold visits and at the end: "
        + "; ".join("/".join(f"{x:.1f}" for x in la) for la in load)
        + f" (2 cores shared with other engineers' jobs); {time.perf_counter() - t_start:.0f} s in all; "
        f"{retries} action(s) repeated after showing no effect within {INTERACT_TIMEOUT_S} s",
        *notes,
        "",
        *body,
        *(["", *(f"**{f}** (rows after it were not measured)" for f in failures)] if failures else []),
        "",
        "Browser end-to-end: from the click (or navigation start) until the page's content is drawn with no "
        "progress state and no callback in flight; rows driven by the mouse (a drag-zoom, a button, a click on "
        "a row): from the mouse-up to the end of the frame after the last plotly redraw of the server's answer "
        "(its afterplot event), in the page's own clock, the gesture (mouse-down to mouse-up) beside it. Waiting on the server: the union of the Dash callback "
        "requests' request-to-response intervals within it. CPU columns: seconds of CPU the server process and "
        "the browser's processes used during the measurement (wall time on this shared machine is longer); the "
        "renderer main thread: how long the page's main thread ran tasks, and JavaScript of it (Chrome's "
        "Performance metrics TaskDuration and ScriptDuration, through CDP). "
        "Cold rows: each sample is a fresh server process; the first paint is the run header plus the page's "
        "content or its progress state.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    return 0 if ok_all and not failures else 1


def main_runs_page(args) -> int:
    """--runs-page N: a root of N runs in a temporary directory, its own hash cache (empty at the
    first server), the Runs page's cold visits."""
    import tempfile

    from playwright import sync_api
    load, t_start, rows, failures = [os.getloadavg()], time.perf_counter(), [], []
    with tempfile.TemporaryDirectory(prefix="epscope-bench-runs-") as tmp:
        os.environ["EPSCOPE_HASH_CACHE"] = str(Path(tmp) / "file-hashes.json")   # the servers inherit it
        args.runs_root = make_runs_root(Path(tmp), args.runs_page)
        with sync_api.sync_playwright() as pw:
            browser = Browser(pw)
            try:
                runs_page(args, browser, rows)
            except Exception as e:
                failures.append(f"runs page stopped: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                print(failures[-1], flush=True)
            load.append(os.getloadavg())
            browser.browser.close()
    body, _ = table(rows)
    complete = [s.wall_s for r in rows[1:] for s in r.samples]
    ok = bool(complete) and max(complete) <= RUNS_PAGE_S
    body.append("")
    body.append(f"Target (issue 31): the Runs page with 500 runs complete in ≤ {RUNS_PAGE_S:g} s cold: "
                + ("met (worst cold sample)" if ok else "NOT met") + ".")
    run_line = f"root: {args.runs_page} runs (the bundled runs repeated, hard-linked); "
    return write(args, rows, body, ok, failures, load, t_start, run_line)


if __name__ == "__main__":
    sys.exit(main())
