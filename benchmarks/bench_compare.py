"""Compare of 3 runs a side as a user meets it (issue 20: "compare of 3 runs a side <= 2 s").

    python benchmarks/bench_compare.py make --events 10000000 --runs 3 DIR
    python benchmarks/bench_compare.py measure DIR [--app-root PATH] [--repeat 3] [--out FILE]

`make` writes 2 x `--runs` synthetic runs of 8 ranks (profiler.groundtruth.synthetic, scenario 'ab': side B's
one phase 20 % slower) under DIR/a0.., DIR/b0.. (`epscope analyze` them to give them stored
results). `measure` starts a fresh viewer process (`viewer.app.serve`, from --app-root's code:
another checkout measures an older commit with this script) per repeat, opens /compare in
headless Chromium, picks the runs of each side in the dropdowns with the mouse and clicks
"compare"; it times the click to the verdict drawn with no progress state and no callback in
flight (cold: a fresh server), then a second click (warm: the same server), with the server's
CPU seconds and peak RSS. Writes a markdown table (CPU, commit, date, load) to --out.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.bench_browser import Browser, Server, measure  # noqa: E402
from benchmarks.machine import commit, cpu_name  # noqa: E402

TARGET_S = 2.0          # issue 20: compare of 3 runs a side
VERDICT = "!!document.querySelector('#cmp-verdict')"


def make(a) -> None:
    from profiler.store.runstore import write_run
    from profiler.groundtruth.synthetic import make_events
    out = Path(a.dir)
    for side in ("a", "b"):
        for i in range(a.runs):
            ev, la, man = make_events(ranks=8, events=a.events, iterations=a.iterations, scenario="ab",
                                      variant=side, seed=100 * (side == "b") + i)
            man["name"] = f"{side}{i}"
            p = write_run(out / f"{side}{i}", ev, la, man, perfetto=False, overwrite=True)
            print(f"{p}: {len(ev):,} events", flush=True)
            del ev, la


def _pick(pg, side: str, names: list[str]) -> None:
    """Select exactly the runs named `names` in a multi-select dropdown, by clicking its options."""
    pg.click(side)
    box = pg.locator("[role=listbox]")
    box.wait_for()
    opts = box.locator("[role=option]")
    for i in range(opts.count()):
        o = opts.nth(i)
        want = o.inner_text().strip() in names
        if (o.get_attribute("aria-selected") == "true") != want:
            o.click()
    pg.keyboard.press("Escape")
    box.wait_for(state="detached")


def measure_once(app_root: Path, run_dir: Path, browser, runs: int) -> dict:
    server = Server(app_root, run_dir)
    try:
        pg = browser.new_page()
        pg.goto(server.base + "/compare")
        pg.wait_for_selector("#cmp-go")
        _pick(pg, "#cmp-a", [f"a{i}" for i in range(runs)])
        _pick(pg, "#cmp-b", [f"b{i}" for i in range(runs)])
        cold = measure(pg, server, browser, lambda: pg.click("#cmp-go"), VERDICT)
        verdict = pg.locator("#cmp-verdict").inner_text()

        def click_answered():
            # the verdict of the first click is on the page already: wait for this click's answer
            with pg.expect_response(lambda r: "_dash-update-component" in r.url):
                pg.click("#cmp-go")
        warm = measure(pg, server, browser, click_answered, VERDICT)
        rss = server.peak_rss_gb()
        pg.context.close()
    finally:
        server.close()
    return {"cold": cold, "warm": warm, "rss_gb": rss, "verdict": " ".join(verdict.split())[:160]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--events", type=int, default=10_000_000)
    m.add_argument("--iterations", type=int, default=4)
    m.add_argument("--runs", type=int, default=3)
    s = sub.add_parser("measure")
    s.add_argument("dir")
    s.add_argument("--app-root", default=str(ROOT))
    s.add_argument("--runs", type=int, default=3)
    s.add_argument("--repeat", type=int, default=3)
    s.add_argument("--label", default="")
    s.add_argument("--out")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a)
        return 0
    from playwright.sync_api import sync_playwright
    from profiler.analysis import summary
    run_dir = Path(a.dir).resolve()
    n_events = sum(int(json.loads((p / "manifest.json").read_text())["num_events"])
                   for p in sorted(run_dir.iterdir()) if (p / "manifest.json").is_file())
    stored = sum(summary.load(p) is not None for p in run_dir.iterdir() if (p / "manifest.json").is_file())
    load0 = os.getloadavg()[0]
    res = []
    with sync_playwright() as pw:
        browser = Browser(pw)
        for _ in range(a.repeat):
            res.append(measure_once(Path(a.app_root).resolve(), run_dir, browser, a.runs))
            r = res[-1]
            for k in ("cold", "warm"):
                x = r[k]
                print(f"{k}: {x.wall_s:.2f} s, waiting on the server {x.server_wait_s:.2f} s in {x.requests} requests, "
                      f"server CPU {x.server_cpu_s:.2f} s, browser CPU {x.browser_cpu_s:.2f} s (renderer main "
                      f"thread {x.renderer_task_s:.2f} s, script {x.renderer_script_s:.2f} s)", flush=True)
            print(f"peak RSS {r['rss_gb']:.2f} GB: {r['verdict'][:80]}", flush=True)
    load1 = os.getloadavg()[0]

    def med(f):
        return statistics.median(f(r) for r in res)
    lines = [
        f"| {a.label or Path(a.app_root).name} | {n_events:,} in {2 * a.runs} runs | {stored} of {2 * a.runs} | "
        f"{med(lambda r: r['cold'].wall_s):.2f} ({min(r['cold'].wall_s for r in res):.2f}-{max(r['cold'].wall_s for r in res):.2f}) | "
        f"{med(lambda r: r['cold'].server_cpu_s):.2f} | {med(lambda r: r['warm'].wall_s):.2f} "
        f"({med(lambda r: r['warm'].server_wait_s):.2f}) | "
        f"{max(r['rss_gb'] for r in res):.2f} | {load0:.1f}-{load1:.1f} | {res[0]['verdict'][:90]} |"]
    head = (f"<!-- {dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC, commit {commit()}, {cpu_name()}, "
            f"{a.repeat} fresh servers, target {TARGET_S} s -->\n"
            "| code | events | runs with stored results | click to verdict, cold: median (range) s | server CPU s, cold "
            "| warm s (waiting on the server) | server peak RSS GB | 1-min load | verdict |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    text = head + "\n" + "\n".join(lines) + "\n"
    print(text)
    if a.out:
        with open(a.out, "a") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
