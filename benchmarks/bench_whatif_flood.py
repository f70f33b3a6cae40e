"""A flood of distinct what-if requests against `epscope view` (issue 19: a 30 s flood kept the
server busy 75 s after its clients left; 20 clients for 60 s grew it from 405 MB to 1.7 GB).

    nice python3 benchmarks/bench_whatif_flood.py [--clients 20] [--seconds 30] [--events 200000] [--out FILE]

Starts `viewer.app.serve` on 127.0.0.1 in a fresh process over one synthetic run, computes one
what-if (the run loaded, its critical path built: the baseline), then --clients threads send
what-if requests with distinct percentages for --seconds (bounded loops, 127.0.0.1 only). After
the last client stops it samples the server's CPU time (/proc/PID/stat) every 0.2 s: the server
is idle once a whole second passes with under 5 % of a core used. Reports the time to idle
(target <= 5 s), the server's resident memory at the baseline, at the flood's peak and 5 s after
idle (target: within 20 % of the baseline), its threads, and the answers the clients got.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.machine import commit, cpu_name  # noqa: E402

IDLE_TARGET_S = 5.0
MEMORY_TARGET = 0.20
TICKS = os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, resident bytes, threads) of a process."""
    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    cpu = (int(stat[11]) + int(stat[12])) / TICKS
    rss = threads = 0
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
    return cpu, rss, threads


def _what_if(port: int, run_id: str, phase: str, percent: float) -> tuple[int, str]:
    body = json.dumps({
        "output": "cp-whatif-result.children", "outputs": {"id": "cp-whatif-result", "property": "children"},
        "inputs": [{"id": "cp-whatif-apply", "property": "n_clicks", "value": 1}],
        "state": [{"id": "cp-run", "property": "data", "value": run_id},
                  {"id": "cp-whatif-phase", "property": "value", "value": phase},
                  {"id": "cp-whatif-rank", "property": "value", "value": "all"},
                  {"id": "cp-whatif-percent", "property": "value", "value": percent}],
        "changedPropIds": ["cp-whatif-apply.n_clicks"]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/_dash-update-component", data=body,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            text = r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except OSError:
        return -1, ""
    if "end-to-end" in text:
        return 200, "result"
    if "busy" in text.lower():
        return 200, "busy"
    return 200, "pending"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    from profiler.store.runstore import load_run
    from profiler.groundtruth.synthetic import make_run
    load0 = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="flood-") as tmp:
        run = make_run(Path(tmp) / "flood", ranks=a.ranks, events=a.events, perfetto=False)
        ev = load_run(run).events
        spans = ev[ev["kind"] == "span"]
        phase = str(spans["phase"].value_counts().index[0])
        port = _free_port()
        code = "import sys; sys.path.insert(0, %r); from viewer.app import serve; serve([%r], port=%d)" % (
            str(ROOT), str(run), port)
        srv = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while _what_if(port, "flood", phase, 10.0)[0] != 200:
                assert time.monotonic() < deadline and srv.poll() is None, "the server did not start"
                time.sleep(0.5)
            while _what_if(port, "flood", phase, 10.0)[1] != "result":   # the baseline: run and path in memory
                assert time.monotonic() < deadline, "the first what-if did not finish"
                time.sleep(0.5)
            time.sleep(2)
            cpu0, rss0, threads0 = _proc(srv.pid)
            answers: dict[str, int] = {}
            peak = [rss0, threads0]
            lock = threading.Lock()
            stop_at = time.monotonic() + a.seconds

            def client(k: int) -> None:
                rng = random.Random(k)
                while time.monotonic() < stop_at:
                    status, what = _what_if(port, "flood", phase, round(rng.uniform(1, 99), 4))
                    with lock:
                        key = f"HTTP {status}" + (f" {what}" if what else "")
                        answers[key] = answers.get(key, 0) + 1

            def watch() -> None:
                while time.monotonic() < stop_at:
                    _, rss, th = _proc(srv.pid)
                    peak[0], peak[1] = max(peak[0], rss), max(peak[1], th)
                    time.sleep(0.5)
            threads = [threading.Thread(target=client, args=(k,)) for k in range(a.clients)]
            threads.append(threading.Thread(target=watch))
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            t_end = time.monotonic()
            samples = [(t_end, _proc(srv.pid)[0])]
            idle_after = None
            while time.monotonic() - t_end < 90:
                time.sleep(0.2)
                now, cpu = time.monotonic(), _proc(srv.pid)[0]
                samples.append((now, cpu))
                old = [s for s in samples if now - s[0] >= 1.0]
                if old and (cpu - old[-1][1]) / (now - old[-1][0]) < 0.05:
                    idle_after = old[-1][0] - t_end
                    break
            time.sleep(5)
            _, rss1, threads1 = _proc(srv.pid)
        finally:
            srv.terminate()
            srv.wait(10)
    growth = rss1 / rss0 - 1
    ok_idle = idle_after is not None and idle_after <= IDLE_TARGET_S
    lines = [f"# What-if flood against `epscope view` ({dt.date.today().isoformat()})", "",
             f"commit {commit(('viewer', 'profiler', 'benchmarks'))}; {cpu_name()}, {os.cpu_count()} cores; "
             f"load average {load0[0]:.2f} at start; synthetic run of {a.events:,} events, {a.ranks} ranks; "
             f"{a.clients} clients for {a.seconds:.0f} s, distinct percentages of phase {phase}", "",
             "| measure | value | target |", "|---|---:|---|",
             f"| server idle after the last client | {'never (90 s)' if idle_after is None else f'{idle_after:.1f} s'} "
             f"| <= {IDLE_TARGET_S:.0f} s {'(met)' if ok_idle else '(MISSED)'} |",
             f"| resident memory: baseline / flood peak / 5 s after idle | {rss0 / 1e6:.0f} / {peak[0] / 1e6:.0f} / "
             f"{rss1 / 1e6:.0f} MB | after within {100 * MEMORY_TARGET:.0f} % of baseline: {100 * growth:+.1f} % "
             f"{'(met)' if growth <= MEMORY_TARGET else '(MISSED)'} |",
             f"| server threads: baseline / peak / after | {threads0} / {peak[1]} / {threads1} | bounded |",
             f"| answers | {', '.join(f'{k}: {v:,}' for k, v in sorted(answers.items()))} | |", ""]
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
