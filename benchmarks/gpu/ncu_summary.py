"""Read an Nsight Compute raw CSV (`ncu -i REP --page raw --csv`) of benchmarks/gpu/ep_cost_ncu.py's
launches and print, per kernel and SM count, each mode's median of the metrics that differ most
from the compiled-out build (the modes come from <dir>/ncu_launches.json, in launch order: the
two builds give their kernels the same names, so the report alone cannot tell them apart).

    python benchmarks/gpu/ncu_summary.py RAW.csv LAUNCHES.json [--top 45] > summary.txt
"""
from __future__ import annotations

import argparse
import json
import sys

import numpy as np
import pandas as pd

# Always shown, when ncu measured them: time, work, the issue-stall breakdown's main lines, memory.
ALWAYS = ("gpu__time_duration.sum", "sm__cycles_elapsed.max", "smsp__cycles_active.avg", "smsp__inst_executed.sum",
          "smsp__inst_executed_op_global_st.sum", "smsp__inst_executed_op_global_ld.sum", "launch__registers_per_thread",
          "sm__warps_active.avg.pct_of_peak_sustained_active", "dram__bytes_read.sum", "dram__bytes_write.sum",
          "smsp__average_warp_latency_issue_stalled_no_instruction", "smsp__average_warp_latency_issue_stalled_long_scoreboard",
          "smsp__average_warp_latency_issue_stalled_lg_throttle", "smsp__average_warp_latency_issue_stalled_barrier",
          "smsp__average_warp_latency_issue_stalled_wait", "smsp__average_warp_latency_issue_stalled_branch_resolving",
          "smsp__average_warp_latency_issue_stalled_membar", "smsp__average_warp_latency_issue_stalled_drain")


# the modes of recorder_ep_cost.MODES, shortened for the table's columns
SHORT = {"compiled out": "out", "instrumented, recording off": "off", "instrumented, recording on": "on"}


def load(raw_csv: str, launches_json: str) -> pd.DataFrame:
    df = pd.read_csv(raw_csv, skiprows=[1], low_memory=False)   # row 1: the units
    launches = json.loads(open(launches_json).read())
    df = df.sort_values("ID", kind="stable").reset_index(drop=True)
    if len(df) != len(launches):
        raise SystemExit(f"{len(df)} profiled kernels but {len(launches)} launches listed: the filter and the list differ")
    for i, (name, want) in enumerate(zip(df["Kernel Name"], launches)):
        if want["kernel"] not in str(name):
            raise SystemExit(f"profiled kernel {i} is {name!r}, the list says {want['kernel']}")
    meta = pd.DataFrame(launches)
    return pd.concat([meta, df], axis=1)


def numeric(df: pd.DataFrame) -> pd.DataFrame:
    out = {}
    for c in df.columns:
        if "__" not in c:
            continue
        v = pd.to_numeric(df[c].astype(str).str.replace(",", ""), errors="coerce")
        if v.notna().all():
            out[c] = v
    return pd.DataFrame(out)


def summarise(df: pd.DataFrame, top: int) -> str:
    lines = []
    num = numeric(df)
    modes = [m for m in dict.fromkeys(df["mode"]) if m != "setup"]   # the handle's dispatch is no mode
    base = modes[0]
    for (kernel, sms), g in df[~df["warm"]].groupby(["kernel", "sms"], sort=False):
        med = {m: num.loc[g.index[g["mode"] == m]].median() for m in modes}
        rel = {m: (med[m] - med[base]) / med[base].abs().replace(0, np.nan) for m in modes[1:]}
        score = pd.concat([rel[m].abs() for m in modes[1:]], axis=1).max(axis=1)
        moved = (pd.concat([(med[m] - med[base]).abs() for m in modes[1:]], axis=1).max(axis=1) > 0)
        pick = list(dict.fromkeys([c for c in ALWAYS if c in num.columns] +
                                  list(score[moved].dropna().sort_values(ascending=False).index[:top])))
        lines.append(f"## {kernel}, {sms} SMs: median of {int((g['mode'] == base).sum())} launches a mode")
        lines.append(f"{'metric':78s} " + " ".join(f"{SHORT.get(m, m):>14s}" for m in modes) + "  " +
                     " ".join(f"{SHORT.get(m, m) + ' vs ' + SHORT.get(base, base):>12s}" for m in modes[1:]))
        for c in pick:
            lines.append(f"{c[:78]:78s} " + " ".join(f"{med[m][c]:14.6g}" for m in modes) + "  " +
                         " ".join(f"{rel[m][c] * 100:+11.2f}%" for m in modes[1:]))
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("raw_csv")
    ap.add_argument("launches_json")
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    print(summarise(load(a.raw_csv, a.launches_json), a.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
