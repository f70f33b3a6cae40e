"""README.md and traces/README.md are true to the numbers (issue 34: the README quoted 37-43 cycles a
record, cold pages of 85-155 s, "7 s" analyses and "21 passed, 1 skipped" long after the files
that held them had been replaced).

How a README quotes a figure (benchmarks/results/README.md, "Quoting a figure", says the same):

* A figure is a number with a unit of measure (time, rate, size, cycles, %, a ratio with × or x,
  a test count: "passed", "skipped") or the value after "measured NAME =". Numbers that share one
  unit ("29.5 / 30.3 µs", "2.1-2.5 s") are one figure. In a table under a paragraph that names a
  results file, every number of a row after its first cell is a figure (the unit sits in the
  header), and a ratio written right after the two numbers it divides, "a / b (r×)", is b / a.
* The block that quotes it (a paragraph, one list item, a table with the paragraph before it, a
  comment of a command line) names its source: a file of benchmarks/results/ (its name or path, in
  backticks, a link or a path), a code or data file of the repository by path (where a setting is
  set), or bundled runs by name (`ep-host-late`, `ll-host-a0..2`: their manifest.json). Prose that
  quotes figures itself (benchmarks/NOTES.md, docs/, the READMEs) is no source.
* Every number of the figure appears in one of its block's sources, as written or rounded as the
  README rounds it (222 for 222.4; 80 % for 0.80).
* A results file a README names is the current one of its kind: the index
  (benchmarks/results/README.md) lists it in a "file (current)" cell, and a file name is never a
  glob (name the file).

A block without a figure needs no source, so sections that quote none are free of all this.
"""
from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
TRACES = REPO / "traces"
READMES = ("README.md", "traces/README.md")
# files that quote figures themselves: a figure found there proves nothing
NOT_SOURCES = ("benchmarks/NOTES.md", "README.md", "traces/README.md", "docs/")

_NUM = r"\d[\d,]*(?:\.\d+)?"
_UNIT = (r"(?:M records/s|M slices/s|M/s|GB/s|MB/s|GiB|MiB|GB|MB|KB|ns|µs|us|ms|min|s|cycles|%|passed|skipped|failed"
         r"|fraction|[x×](?!\s*\d))")
# one number, or several sharing the unit: "29.5 / 30.3 µs", "2.1–2.5 s", "1.004-1.010×"
FIGURE = re.compile(rf"(?<![\w.])({_NUM}(?:\s*(?:/|–|-|to)\s*{_NUM})*)\s?({_UNIT})(?![\w/])")
MEASURED = re.compile(rf"measured [\w.]+ = (-?{_NUM})")
CODE_SPAN = re.compile(r"`([^`]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
PATH = re.compile(r"(?<![\w/])((?:benchmarks|profiler|ep_core|viewer|tests|docs)/[\w./*{},-]+)")
RUN_RANGE = re.compile(r"^([\w-]*?)(\d+)\.\.(\d+)$")
RATIO = re.compile(rf"({_NUM}) / ({_NUM}) \(({_NUM})[×x]\)")


@dataclass
class Block:
    readme: str
    line: int
    text: str
    table: bool = False
    sources: list[str] = field(default_factory=list)


def blocks(readme: str) -> list[Block]:
    """Paragraphs, list items, tables (with the sources of the paragraph just before them) and the
    comments of command lines."""
    out: list[Block] = []
    cur: Block | None = None    # the block the line before belongs to
    last: Block | None = None   # the block of the last line that was not blank
    fence = False
    for i, raw in enumerate((REPO / readme).read_text().splitlines(), 1):
        line = raw.rstrip()
        if line.startswith("```"):
            fence, cur, last = not fence, None, None
        elif fence:   # a command's comment is prose (its figures count); the command is not
            if "#" in line:
                out.append(Block(readme, i, line.split("#", 1)[1]))
        elif not line:
            cur = None
        elif line.startswith(("#", "<!--")):
            cur = last = None
        else:
            table = line.startswith("|")
            item = line.startswith("- ") or re.match(r"\d+\. ", line)
            if cur is not None and cur.table == table and not item:
                cur.text += ("\n" if table else " ") + line
            else:
                above = [s for s in cited(last.text) if s.startswith("benchmarks/results/")] \
                    if table and last is not None and not last.table else []
                cur = Block(readme, i, line, table=table, sources=above)
                out.append(cur)
            last = cur
    return out


@lru_cache(maxsize=None)
def run_dirs() -> dict[str, Path]:
    return {p.parent.name: p.parent for p in TRACES.rglob("manifest.json")}


def _expand_runs(name: str) -> list[str]:
    m = RUN_RANGE.match(name)
    return [f"{m.group(1)}{k}" for k in range(int(m.group(2)), int(m.group(3)) + 1)] if m else [name]


def cited(text: str) -> list[str]:
    """What a block names as sources: paths relative to the repository (results files, other files,
    directories) and bundled runs' manifests."""
    found = []
    for token in [*CODE_SPAN.findall(text), *LINK.findall(text), *PATH.findall(text)]:
        token = token.strip().rstrip(".,;:)")
        for cand in (token, f"benchmarks/results/{token}"):
            if any(ch in cand for ch in "*{") and cand.startswith("benchmarks/results/"):
                found.append(cand)   # a glob: refused below when the block quotes a figure
                break
            if (REPO / cand).exists():
                found.append(cand.rstrip("/"))
                break
        else:
            runs = _expand_runs(token)
            if all(r in run_dirs() for r in runs):
                found += [str(run_dirs()[r].relative_to(REPO) / "manifest.json") for r in runs]
    return list(dict.fromkeys(found))


def figures(block: Block) -> list[str]:
    """The figures of a block, each as the text of its numbers."""
    text = CODE_SPAN.sub(lambda m: " " if not m.group(1).replace(".", "").isdigit() else m.group(1), block.text)
    if block.table and block.sources:
        text = RATIO.sub(lambda m: f"{m.group(1)} / {m.group(2)}", text)   # ratios: checked by arithmetic
    out = [m.group(1) for m in FIGURE.finditer(text)] + MEASURED.findall(text)
    if block.table and block.sources:
        for row in text.splitlines()[1:]:   # the first line is the header
            cells = [c for c in row.strip().strip("|").split("|")][1:]
            if row.strip() and not set(row) <= set("|- :"):
                out += re.findall(_NUM, " ".join(cells))
    return out


def wrong_ratios(block: Block) -> list[str]:
    """The "a / b (r×)" of a table whose r is not b / a (a and b as quoted, so as rounded)."""
    out = []
    for m in RATIO.finditer(block.text) if block.table and block.sources else ():
        a, b, r = (float(x.replace(",", "")) for x in m.groups())
        if abs(b / a - r) > 0.005 + r * (0.5 / a + 0.5 / b):
            out.append(m.group(0))
    return out


def _numbers(figure: str) -> list[str]:
    return [n.replace(",", "") for n in re.findall(_NUM, figure)]


@lru_cache(maxsize=None)
def source_numbers(rel: str) -> tuple[float, ...]:
    p = REPO / rel
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    nums = []
    for f in files:
        nums += [float(n.replace(",", "")) for n in re.findall(_NUM, f.read_text(errors="replace"))]
    return tuple(nums)


def holds(number: str, sources: list[str]) -> bool:
    """Whether a source holds the number, as written or rounded as written (a percentage may be
    written as a fraction there)."""
    v = float(number)
    tol = 0.5 * 10 ** -(len(number.split(".")[1]) if "." in number else 0) + 1e-9
    return any(abs(x - v) <= tol or abs(100 * x - v) <= tol
               for s in sources if (REPO / s).exists() for x in source_numbers(s))


@lru_cache(maxsize=None)
def index_current() -> frozenset[str]:
    """Results files the index names in a "file (current)" cell (directories' files included)."""
    names = set()
    for row in (RESULTS / "README.md").read_text().splitlines():
        cells = row.split("|")
        if len(cells) < 5 or set(cells[3].strip()) <= set("- "):
            continue
        for token in CODE_SPAN.findall(cells[3]):
            names.add(token.rstrip("/"))
    return frozenset(names)


def _problems(block: Block) -> list[str]:
    sources = [s for s in dict.fromkeys(block.sources + cited(block.text)) if not s.startswith(NOT_SOURCES)]
    figs = figures(block)
    if not figs:
        return []
    where = f"{block.readme}:{block.line}"
    if not sources:
        return [f"{where}: quotes {figs} without naming a source: {block.text.strip()[:160]!r}"]
    out = []
    for s in sources:
        if not s.startswith("benchmarks/results/"):
            continue
        name = s.removeprefix("benchmarks/results/")
        if any(ch in name for ch in "*{"):
            out.append(f"{where}: names {s!r}, a glob: name the file the figures come from")
        elif name.split("/")[0] not in index_current() and name not in index_current():
            out.append(f"{where}: names {name!r}, which benchmarks/results/README.md does not list as current")
    out += [f"{where}: {r!r}: the ratio is not b / a" for r in wrong_ratios(block)]
    for fig in figs:
        missing = [n for n in _numbers(fig) if not holds(n, sources)]
        if missing:
            out.append(f"{where}: {fig!r}: {missing} not in {sources}")
    return out


@pytest.mark.parametrize("readme", READMES)
def test_every_figure_comes_from_a_current_file_its_block_names(readme):
    problems = [p for b in blocks(readme) for p in _problems(b)]
    assert not problems, "\n".join(problems)


# -- the checker itself, on made-up blocks ---------------------------------------------------------
def _check(text: str, table: bool = False, sources=()) -> list[str]:
    return _problems(Block("README.md", 1, text, table=table, sources=list(sources)))


def test_a_figure_without_a_source_fails():
    assert _check("The recorder costs 37-43 cycles per record.")
    assert _check("A drag-zoom takes 0.24 s on a warm server.")
    assert _check("- `ep-ab-sms-a0..2`: measured op_latency_change = -0.2639") == []   # its runs' manifests
    assert _check("The viewer serves every run; 10 M-event runs stay responsive.") == []   # no unit: no figure


def test_a_stale_or_older_file_fails():
    # the old recorder round holds 37-43, and the index lists it as older
    old = _check("Recorder (`recorder-h200-2026-11-30-r3-d2eb966.md`): 37–43 cycles per record")
    assert any("does not list as current" in p for p in old)
    # a newer round makes the one before it older too
    assert any("does not list as current" in p
               for p in _check("Recorder (`recorder-h200-2026-12-01-r3-8069822/`): 28.65 / 36.4 cycles per record"))
    new = "Recorder (`recorder-h100-2026-12-06-i33-c19a02b/`): 26.15 / 25.9 cycles per record"
    assert _check(new) == []
    assert any("[\'43\']" in p or "43" in p for p in _check(new.replace("25.9", "43")))
    assert any("a glob" in p for p in _check("decode 23.8 M records/s (`decode-cpu-*.md`)"))


def test_numbers_match_as_rounded():
    assert holds("1.40", ["benchmarks/results/ep-2xH200-2026-11-30-deepep-b28d6ee.md"]) is not None
    src = ["profiler/analysis/stats.py"]
    assert _check("with 80 % probability (`profiler/analysis/stats.py`)") == []   # POWER = 0.80
    assert _check("with 85 % probability (`profiler/analysis/stats.py`)")
    assert all(not holds(n, src) for n in ("123456.7",))


def test_a_table_under_a_cited_paragraph_checks_every_cell():
    b = [x for x in blocks("README.md") if x.table and x.sources]
    assert b, "the README's kernel table names its file through the paragraph above it"
    t = b[0]
    bad = Block(t.readme, t.line, t.text.replace("222 / 309", "223.7 / 309", 1), table=True, sources=t.sources)
    assert "222 / 309" in t.text and any("223.7" in p for p in _problems(bad))
    ratio = Block(t.readme, t.line, t.text.replace("(1.40×)", "(1.50×)", 1), table=True, sources=t.sources)
    assert "(1.40×)" in t.text and any("the ratio is not b / a" in p for p in _problems(ratio))


def test_the_bundled_runs_are_counted_as_they_are():
    """The README says how many bundled runs were recorded on GPUs and how many simulated (issue 34:
    it called all 77 real runs recorded on H200 GPUs while 12 are synthetic)."""
    import json
    kinds = [(json.loads(m.read_text()).get("workload") or {}).get("kind") for m in TRACES.rglob("manifest.json")]
    m = re.search(r"(\d+) recorded on GPUs\b[^.]*?\band (\d+) simulated", (REPO / "README.md").read_text(), re.S)
    assert m, "README.md no longer says how many bundled runs are recorded and simulated"
    assert (int(m.group(1)), int(m.group(2))) == (len(kinds) - kinds.count("synthetic"), kinds.count("synthetic"))
