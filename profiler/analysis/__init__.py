"""Pure analyses of an epscope event table (profiler.schema): event table in, DataFrames out.

Nothing here plots (style.md rule 8); viewer/ draws what these functions return. Every function
takes the tidy event table of one run (`events`, schema in docs/design.md) and, where phase
semantics matter, the run's registries (`registry=`: the manifest's `"registry"` dict
{family: registry-json}, one registry-json dict, a `profiler.registry.Registry`, or a list of
those). Without a registry the analyses fall back to name conventions: phases named `wait_*` are
waits, `wait_data` is released by `publish_tail` and `wait_space` by `publish_head` (any other
`wait_*` by any `publish_*` instant), phases named `idle*` are idle, and a barrier is cross-rank
when its name starts with `rank`, per block when it starts with `block`, per grid otherwise.

Time columns are int64 ns on the run timeline. All functions accept an empty table and return
empty frames with the documented columns.

critical_path(events, *, iteration=None, registry=None) -> CriticalPath
    The longest dependency chain to the end of each iteration (see profiler.analysis.graph for
    the dependency graph: consecutive segments of a warp; barrier departure <- the occurrence's
    last arrival; wait end <- the latest matching release on the peer rank that precedes it;
    kernel start <- its host span (the span's end when it ended before the kernel started, else
    its begin) and the previous kernel on the same rank; a host span that outlives its kernels
    ends after their last warp).
    .segments  DataFrame, ordered along the path (earliest first) per iteration:
        iteration (int), rank (int), kernel (str), launch (int), block (int, -1 host),
        warp (int, -1 host), role (str), phase (str: phase or barrier name; '' for gaps),
        kind (str: 'work'   a non-wait span's own time,
                    'wait'   part of a wait span (the release latency or an unexplained wait),
                    'barrier' part of a barrier wait (arrive..depart),
                    'gap'    time on a warp covered by no span,
                    'launch' from kernel-ready (host enqueue / previous kernel end) to warp start,
                    'host'   a host span),
        begin_ns, end_ns, duration_ns (int), share (float: duration / the iteration's total_ns)
    .slack     DataFrame, one row per (iteration, rank, launch, block, warp), host lanes included:
        iteration, rank, kernel, launch, block, warp, role,
        busy_ns   (time in 'work' segments of the warp),
        slack_ns  (free float: how much later the warp could have finished each thing others
                   depend on without delaying anyone = min over its barrier arrivals of
                   (occurrence last arrival - own arrival) and of (iteration end - own last end);
                   0 for warps on the path),
        on_path   (bool: some path segment lies on this warp)
    .total_ns  DataFrame [iteration, begin_ns, end_ns, total_ns] (iteration span: first begin
               of its events, host spans included, to the last end of its GPU warps; a host
               call that synchronises outlives its kernels and does not extend the iteration)
    .pacing_rank int: the rank with the most non-wait ('work', 'gap', 'launch', 'host') path
               time summed over iterations; -1 for an empty table
    .path_ns   DataFrame [iteration, rank, kind, duration_ns, share]: the path summed per rank

what_if(events, *, phase, speedup, rank=None, iteration=None, registry=None) -> WhatIf
    Phase `phase` (name, or 'kernel/phase') on `rank` (int, list of ints, or None = every rank)
    runs `speedup` faster (fraction: 0.2 = its durations shrink by 20%; negative = slower).
    The graph is re-timed forward (every segment starts at max(own previous end, its cross
    dependency's new time + the recorded latency), keeping its duration; waits shrink to what
    the new release allows) and the critical path recomputed.
    .summary   DataFrame, one row per iteration: iteration,
        before_ns, after_ns (iteration total before / after), change_ns (after - before),
        change_pct (100 * change / before), local_saving_ns (how much sooner the chosen rank would
        finish on its own: per launch the largest duration removed from one warp's spans of the
        phase, summed over the rank's launches, the largest over ranks; negative for a slowdown),
        absorbed_pct (100 * (1 - (-change_ns) / local_saving_ns): the share of the local
        saving that rendezvous and waits swallowed; NaN when local_saving_ns is 0)
    .new_path  CriticalPath of the re-timed run
    .retimed   the event table with re-timed begin_ns / end_ns (same rows and columns)
    iteration=: only those iterations are sped up, re-timed and reported (others keep their times)

idle_warps(events, *, registry=None) -> IdleReport
    Busy = time in a warp's non-wait, non-idle spans (leaf time: nested children counted once);
    the kernel time of a warp = its launch's GPU time (first warp begin to last warp end).
    .per_warp  DataFrame, one row per (rank, kernel, block, warp) summed over launches:
        rank, kernel, block, warp, role, launches (int), kernel_ns (sum of launch GPU times),
        busy_ns, wait_ns (time in wait spans and barrier waits), idle_ns (kernel_ns - busy_ns),
        busy_share (busy_ns / kernel_ns), did_work (bool: busy_share >= idle.NO_WORK_SHARE, 1%)
    .per_block DataFrame [rank, kernel, block, warps, working_warps, busy_ns, idle_ns,
        busy_share (block busy / (warps * kernel_ns)), did_work (any warp did work)]
    .imbalance DataFrame [rank, kernel, role, warps, max_busy_ns, median_busy_ns,
        ratio (max / median; inf when the median is 0 and max > 0, NaN when both are 0)]
    .verdict   str naming concrete ranks/blocks/warps with compressed ranges, e.g.
        "rank 1 dispatch: blocks 16–127 did no work; 16 warps carried all work"
    .evidence  DataFrame: the per_warp rows of the (rank, kernel) pairs the verdict names

barrier_contention(events, *, registry=None) -> BarrierReport
    .occurrences DataFrame, one row per barrier occurrence:
        rank (-1 for cross-rank barriers), kernel, iteration, launch (-1 for cross-rank),
        block (-1 unless scope 'block'), barrier, scope ('block' | 'grid' | 'rank'),
        occurrence (the payload), arrivals (int), useless_arrivals (arrivals from warps with no
        busy time since their previous barrier departure or their start), first_arrive_ns,
        last_arrive_ns, spread_ns (last - first), depart_ns (last departure),
        total_wait_ns (sum over arrivals of own departure - own arrival),
        last_rank, last_block, last_warp (the last arriver)
    .summary     DataFrame, one row per (rank, kernel, barrier) (rank -1 for cross-rank barriers):
        rank, kernel, barrier, scope, occurrences,
        arrivals (sum), useless_arrivals (sum), useless_share, mean_spread_ns, max_spread_ns,
        total_wait_ns, last_rank, last_block, last_warp (the most frequent last arriver),
        last_share (share of occurrences it arrived last)
    .per_rank    DataFrame for scope 'rank' barriers, one row per (kernel, barrier, rank):
        kernel, barrier, rank, occurrences, times_last (occurrences where this rank arrived
        last), last_share, mean_lateness_ns (mean of the rank's last arrival - occurrence's
        first arrival), total_wait_ns (the rank's warps' waits)

compare(a, b, *, n_boot=2000, seed=0, alpha=0.05, registry=None) -> Comparison
    a, b: one event table or a list of them (runs of side A / side B; interleaved A/B runs are
    simply passed as two lists). Samples: one per (run, iteration): for a phase, the mean
    duration of its spans in that iteration (instants and barriers excluded); end-to-end, the
    iteration's total (first begin to last GPU warp end, as critical_path's). Differences are
    B - A. With several runs on a side the bootstrap resamples runs, then their samples.
    .per_phase DataFrame [kernel, phase, n_a, n_b, median_a_ns, median_b_ns, diff_ns,
        diff_pct (100 * diff / median_a), ci_low_ns, ci_high_ns (bootstrap percentile CI of the
        difference of medians at level 1 - alpha), non_overlap_share (share of (a, b) sample
        pairs ordered the same way as the medians: P(b > a) when B is slower, P(b < a) when
        faster; ties count half), verdict ('within noise' | 'faster' | 'slower' | 'only in A'
        | 'only in B'; 'faster'/'slower' describe B against A)]
    .end_to_end one row, same columns (kernel = '', phase = 'end-to-end')
    .critical_path_changes DataFrame [kernel, phase, share_a, share_b, in_a, in_b,
        change ('entered' | 'left' | 'stayed')]: phases on the critical path (share of path
        time >= 1%) of A and of B
    .verdict   str, e.g. "B is 12.0% slower end-to-end (95% CI +9.1% to +15.2%); slower:
        dispatch/copy_out (+20.1%)"
"""
from .critical_path import CriticalPath, critical_path
from .whatif import WhatIf, what_if
from .idle import IdleReport, idle_warps
from .barriers import BarrierReport, barrier_contention
from .compare import Comparison, compare

__all__ = [
    "CriticalPath", "critical_path",
    "WhatIf", "what_if",
    "IdleReport", "idle_warps",
    "BarrierReport", "barrier_contention",
    "Comparison", "compare",
]
