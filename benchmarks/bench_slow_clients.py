"""Slow clients against the viewer (issue 32): while N clients trickle their requests (one header
byte every --interval s, never finishing), how long a normal page load takes, through HTTP as a
browser issues it and in headless Chromium; the same against another checkout's server (the
baseline: the hand-made werkzeug server before waitress) in the same run.

    nice python3 benchmarks/bench_slow_clients.py [--before /path/to/old/checkout] [--clients 64]
        [--interval 10] [--loads 20] --out benchmarks/results/slow-clients-cpu-DATE-COMMIT.md

A page load over HTTP is what the Runs page's first visit asks: GET /, its scripts and styles
(6 at a time, as Chromium per host), /_dash-layout, /_dash-dependencies and the route callback;
each load is timed from its first request to its last answer, a load with an error or past
--deadline counted as failed. In Chromium: a fresh context's goto / until the runs table is drawn.
The server is `viewer.app.serve` in its own process on the bundled traces (benchmarks/bench_browser.py's
Server), warm: one load before the clients start.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as dt
import json
import os
import re
import socket
import statistics
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_browser import ARGS, CHROMIUM, Server  # noqa: E402
from benchmarks.machine import commit, cpu_name  # noqa: E402

ROUTE = "..page.children...nav.children...run-select.value...url.search.."
BODY = json.dumps({
    "output": ROUTE,
    "outputs": [{"id": "page", "property": "children"}, {"id": "nav", "property": "children"},
                {"id": "run-select", "property": "value"}, {"id": "url", "property": "search"}],
    "inputs": [{"id": "url", "property": "pathname", "value": "/"}, {"id": "url", "property": "search", "value": ""},
               {"id": "run-select", "property": "value", "value": None}],
    "changedPropIds": ["url.pathname"]}).encode()


def trickle(port: int, interval: float, stop: threading.Event, connected: list) -> None:
    """One slow client: connects, then sends its request line one byte every `interval` seconds."""
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return
    connected.append(1)
    with c:
        for b in b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 100_000:
            try:
                c.send(bytes([b]))
            except OSError:
                return
            if stop.wait(interval):
                return


def _get(url: str, deadline: float, data: bytes | None = None) -> bytes:
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    return urllib.request.urlopen(req, timeout=max(0.1, deadline - time.monotonic())).read()


def http_page_load(base: str, deadline_s: float) -> float | None:
    """Seconds for the Runs page's requests, as a browser issues them; None when any failed."""
    t0 = time.monotonic()
    deadline = t0 + deadline_s
    try:
        html = _get(base + "/", deadline).decode()
        assets = re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css)[^"]*)"', html)
        with cf.ThreadPoolExecutor(6) as ex:
            list(ex.map(lambda a: _get(base + a, deadline), assets))
            list(ex.map(lambda a: _get(base + a, deadline), ["/_dash-layout", "/_dash-dependencies"]))
        _get(base + "/_dash-update-component", deadline, BODY)
    except (OSError, urllib.error.URLError):
        return None
    took = time.monotonic() - t0
    return took if took <= deadline_s else None


def browser_loads(base: str, n: int, deadline_s: float) -> list[float | None]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return []
    out = []
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        for _ in range(n):
            ctx = b.new_context()
            pg = ctx.new_page()
            t0 = time.monotonic()
            try:
                pg.goto(base + "/", timeout=deadline_s * 1000, wait_until="commit")
                pg.wait_for_selector(".tbl-runs", timeout=max(1, (t0 + deadline_s - time.monotonic()) * 1000))
                out.append(time.monotonic() - t0)
            except Exception:   # noqa: BLE001 -- a timeout or a refused load is a failed load
                out.append(None)
            ctx.close()
        b.close()
    return out


def _summary(xs: list) -> str:
    ok = sorted(x for x in xs if x is not None)
    if not ok:
        return f"0 of {len(xs)} loaded"
    return (f"{len(ok)} of {len(xs)} loaded; median {statistics.median(ok):.2f} s, max {ok[-1]:.2f} s"
            + (f", {sum(x <= 2 for x in ok)} within 2 s" if ok else ""))


def measure(app_root: Path, runs: Path, a) -> dict:
    srv = Server(app_root, runs)
    stop, connected = threading.Event(), []
    clients = []
    try:
        quiet = [http_page_load(srv.base, a.deadline) for _ in range(3)]
        quiet_browser = browser_loads(srv.base, a.browser_loads, a.deadline)
        clients = [threading.Thread(target=trickle, args=(srv.port, a.interval, stop, connected), daemon=True)
                   for _ in range(a.clients)]
        for c in clients:
            c.start()
        time.sleep(2.0)
        loaded = [http_page_load(srv.base, a.deadline) for _ in range(a.loads)]
        browser = browser_loads(srv.base, a.browser_loads, a.deadline)
        return {"quiet": quiet, "quiet_browser": quiet_browser, "http": loaded, "browser": browser,
                "connected": len(connected)}
    finally:
        stop.set()
        for c in clients:
            c.join(5)
        srv.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to measure the same way (the baseline)")
    ap.add_argument("--runs", type=Path, default=ROOT / "traces")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--loads", type=int, default=20)
    ap.add_argument("--browser-loads", type=int, default=5)
    ap.add_argument("--deadline", type=float, default=20.0, help="a load taking longer counts as failed")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    load0 = os.getloadavg()
    sides = ([("before", a.before)] if a.before else []) + [("this tree", ROOT)]
    res = {name: measure(path, a.runs, a) for name, path in sides}
    lines = [f"# Slow clients against the viewer ({dt.date.today().isoformat()})", "",
             f"commit {commit(('viewer', 'profiler', 'benchmarks'))}; {cpu_name()}, {os.cpu_count()} cores; "
             f"load average {load0[0]:.2f} at start; server: the viewer on {a.runs.name}/ in its own process, warm",
             "", f"`nice python3 benchmarks/bench_slow_clients.py{' --before ' + str(a.before) if a.before else ''} "
             f"--clients {a.clients} --interval {a.interval:g} --loads {a.loads} --browser-loads {a.browser_loads} "
             f"--deadline {a.deadline:g}`", "",
             f"{a.clients} clients each send one header byte every {a.interval:g} s and never finish their request. "
             "A page load over HTTP: GET /, its scripts and styles 6 at a time, /_dash-layout, /_dash-dependencies "
             "and the route callback (server wall time as a client sees it); in Chromium: a fresh context's "
             f"goto / until the runs table is drawn. A load failing or past {a.deadline:g} s counts as not loaded.",
             "", "| server | slow clients connected | quiet, HTTP | with slow clients, HTTP | quiet, Chromium | "
             "with slow clients, Chromium |", "|---|---:|---|---|---|---|"]
    for name, r in res.items():
        lines.append(f"| {name} | {r['connected']} | {_summary(r['quiet'])} | {_summary(r['http'])} | "
                     f"{_summary(r['quiet_browser']) if r['quiet_browser'] else 'not run'} | "
                     f"{_summary(r['browser']) if r['browser'] else 'not run'} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
