"""Phase registries: one TOML file per kernel family, validated here.

A registry names the phases and barriers a kernel family records. The same file generates the
CUDA header the kernels include and the Python table the decoder uses (profiler.registry.codegen), and a
recorded run embeds it in its manifest (`Registry.to_json`) so a trace from another branch, with
other phases, still decodes: decoding never needs the registry files of the current checkout.

Where registries live: next to the kernels they describe, in a `phases/` directory of the
package that owns them (`<package>/phases/<family>.toml`); the profiler's own self-test family is
in `profiler/phases/`. The profiler names no other family: the directories it searches are the
project's `[tool.epscope] registry_dirs` (pyproject.toml, paths relative to the repository) and
the `EPSCOPE_REGISTRY_PATH` environment variable (directories separated by os.pathsep), after
its own. `registry_dirs()` lists them, `find_registry(family)` locates one family's file.

It is also the one place phase *semantics* are declared (style.md rule 14): which phases are waits
(`wait`, released by the peer's `waits_for` phase), which are idle (`idle`: a warp with nothing to
do), and each barrier's `scope`. The analyses read them from here (profiler.analysis.semantics),
never from names. Read registries through this module: `load_family(name)` for the checkout's,
`registries(obj)` for the ones a manifest embeds.
"""
from __future__ import annotations

import functools
import json
import os
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path

PHASES_DIR = Path(__file__).parents[1] / "phases"     # the profiler's own families (selftest): profiler/phases
REPO_ROOT = Path(__file__).resolve().parents[2]
PROJECT_FILE = REPO_ROOT / "pyproject.toml"          # [tool.epscope] registry_dirs
REGISTRY_PATH_ENV = "EPSCOPE_REGISTRY_PATH"

PHASE_KINDS = ("span", "instant")
BARRIER_SCOPES = ("block", "grid", "rank")
MAX_ID = 0xFFFF  # Record.id is a u16 (formats 1-2; format 3 keeps 12 bits: profiler.registry.codegen checks)
# How wide a phase's or barrier's payload is (`payload_bits`): 16 fits in the 8-byte record of format
# 3 (a larger value is saturated at 0xFFFF and the decoder says so); 32 makes the recorder write the
# whole payload in a PAYLOAD slot after the record (an 8-byte store more). 16 is the default and
# is left out of to_json, so a registry that declares nothing keeps its hash (the runs recorded
# before format 3 carry their registries and buffer hashes).
PAYLOAD_BITS = (16, 32)
DEFAULT_PAYLOAD_BITS = 16


class RegistryError(ValueError):
    """A registry file is malformed; the message names the family and the field."""


@dataclass(frozen=True)
class Phase:
    name: str
    id: int
    kind: str = "span"
    role: str = ""
    parent: str = ""
    wait: bool = False
    # For a wait phase: the phase on the peer rank (named by this span's payload) whose record
    # releases the wait, e.g. wait_data waits_for publish_tail. The critical-path analysis links
    # the two; the peer's phase carries this rank in its payload.
    waits_for: str = ""
    # An idle phase: the warp has nothing to do and waits for the others (no peer releases it);
    # the analyses count it as waiting, never as work.
    idle: bool = False
    doc: str = ""
    payload_bits: int = DEFAULT_PAYLOAD_BITS


@dataclass(frozen=True)
class Barrier:
    name: str
    id: int
    scope: str = "grid"
    doc: str = ""
    payload_bits: int = DEFAULT_PAYLOAD_BITS


def _canonical(item) -> dict:
    """A phase's or barrier's to_json entry: its fields, payload_bits only when not the default."""
    d = vars(item).copy()
    if d.get("payload_bits") == DEFAULT_PAYLOAD_BITS:
        del d["payload_bits"]
    return d


@dataclass(frozen=True)
class Registry:
    family: str
    version: int
    doc: str
    roles: tuple[str, ...]
    phases: tuple[Phase, ...]
    barriers: tuple[Barrier, ...] = field(default_factory=tuple)

    # -- construction -----------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict) -> "Registry":
        fam = d.get("family")
        if not isinstance(fam, str) or not fam.isidentifier():
            raise RegistryError(f"registry: 'family' must be an identifier, got {fam!r}")

        def err(msg: str) -> RegistryError:
            return RegistryError(f"registry {fam}: {msg}")

        roles = tuple(r["name"] if isinstance(r, dict) else r for r in d.get("role", d.get("roles", [])))
        phases = []
        for p in d.get("phase", d.get("phases", [])):
            try:
                phases.append(Phase(**p))
            except TypeError as e:
                raise err(f"phase {p.get('name')!r}: {e}") from None
        barriers = []
        for b in d.get("barrier", d.get("barriers", [])):
            try:
                barriers.append(Barrier(**b))
            except TypeError as e:
                raise err(f"barrier {b.get('name')!r}: {e}") from None
        reg = cls(fam, int(d.get("version", 1)), str(d.get("doc", "")), roles, tuple(phases), tuple(barriers))
        reg._validate(err)
        return reg

    @classmethod
    def load(cls, path: str | Path) -> "Registry":
        with open(path, "rb") as f:
            return cls.from_dict(tomllib.load(f))

    def _validate(self, err) -> None:
        for what, items in (("phase", self.phases), ("barrier", self.barriers)):
            names = [i.name for i in items]
            ids = [i.id for i in items]
            if len(set(names)) != len(names):
                raise err(f"duplicate {what} name in {names}")
            if len(set(ids)) != len(ids):
                raise err(f"duplicate {what} id in {ids}")
            for i in items:
                if not i.name.isidentifier():
                    raise err(f"{what} name {i.name!r} is not an identifier")
                if not (1 <= i.id <= MAX_ID):
                    raise err(f"{what} {i.name}: id {i.id} outside 1..{MAX_ID} (0 is reserved)")
                if i.payload_bits not in PAYLOAD_BITS:
                    raise err(f"{what} {i.name}: payload_bits {i.payload_bits!r} not in {PAYLOAD_BITS}")
        names = {p.name for p in self.phases}
        for p in self.phases:
            if p.kind not in PHASE_KINDS:
                raise err(f"phase {p.name}: kind {p.kind!r} not in {PHASE_KINDS}")
            if p.role and p.role not in self.roles:
                raise err(f"phase {p.name}: role {p.role!r} is not declared (roles: {self.roles})")
            if p.parent and p.parent not in names:
                raise err(f"phase {p.name}: parent {p.parent!r} is not a phase")
            if p.waits_for and p.waits_for not in names:
                raise err(f"phase {p.name}: waits_for {p.waits_for!r} is not a phase")
            if p.waits_for and not p.wait:
                raise err(f"phase {p.name}: waits_for needs wait = true")
            if p.idle and p.wait:
                raise err(f"phase {p.name}: a phase is either a wait (released by a peer) or idle, not both")
            if (p.wait or p.idle) and p.kind != "span":
                raise err(f"phase {p.name}: only span phases can be waits or idle (kind is {p.kind!r})")
            if p.parent == p.name:
                raise err(f"phase {p.name}: a phase cannot nest in itself")
        # parent chains must end (no cycles)
        by_name = {p.name: p for p in self.phases}
        for p in self.phases:
            seen, cur = set(), p
            while cur.parent:
                if cur.name in seen:
                    raise err(f"phase {p.name}: parent chain has a cycle")
                seen.add(cur.name)
                cur = by_name[cur.parent]
        for b in self.barriers:
            if b.scope not in BARRIER_SCOPES:
                raise err(f"barrier {b.name}: scope {b.scope!r} not in {BARRIER_SCOPES}")

    # -- views ---------------------------------------------------------------------------------
    def to_json(self) -> dict:
        """Canonical JSON form: what manifests embed and what the hash covers."""
        return {
            "family": self.family,
            "version": self.version,
            "doc": self.doc,
            "roles": list(self.roles),
            "phases": [_canonical(p) for p in sorted(self.phases, key=lambda p: p.id)],
            "barriers": [_canonical(b) for b in sorted(self.barriers, key=lambda b: b.id)],
        }

    @functools.cached_property   # frozen: computed once (the decoder reads it per launch; ~0.1 ms a JSON dump)
    def hash(self) -> int:
        """crc32 of the canonical JSON; stored in every buffer header of this family."""
        blob = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()
        return zlib.crc32(blob) & 0xFFFFFFFF

    def phase_names(self) -> dict[int, str]:
        return {p.id: p.name for p in self.phases}

    def barrier_names(self) -> dict[int, str]:
        return {b.id: b.name for b in self.barriers}

    def phase(self, name: str) -> Phase:
        for p in self.phases:
            if p.name == name:
                return p
        raise KeyError(f"registry {self.family}: no phase {name!r}")


@functools.lru_cache(maxsize=None)
def _project_dirs(project_file: Path) -> tuple[Path, ...]:
    """`[tool.epscope] registry_dirs` of the project file (none when it is absent: an installed
    copy without the repository keeps only the profiler's own registries and the env path)."""
    if not project_file.is_file():
        return ()
    with open(project_file, "rb") as f:
        cfg = tomllib.load(f).get("tool", {}).get("epscope", {})
    dirs = cfg.get("registry_dirs", [])
    if not isinstance(dirs, list) or not all(isinstance(d, str) for d in dirs):
        raise RegistryError(f"{project_file}: [tool.epscope] registry_dirs must be a list of paths, got {dirs!r}")
    return tuple((project_file.parent / d).resolve() for d in dirs)


def registry_dirs() -> list[Path]:
    """Directories holding `<family>.toml` registries, in search order (no duplicates)."""
    env = [Path(p).resolve() for p in os.environ.get(REGISTRY_PATH_ENV, "").split(os.pathsep) if p]
    out: list[Path] = []
    for d in (PHASES_DIR.resolve(), *_project_dirs(PROJECT_FILE), *env):
        if d not in out:
            out.append(d)
    return out


def registries(obj) -> tuple[Registry, ...]:
    """The registries in `obj`: a Registry, one registry's JSON (what `to_json` writes), a
    manifest's "registry" map {family: registry-json}, a list of any of those, or None (none).
    Raises RegistryError for a registry that does not validate."""
    if obj is None:
        return ()
    if isinstance(obj, Registry):
        return (obj,)
    if isinstance(obj, (list, tuple)):
        return tuple(r for o in obj for r in registries(o))
    if isinstance(obj, dict):
        if "family" in obj and ("phases" in obj or "phase" in obj):
            return (Registry.from_dict(obj),)
        return tuple(r for v in obj.values() for r in registries(v))
    raise TypeError(f"registries: expected a Registry, a registry dict or a manifest's registry map, "
                    f"got {type(obj).__name__}")


def registry_files() -> list[Path]:
    """Every registry file of the search path, sorted by family name."""
    files = [p for d in registry_dirs() if d.is_dir() for p in d.glob("*.toml")]
    return sorted(files, key=lambda p: (p.stem, str(p)))


def find_registry(family: str) -> Path:
    """The registry file of `family` (the first one on the search path)."""
    for d in registry_dirs():
        p = d / f"{family}.toml"
        if p.is_file():
            return p
    raise RegistryError(f"no registry for kernel family {family!r} in {[str(d) for d in registry_dirs()]} "
                        f"(add <package>/phases/{family}.toml and list its directory in pyproject.toml "
                        f"[tool.epscope] registry_dirs)")


def load_all() -> dict[str, Registry]:
    """Every registry of this checkout, by family name."""
    regs = [Registry.load(p) for p in registry_files()]
    out = {r.family: r for r in regs}
    if len(out) != len(regs):
        raise RegistryError("two registry files declare the same family")
    return out


def load_family(family: str) -> Registry:
    """The checkout's registry of one kernel family (RegistryError naming the search path)."""
    return Registry.load(find_registry(family))
