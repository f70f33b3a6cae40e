"""Static cost of compiled kernels from their SASS: registers, loops, and the stall cycles ptxas
encoded in each instruction's control bits, for both builds (recording compiled out / in).

    python benchmarks/sass_static.py --out benchmarks/results      # ~2 min on 2 cores, no GPU

Why static: the instrumented build of dispatch / combine cost 4.5-6 % of kernel time at 24 SMs
with recording off (issue 9), though no record sits in a copy loop. The stall counts show where:
the compiler laid the hot copy loops out differently around the recorder's live state. The same
counts give the recorder's cost per record in the record_cost loop (the measured cycles per
record track them within a few cycles: 31.25 static vs 32.9 measured at 4db78b1).

On sm_70+ every instruction carries a 4-bit stall count (cycles before the next instruction may
issue), a yield bit, write / read scoreboard indices and a wait mask (bits 105..121 of the
128-bit word). The sum of stall counts over a loop body is a lower bound on its issue time per
iteration on one warp; variable-latency waits (memory) come on top.

cuobjdump is found on PATH, under CUDA_HOME, or in Triton's wheel (triton/backends/nvidia/bin).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# (source, kernel symbol substring) of the kernels whose loops the table compares
KERNELS = (("ep_core/csrc/dispatch.cu", "dispatch_kernelILi2EEE"),
           ("ep_core/csrc/combine.cu", "combine_kernelILi2EEE"),
           ("profiler/csrc/selftest.cu", "record_cost_kernel"))


@dataclass(frozen=True)
class Instr:
    addr: int
    stall: int      # cycles before the next instruction may issue
    text: str       # the disassembled instruction


@dataclass(frozen=True)
class Loop:
    start: int
    end: int        # address of the backward branch
    body: tuple     # Instr, start..end inclusive

    @property
    def stall(self) -> int:
        return sum(i.stall for i in self.body)

    @property
    def records(self) -> int:
        """Record sites in the body: a record is the one 128-bit store without a cache hint
        (STG.E.128; the kernels' own copies are STG.E.NA.128), 0 for the spin loops' timer reads."""
        return sum(bool(re.search(r"\bSTG\.E\.128\b", i.text)) for i in self.body)

    @property
    def ops(self) -> str:
        """The loop's memory traffic and timer reads, as a short signature."""
        found = set()
        for i in self.body:
            m = re.search(r"\b(LDG\.[A-Z0-9.]+|STG\.[A-Z0-9.]+|LD\.E[A-Z0-9.]*|ST\.E[A-Z0-9.]*)", i.text)
            if m:
                found.add(m.group(1))
            if "SR_GLOBALTIMER" in i.text or "SR_CLOCK" in i.text:
                found.add("timer")
        return " ".join(sorted(found))


def cuobjdump_path() -> str | None:
    found = shutil.which("cuobjdump")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    cand = Path(home) / "bin" / "cuobjdump"
    if cand.exists():
        return str(cand)
    try:
        import triton  # noqa: PLC0415 (optional: only its bundled binary is wanted)
    except ImportError:
        return None
    cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(cand) if cand.exists() else None


def disassemble(cubin: Path, cuobjdump: str) -> dict[str, list[Instr]]:
    """kernel symbol -> its instructions with their stall counts."""
    return parse_sass(subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                                     check=True).stdout)


def parse_sass(text: str) -> dict[str, list[Instr]]:
    """cuobjdump -sass text -> kernel symbol -> instructions (each line pair: the instruction with
    its low encoding word, then the high word that holds the control bits)."""
    out: dict[str, list[Instr]] = {}
    cur, pending = None, None
    for line in text.splitlines():
        m = re.match(r"\s+Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*/\* (0x[0-9a-f]+) \*/", line)
        if m:
            pending = (int(m.group(1), 16), m.group(2).rstrip(" ;"))
            continue
        m = re.match(r"\s+/\* (0x[0-9a-f]+) \*/", line)
        if m and pending is not None and cur is not None:
            hi = int(m.group(1), 16)  # bits 64..127: the control bits are 105..121
            cur.append(Instr(pending[0], (hi >> 41) & 0xF, pending[1]))
            pending = None
    return out


def loops(instrs: list[Instr]) -> list[Loop]:
    """Every backward branch's body (innermost loops are the short ones)."""
    index = {i.addr: k for k, i in enumerate(instrs)}
    found = []
    for k, i in enumerate(instrs):
        m = re.search(r"\bBRA\s+(?:`\(\.L_x_\d+\)|0x([0-9a-f]+))", i.text)
        if m and m.group(1):
            target = int(m.group(1), 16)
            if target < i.addr and target in index:
                found.append(Loop(target, i.addr, tuple(instrs[index[target]:k + 1])))
    return found


def compile_cubin(src: Path, profile: bool, out: Path, root: Path = ROOT, nvcc: str = "nvcc") -> tuple[Path, str]:
    """(cubin, ptxas -v log) of one build of one source file of the checkout at `root`."""
    cubin = out / f"{src.stem}-{int(profile)}.cubin"
    res = subprocess.run([nvcc, "-arch=sm_90", "-std=c++17", "-O3", f"-I{root}", f"-DEPSCOPE_PROFILE={int(profile)}",
                          "-Xptxas", "-v", "-cubin", "-o", str(cubin), str(src)], capture_output=True, text=True)
    if res.returncode != 0:
        raise RuntimeError(f"nvcc failed on {src}:\n{res.stderr[-2000:]}")
    return cubin, res.stderr


def registers(ptxas_log: str, kernel: str) -> int | None:
    m = re.search(re.escape(kernel) + r".*?Used (\d+) registers", ptxas_log, re.S)
    return int(m.group(1)) if m else None


def analyse(tmp: Path, cuobjdump: str, root: Path = ROOT) -> list[dict]:
    rows = []
    for src, kernel in KERNELS:
        per_build = {}
        for profile in (False, True):
            cubin, log = compile_cubin(root / src, profile, tmp, root)
            funcs = disassemble(cubin, cuobjdump)
            name = next(n for n in funcs if kernel in n)
            per_build[profile] = {"registers": registers(log, name), "loops": loops(funcs[name])}
        rows.append({"source": src, "kernel": kernel, **{("instrumented" if p else "compiled out"): v
                                                         for p, v in per_build.items()}})
    return rows


def hot_loops(ls: list[Loop]) -> list[Loop]:
    """Innermost loops that move 128-bit vectors: the copy / reduce loops and the record loops."""
    inner = [l for l in ls if not any(o is not l and l.start <= o.start and o.end <= l.end for o in ls)]
    return [l for l in inner if ".128" in l.ops]


def format_rows(rows: list[dict]) -> str:
    L = ["| kernel | build | registers | innermost loops with 128-bit accesses: "
         "instructions / static stall cycles per iteration [memory ops] |", "| --- | --- | --- | --- |"]
    for r in rows:
        for b in ("compiled out", "instrumented"):
            d = r[b]
            cells = "; ".join(f"{len(l.body)} / {l.stall} [{l.ops}]" +
                              (f" = {l.stall / l.records:.1f} per record" if l.records else "")
                              for l in hot_loops(d["loops"]))
            L.append(f"| {r['kernel']} | {b} | {d['registers']} | {cells} |")
    return "\n".join(L)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=None, help="a .md file, or a directory for sass-static-<date>.md (default: print only)")
    ap.add_argument("--root", default=str(ROOT),
                    help="the checkout whose kernels are compiled (e.g. `git worktree add /tmp/old <commit>`)")
    ap.add_argument("--label", default=None, help="what that checkout is, for the heading (default: its commit)")
    a = ap.parse_args(argv)
    cuobjdump = cuobjdump_path()
    if cuobjdump is None:
        print("cuobjdump not found (PATH, CUDA_HOME/bin, Triton's wheel)", file=sys.stderr)
        return 2
    root = Path(a.root).resolve()
    with tempfile.TemporaryDirectory(prefix="sass-static-") as tmp:
        rows = analyse(Path(tmp), cuobjdump, root)
    label = a.label
    if label is None:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
        label = f"commit {head.stdout.strip() or 'unknown'}{' + uncommitted changes' if dirty else ''}"
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    text = (f"# Static SASS cost, both builds, sm_90 ({label}, {date})\n\n"
            f"From `python benchmarks/sass_static.py` (nvcc -O3 -arch=sm_90, cuobjdump; no GPU). A loop "
            f"with record stores (STG.E.128) is a record_cost loop (one record + one LCG step per source iteration, "
            f"unrolled): per record = its stall sum / its record stores.\n\n{format_rows(rows)}\n")
    print(text)
    if a.out:
        path = Path(a.out) if a.out.endswith(".md") else Path(a.out) / f"sass-static-{date}.md"
        path.write_text(text)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
