"""A stand-in for profiler/workflows/ab_worker.py on machines without a GPU: it speaks the same protocol and
answers with samples drawn around levels read from its side's tree (fake.json), so the tests of
profiler.workflows.rounds / profiler.workflows.ab know the answer. Profiled rounds write a synthetic run directory
(profiler.groundtruth.synthetic, scenario "ab": variant a or b) from rank 0.

fake.json: {"level": 100.0, "sd": 0.3, "variant": "a", "die_round": null, "fail_round": null,
            "ready_error": null}
The epscope package of the test is found through FAKE_TOOL_ROOT (the side's tree has no code).
"""
import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, os.environ["FAKE_TOOL_ROOT"])

import numpy as np  # noqa: E402

from profiler.workflows.ab_worker import METRICS, REPLY_PREFIX  # noqa: E402


def reply(obj):
    sys.stdout.write(REPLY_PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser()
    for k in ("--rank", "--world", "--port"):
        ap.add_argument(k, type=int, required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--no-profile", action="store_true")
    a = ap.parse_args()
    conf = json.loads(Path("fake.json").read_text())
    print("a line of build output that is not a reply", flush=True)
    if conf.get("ready_error"):
        reply({"ok": False, "rank": a.rank, "error": conf["ready_error"]})
        return 1
    assert Path(a.inputs, f"rank{a.rank}.pt").exists(), "the parent wrote no inputs"
    reply({"ok": True, "ready": True, "rank": a.rank, "gpu": "FakeGPU", "ep_core": str(Path.cwd()),
           "commit": os.environ.get("EPSCOPE_GIT_COMMIT"), "build_dir": os.environ.get("EPSCOPE_BUILD_DIR")})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "quit":
            return 0
        r = cmd["round"]
        if conf.get("die_round") == r:
            os._exit(3)
        if conf.get("fail_round") == r:
            reply({"ok": False, "rank": a.rank, "round": r, "error": "RuntimeError: planted failure"})
            return 1
        rng = np.random.default_rng(1000 * r + a.rank)
        level = conf["level"] + a.rank   # rank 1 is the slower one: the op is as slow as it
        samples = {m: list(rng.normal(level, conf.get("sd", 0.3), cmd["iters"])) for m in METRICS}
        run_dir = None
        if cmd.get("profile"):
            p = cmd["profile"]
            run_dir = f"{p['out']}/{p['name']}"
            if a.rank == 0:
                from profiler.groundtruth.synthetic import make_run
                from profiler.store.runstore import update_manifest

                make_run(run_dir, ranks=2, events=3000, scenario="ab", variant=conf.get("variant", "a"), seed=r,
                         perfetto=False)
                update_manifest(run_dir, {"workload": p["workload"], "name": p["name"]})
        reply({"ok": True, "rank": a.rank, "round": r, "samples": samples, "run_dir": run_dir,
               "configs": cmd.get("configs"), "num_sms": cmd.get("num_sms")})
    return 0


if __name__ == "__main__":
    sys.exit(main())
