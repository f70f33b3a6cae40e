"""`epscope ab REF_A REF_B`: build two git refs and run their EP workloads interleaved on this
machine's GPUs; print a verdict with confidence intervals over rounds.

    epscope ab main my-branch --rounds 8 --iters 20            # refs of this repository
    epscope ab main main                                        # A/A: must come out within noise
    epscope ab .ab/a .ab/b                                      # source trees (a machine without .git)
    epscope ab --export main .ab/a                              # make such a tree from a ref (CPU side)

Each ref is checked out into a temporary worktree (`git worktree add --detach`; a directory that
holds ep_core/ is used as it is) and gets its own worker processes (profiler.workflows.rounds.WorkerSet), so
two builds of one extension never share a process, and a build cache per commit (`build_dir`:
EPSCOPE_BUILD_DIR in the workers), so two commits never overwrite each other's build.
The inputs are made once and loaded by both sides. Rounds alternate A B A B ...; each round
warms up (not measured) and then times `--iters` iterations with CUDA events (the slowest rank's
GPU time of each call and of the op, and the host time per call). The rounds of
`--profile-rounds` are recorded with the profiler instead, one run directory each
(`ab-<side>-r<round>`, manifests tagged with ref, commit and round), and are left out of the
timing verdict. The comparison record (profiler.commands.ab) lands next to the run directories; the
verdict table is printed last; `--view` serves the viewer on the output directory.
"""
from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from .rounds import WorkerError

REF_STAMP = ".epscope-ref.json"   # in an exported tree: the ref and commit it was made from
EXPORT_PATHS = ("ep_core", "profiler", "pyproject.toml")   # pyproject: the registry search path


class ABUsage(ValueError):
    """A bad argument or ref; the message names it."""


@dataclass(frozen=True)
class SideTree:
    side: str
    ref: str
    commit: str
    tree: Path
    worktree: bool    # created here (removed at the end)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="epscope ab", description="Compare two git refs' EP kernels on this "
                                 "machine's GPUs, interleaved, with confidence intervals over rounds.")
    ap.add_argument("refs", nargs="*", metavar="REF", help="REF_A REF_B: git refs of this repository or "
                    "source trees (directories holding ep_core/)")
    ap.add_argument("--export", nargs=2, metavar=("REF", "DIR"), default=None,
                    help="write REF's ep_core/, profiler/ and pyproject.toml into DIR (for a machine without "
                         ".git) and exit")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=4096, help="tokens per rank")
    ap.add_argument("--hidden", type=int, default=7168)
    ap.add_argument("--topk", type=int, default=8)
    ap.add_argument("--experts", type=int, default=256)
    ap.add_argument("--routing", default="uniform", choices=("uniform", "skewed", "zipf", "zero-rank"))
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    ap.add_argument("--num-sms", type=int, default=None,
                    help="SMs of dispatch/combine (Buffer.set_num_sms on both sides; default: each ref's default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=8, help="rounds per side, profiled ones included (default 8)")
    ap.add_argument("--profile-rounds", default="-1",
                    help="comma-separated round indices recorded with the profiler (negative from the end; "
                         "'' for none; default -1, the last)")
    ap.add_argument("--iters", type=int, default=20, help="timed iterations per round (default 20)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed iterations before each round (default 5)")
    ap.add_argument("--profile-iters", type=int, default=2, help="iterations of a profiled round (default 2)")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default ab-runs/<time>-<A>-vs-<B>)")
    ap.add_argument("--view", action="store_true", help="serve the viewer on the output directory at the end")
    ap.add_argument("--build-root", type=Path, default=None,
                    help="where the other trees' builds are cached, one directory per commit (default: a temporary "
                         "directory; this checkout always uses its usual cache, EPSCOPE_BUILD_DIR)")
    ap.add_argument("--keep-worktrees", action="store_true", help="leave the temporary worktrees and builds")
    ap.add_argument("--round-timeout", type=float, default=600.0, help="seconds a round may take")
    return ap


def parse_profile_rounds(text: str, rounds: int) -> list[int]:
    """Indices of the profiled rounds (normalised, sorted); at least 2 timing rounds must remain."""
    out = set()
    for tok in (t.strip() for t in (text or "").split(",")):
        if not tok:
            continue
        try:
            i = int(tok)
        except ValueError:
            raise ABUsage(f"--profile-rounds: {tok!r} is not a round index") from None
        if not -rounds <= i < rounds:
            raise ABUsage(f"--profile-rounds: round {i} is outside 0..{rounds - 1}")
        out.add(i % rounds)
    if rounds - len(out) < 2:
        raise ABUsage(f"--profile-rounds leaves {rounds - len(out)} timing round(s) of {rounds}: the verdict needs "
                      f"at least 2 per side (raise --rounds)")
    return sorted(out)


def check_args(a):
    """Everything checkable without a GPU; returns (Problem, profiled round indices)."""
    from ep_core.config import Problem

    if a.export is None and len(a.refs) != 2:
        raise ABUsage(f"give two refs (REF_A REF_B), got {len(a.refs)}")
    try:
        p = Problem(a.tokens, a.hidden, a.topk, a.experts, a.ranks, a.dtype)
    except (TypeError, ValueError) as e:
        raise ABUsage(str(e)) from None
    if a.rounds < 2:
        raise ABUsage(f"--rounds must be >= 2 (run-to-run noise needs two rounds per side), got {a.rounds}")
    for name in ("iters", "profile_iters"):
        if getattr(a, name) < 1:
            raise ABUsage(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
    if a.warmup < 0:
        raise ABUsage(f"--warmup must be >= 0, got {a.warmup}")
    if a.num_sms is not None and (a.num_sms < 2 or a.num_sms % 2):
        raise ABUsage(f"--num-sms must be even and >= 2, got {a.num_sms}")
    return p, parse_profile_rounds(a.profile_rounds, a.rounds)


# -- refs -> trees ---------------------------------------------------------------------------------
def _git(repo: Path, *args) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise ABUsage(f"git {' '.join(args)}: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip()


def commit_of(repo: Path, ref: str) -> str:
    """The full commit `ref` names in `repo`; ABUsage when it names none."""
    r = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
                       capture_output=True, text=True, timeout=120)
    if r.returncode != 0 or not r.stdout.strip() or not ref:
        raise ABUsage(f"{ref!r} is not a commit of {repo}")
    return r.stdout.strip()


def repo_root() -> Path:
    return Path(__file__).resolve().parents[2]   # profiler/workflows/ab.py -> the checkout


def resolve_side(side: str, ref: str, workdir: Path, repo: Path) -> SideTree:
    """A directory holding ep_core/ is used as it is (its commit from REF_STAMP, else 'unknown');
    anything else is a git ref of `repo`, checked out detached into workdir/<side>."""
    d = Path(ref)
    if d.is_dir() and (d / "ep_core").is_dir():
        stamp = d / REF_STAMP
        if stamp.exists():
            info = json.loads(stamp.read_text())
        elif d.resolve() == repo.resolve():
            # this checkout (on the GPU machine a copy without .git: EPSCOPE_GIT_COMMIT names it)
            from profiler.record.session import git_info

            g = git_info(repo)
            info = {"ref": f"{ref} (working tree{', dirty' if g['dirty'] else ''})", "commit": g["commit"]}
        else:
            info = {}
        return SideTree(side, info.get("ref", str(d)), info.get("commit", "unknown"), d.resolve(), False)
    if not (repo / ".git").exists():
        raise ABUsage(f"{ref!r} is not a directory holding ep_core/, and {repo} is not a git checkout "
                      f"(on a machine without .git, export the refs with `epscope ab --export REF DIR` first)")
    commit = commit_of(repo, ref)
    tree = workdir / f"tree-{side}"
    _git(repo, "worktree", "add", "--detach", str(tree), commit)
    return SideTree(side, ref, commit, tree, True)


def build_dir(t: SideTree, repo: Path, root: Path) -> Path:
    """The side's extension build cache. This checkout keeps its usual one (shared with `epscope
    trace`, the catalogue and tune: the same sources); another tree gets root/ab-<commit>, so two
    commits never share a cache and one commit is built once (two sides of one commit share
    identical sources, which cannot overwrite each other's build). A tree of unknown commit gets
    a cache of its own side."""
    if t.tree.resolve() == repo.resolve():
        from profiler.record.build import build_root

        return build_root()
    return root / (f"ab-{t.commit[:16]}" if t.commit != "unknown" else f"ab-side-{t.side}")


def remove_worktree(t: SideTree, repo: Path) -> None:
    if t.worktree:
        subprocess.run(["git", "-C", str(repo), "worktree", "remove", "--force", str(t.tree)], capture_output=True,
                       timeout=120)


def export_tree(ref: str, dest: Path, repo: Path | None = None) -> Path:
    """REF's EXPORT_PATHS into dest (git archive), stamped with the ref and commit."""
    repo = repo or repo_root()
    commit = commit_of(repo, ref)
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise ABUsage(f"{dest} is not empty")
    arch = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", commit, *EXPORT_PATHS],
                          capture_output=True, timeout=120)
    if arch.returncode != 0:
        raise ABUsage(f"git archive {ref}: {arch.stderr.decode(errors='replace').strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=arch.stdout, check=True, timeout=120)
    (dest / REF_STAMP).write_text(json.dumps({"ref": ref, "commit": commit}) + "\n")
    return dest


# -- the run ---------------------------------------------------------------------------------------
def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _say(msg: str) -> None:
    print(f"[epscope ab {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def round_command(a, side: SideTree, i: int, profiled: bool, out: Path, problem) -> dict:
    cmd = {"cmd": "round", "round": i, "warmup": a.warmup, "num_sms": a.num_sms, "configs": None,
           "iters": a.profile_iters if profiled else a.iters, "profile": None}
    if profiled:
        cmd["profile"] = {
            "out": str(out), "name": f"ab-{side.side}-r{i}", "capacity": 512,
            "description": f"epscope ab side {side.side} ({side.ref} @ {side.commit[:10]}), round {i}",
            "workload": {"kind": "ep", **problem.to_dict(), "routing": a.routing, "seed": a.seed,
                         "num_sms": a.num_sms, "iters": a.profile_iters, "profile_iters": a.profile_iters,
                         "ab": {"side": side.side, "ref": side.ref, "commit": side.commit, "round": i}}}
    return cmd


def run(a, problem, profiled: list[int], sides: list[SideTree], out: Path, work: Path, command: str,
        repo: Path):
    from profiler.commands.ab import ComparisonRecord, RoundSamples, format_table, verdict_table

    from .rounds import WorkerSet, interleave, prebuild, slowest_rank, write_inputs

    inputs = write_inputs(work / "inputs", problem, a.routing, a.seed)
    sets = {}
    for t in sides:
        env = {"EPSCOPE_BUILD_DIR": str(build_dir(t, repo, (a.build_root or work).resolve())),
               "EPSCOPE_GIT_COMMIT": t.commit, "EPSCOPE_GIT_BRANCH": t.ref}
        sets[t.side] = WorkerSet(t.side, t.tree, a.ranks, inputs, out / "logs", env=env, profile=bool(profiled))
    record = ComparisonRecord(sides={t.side: {"ref": t.ref, "commit": t.commit, "tree": str(t.tree)} for t in sides},
                              workload={**problem.to_dict(), "routing": a.routing, "seed": a.seed,
                                        "num_sms": a.num_sms, "iters": a.iters, "warmup": a.warmup,
                                        "rounds": a.rounds, "profile_rounds": profiled},
                              command=command)
    try:
        _say("building both sides' extensions (a cache per commit, in parallel)")
        t0 = time.time()
        for f in prebuild(list(sets.values())):
            record.notes.append(f"build {f}: the side's workers build on first use instead")
        _say(f"builds done in {time.time() - t0:.0f} s; starting the workers")
        for s in sets.values():
            s.spawn()
        for name, s in sets.items():
            ready = s.wait_ready()
            record.gpu = ready[0].get("gpu", "")
            record.sides[name]["build_dir"] = s.env["EPSCOPE_BUILD_DIR"]
            _say(f"side {name} ready: ep_core from {ready[0].get('ep_core')}, built in {s.env['EPSCOPE_BUILD_DIR']}")
        order = interleave([t.side for t in sides], a.rounds)
        by_side = {t.side: t for t in sides}
        for k, (side, i) in enumerate(order):
            prof = i in profiled
            replies = sets[side].request(round_command(a, by_side[side], i, prof, out, problem), a.round_timeout)
            samples = slowest_rank(replies)
            run_dir = replies[0].get("run_dir")
            rs = RoundSamples(side, i, prof, samples, Path(run_dir).name if run_dir else None)
            record.rounds.append(rs)
            op = sorted(samples["op"])[len(samples["op"]) // 2] if samples["op"] else float("nan")
            _say(f"{k + 1}/{len(order)} side {side} round {i} ({'profiled' if prof else 'timing'}): "
                 f"op median {op:.1f} µs")
    finally:
        for s in sets.values():
            s.close()
    record.verdict = verdict_table(record.rounds)
    record.critical_path, notes = critical_path_changes(record, out)
    record.notes += notes
    path = record.write(out)
    title = (f"epscope ab: A = {sides[0].ref} ({sides[0].commit[:10]}), B = {sides[1].ref} ({sides[1].commit[:10]}); "
             f"{len(profiled)} profiled and {a.rounds - len(profiled)} timing rounds per side; record {path}")
    return record, title, format_table


def critical_path_changes(record, out: Path) -> tuple[list, list]:
    """Phases that moved between the profiled rounds of A and B (profiler.analysis.compare on the
    run directories), for the record; notes say why there are none."""
    dirs = {s: [out / r.run_dir for r in record.rounds if r.side == s and r.profiled and r.run_dir]
            for s in ("A", "B")}
    if not dirs["A"] or not dirs["B"]:
        return [], ["no profiled round on one side: no critical-path comparison"]
    from profiler.analysis import compare
    from profiler.store.runstore import load_run

    runs = {s: [load_run(d) for d in v] for s, v in dirs.items()}
    reg = {}
    for r in runs["A"] + runs["B"]:
        reg.update(r.manifest.get("registry") or {})
    c = compare(runs["A"], runs["B"], registry=reg or None)
    if c.refused:
        return [], ["the profiled runs record different workloads: " + "; ".join(c.refused)]
    moved = c.per_phase[c.per_phase["verdict"].isin(["faster", "slower"])]
    # the profiled runs' warm-up iterations are set aside by compare; the record says so
    notes = [n for n in c.verdict.notes if n.startswith("warm-up set aside")]
    if min(len(runs["A"]), len(runs["B"])) < 2:
        notes.append("one profiled round on a side: run-to-run noise cannot be estimated, so no phase is called "
                     "moved (profile two or more rounds: --profile-rounds)")
    cp = c.critical_path_changes
    rows = [{"kernel": k, "phase": p, "verdict": v, "diff_pct": None if d != d else round(float(d), 1),
             "on_path": bool(((cp["kernel"] == k) & (cp["phase"] == p)).any())}
            for k, p, v, d in moved[["kernel", "phase", "verdict", "diff_pct"]].itertuples(index=False)]
    return rows + [{"kernel": k, "phase": p, "path_change": ch} for k, p, ch in
                   cp[cp["change"] != "stayed"][["kernel", "phase", "change"]].itertuples(index=False)], notes


def main(argv=None) -> int:
    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    try:
        if a.export is not None:
            dest = export_tree(a.export[0], Path(a.export[1]))
            print(f"epscope ab: exported {a.export[0]} into {dest}")
            return 0
        problem, profiled = check_args(a)
    except ABUsage as e:
        print(f"epscope ab: {e}", file=sys.stderr)
        return 2
    have = gpu_count()
    if have < a.ranks:
        print(f"epscope ab: runs both refs' kernels on {a.ranks} GPU(s) of this machine, and it has {have} "
              f"(run it on the GPU machine; on a machine without .git, `epscope ab --export REF DIR` the refs first)",
              file=sys.stderr)
        return 2
    repo = repo_root()
    work = Path(tempfile.mkdtemp(prefix="epscope-ab-"))
    sides = []
    try:
        for side, ref in zip(("A", "B"), a.refs):
            sides.append(resolve_side(side, ref, work, repo))
        out = a.out or Path("ab-runs") / (time.strftime("%Y%m%d-%H%M%S") + f"-{_slug(a.refs[0])}-vs-{_slug(a.refs[1])}")
        out = out.resolve()   # the workers run in the sides' trees: every path they get is absolute
        if (out / "comparison.json").exists():
            raise ABUsage(f"{out} already holds a comparison; give another --out")
        out.mkdir(parents=True, exist_ok=True)
        command = "epscope ab " + " ".join(map(shlex.quote, sys.argv[1:] if argv is None else argv))
        record, title, fmt = run(a, problem, profiled, sides, out, work, command, repo)
    except ABUsage as e:
        print(f"epscope ab: {e}", file=sys.stderr)
        return 2
    except WorkerError as e:
        print(f"epscope ab: {e}", file=sys.stderr)
        return 1
    finally:
        if not a.keep_worktrees:
            for t in sides:
                remove_worktree(t, repo)
            shutil.rmtree(work, ignore_errors=True)
    for n in record.notes:
        print(f"note: {n}")
    for row in record.critical_path:
        print("critical path: " + ", ".join(f"{k}={v}" for k, v in row.items()))
    print()
    print(fmt(record.verdict, title), flush=True)
    if a.view:
        from profiler.commands.cli import main as cli_main

        print(f"epscope ab: serving {out}; on the Compare page pick the ab-A-r* runs against the ab-B-r* runs")
        return cli_main(["view", str(out)])
    return 0


def _slug(ref: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(ref).name or ref)[:40]


if __name__ == "__main__":
    sys.exit(main())
