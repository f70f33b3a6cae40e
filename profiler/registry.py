"""Phase registries: one TOML file per kernel family, validated here.

A registry names the phases and barriers a kernel family records. The same file generates the
CUDA header the kernels include and the Python table the decoder uses (profiler.codegen), and a
recorded run embeds it in its manifest (`Registry.to_json`) so a trace from another branch, with
other phases, still decodes: decoding never needs the registry files of the current checkout.
"""
from __future__ import annotations

import json
import tomllib
import zlib
from dataclasses import dataclass, field
from pathlib import Path

PHASES_DIR = Path(__file__).parent / "phases"

PHASE_KINDS = ("span", "instant")
BARRIER_SCOPES = ("block", "grid", "rank")
MAX_ID = 0xFFFF  # Record.id is a u16


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
    doc: str = ""


@dataclass(frozen=True)
class Barrier:
    name: str
    id: int
    scope: str = "grid"
    doc: str = ""


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
            "phases": [vars(p).copy() for p in sorted(self.phases, key=lambda p: p.id)],
            "barriers": [vars(b).copy() for b in sorted(self.barriers, key=lambda b: b.id)],
        }

    @property
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


def registry_files() -> list[Path]:
    return sorted(PHASES_DIR.glob("*.toml"))


def load_all() -> dict[str, Registry]:
    """Every registry of this checkout, by family name."""
    regs = [Registry.load(p) for p in registry_files()]
    out = {r.family: r for r in regs}
    if len(out) != len(regs):
        raise RegistryError("two registry files declare the same family")
    return out
