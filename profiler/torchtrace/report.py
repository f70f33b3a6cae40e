"""The op inside the step, for `epscope report`, the stored summary and the pages: the run's
merged PyTorch traces (store.load_merged) and the time model (analysis.timemodel) -> blame.Blame,
its text section and its summary field. One computation (style rule 16): every reader calls
`run_blame`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..analysis.verdict import fmt_ns
from . import blame as B
from .store import FIELD, load_merged

SHOW_LATE = 10      # late-entry sentences a report prints (largest windows first)
SHOW_LEAD = 8       # lead-in sentences a report prints
MIN_LEAD_NS = 10_000   # a lead-in shorter than 10 µs is launch overhead, not worth a sentence


def run_blame(run, tm=None):
    """(MergedTrace, Blame) of a loaded run, or (None, None) when it has no PyTorch trace. tm: its
    TimeModel when computed already (else built from the run's events)."""
    merged = load_merged(run)
    if merged is None:
        return None, None
    if tm is None:
        from ..analysis import graph as G
        from ..analysis import unfinished
        from ..analysis.timemodel import time_model
        ev = unfinished.close(run.events, run.launches)
        tm = time_model(G.build(ev, run.manifest.get("registry"), run.launches))
    return merged, B.blame(tm.ops, tm.per_rank, merged)


def alignment_line(a) -> str:
    return (f"rank {a.rank}: {a.launches} launches joined ({a.unmatched} labels unmatched); Kineto time = run time "
            f"+ {a.offset_ns / 1e6:.6f} ms, drift {a.drift_ppm:+.2f} ppm, uncertainty ±{fmt_ns(a.width_ns / 2)} "
            f"(width {fmt_ns(a.width_ns)}; launches {a.binding_lo} and {a.binding_hi} bound it)")


def torch_lines(run, tm=None) -> list[str]:
    """The report's section (empty for a run without PyTorch traces)."""
    if not run.manifest.get(FIELD):
        return []
    merged, bl = run_blame(run, tm)
    lines = ["", "PyTorch profiler traces merged (the op inside the step; `epscope merge`)"]
    for r in sorted(merged.ranks):
        lines.append("  " + alignment_line(merged.ranks[r].alignment))
    for r, err in sorted(merged.errors.items()):
        lines.append(f"  rank {r}: not merged: {err}")
    c = bl.clauses
    late = c[c["scope"] == B.LATE].sort_values("window_ns", ascending=False)
    lead = c[(c["scope"] == B.LEAD) & (c["window_ns"] >= MIN_LEAD_NS)].sort_values("window_ns", ascending=False)
    if len(late):
        lines.append(f"  late entries ({len(late)}; the {min(len(late), SHOW_LATE)} longest):")
        lines += [f"    iteration {r.iteration}: {r.clause}" for r in late.head(SHOW_LATE).itertuples()]
    else:
        lines.append("  late entries: none on the merged ranks")
    if len(lead):
        lines.append(f"  lead-ins of {fmt_ns(MIN_LEAD_NS)} or more ({len(lead)}; the {min(len(lead), SHOW_LEAD)} longest):")
        lines += [f"    iteration {r.iteration}: {r.clause}" for r in lead.head(SHOW_LEAD).itertuples()]
    return lines


def torch_section(run, tm=None) -> str:
    return "\n".join(torch_lines(run, tm)).strip("\n")


def summary_field(run, tm) -> dict | None:
    """The stored summary's `op_before_entry` (analysis-summary.json): the alignment per rank and
    the largest late entry's and lead-in's named op; None for a run without PyTorch traces."""
    if not run.manifest.get(FIELD):
        return None
    merged, bl = run_blame(run, tm)

    def top(scope):
        r = _longest(bl, scope)
        if r is None:
            return None
        return {"rank": int(r["rank"]), "kernel": str(r["kernel"]), "iteration": int(r["iteration"]),
                "side": str(r["cause"]), "op": str(r["name"]), "window_ns": float(r["window_ns"]),
                "op_ns": float(r["top_ns"]), "stack": str(r["stack"]), "clause": str(r["clause"])}

    return {"ranks": {str(r): {"width_ns": t.alignment.width_ns, "launches": t.alignment.launches}
                      for r, t in merged.ranks.items()},
            "errors": {str(r): e for r, e in merged.errors.items()},
            "late_entry": top(B.LATE), "lead_in": top(B.LEAD)}


# -- the op before entry in the pages' verdicts (issue 30 item 4) -----------------------------
STEP_FACT = "the op before entry (PyTorch trace"
# the longest lead-in of the run (the "launch and queue" time before a kernel, on any rank), named
# on every page: on one rank there is no late entry, and this is the time before the op that the
# critical path's host and launch-and-queue shares count
LEAD_FACT = "the longest wait before a kernel (PyTorch trace"
_LATE_NOTES = ("borderline late entry", "late entry not tied")


def _longest(bl, scope: str, rank: int | None = None):
    """The clause row (blame.CLAUSE_COLUMNS) of the longest window of `scope` (blame.LATE /
    blame.LEAD), of `rank` when given; None when there is none. One choice for the pages, the
    report and the stored summary."""
    if bl is None:
        return None
    c = bl.clauses
    c = c[c["scope"] == scope]
    if rank is not None:
        c = c[c["rank"] == rank]
    if c.empty:
        return None
    return c.sort_values("window_ns", ascending=False, kind="stable").iloc[0]


def _longest_lead(bl):
    """The clause row of the run's longest lead-in, None without one of MIN_LEAD_NS or more (what
    the report lists: shorter is launch overhead)."""
    top = _longest(bl, B.LEAD)
    return None if top is None or float(top["window_ns"]) < MIN_LEAD_NS else top


def lead_in_fact(bl) -> str | None:
    """The sentence naming what held back the run's longest lead-in, or None without one."""
    top = _longest_lead(bl)
    return None if top is None else f"{LEAD_FACT}, iteration {int(top['iteration'])}): {top['clause']}"


def _longest_late(bl, rank: int | None):
    """The clause row of `rank`'s longest late-entry window, or None without a merged trace or a
    window of that rank."""
    return None if rank is None else _longest(bl, B.LATE, rank)


def _fact(top) -> str:
    return f"{STEP_FACT}, iteration {int(top['iteration'])}): {top['clause']}"


def late_entry_fact(bl, rank: int | None) -> str | None:
    """The sentence naming what `rank` ran before its longest late entry (blame.Blame's clause), or
    None without a merged trace or a window of that rank."""
    top = _longest_late(bl, rank)
    return None if top is None else _fact(top)


def with_step(v, bl, le):
    """The verdict with the op before the late rank's entry named where it states the late entry
    (a fact of a late-entry verdict, a note right after a late-entry note), and the run's longest
    lead-in named in a last note (lead_in_fact). One function for every page, `epscope report` and
    the stored summary (the same sentences everywhere)."""
    v = _with_late(v, bl, le)
    lead = lead_in_fact(bl)
    return v if lead is None else dataclasses.replace(v, notes=tuple(v.notes) + (lead,))


def _with_late(v, bl, le):
    fact = late_entry_fact(bl, None if le is None else le.rank)
    if fact is None:
        return v
    if v.late_entry is not None:
        return dataclasses.replace(v, facts=tuple(v.facts) + (fact,))
    notes = list(v.notes)
    at = next((i for i, n in enumerate(notes) if n.startswith(_LATE_NOTES)), None)
    if at is None:
        return v
    notes.insert(at + 1, fact)
    return dataclasses.replace(v, notes=tuple(notes))


def with_steps(run, tm, verdicts: dict, le) -> dict:
    """{page: verdict} with the op before entry named (with_step); unchanged for a run without
    PyTorch traces. tm: the run's TimeModel; le: its late_entry.LateEntry (or None)."""
    if not run.manifest.get(FIELD):
        return verdicts
    _, bl = run_blame(run, tm)
    return {page: with_step(v, bl, le) for page, v in verdicts.items()}


# -- Compare: the op before entry on each side (issue 30 item 4) -------------------------------
NONE_NAMED = "none named"


@dataclass(frozen=True)
class BeforeEntry:
    """What a run's late rank (late_entry.LateEntry.rank) ran before its longest late entry, or,
    in a run without one, what held back its longest lead-in, as every page states it: `sentence`
    is late_entry_fact's (lead_in_fact's), word for word; the other fields are that clause's (op:
    the op named, '' when none was recorded then; op_ns: its time then)."""
    run: str
    rank: int
    kernel: str
    iteration: int
    op: str
    op_ns: float
    sentence: str

    def phrase(self) -> str:
        """'aten::mm before dispatch on rank 1 (470 µs)': the op in a line that sets sides apart."""
        op = self.op or "no op recorded"
        return f"{op} before {self.kernel} on rank {self.rank} ({fmt_ns(self.op_ns)})"


def before_entry(name: str, bl, le) -> BeforeEntry | None:
    """The run's BeforeEntry from its Blame (run_blame) and late-entry decision: the late rank's
    longest late entry (late_entry_fact's sentence); without one (one rank, or no rank entered
    late) the run's longest lead-in (lead_in_fact's sentence, as every page states it); None
    without a merged trace or either window."""
    top = _longest_late(bl, None if le is None else le.rank)
    sentence = None if top is None else _fact(top)
    if top is None:
        top = _longest_lead(bl)
        sentence = lead_in_fact(bl)
    if top is None:
        return None
    return BeforeEntry(run=name, rank=int(top["rank"]), kernel=str(top["kernel"]), iteration=int(top["iteration"]),
                       op=str(top["name"]), op_ns=float(top["top_ns"]), sentence=sentence)


def _side_phrase(side: list) -> tuple[frozenset, str]:
    """(the side's (op, kernel, rank) set, its phrase): a run without a BeforeEntry is 'none named'."""
    keys = frozenset((b.op, b.kernel, b.rank) if b is not None else None for b in side)
    longest = {}
    for b in sorted((b for b in side if b is not None), key=lambda b: b.op_ns):
        longest[(b.op, b.kernel, b.rank)] = b          # the longest of each (op, kernel, rank) last
    parts = [longest[k].phrase() for k in sorted(longest, key=str)] + ([NONE_NAMED] if None in keys else [])
    return keys, ", ".join(parts)


def sides_differ(a: list, b: list) -> str | None:
    """One line when the two sides of a comparison are blamed on different ops before entry
    ("A: aten::mm before dispatch on rank 1 (470 µs); B: none named"), None when they name the same
    ops or neither names one. a, b: each run's BeforeEntry or None."""
    (ka, pa), (kb, pb) = _side_phrase(a), _side_phrase(b)
    if ka == kb or not (ka | kb) - {None}:
        return None
    return f"A: {pa}; B: {pb}"
