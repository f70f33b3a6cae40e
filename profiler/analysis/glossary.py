"""Definitions of every word the analyses and their pages use: one source for docs/glossary.md and
for the viewer's tooltips (a term's tooltip is its definition here, word for word).

docs/glossary.md is generated: `python -m profiler.analysis.glossary > docs/glossary.md`;
tests/analysis/test_glossary.py fails when it differs.
"""
from __future__ import annotations

import sys

# section -> {term: definition}; a term is what a page shows (a column header, a card, a kind)
SECTIONS: dict[str, dict[str, str]] = {
    "Verdicts": {
        "verdict": "The sentence a page leads with: what made the run slow, in the fields of profiler.groundtruth.expect "
                   "(cause, rank, peer, kernel, phase, direction) and the size of the effect. Tests check the "
                   "fields against recordings with a planted cause.",
        "alarm": "The page says 'act on this'. Every alarm but a timeout and starved warps is a decision: the "
                 "band of one measured interval against one threshold (see decision). A run with nothing planted "
                 "raises none: late entry that moves between ranks (host jitter before the op) is a finding "
                 "about the step, stated beside the kernel's verdict, never an alarm.",
        "decision": "One quantity measured per iteration (ns), divided by a reference per iteration (the "
                    "iteration's span, or the op latency after entry) into a share; the 80% Student t interval "
                    "of the mean share over the iterations; and the band of that interval against the "
                    "quantity's threshold (profiler.analysis.decision). Stated as: the mean per iteration, the "
                    "share, the interval, the threshold and the band. Every page, the report and the Runs page "
                    "state one decision with the same sentence and numbers.",
        "band": "alarm: the whole interval is at or past the threshold; borderline: it straddles the threshold; "
                "none: it is wholly below. Two runs whose intervals overlap cannot get alarm and none; with one "
                "iteration the interval is unbounded (never an alarm).",
        "borderline": "A decision whose interval straddles its threshold: no alarm; the page states the share "
                      "and its interval as a note, so repeated runs of one config do not flip between alarm and "
                      "silence.",
        "late-entry wait": "Per iteration, what the other ranks waited for rank r to enter the op (per op "
                           "occurrence in which r entered last, the longest-waiting rank's waits before r's "
                           "entry; summed over the iteration). Stated beside the decision, no threshold of its "
                           "own.",
        "net late-entry wait": "Per iteration, rank r's late-entry wait minus what r itself waited for the "
                               "others to enter. The late-entry decision: the rank with the largest mean, against "
                               "25% of the iteration. Ranks that take turns being late have a net near zero; a "
                               "rank late by construction (a host delay, an upstream GEMM) waits for nobody.",
        "late-entry wait (all ranks)": "Per iteration, every rank's late-entry wait together: the step's late "
                                       "entry, stated as a finding (from 5% of the iteration, or when its interval "
                                       "reaches 25%) when no one rank is late by construction.",
        "late rank per iteration": "In each iteration, the rank the others waited for most before it entered; "
                                   "'rank 1 in 5 of 6 iterations'. When it changes between iterations the "
                                   "lateness is not tied to one rank.",
        "net held after entry": "Per iteration, what the other ranks were held waiting on rank r once every rank "
                                "had entered the op occurrence (waits on r cut at the last rank's entry; per "
                                "waiting launch its longest-waiting warp), minus what r was held on them.",
        "straggler cost": "Per iteration, what a straggler costs the op: the largest of its net held after entry, "
                          "its busiest warps' busy excess over the median rank's, and what balancing would save "
                          "each of its warps of the role. The straggler decision: against 5% of the op latency "
                          "after entry (half the 10% the catalogue counts as a knob's effect), for a rank whose "
                          "role is busy 1.5x the other ranks' or more.",
        "host time on the path": "Per iteration, the critical path's host segments (host calls and the host "
                                 "between them). The host-bound decision with no rank named: against 50% of the "
                                 "iteration (the GPUs wait for their hosts more than they work).",
        "barrier lateness after entry": "Per iteration, at the occurrences where one rank (cross-rank barrier) or "
                                        "warp (block, grid) arrived last: its arrival minus the later of the "
                                        "arrival before it and, at a cross-rank barrier, the last rank's entry into "
                                        "the op (what came before that is the late entry's). The barrier-straggler "
                                        "decision: against 25% of the iteration.",
        "useless wait": "Per iteration, the median over a barrier's occurrences of the median wait of its useless "
                        "arrivals. The useless-arrivals decision: against 5% of the op latency after entry, for a "
                        "barrier whose useless arrivals are 5% of its arrivals or more.",
        "op's latency": "The op latency after entry, per iteration (profiler.analysis.timemodel): what the op "
                        "took once every rank was in it, so neither host gaps between launches nor a rank's wait "
                        "for a late peer count; a verdict states its mean over iterations.",
        "entry skew": "Per op occurrence (the k-th launch of a kernel in an iteration, across ranks): from the "
                      "first rank's first warp to the last rank's first warp, with the late rank named and the "
                      "side its lateness came from (host: its host had not yet launched the kernel; gpu: the "
                      "kernel was queued behind earlier GPU work, recorded or not). Wall time.",
        "op latency after entry": "Per op occurrence: from the last rank's first warp to the last warp end of "
                                  "any rank: the op's own time, which a kernel change can move and a late peer "
                                  "cannot; summed over an iteration's occurrences (undefined when a rank never "
                                  "launched an occurrence: that rank is missing). Wall time, not summed over "
                                  "warps.",
        "late entry": "A rank entered an op after the others, who waited for it before it launched. One "
                      "decision shared by every page (profiler.analysis.late_entry), on the net late-entry wait; "
                      "a rank that never launched an occurrence the others did is missing from it (side 'never "
                      "launched').",
        "power": "The smallest change a comparison could have detected at its level with 80% probability, "
                 "given the run-to-run spread (its minimum detectable effect). When it is larger than 10% of A's "
                 "median, a row within noise reads 'cannot tell' with the runs a side it would need.",
        "cannot tell": "Within noise, but the comparison could not have seen a 10% change with the runs it "
                       "has (see power); the verdict says about how many runs a side would.",
        "cause": "What made the run slow: none, timeout, rank_imbalance, host_bound, starved_warps, "
                 "barrier_straggler, useless_arrivals; on Compare same_code (within noise) or knob_change (a "
                 "real difference).",
        "none": "Nothing stands out beyond run-to-run jitter; the verdict says how large the largest effect was.",
        "timeout": "A wait never ended: the kernel gave up at its timeout (or aborted): certain, not a decision "
                   "on an interval. The verdict names the stalled wait that began first (rank, the peer it waited "
                   "on, kernel/phase, how long); the others followed from it.",
        "rank_imbalance": "One rank (the straggler) carries more work than the others: a role of it is busy "
                          "1.5x the other ranks' or more (rows received, chunks sent); decided on its straggler "
                          "cost (see straggler cost). Also the cause of a late entry on the GPU side.",
        "host_bound": "A rank's host was late: it entered the op after the others, who waited for it (the "
                      "late-entry decision, host side); or, with no rank named, every rank's host: host time on "
                      "the path is the majority of each iteration (see host time on the path).",
        "starved_warps": "Warps or blocks did no work in a kernel in which other warps did (too few tokens, a "
                         "per-block split): a count over the run, not an interval (a warp either brought work or "
                         "not), an alarm whenever there is one.",
        "barrier_straggler": "One rank (cross-rank barriers) or one warp (block and grid barriers) arrives last "
                             "and the others wait on it: decided on its barrier lateness after entry; a late "
                             "entry at a cross-rank barrier is named as such.",
        "useless_arrivals": "Warps arrive at a barrier bringing no work (see useless): they only came to be "
                            "released, and start their next work that much later; decided on the useless wait.",
        "same_code": "Compare: no kernel or phase of B differs from A beyond run-to-run noise.",
        "knob_change": "Compare: B differs from A beyond run-to-run noise; the verdict names what moved and in "
                       "which direction.",
        "mean over n iterations": "A per-iteration value's mean; n says how many iterations it is over. "
                                  "A decision's interval is its mean's.",
    },
    "Critical path": {
        "critical path": "The chain of dependencies that ends each iteration: walking back from the last GPU "
                         "warp to finish, through the waits that were released by someone (a peer's publish, a "
                         "barrier's last arrival, the kernel before, the host call). Its segments add up to the "
                         "iteration.",
        "iteration": "From the first record of the iteration (host rows included) to the last end of its GPU "
                     "warps.",
        "segment": "A stretch of the critical path on one warp (or a rank's host) with one kind.",
        "work": "Segment kind: the warp's own time in a work span (leaf time: nested spans count once).",
        "wait": "Segment kind: time in a wait span (the registry says which phases are waits) or an idle span "
                "that nothing released sooner: the release latency, or the whole wait when unexplained or "
                "unfinished.",
        "barrier": "Segment kind: time in a barrier wait (own arrival to own departure) after the last arrival.",
        "gap": "Segment kind: time on a warp covered by no span (between two recorded phases).",
        "launch": "Segment kind: from kernel-ready (the host call began, or the previous kernel ended) to the "
                  "kernel's first warp record: host code inside the call before the launch, plus launch "
                  "latency. At the start of an iteration of a rank without host rows: its first kernel started "
                  "after the iteration began.",
        "host": "Segment kind: host time: a host call (span of kind host), the host between two calls, or a "
                "rank's late entry into the op (from the iteration's begin to its first host record). "
                "Attributed to that rank.",
        "peer": "For a wait or barrier segment: the rank it waited on (the releaser, or for an unfinished "
                "barrier wait the rank that never arrived); -1 when none or its own rank.",
        "unfinished": "A wait the kernel never ended (no END / no departure recorded): it ends where the kernel "
                      "stopped recording (its GPU end in the launch table, i.e. the timeout) and counts as "
                      "waiting.",
        "share": "Duration / the iteration's span.",
        "pacing rank": "The rank holding the most non-waiting (work, gap, launch, host) time on the critical "
                       "path, summed over iterations. It is not an alarm by itself: the verdict says whether "
                       "the others wait on it.",
        "path spent waiting": "Share of the critical path in wait and barrier segments.",
        "warps on the path": "Warps with at least one critical-path segment.",
        "held": "At a rendezvous, how long the waiting rank sat idle for the releaser (cross-rank barrier: the "
                "last arrival minus the arrival before it; data wait on the path: release minus the wait's "
                "begin).",
        "slack": "How much later a warp could have finished what others depend on without delaying anyone: "
                 "min over its barrier arrivals of (the occurrence's last arrival - its arrival) and of "
                 "(iteration end - its last record); 0 on the path.",
        "busy": "Time in the warp's work segments (leaf time), summed as the column says.",
        "what-if": "The same dependency graph re-timed with one phase shortened: each point moves to the later "
                   "of its own previous point plus its (new) segment time and its dependency's new time plus the "
                   "recorded latency.",
        "local saving": "How much sooner the chosen rank would finish on its own: per launch the largest time "
                        "removed from one warp, summed over the rank's launches, the largest over ranks.",
        "absorbed": "Share of the local saving that waits and rendezvous swallow: 100% - end-to-end saving / "
                    "local saving.",
        "phase time on path": "The phase's own time on the recorded critical path of the iteration: what-if "
                              "never projects a larger saving.",
    },
    "Idle warps": {
        "kernel time": "A launch's GPU time (first warp record to last), summed over the launches the row "
                       "covers.",
        "busy share": "busy / kernel time.",
        "did work": "Busy at least 1% of the busiest warp of the same kernel (any rank); below that a warp only "
                    "waited, idled or met barriers. A warp that recorded nothing at all (its launch's profile "
                    "buffer has a region for it: the launch table's regions) did no work either.",
        "waiting": "Time in wait spans, idle spans and barrier waits (unfinished ones included), summed over "
                   "the warp's launches.",
        "idle": "kernel time - busy.",
        "working": "Warps of the block that did work.",
        "max busy / median busy": "Within one rank and role: the busiest warp's busy time over the median "
                                  "warp's.",
        "busy (role, all warps)": "The role's busy time summed over its warps and launches on that rank.",
        "work spans": "How many work spans the role recorded (chunks copied, rows sent): the units it worked "
                      "through.",
        "busy ratio": "The rank's busy time over the other ranks' (the median of the others; with 2 ranks, the "
                      "other one), for the same kernel and role (a rank that ran the kernel without that role "
                      "counts 0; inf: the others did none of it). 1.5 or more is extra work.",
        "waited on": "How long the other ranks were held waiting on this rank, before and after its entry: per "
                     "waiting launch, its longest-waiting warp's wait on the rank, summed over launches and "
                     "iterations (a total, not a decision's quantity: see net held after entry and late-entry "
                     "wait).",
        "-1 (rank, block, warp)": "-1 means 'not one': rank -1 is a cross-rank barrier (all ranks), block and "
                                  "warp -1 are host rows or a launch-level segment, launch -1 a host lane.",
    },
    "Barriers": {
        "occurrence": "One meeting at a barrier: its arrivals with the same occurrence number in one scope "
                      "(block, grid = one launch, rank = every rank).",
        "scope": "Who meets at the barrier, from the registry: block, grid (the launch on one rank) or rank "
                 "(every rank).",
        "arrivals": "Warps that arrived, summed over occurrences.",
        "useless": "Arrivals from warps that brought no work: no work since the warp last synchronised "
                   "(its previous barrier departure, or its first record) while another arrival of the same "
                   "occurrence did, or no work in the whole launch.",
        "spread": "Last arrival - first arrival of an occurrence.",
        "lateness": "Last arrival - the arrival before it (per rank at cross-rank barriers): how long the "
                    "others waited on the last arriver.",
        "wait (sum over warps)": "Each arriving warp's own departure - own arrival, summed over the warps (and "
                                 "occurrences) of the row: warp time, not wall time; it exceeds the iteration "
                                 "when many warps wait at once.",
        "last arriver": "The rank / block / warp whose arrival came last; in the summary the most frequent one.",
        "last share": "Share of the occurrences in which that arriver came last.",
        "times last": "Occurrences in which this rank arrived last.",
        "mean lateness": "Mean of the rank's last arrival - the occurrence's first arrival.",
    },
    "Compare": {
        "end-to-end": "The op latency after entry per iteration (every kernel's occurrences summed): host gaps "
                      "and a wait for a late rank do not count; a late entry is the entry skew rows'.",
        "kernel time (compare)": "Per iteration, the kernel's op latency after entry (its occurrences summed).",
        "entry skew (compare)": "Per iteration, the kernel's entry skew (its occurrences summed): how late the "
                                "last rank entered it.",
        "MDE": "Minimum detectable effect: the smallest |B - A| this row could have called at its level with "
               "80% power under the rule that decides (see within noise): the noncentral t of the t-test on run "
               "medians, with the bootstrap interval's half-width as a floor below which the bootstrap does not "
               "call; checked by simulation (tests/analysis/test_stats.py).",
        "runs needed": "Runs a side for an MDE of 10% of A's median (blank: enough already; 'more than 100' when "
                       "no count up to 100 would do).",
        "warm-up": "A run's leading iterations whose op latency after entry is more than 5% above the median of "
                   "the iterations after it (at most half the run, at least 2 kept): set aside from every row "
                   "of the comparison, and listed. Bundled runs' warm-up iterations are 5-28% slower; later "
                   "iterations stay within 3% of their run's median, bar single outliers mid-run.",
        "run": "One recording; the unit of replication. With one run on a side run-to-run noise cannot be "
               "estimated and nothing is called faster or slower.",
        "runs": "Runs on the side.",
        "n": "Samples on the side: one per (run, iteration).",
        "median": "Median of the side's samples, all runs pooled.",
        "B − A": "median(B) - median(A); as a percentage of median(A) only where median(A) is at least 1% of "
                 "the op's latency (end-to-end): a percentage of a near-zero base reads huge while the op "
                 "hardly moves, so the change is stated in time.",
        "CI": "95% bootstrap interval of B - A: resample runs, then each drawn run's iterations (fixed seed).",
        "A-vs-A spread": "How far apart the medians of two groups of runs of the same code fall: the t quantile "
                         "at the comparison's level (see level) times the pooled standard deviation of the "
                         "per-run medians times sqrt(1/runs A + 1/runs B). A difference below it is noise.",
        "level": "Every row of a comparison is decided at one level, found by Benjamini-Hochberg over the "
                 "rows' p-values (each the larger of the t-test's on run medians and the bootstrap's): k x "
                 "5% / rows for the largest k whose k-th smallest p-value is below it, else 5% / rows. Runs "
                 "of the same code then call any row with probability <= 5%; a knob that moves many rows "
                 "lets a moderate change through that 5% / rows would hide.",
        "within noise": "The interval at the comparison's level contains 0, or |B - A| is below the A-vs-A "
                        "spread. A row is called faster or slower only when both tests reject (the bootstrap "
                        "keeps rows of a few noisy iterations a run quiet that the t-test alone would call).",
        "host call (compare)": "Per kernel, the mean duration of the host calls that launched it in the "
                               "iteration (runs that record host rows): what a host-side knob moves while "
                               "kernel time stays.",
        "heavy tail": "On a side, mean and median differ by more than 10% of the median: a few slow outliers; "
                      "read medians.",
        "refused": "The runs record different workloads (kind, number of ranks, kernels): their numbers "
                   "compare different things.",
        "flagged": "The runs differ in shape or dtype (tokens, hidden, top-k, experts, dtype): compared, but the "
                   "difference may be that.",
        "path share": "A phase's time on the critical path over the path's total, all runs of the side.",
    },
    "Timeline": {
        "window (timeline)": "The time range drawn. Its axis reads time since the window's start, in one unit "
                             "chosen by the window's width; the line above it says where the window starts, "
                             "counted from the run's first record (a position 25 s into a run says nothing by "
                             "itself). Hovers give positions in µs into the run.",
        "unfinished span": "Drawn hatched: a wait the kernel never ended, up to where the kernel stopped "
                           "recording.",
        "busy (timeline)": "Zoomed out, a cell's shade: the share of the row's warps busy in the cell "
                           "(exclusive time: a parent span only where its children leave time).",
    },
}

TERMS: dict[str, str] = {t: d for sec in SECTIONS.values() for t, d in sec.items()}


def tip(term: str) -> str:
    """The definition of `term` (KeyError naming it when the glossary lacks it: tests catch that)."""
    try:
        return TERMS[term]
    except KeyError:
        raise KeyError(f"glossary has no term {term!r}: add it to profiler/analysis/glossary.py") from None


def markdown() -> str:
    out = ["# Glossary", "",
           "Every word the analyses and the viewer's pages use. The viewer shows these definitions as "
           "tooltips. Generated from `profiler/analysis/glossary.py` "
           "(`python -m profiler.analysis.glossary > docs/glossary.md`); edit that file, not this one.", ""]
    for sec, terms in SECTIONS.items():
        out += [f"## {sec}", ""]
        out += [f"- **{t}**: {d}" for t, d in terms.items()]
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    sys.stdout.write(markdown())
