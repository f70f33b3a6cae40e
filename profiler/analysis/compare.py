"""Compare two runs or two groups of runs, A vs B (the returned columns are documented in the
package docstring).

A sample is one (run, iteration): for a phase, the mean duration of its spans in that iteration;
end-to-end, the iteration's total (first begin to last GPU warp end, as critical_path's). Runs of one side are pooled, so
several runs per side, or A/B runs recorded interleaved, are passed as two lists. The difference
B - A of the medians gets a percentile bootstrap interval (resampling each side's samples with
replacement); 'within noise' when the interval contains 0. Phases present on one side only are
reported as such (branches may record different phase sets).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .critical_path import critical_path

COLUMNS = ["kernel", "phase", "n_a", "n_b", "median_a_ns", "median_b_ns", "diff_ns", "diff_pct", "ci_low_ns",
           "ci_high_ns", "non_overlap_share", "verdict"]
CP_COLUMNS = ["kernel", "phase", "share_a", "share_b", "in_a", "in_b", "change"]
MIN_SAMPLES = 3        # fewer samples per side than this cannot support a bootstrap interval
ON_PATH_SHARE = 0.01   # a phase is "on the critical path" with at least 1% of the path time
# bootstrap matrices are (n_boot x n); above this many samples a side is thinned (evenly spaced
# order statistics keep the distribution) to bound memory
MAX_BOOT_SAMPLES = 4000


@dataclass
class Comparison:
    per_phase: pd.DataFrame
    end_to_end: pd.DataFrame
    critical_path_changes: pd.DataFrame
    verdict: str


def _events_list(x) -> list[pd.DataFrame]:
    if isinstance(x, pd.DataFrame):
        return [x]
    if hasattr(x, "events"):
        return [x.events]
    out = []
    for r in x:
        out.extend(_events_list(r))
    return out


def phase_samples(runs: list[pd.DataFrame]) -> pd.DataFrame:
    """[run, iteration, kernel, phase, value]: mean span duration per (run, iteration, kernel, phase)."""
    parts = []
    for i, ev in enumerate(runs):
        sp = ev[ev["kind"] == "span"]
        if sp.empty:
            continue
        d = pd.DataFrame({"iteration": sp["iteration"].to_numpy(), "kernel": sp["kernel"].astype(str).to_numpy(),
                          "phase": sp["phase"].astype(str).to_numpy(),
                          "value": (sp["end_ns"] - sp["begin_ns"]).to_numpy()})
        m = d.groupby(["iteration", "kernel", "phase"], sort=True)["value"].mean().reset_index()
        m.insert(0, "run", i)
        parts.append(m)
    if not parts:
        return pd.DataFrame({"run": [], "iteration": [], "kernel": [], "phase": [], "value": []})
    return pd.concat(parts, ignore_index=True)


def e2e_samples(runs: list[pd.DataFrame]) -> tuple[np.ndarray, np.ndarray]:
    """Iteration totals (first begin to last end) of every run, and the run of each."""
    out, lab = [], []
    for i, ev in enumerate(runs):
        if ev.empty:
            continue
        # as critical_path's iteration total: first begin (host included) to last GPU warp end
        gpu_end = ev["end_ns"].where(ev["block"].to_numpy() >= 0)
        g = ev.assign(gpu_end=gpu_end).groupby("iteration", sort=True).agg(
            b=("begin_ns", "min"), e=("end_ns", "max"), ge=("gpu_end", "max"))
        end = g["ge"].fillna(g["e"]).to_numpy()
        out.append(end - g["b"].to_numpy())
        lab.append(np.full(len(g), i))
    if not out:
        return np.zeros(0), np.zeros(0, int)
    return np.concatenate(out).astype(float), np.concatenate(lab)


def _thin(x: np.ndarray) -> np.ndarray:
    if len(x) <= MAX_BOOT_SAMPLES:
        return x
    return np.sort(x)[np.linspace(0, len(x) - 1, MAX_BOOT_SAMPLES).round().astype(int)]


def boot_medians(x: np.ndarray, runs: np.ndarray | None, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Bootstrap distribution of the median of x. With samples from two or more runs, a two-stage
    bootstrap: resample the runs, then the samples of the drawn runs, so run-to-run variation
    (warm-up, clocks, placement) widens the interval instead of passing for a real difference."""
    if runs is None or len(np.unique(runs)) < 2:
        t = _thin(x)
        return np.median(t[rng.integers(0, len(t), (n_boot, len(t)))], axis=1)
    groups = [_thin(x[runs == r]) for r in np.unique(runs)]
    m = len(groups)
    out = np.empty(n_boot)
    for i in range(n_boot):
        pool = np.concatenate([groups[j] for j in rng.integers(0, m, m)])
        out[i] = np.median(pool[rng.integers(0, len(pool), len(pool))])
    return out


def stats(a: np.ndarray, b: np.ndarray, *, n_boot: int, rng: np.random.Generator, alpha: float,
          runs_a: np.ndarray | None = None, runs_b: np.ndarray | None = None) -> dict:
    """Medians, bootstrap CI of median(b) - median(a), non-overlap share and the verdict.
    runs_a / runs_b: the run each sample came from (two-stage bootstrap across runs)."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    row = {"n_a": len(a), "n_b": len(b),
           "median_a_ns": float(np.median(a)) if len(a) else np.nan,
           "median_b_ns": float(np.median(b)) if len(b) else np.nan}
    if len(a) == 0 or len(b) == 0:
        row.update(diff_ns=np.nan, diff_pct=np.nan, ci_low_ns=np.nan, ci_high_ns=np.nan, non_overlap_share=np.nan,
                   verdict="only in B" if len(a) == 0 else "only in A")
        return row
    diff = row["median_b_ns"] - row["median_a_ns"]
    row["diff_ns"] = diff
    row["diff_pct"] = 100.0 * diff / row["median_a_ns"] if row["median_a_ns"] else np.nan
    # share of (a, b) pairs ordered like the medians; ties count half
    sa = np.sort(a)
    lt = np.searchsorted(sa, b, side="left").sum()       # pairs with a < b
    le = np.searchsorted(sa, b, side="right").sum()      # pairs with a <= b
    pairs = len(a) * len(b)
    p_b_greater = lt / pairs
    ties = (le - lt) / pairs
    row["non_overlap_share"] = (p_b_greater if diff >= 0 else 1.0 - p_b_greater - ties) + 0.5 * ties
    if min(len(a), len(b)) < MIN_SAMPLES:
        row.update(ci_low_ns=np.nan, ci_high_ns=np.nan, verdict="too few samples")
        return row
    ma = boot_medians(a, runs_a, n_boot, rng)
    mb = boot_medians(b, runs_b, n_boot, rng)
    lo, hi = np.quantile(mb - ma, [alpha / 2, 1 - alpha / 2])
    row["ci_low_ns"], row["ci_high_ns"] = float(lo), float(hi)
    row["verdict"] = "slower" if lo > 0 else "faster" if hi < 0 else "within noise"
    return row


def _path_shares(runs: list[pd.DataFrame], registry) -> pd.Series:
    parts, total = [], 0
    for ev in runs:
        cp = critical_path(ev, registry=registry)
        seg = cp.segments[cp.segments["phase"] != ""]
        parts.append(seg.groupby(["kernel", "phase"])["duration_ns"].sum())
        total += int(cp.total_ns["total_ns"].sum())
    if not parts or total == 0:
        return pd.Series(dtype=float)
    s = pd.concat(parts).groupby(level=[0, 1]).sum()
    return s / total


def compare(a, b, *, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05, registry=None) -> Comparison:
    """Per phase and end-to-end medians, bootstrap CI of B - A, verdicts (columns: package docstring).

    a, b: an event table, a run (anything with .events), or a list of those per side.
    """
    ra, rb = _events_list(a), _events_list(b)
    rng = np.random.default_rng(seed)
    sa, sb = phase_samples(ra), phase_samples(rb)
    keys = sorted(set(map(tuple, sa[["kernel", "phase"]].drop_duplicates().to_numpy()))
                  | set(map(tuple, sb[["kernel", "phase"]].drop_duplicates().to_numpy())))
    ga = {k: (v["value"].to_numpy(), v["run"].to_numpy()) for k, v in sa.groupby(["kernel", "phase"])} if len(sa) else {}
    gb = {k: (v["value"].to_numpy(), v["run"].to_numpy()) for k, v in sb.groupby(["kernel", "phase"])} if len(sb) else {}
    none = (np.zeros(0), np.zeros(0, int))
    rows = []
    for k in keys:
        (xa, la), (xb, lb) = ga.get(k, none), gb.get(k, none)
        r = stats(xa, xb, n_boot=n_boot, rng=rng, alpha=alpha, runs_a=la, runs_b=lb)
        rows.append({"kernel": k[0], "phase": k[1], **r})
    per_phase = pd.DataFrame(rows, columns=COLUMNS)
    (ea, la), (eb, lb) = e2e_samples(ra), e2e_samples(rb)
    e2e = pd.DataFrame([{"kernel": "", "phase": "end-to-end",
                         **stats(ea, eb, n_boot=n_boot, rng=rng, alpha=alpha, runs_a=la, runs_b=lb)}],
                       columns=COLUMNS)

    pa, pb = _path_shares(ra, registry), _path_shares(rb, registry)
    idx = pa.index.union(pb.index)
    cpc = pd.DataFrame({"share_a": pa.reindex(idx).fillna(0.0), "share_b": pb.reindex(idx).fillna(0.0)})
    cpc["in_a"] = cpc["share_a"] >= ON_PATH_SHARE
    cpc["in_b"] = cpc["share_b"] >= ON_PATH_SHARE
    cpc = cpc[cpc["in_a"] | cpc["in_b"]]
    cpc["change"] = np.where(cpc["in_a"] & cpc["in_b"], "stayed", np.where(cpc["in_b"], "entered", "left"))
    cpc = cpc.reset_index()
    cpc.columns = ["kernel", "phase"] + list(cpc.columns[2:])
    cpc = cpc[CP_COLUMNS].sort_values(["change", "kernel", "phase"], kind="stable").reset_index(drop=True)
    return Comparison(per_phase=per_phase, end_to_end=e2e, critical_path_changes=cpc,
                      verdict=_verdict(per_phase, e2e, cpc, alpha))


def _verdict(per_phase: pd.DataFrame, e2e: pd.DataFrame, cpc: pd.DataFrame, alpha: float) -> str:
    level = f"{100 * (1 - alpha):.0f}% CI"
    r = e2e.iloc[0]
    med = r["median_a_ns"]

    def pct(x):
        return f"{100 * x / med:+.1f}%" if med else f"{x:+.0f} ns"

    if r["verdict"] in ("slower", "faster"):
        head = (f"B is {abs(r['diff_pct']):.1f}% {r['verdict']} end-to-end "
                f"({level} {pct(r['ci_low_ns'])} to {pct(r['ci_high_ns'])})")
    elif r["verdict"] == "within noise":
        head = (f"end-to-end: within noise (B - A median {pct(r['diff_ns'])}, "
                f"{level} {pct(r['ci_low_ns'])} to {pct(r['ci_high_ns'])})")
    elif r["verdict"] == "too few samples":
        head = f"end-to-end: too few iterations to judge (B - A median {pct(r['diff_ns'])})"
    else:
        head = "end-to-end: no iterations on one side"
    parts = [head]
    for v in ("slower", "faster"):
        s = per_phase[per_phase["verdict"] == v].sort_values("diff_pct", key=abs, ascending=False)
        if len(s):
            parts.append(f"{v} in B: " + ", ".join(f"{k}/{p} ({d:+.1f}%)" for k, p, d in
                                                   s[["kernel", "phase", "diff_pct"]].head(5).itertuples(index=False)))
    for v in ("only in A", "only in B"):
        s = per_phase[per_phase["verdict"] == v]
        if len(s):
            parts.append(f"{v}: " + ", ".join(f"{k}/{p}" for k, p in s[["kernel", "phase"]].itertuples(index=False)))
    for v, word in (("entered", "entered the critical path"), ("left", "left the critical path")):
        s = cpc[cpc["change"] == v]
        if len(s):
            parts.append(f"{word}: " + ", ".join(f"{k}/{p}" for k, p in s[["kernel", "phase"]].itertuples(index=False)))
    return "; ".join(parts)
