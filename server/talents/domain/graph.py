"""The talent dependency graph: closure of a selection over hard edges, and the doctor.

Pure functions over `TalentNode`s. Hard edges are `requires` and `includes`; `recommends` is soft
and never followed here (recommended talents stay subject to relevance).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

# Elementary cycles can be exponentially many; the doctor stops reporting after this many.
MAX_REPORTED_CYCLES = 100


@dataclass(frozen=True)
class TalentNode:
    """A talent's id, edges and roles (empty roles: every role)."""

    id: str
    requires: tuple[str, ...] = ()
    includes: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()

    @property
    def hard_edges(self) -> tuple[str, ...]:
        """`requires` then `includes`, in declared order."""
        return self.requires + self.includes


@dataclass(frozen=True)
class Closure:
    """Talents the closure adds (servable) and required ones it cannot serve (not active)."""

    added: list[str]
    missing: list[str]


def requires_closure(
    kept_ids: Sequence[str], graph: Mapping[str, TalentNode], active_ids: Collection[str]
) -> Closure:
    """Close `kept_ids` over hard edges, transitively and unconditionally, within `active_ids`.

    Breadth-first from the kept ids in their order, each talent's edges in declared order
    (`requires` then `includes`); `added` and `missing` are in discovery order, without the kept
    ids and without duplicates. A required talent that is not active (including one absent from
    `graph`) goes to `missing` and its own edges are not followed, since it is never served.
    An active target absent from `graph` is added but has no edges to follow.
    """
    seen = set(kept_ids)
    queue = deque(dict.fromkeys(kept_ids))
    added: list[str] = []
    missing: list[str] = []
    while queue:
        node = graph.get(queue.popleft())
        for target in node.hard_edges if node else ():
            if target in seen:
                continue
            seen.add(target)
            if target in active_ids:
                added.append(target)
                queue.append(target)
            else:
                missing.append(target)
    return Closure(added=added, missing=missing)


class FindingCode(StrEnum):
    """Doctor finding codes; values are the wire strings of `satchel.v1`."""

    REQUIRED_NOT_ACTIVE = "required_not_active"
    UNKNOWN_EDGE_TARGET = "unknown_edge_target"
    REQUIRES_CYCLE = "requires_cycle"
    UNREACHABLE_BY_ROLE = "unreachable_by_role"


@dataclass(frozen=True, order=True)
class Finding:
    """One problem found by the doctor."""

    code: FindingCode
    talent_id: str
    detail: str


def diagnose(
    talents: Iterable[TalentNode],
    active_ids: Collection[str],
    roles_known: Collection[str] | None = None,
) -> list[Finding]:
    """The doctor: what is wrong with a project's talents, sorted by (code, talent_id, detail).

    `talents` is the whole catalogue, `active_ids` the talents active on the project,
    `roles_known` the roles the project's agents use (None skips the role check).

    - required_not_active: an active talent requires/includes a catalogued, inactive talent.
    - unknown_edge_target: any talent has an edge of any kind to an id not in the catalogue
      (reported only under this code, never also as required_not_active).
    - requires_cycle: one finding per elementary cycle over requires/includes in the catalogue,
      on its smallest id, detail "a -> b -> a"; at most MAX_REPORTED_CYCLES.
    - unreachable_by_role: an active talent whose non-empty roles share none with roles_known.
    """
    catalogue = {talent.id: talent for talent in talents}
    findings: list[Finding] = []
    for talent in catalogue.values():
        for kind in ("requires", "includes", "recommends"):
            for target in getattr(talent, kind):
                if target not in catalogue:
                    findings.append(
                        Finding(FindingCode.UNKNOWN_EDGE_TARGET, talent.id, f"{kind} {target}")
                    )
                elif kind != "recommends" and talent.id in active_ids and target not in active_ids:
                    detail = f"{kind} {target}, which is not active on the project"
                    findings.append(Finding(FindingCode.REQUIRED_NOT_ACTIVE, talent.id, detail))
        if (
            roles_known is not None
            and talent.id in active_ids
            and talent.roles
            and not set(talent.roles) & set(roles_known)
        ):
            detail = f"roles {sorted(talent.roles)} match none of {sorted(roles_known)}"
            findings.append(Finding(FindingCode.UNREACHABLE_BY_ROLE, talent.id, detail))
    for cycle in _hard_cycles(catalogue):
        path = " -> ".join([*cycle, cycle[0]])
        findings.append(Finding(FindingCode.REQUIRES_CYCLE, cycle[0], path))
    return sorted(findings)


def _hard_cycles(catalogue: Mapping[str, TalentNode]) -> list[list[str]]:
    """Elementary cycles over hard edges, each once, starting at its smallest id."""
    successors = {
        node_id: sorted({t for t in node.hard_edges if t in catalogue})
        for node_id, node in catalogue.items()
    }
    cycles: list[list[str]] = []
    for start in sorted(catalogue):
        # Only nodes above `start` may follow it, so each cycle is found from its minimum only.
        stack = [(start, iter(successors[start]))]
        path = [start]
        on_path = {start}
        while stack:
            if len(cycles) >= MAX_REPORTED_CYCLES:
                return cycles
            _, children = stack[-1]
            child = next(children, None)
            if child is None:
                stack.pop()
                on_path.discard(path.pop())
            elif child == start:
                cycles.append(list(path))
            elif child > start and child not in on_path:
                stack.append((child, iter(successors[child])))
                path.append(child)
                on_path.add(child)
    return cycles


@dataclass(frozen=True)
class EdgeViolation:
    """An invalid edge of a talent being upserted."""

    field: str
    target: str
    description: str


class InvalidEdgesError(ValueError):
    """Raised by `validate_edges`; `violations` names each bad edge."""

    def __init__(self, violations: Sequence[EdgeViolation]) -> None:
        self.violations = tuple(violations)
        super().__init__("; ".join(f"{v.field}: {v.description}" for v in self.violations))


def validate_edges(
    talent_id: str,
    requires: Iterable[str] = (),
    includes: Iterable[str] = (),
    recommends: Iterable[str] = (),
) -> None:
    """Reject self-edges and empty targets; raise InvalidEdgesError listing every violation."""
    violations: list[EdgeViolation] = []
    edges = {"requires": requires, "includes": includes, "recommends": recommends}
    for field, targets in edges.items():
        for target in targets:
            if not target.strip():
                violations.append(EdgeViolation(field, target, "edge target must be a talent id"))
            elif target == talent_id:
                violations.append(EdgeViolation(field, target, f"{talent_id} {field} itself"))
    if violations:
        raise InvalidEdgesError(violations)
