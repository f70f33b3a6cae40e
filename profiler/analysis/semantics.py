"""What the analyses need to know about phase and barrier names, read from registries only.

A phase is a wait (`wait = true`, released by the peer's `waits_for` phase), idle (`idle = true`)
or work; a barrier has a scope (block, grid, rank). Nothing is inferred from a name (style.md
rule 14): a phase or barrier that no registry declares counts as work / a per-launch (grid)
barrier, and the analysis reports it with a typed `UndeclaredPhases` warning, so a table analysed
without its registry says so instead of silently guessing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from profiler.errors import AnalysisWarning, InvalidRegistry, UndeclaredPhases
from profiler.registry.registry import RegistryError, registries

UNDECLARED_SCOPE = "grid"   # an undeclared barrier: only the warps of one launch meet there


@dataclass(frozen=True)
class Semantics:
    waits: dict = field(default_factory=dict)     # wait phase -> release phase ('' = none declared)
    idle: frozenset = frozenset()                 # idle phases
    scopes: dict = field(default_factory=dict)    # barrier -> 'block' | 'grid' | 'rank'
    phases: frozenset = frozenset()               # every declared phase
    warnings: tuple = ()                          # registries that could not be read

    def is_wait(self, name: str) -> bool:
        return name in self.waits

    def is_idle(self, name: str) -> bool:
        return name in self.idle

    def release_of(self, name: str) -> str:
        """The phase whose record on the peer releases wait `name` ('' when none is declared)."""
        return self.waits.get(name, "")

    def scope(self, barrier: str) -> str:
        return self.scopes.get(barrier, UNDECLARED_SCOPE)

    def declares_phase(self, name: str) -> bool:
        return name in self.phases

    def declares_barrier(self, name: str) -> bool:
        return name in self.scopes


def semantics(registry=None) -> Semantics:
    """Semantics of the registries in `registry` (anything profiler.registry.registry.registries reads)."""
    warns: list[AnalysisWarning] = []
    try:
        regs = registries(registry)
    except (RegistryError, TypeError, KeyError, ValueError) as e:
        regs = ()
        warns.append(InvalidRegistry(1, str(e)))
    waits, idle, scopes, declared = {}, set(), {}, set()
    for reg in regs:
        for p in reg.phases:
            declared.add(p.name)
            if p.wait:
                waits[p.name] = p.waits_for
            if p.idle:
                idle.add(p.name)
        for b in reg.barriers:
            scopes[b.name] = b.scope
    return Semantics(waits, frozenset(idle), scopes, frozenset(declared), tuple(warns))


def undeclared(sem: Semantics, span_phases, barriers) -> list[AnalysisWarning]:
    """A typed warning naming the span phases and barriers of a table that `sem` does not declare."""
    ph = sorted({str(p) for p in span_phases} - set(sem.phases))
    br = sorted({str(b) for b in barriers} - set(sem.scopes))
    if not ph and not br:
        return []
    parts = []
    if ph:
        parts.append("phases " + ", ".join(ph) + " (counted as work)")
    if br:
        parts.append("barriers " + ", ".join(br) + f" (counted as scope {UNDECLARED_SCOPE})")
    return [UndeclaredPhases(len(ph) + len(br), "no registry declares " + "; ".join(parts))]
