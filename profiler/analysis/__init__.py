"""Pure analyses of an epscope event table (profiler.store.schema): event table in, DataFrames out.

Nothing here plots (style.md rule 8); viewer/ draws what these functions return. Every function
takes the tidy event table of one run (`events`, schema in docs/design.md), the run's registries
(`registry=`: the manifest's `"registry"` dict {family: registry-json}, one registry-json dict, a
`profiler.registry.registry.Registry`, or a list of those) and, optionally, its launch table
(`launches=`: where a timed-out kernel stopped).

Phase semantics come from the registry only (profiler.analysis.semantics): a phase is a wait
(`wait = true`, released by its `waits_for` phase on the peer named by its payload), idle
(`idle = true`) or work; a barrier's scope is declared there. Phases and barriers no registry
declares count as work / scope grid, and every result carries a typed UndeclaredPhases warning
(`.warnings`). Unfinished waits (open spans, arrivals without departure: a timeout) end where their
kernel stopped recording (profiler.analysis.unfinished) and are marked `unfinished`.

Every report carries `.verdict`, a profiler.analysis.verdict.Verdict: the page's headline as
fields (alarm, cause, rank, peer, kernel, phase, direction, magnitude_ns, n, ...); its sentence is
`.verdict.headline` (one short sentence), its evidence `.facts`, further findings `.notes`, and
`.decisions` every decision (profiler.analysis.decision: a quantity per iteration, the interval of
its mean share, the band against a threshold) those lines state. The decisions every page shares
are computed once per run: the late entry (late_entry.py), the straggler (straggler.py). docs/glossary.md defines every term (profiler.analysis.glossary).
Time columns are int64 ns on the run timeline. All functions accept an empty table and return
empty frames with the documented columns.

critical_path(events, *, iteration=None, registry=None, launches=None) -> CriticalPath
    The longest dependency chain to the end of each iteration (profiler.analysis.graph: a warp's
    consecutive segments; barrier departure <- the occurrence's last arrival; wait end <- the
    latest matching release on the peer rank before it; kernel start <- its host call and the
    previous kernel on the rank; a host call that outlives its kernels ends after their last warp).
    The path covers the whole iteration: segments add up to its span (a rank's late entry into the
    op is a leading 'host' segment, 'launch' without host rows).
    .segments  DataFrame, ordered along the path (earliest first) per iteration:
        iteration, rank, kernel, launch (-1: host), block (-1: host or late entry), warp (-1 idem),
        role, phase (phase or barrier name; '' for gaps, launch and late entry),
        kind ('work' | 'wait' | 'barrier' | 'gap' | 'launch' | 'host'; glossary), begin_ns, end_ns,
        duration_ns, share (duration / the iteration's total_ns), peer (rank a wait or barrier
        segment waited on, -1 none), unfinished (bool: an unfinished wait)
    .slack     DataFrame, one row per (iteration, rank, launch, block, warp), host lanes included:
        iteration, rank, kernel, launch, block, warp, role, busy_ns (its 'work' segments),
        slack_ns (free float: min over its barrier arrivals of (occurrence last arrival - own
        arrival) and of (iteration end - own last end); 0 on the path), on_path (bool)
    .total_ns  DataFrame [iteration, begin_ns, end_ns, total_ns] (first record of the iteration,
               host included, to the last end of its GPU warps)
    .pacing_rank int: the rank with the most non-wait path time over iterations; -1 when empty
    .path_ns   DataFrame [iteration, rank, kind, duration_ns, share]: the path summed per rank
    .verdict   timeout (the stalled wait that began first) | a late entry (host_bound / rank_imbalance
               with late_entry = its side: profiler.analysis.late_entry) | the straggler
               (rank_imbalance: profiler.analysis.straggler) | host_bound with no rank (host time is
               the majority of the path) | none (profiler.analysis.path_verdict)

what_if(events, *, phase, speedup, rank=None, iteration=None, registry=None, launches=None) -> WhatIf
    Phase `phase` (name, or 'kernel/phase') on `rank` (int, list, or None = every rank) runs
    `speedup` faster (0.2 = 20% shorter; negative = slower); the graph is re-timed forward
    (profiler.analysis.retime) and the critical path recomputed.
    .summary   one row per iteration: iteration, before_ns, after_ns, change_ns (after - before),
        change_pct, local_saving_ns (per launch the largest time removed from one warp, summed over
        the rank's launches, the largest over ranks), absorbed_pct (100 * (1 - (-change) /
        local_saving); NaN when local_saving is 0), path_phase_ns (the phase's own time on the
        recorded path: a saving never exceeds it)
    .new_path  CriticalPath of the re-timed run (no verdict)
    .retimed   the event table (unfinished waits closed) with re-timed begin_ns / end_ns

idle_warps(events, *, registry=None, launches=None) -> IdleReport
    Busy = leaf time of a warp's work spans; a warp did no work below 1% of its kernel's busiest
    warp; kernel time = its launch's GPU time.
    .per_warp  per (rank, kernel, block, warp), summed over launches: rank, kernel, block, warp,
        role, launches, kernel_ns, busy_ns, wait_ns (waits, idle spans, barrier waits, unfinished
        included), idle_ns (kernel_ns - busy_ns), busy_share, did_work
    .per_block [rank, kernel, block, warps, working_warps, busy_ns, idle_ns, busy_share, did_work]
    .imbalance within a rank: [rank, kernel, role, warps, max_busy_ns, median_busy_ns, ratio]
    .ranks     across ranks (profiler.analysis.imbalance): [kernel, role, rank, warps, spans (work
        spans), busy_ns (summed over warps and launches), kernel_ns, waited_on_ns, busy_ratio
        (busy / the median rank's)]
    .phases    across ranks per work phase: [kernel, phase, rank, busy_ns, spans, busy_ratio]
    .waited    [iteration, kernel, rank, waited_on_ns]
    .verdict   timeout | rank_imbalance (the straggler decision: a rank busy >= 1.5x the other
               ranks' whose straggler cost is >= 5% of the op latency after entry over its whole
               interval; below, a note) | starved_warps | a late entry | none, the largest first
    .evidence  the rows the verdict names (warps of its rank and kernel, or the ranks of its kernel)

barrier_contention(events, *, registry=None, launches=None) -> BarrierReport
    .occurrences one row per occurrence: rank (-1 cross-rank), kernel, iteration, launch (-1
        cross-rank), block (-1 unless scope block), barrier, scope, occurrence, arrivals,
        useless_arrivals (from warps that brought no work: glossary 'useless'), unfinished (arrivals that never
        departed), first_arrive_ns, last_arrive_ns, spread_ns, lateness_ns (last arrival - the one
        before it, per rank at cross-rank barriers), depart_ns, total_wait_ns (sum over arrivals of
        own departure - own arrival: warp time), last_rank, last_block, last_warp
    .summary     per (rank, kernel, barrier): scope, occurrences, arrivals, useless_arrivals,
        useless_share, mean_spread_ns, max_spread_ns, total_wait_ns, last_rank, last_block,
        last_warp (most frequent last arriver), last_share
    .per_rank    cross-rank barriers per (kernel, barrier, rank): occurrences, times_last,
        last_share, mean_lateness_ns (own last arrival - the occurrence's first), total_wait_ns
    .verdict     timeout | barrier_straggler (rank, or warp within a rank, others wait on: lateness
                 summed per iteration) | useless_arrivals | none

chunked.analyze(events, *, registry=None, launches=None, max_events=chunked.MAX_EVENTS) -> chunked.Results
chunked.analyze_run(run, *, max_events=...) / chunked.analyze_chunks(chunks, ..., ranks=...)
    critical_path, idle_warps, barrier_contention and the time model of a run computed in chunks
    of whole iterations (each chunk's graph built, its small tables kept, the graph dropped), so
    memory is bounded by the largest chunk; results equal to the functions above on the whole
    table (.critical, .idle, .barriers, .time_model; .critical.graph is a chunked.Summaries:
    what_if over it is .what_if_summary). The viewer and `epscope analyze` use it above
    chunked.MAX_EVENTS events.

compare(a, b, *, n_boot=2000, seed=0, alpha=0.05, registry=None) -> Comparison
    a, b: an event table, a run (anything with .events, and .launches / .manifest), or a list per
    side. The run is the unit of replication (profiler.analysis.stats): one run a side calls
    nothing; several: hierarchical bootstrap over runs then iterations, and B differs only beyond
    the A-vs-A spread, every row at one level (stats.compare_family: Benjamini-Hochberg over the
    rows' p-values). Workloads are checked first: kind, ranks, kernels
    differ -> refused; shape or dtype differ -> flagged.
    .per_phase   rows per kernel (phase '': the slowest rank's GPU time in that kernel) and per
        (kernel, phase) (mean span duration; phase 'host call': the mean host call launching the
        kernel, when the runs record host rows): kernel, phase, runs_a, runs_b, n_a, n_b, median_a_ns,
        median_b_ns, diff_ns, diff_pct, ci_low_ns, ci_high_ns, noise_ns (A-vs-A spread),
        heavy_tail, verdict ('within noise' | 'faster' | 'slower' | 'noise unknown (one run per
        side)' | 'too few samples' | 'only in A' | 'only in B'; B against A)
    .end_to_end  one row, same columns: per iteration the slowest rank's GPU time (no host gaps)
    .per_rank    [rank, runs_a, runs_b, median_a_ns, median_b_ns, diff_ns, diff_pct, verdict]
    .critical_path_changes [kernel, phase, share_a, share_b, in_a, in_b, change]
    .samples     [side, run, iteration, kernel, phase, value_ns] (warm-up iterations set aside)
    .warmup      [side, run, name, iteration, value_ns, rest_median_ns, excess_pct]: each run's leading
        iterations more than compare.WARMUP_SHARE above the median of those after them, left out of
        every row (the verdict's notes say so)
    .refused, .flags  workload differences
    .verdict     same_code | knob_change (what moved, which direction) | none (refused, one run a side,
        underpowered); its headline one sentence, the evidence in its notes
"""
from .verdict import Verdict
from .critical_path import CriticalPath, critical_path
from .whatif import WhatIf, what_if
from .idle import IdleReport, idle_warps
from .barriers import BarrierReport, barrier_contention
from .compare import Comparison, compare

__all__ = [
    "Verdict",
    "CriticalPath", "critical_path",
    "WhatIf", "what_if",
    "IdleReport", "idle_warps",
    "BarrierReport", "barrier_contention",
    "Comparison", "compare",
]
