"""Talent selection, the application layer: catalogue, activation, resolution, the doctor.

`resolve_selection` is the pure composition every caller shares (the server and the
calibration benchmark): relevance on (`talent_selection.select`) or off
(`order_without_relevance`), then the closure over hard edges (`talent_graph.requires_closure`),
then the rendered block and the token counts. `TalentService` does the I/O around it: it reads
the project's active talents, builds `ScorableTalent`s (kept in memory by talent version), and
fetches talent vectors from memory, then from `talent_embeddings`, embedding only what neither
holds; so a ResolveTalents call embeds only its task.

Decisions the spec leaves open:

- Candidates are the active talents of the project whose roles are empty or contain the
  request's role (an empty role receives only role-less talents).
- The closure follows hard edges of the kept talents into any talent active on the project,
  whatever its roles: a hard requirement is part of the talent that declares it. Added talents
  follow the kept ones, in discovery order; each names the talent that pulled it in.
  Required talents that are not active are reported as excluded `not_active`.
- The closure applies with relevance off too (its candidates all count as kept).
- A pinned talent (`alwaysApply: true` of a Cursor rule) is served to its roles whatever the
  task, first, reason `pinned`, never scored (so it moves neither the gate nor the margin);
  its tokens are taken from the budget before relevance spends the rest.
- A talent is served as its body, or its summary when the body is empty; its tokens are those
  of what is served.
- With relevance off the model is not used (as in the seed, where the flag alone loads it):
  the task orders the talents by BETA x shared stems, then by id.
- Fused scoring (the default) embeds two texts per talent (`ScorableTalent.text`, `full_text`)
  at upsert, and the shipped unrelated tasks once per process (kept in `talent_embeddings`
  like the talents' vectors); a candidate set's `FusedSpace`, gate calibrated, is built on its
  first call and kept by the set of contents.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import numpy as np
from psycopg import AsyncConnection

from satchel.server.platform.config import TalentSettings
from satchel.server.platform.runtime import Runtime
from satchel.server.platform.storage.pool import autocommit
from satchel.server.talents.domain.fusion import FusedSpace, GateReport, sub_intents
from satchel.server.talents.domain.graph import Finding, FindingCode, TalentNode, diagnose
from satchel.server.talents.domain.graph import requires_closure as close_over_requires
from satchel.server.talents.domain.lexical import FieldIndex, LexicalIndex
from satchel.server.talents.domain.selection import (
    LISTED_EXCLUSIONS,
    CentredSpace,
    Reason,
    ScorableTalent,
    ScoredTalent,
    Scoring,
    SelectionParams,
    order_without_relevance,
    select,
    stems,
    talent_fields,
)
from satchel.server.talents.storage import catalogue as storage
from satchel.server.talents.storage.catalogue import TalentRecord, TalentRef

# Calibrated (floor, beta, margin) per embedding model for the seed's scoring, matched as a
# substring of the model id (lower case); see benchmarks/talents.md (all-mpnet-base-v2:
# benchmarks/models.md). Other models get the seed's values, which were tuned for
# multilingual-e5.
MODEL_DEFAULTS: dict[str, tuple[float, float, float]] = {
    "all-minilm-l6-v2": (0.18, 0.12, 0.30),
    "all-mpnet-base-v2": (0.16, 0.12, 0.30),
}
# The same for hybrid scoring (the floor bounds the plain cosine); other models get the seed's.
HYBRID_MODEL_DEFAULTS: dict[str, tuple[float, float, float]] = {
    "all-minilm-l6-v2": (0.22, 0.12, 0.30),
    "all-mpnet-base-v2": (0.22, 0.12, 0.30),
}
SEED_DEFAULTS: tuple[float, float, float] = (0.18, 0.12, 0.15)
# Fused scoring (the default): talents within this much of the best score are served
# (`talent_fusion`), at most this many; the gate is calibrated, not configured.
FUSED_MARGIN = 4.0
FUSED_MAX_SERVED = 8

COMPILED_OPEN = "<satchel_talents>"
COMPILED_CLOSE = "</satchel_talents>"
OUT_OF_DOMAIN_TEXT = "No specific talent for this task."
CACHE_ENTRIES = 20_000
SPACE_ENTRIES = 64
SNAPSHOT_ENTRIES = 256
TASK_ENTRIES = 1024


def _calibrated(
    table: Mapping[str, tuple[float, float, float]], model_id: str
) -> tuple[float, float, float] | None:
    lowered = model_id.lower()
    return next((values for pattern, values in table.items() if pattern in lowered), None)


def model_defaults(model_id: str, scoring: Scoring = Scoring.SEED) -> tuple[float, float, float]:
    """(floor, beta, margin) calibrated for an embedding model and a scoring, else the seed's."""
    table = HYBRID_MODEL_DEFAULTS if scoring == Scoring.HYBRID else MODEL_DEFAULTS
    return _calibrated(table, model_id) or SEED_DEFAULTS


MULTILINGUAL_MODELS = ("multilingual",)
"""Embedding models whose similarities cross languages, matched as a substring of the model id
(lower case): multilingual-e5-small. With the others (MiniLM, mpnet), fused scoring's gate asks
a task in another language than English to share a word with some talent."""


def is_multilingual(model_id: str) -> bool:
    """Whether the model's similarities cross languages (`MULTILINGUAL_MODELS`)."""
    return any(pattern in model_id.lower() for pattern in MULTILINGUAL_MODELS)


def default_params(settings: TalentSettings, model_id: str) -> SelectionParams:
    """The server's selection parameters: SATCHEL_TALENT_* when set, else fused scoring with
    its gate calibrated per candidate set, or the model's values for the other scorings."""
    scoring = Scoring(settings.scoring or Scoring.FUSED)
    if scoring == Scoring.FUSED:
        floor, beta, margin = None, SEED_DEFAULTS[1], FUSED_MARGIN
    else:
        floor, beta, margin = model_defaults(model_id, scoring)
    return SelectionParams(
        floor=floor if settings.floor is None else settings.floor,
        beta=beta if settings.beta is None else settings.beta,
        margin=margin if settings.margin is None else settings.margin,
        budget_tokens=settings.budget_tokens,
        scoring=scoring,
        text_weight=settings.text_weight,
        max_served=FUSED_MAX_SERVED if settings.max_served is None else settings.max_served,
    )


UNRELATED_TASKS = Path(__file__).with_name("unrelated_tasks.json")
"""Requests that need no talent, in six languages, shipped to calibrate the out-of-domain gate
of each candidate set (`talent_fusion`)."""


@functools.cache
def unrelated_tasks() -> tuple[str, ...]:
    """The texts of the shipped unrelated tasks."""
    document = json.loads(UNRELATED_TASKS.read_text(encoding="utf-8"))
    return tuple(task["text"] for task in document["tasks"])


def scorable(record: TalentRecord) -> ScorableTalent:
    """The talent as selection sees it; what is served is the body, else the summary (and
    the input schema of a tool)."""
    return ScorableTalent.build(
        id=record.id,
        name=record.name,
        summary=record.summary,
        body=record.body,
        tags=record.tags,
        triggers=record.triggers,
        task_types=record.task_types,
        pinned=record.pinned,
        input_schema=record.input_schema,
    )


def graph_node(talent: TalentRecord | TalentRef) -> TalentNode:
    """The talent as the dependency graph sees it."""
    return TalentNode(
        id=talent.id,
        requires=tuple(talent.requires),
        includes=tuple(talent.includes),
        recommends=tuple(talent.recommends),
        roles=tuple(talent.roles),
    )


def text_digest(passage_prefix: str, text: str) -> str:
    """Cache key of a talent vector: sha256 of the exact text embedded (prefix included)."""
    return hashlib.sha256((passage_prefix + text).encode("utf-8")).hexdigest()


@dataclass(slots=True)
class ResolvedTalent:
    """One decision of a resolution; `required_by` names the talent whose edge pulled it in."""

    id: str
    name: str
    reason: str
    score: float = 0.0
    similarity: float = 0.0
    stem_hits: int = 0
    tokens: int = 0
    required_by: str = ""
    text_rank: float = 0.0


@dataclass(frozen=True)
class Resolution:
    """What ResolveTalents answers: selected talents in serving order, excluded ones, the block."""

    selected: tuple[ResolvedTalent, ...]
    excluded: tuple[ResolvedTalent, ...]
    out_of_domain: bool
    note: str
    compiled: str
    tokens_selected: int
    tokens_candidates: int
    relevance: bool
    params: SelectionParams
    gate: GateReport | None = None
    served: tuple[ScorableTalent, ...] = ()  # the selected talents themselves, in order
    excluded_unlisted: int = 0

    @property
    def selected_ids(self) -> list[str]:
        return [talent.id for talent in self.selected]


def render_compiled(talents: Sequence[ScorableTalent], out_of_domain: bool) -> str:
    """The block an agent receives: each talent's body under a heading with its name.

    Nothing selected: a note when the task is out of domain, else an empty string.
    """
    if talents:
        sections = [f"## {talent.name}\n{_body(talent)}".rstrip() for talent in talents]
        return "\n".join([COMPILED_OPEN, "\n\n".join(sections), COMPILED_CLOSE])
    if out_of_domain:
        return "\n".join([COMPILED_OPEN, OUT_OF_DOMAIN_TEXT, COMPILED_CLOSE])
    return ""


def _heading_key(text: str) -> str:
    return "".join(ch for ch in text.casefold() if ch.isalnum())


def _body(talent: ScorableTalent) -> str:
    """A talent's body without a first heading that only repeats its name (a SKILL.md or a rule
    file often opens with `# Name`): the compiled block already heads it `## Name`."""
    body = talent.body.strip()
    first, _, rest = body.partition("\n")
    if first.startswith("#") and _heading_key(first.lstrip("#")) == _heading_key(talent.name):
        return rest.strip()
    return body


def _resolved(decision: ScoredTalent, name: str, reason: str | None = None) -> ResolvedTalent:
    return ResolvedTalent(
        id=decision.id,
        name=name,
        reason=str(reason or decision.reason),
        score=decision.score,
        similarity=decision.similarity,
        stem_hits=decision.stem_hits,
        tokens=decision.tokens,
        text_rank=decision.text_rank,
    )


def _discoverers(order: Iterable[str], graph: Mapping[str, TalentNode]) -> dict[str, str]:
    """For each hard-edge target, the first talent (in closure order) declaring it."""
    parents: dict[str, str] = {}
    for talent_id in order:
        node = graph.get(talent_id)
        for target in node.hard_edges if node else ():
            parents.setdefault(target, talent_id)
    return parents


def resolve_selection(
    candidates: Sequence[ScorableTalent],
    talent_vectors: np.ndarray | CentredSpace | FusedSpace | None,
    task_vector: np.ndarray | None,
    task: str,
    *,
    relevance: bool,
    params: SelectionParams,
    graph: Mapping[str, TalentNode] | None = None,
    servable: Mapping[str, ScorableTalent] | None = None,
    pinned: Sequence[ScorableTalent] = (),
    lexical: LexicalIndex | None = None,
    tokens_candidates: int | None = None,
    part_vectors: np.ndarray | None = None,
) -> Resolution:
    """Serve the pinned talents, select among candidates, close over hard edges, render. Pure.

    `talent_vectors` row i belongs to `candidates[i]` (or their precomputed `CentredSpace`, or
    their `FusedSpace` in fused scoring); vectors may be None with relevance off (order by stem
    hits only). `pinned` talents (none of
    them among `candidates`) come first, whatever the task, and their tokens are taken from the
    budget first. `graph` holds the edges of the project's active talents and `servable` every
    active talent, pinned ones and candidates included (None: those alone); the closure adds
    only servable talents.
    `lexical`: the candidates' BM25 index for hybrid scoring (built when None).
    `tokens_candidates`: the tokens of pinned talents and candidates, when already counted.
    `part_vectors`: a vector per sub-intent of the task (fused scoring; else scored by words).
    """
    graph = graph or {}
    if servable is None:
        servable = {talent.id: talent for talent in [*pinned, *candidates]}
    task_stems = stems(task)
    pinned_tokens = sum(talent.tokens for talent in pinned)
    left = replace(params, budget_tokens=max(1, params.budget_tokens - pinned_tokens))
    if relevance:
        if talent_vectors is None or task_vector is None:
            raise ValueError("relevance needs the talent and task vectors")
        result = select(
            candidates,
            talent_vectors,
            task_vector,
            task_stems,
            left,
            task=task,
            lexical=lexical,
            part_vectors=part_vectors,
        )
    else:
        vectors = None if isinstance(talent_vectors, FusedSpace) else talent_vectors
        result = order_without_relevance(
            candidates,
            task_stems,
            vectors,
            task_vector if vectors is not None else None,
            beta=params.beta,
        )

    kept_ids = [*(talent.id for talent in pinned), *result.kept_ids]
    closure = close_over_requires(kept_ids, graph, servable.keys())
    parents = _discoverers([*kept_ids, *closure.added], graph)
    scored = {decision.id: decision for decision in result.excluded}

    selected = [
        ResolvedTalent(talent.id, talent.name, str(Reason.PINNED), tokens=talent.tokens)
        for talent in pinned
    ]
    selected += [_resolved(d, servable[d.id].name) for d in result.kept]
    for talent_id in closure.added:
        talent = servable[talent_id]
        decision = scored.pop(talent_id, None)
        base = (
            _resolved(decision, talent.name, Reason.REQUIRES_CLOSURE)
            if decision is not None
            else ResolvedTalent(talent_id, talent.name, str(Reason.REQUIRES_CLOSURE))
        )
        selected.append(replace(base, tokens=talent.tokens, required_by=parents[talent_id]))
    ranked_out = [d for d in result.excluded if d.id in scored]
    excluded = [_resolved(d, servable[d.id].name) for d in ranked_out[:LISTED_EXCLUSIONS]]
    excluded += [
        ResolvedTalent(talent_id, talent_id, str(Reason.NOT_ACTIVE), required_by=parents[talent_id])
        for talent_id in closure.missing
    ]

    served = [servable[talent.id] for talent in selected]
    return Resolution(
        selected=tuple(selected),
        excluded=tuple(excluded),
        excluded_unlisted=result.unlisted + max(0, len(ranked_out) - LISTED_EXCLUSIONS),
        out_of_domain=result.out_of_domain,
        note=result.note,
        compiled=render_compiled(served, result.out_of_domain),
        tokens_selected=sum(talent.tokens for talent in served),
        tokens_candidates=(
            sum(talent.tokens for talent in [*pinned, *candidates])
            if tokens_candidates is None
            else tokens_candidates
        ),
        relevance=relevance,
        params=params,
        gate=result.gate,
        served=tuple(served),
    )


def is_candidate(roles: Sequence[str], role: str) -> bool:
    """A talent may go to an agent of `role` when its roles are empty or contain it."""
    return not roles or role in roles


K = TypeVar("K")
V = TypeVar("V")


class _Lru(OrderedDict[K, V]):
    """A small least-recently-used map."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def lookup(self, key: K) -> V | None:
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def put(self, key: K, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


@dataclass(frozen=True)
class _Prepared:
    """A talent version ready for selection: its ScorableTalent and the vector cache keys of
    its text and full text."""

    talent: ScorableTalent
    digest: str
    full_digest: str


@dataclass
class _Snapshot:
    """A project's active talents at one version, with their graph and candidates per role."""

    version: str
    refs: list[TalentRef]
    prepared: dict[str, _Prepared]
    graph: dict[str, TalentNode]
    servable: dict[str, ScorableTalent]
    by_role: dict[str, _Offer]

    def offer(self, role: str) -> _Offer:
        """What an agent of `role` may receive: active talents whose roles are empty or contain
        `role`, by id, computed once per role and version."""
        found = self.by_role.get(role)
        if found is None:
            offered = sorted(
                (
                    self.prepared[ref.id]
                    for ref in self.refs
                    if ref.id in self.prepared and is_candidate(ref.roles, role)
                ),
                key=lambda p: p.talent.id,
            )
            found = _Offer(
                pinned=[p.talent for p in offered if p.talent.pinned],
                candidates=[p for p in offered if not p.talent.pinned],
            )
            self.by_role[role] = found
        return found


@dataclass
class _Offer:
    """A role's pinned talents and candidates at one version; `key` names the candidates'
    contents (their cached space's key), `talents` their ScorableTalents, `tokens` the tokens of
    all of them."""

    pinned: list[ScorableTalent]
    candidates: list[_Prepared]

    def __post_init__(self) -> None:
        self.talents = [p.talent for p in self.candidates]
        self.key = tuple(p.digest for p in self.candidates)
        self.tokens = sum(talent.tokens for talent in [*self.pinned, *self.talents])


class TalentService:
    """The catalogue, activations, ResolveTalents and the doctor over one Runtime.

    In-memory caches for the life of the process (all bounded, least recently used out):
    prepared talents by (id, updated_at), talent vectors by content digest, centred candidate
    spaces by their digests, project snapshots checked against a one-row version digest on
    every call, and the vectors of recent tasks.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.model_id = runtime.embedder.model_id
        self.defaults = default_params(runtime.settings.talents, self.model_id)
        self.configured_roles = tuple(
            role.strip() for role in runtime.settings.talents.roles.split(",") if role.strip()
        )
        self._prepared: _Lru[tuple[str, datetime | None], _Prepared] = _Lru(CACHE_ENTRIES)
        self._vectors: _Lru[str, np.ndarray] = _Lru(CACHE_ENTRIES)
        self._spaces: _Lru[tuple[str, ...], tuple[CentredSpace | FusedSpace, LexicalIndex | None]]
        self._spaces = _Lru(SPACE_ENTRIES)
        self._tasks: _Lru[tuple[str, bool], tuple[np.ndarray, np.ndarray | None]] = _Lru(
            TASK_ENTRIES
        )
        self._snapshots: _Lru[str, _Snapshot] = _Lru(SNAPSHOT_ENTRIES)
        self._roles_seen: set[tuple[str, str]] = set()
        self._unrelated: np.ndarray | None = None

    # --- catalogue ------------------------------------------------------------------------

    async def upsert(self, record: TalentRecord) -> tuple[TalentRecord, bool]:
        """Create or replace a talent; its vector is computed now (once per content)."""
        prepared = self._prepare(record)
        async with self.runtime.pool.connection() as conn:
            await self._vectors_for(conn, self._texts([prepared]))
            return await storage.upsert_talent(conn, record)

    async def list_talents(
        self,
        project_id: str = "",
        active_only: bool = False,
        *,
        after_id: str | None = None,
        limit: int | None = None,
    ) -> tuple[list[TalentRecord], list[str]]:
        """A page of the catalogue (or of a project's active set), by id after `after_id`, and
        the ids of that page active on the project."""
        async with self.runtime.pool.connection() as conn:
            talents = await storage.list_talents(
                conn, project_id or None, active_only, after_id=after_id, limit=limit
            )
            among = [t.id for t in talents]
            active = await storage.active_talent_ids(conn, project_id, among) if project_id else []
        return talents, active

    async def set_activation(self, project_id: str, talent_id: str, active: bool) -> bool:
        """Turn a talent on or off for a project; False when the talent is unknown."""
        async with self.runtime.pool.connection() as conn:
            return await storage.set_activation(conn, project_id, talent_id, active)

    # --- resolution -----------------------------------------------------------------------

    def params(
        self,
        *,
        floor: float | None = None,
        beta: float | None = None,
        margin: float | None = None,
        budget_tokens: int | None = None,
        max_served: int | None = None,
    ) -> SelectionParams:
        """The server's defaults with the request's overrides."""
        d = self.defaults
        return replace(
            d,
            floor=d.floor if floor is None else floor,
            beta=d.beta if beta is None else beta,
            margin=d.margin if margin is None else margin,
            budget_tokens=d.budget_tokens if budget_tokens is None else budget_tokens,
            max_served=d.max_served if max_served is None else max_served,
        )

    def default_relevance(self) -> bool:
        """True when the server's default mode is `embeddings`."""
        return self.runtime.settings.talents.relevance == "embeddings"

    async def resolve(
        self, project_id: str, role: str, task: str, *, relevance: bool, params: SelectionParams
    ) -> Resolution:
        """Select the talents an agent of `role` receives on `project_id` for `task`."""
        # The task is embedded while the database is read (agents often repeat a task: the
        # last TASK_ENTRIES task vectors are kept).
        wants_task = relevance and bool(task.strip())
        # Fused scoring scores each sub-intent with a vector pooled from the task's own run.
        pooled = (
            params.scoring == Scoring.FUSED
            and self.runtime.settings.talents.sub_intents == "pooled"
        )
        key = (task, pooled)
        cached_task = self._tasks.lookup(key) if wants_task else None
        parts = sub_intents(task) if pooled else []
        task_embedding = (
            asyncio.ensure_future(self.runtime.embed_query_parts(task, parts))
            if wants_task and cached_task is None
            else None
        )
        try:
            async with autocommit(self.runtime.pool) as conn:
                snapshot = await self._snapshot(conn, project_id)
                offer = snapshot.offer(role)
                wants_vectors = task_embedding is not None or cached_task is not None
                space, lexical = (
                    await self._space_for(conn, offer.candidates, offer.key)
                    if wants_vectors
                    else (None, None)
                )
                if role and (project_id, role) not in self._roles_seen:
                    await storage.record_role(conn, project_id, role)
                    self._roles_seen.add((project_id, role))
            task_vector, part_vectors = cached_task or (None, None)
            if task_embedding is not None:
                task_vector, part_vectors = await task_embedding
                self._tasks.put(key, (task_vector, part_vectors))
        finally:
            if task_embedding is not None and not task_embedding.done():
                task_embedding.cancel()
        return resolve_selection(
            offer.talents,
            space,
            task_vector,
            task,
            relevance=relevance,
            params=params,
            graph=snapshot.graph,
            servable=snapshot.servable,
            pinned=offer.pinned,
            lexical=lexical,
            tokens_candidates=offer.tokens,
            part_vectors=part_vectors,
        )

    async def _snapshot(self, conn: AsyncConnection, project_id: str) -> _Snapshot:
        """The project's active talents, re-read only when their version changed."""
        version = await storage.active_version(conn, project_id)
        snapshot = self._snapshots.lookup(project_id)
        if snapshot is not None and snapshot.version == version:
            return snapshot
        # Read after the version: at worst newer than it, and refreshed on the next call.
        refs = await storage.talent_refs(conn, project_id)
        prepared = await self._prepared_talents(conn, refs)
        fresh = _Snapshot(
            version=version,
            refs=refs,
            prepared=prepared,
            graph={ref.id: graph_node(ref) for ref in refs},
            servable={talent_id: p.talent for talent_id, p in prepared.items()},
            by_role={},
        )
        self._snapshots.put(project_id, fresh)
        return fresh

    def _prepare(self, record: TalentRecord) -> _Prepared:
        talent = scorable(record)
        prefix = self.runtime.embedder.passage_prefix
        return _Prepared(
            talent, text_digest(prefix, talent.text), text_digest(prefix, talent.full_text)
        )

    def _texts(self, talents: Sequence[_Prepared]) -> dict[str, str]:
        """The passages the server's scoring embeds for these talents, by digest."""
        texts = {p.digest: p.talent.text for p in talents}
        if self.defaults.scoring == Scoring.FUSED:
            texts.update((p.full_digest, p.talent.full_text) for p in talents)
        return texts

    async def _prepared_talents(
        self, conn: AsyncConnection, refs: Sequence[TalentRef]
    ) -> dict[str, _Prepared]:
        """Prepared talents by id for these versions, reading only the ones not in memory."""
        found: dict[str, _Prepared] = {}
        missing: list[str] = []
        for ref in refs:
            hit = self._prepared.lookup((ref.id, ref.updated_at))
            if hit is None:
                missing.append(ref.id)
            else:
                found[ref.id] = hit
        if missing:
            for record in await storage.fetch_talents(conn, missing):
                prepared = self._prepare(record)
                self._prepared.put((record.id, record.updated_at), prepared)
                found[record.id] = prepared
        # A talent updated between the two reads is served in its newer version.
        return found

    async def _space_for(
        self, conn: AsyncConnection, talents: Sequence[_Prepared], key: tuple[str, ...]
    ) -> tuple[CentredSpace | FusedSpace, LexicalIndex | None]:
        """What the server's scoring needs of a candidate set, computed once per set of
        contents (`key`): its FusedSpace (gate calibrated), else its CentredSpace and BM25
        index."""
        found = self._spaces.lookup(key)
        if found is not None:
            return found
        vectors = await self._vectors_for(conn, self._texts(talents))
        dimension = self.runtime.embedder.dimension

        def stacked(digests: list[str]) -> np.ndarray:
            rows = [vectors[d] for d in digests]
            return np.stack(rows) if rows else np.zeros((0, dimension), dtype=np.float32)

        space: tuple[CentredSpace | FusedSpace, LexicalIndex | None]
        if self.defaults.scoring == Scoring.FUSED:
            fields = [p.talent.fields or talent_fields(p.talent.name) for p in talents]
            fused = FusedSpace.of(
                stacked([p.digest for p in talents]),
                stacked([p.full_digest for p in talents]),
                FieldIndex.of(fields),
                await self._unrelated_tasks(conn),
                self.runtime.settings.talents.gate_quantile,
                multilingual=is_multilingual(self.model_id),
                unrelated_texts=unrelated_tasks(),
            )
            space = (fused, None)
        else:
            centred = CentredSpace.of(stacked([p.digest for p in talents]))
            space = (centred, LexicalIndex.of([p.talent.text for p in talents]))
        self._spaces.put(key, space)
        return space

    async def _unrelated_tasks(self, conn: AsyncConnection) -> np.ndarray:
        """The vectors of the shipped unrelated tasks, embedded once per model (kept with the
        talent vectors): what calibrates the out-of-domain gate."""
        if self._unrelated is None:
            prefix = self.runtime.embedder.query_prefix
            texts = {text_digest(prefix, text): text for text in unrelated_tasks()}
            vectors = await self._vectors_for(conn, texts, query=True)
            self._unrelated = np.stack([vectors[digest] for digest in texts])
        return self._unrelated

    async def _vectors_for(
        self, conn: AsyncConnection, texts: Mapping[str, str], *, query: bool = False
    ) -> dict[str, np.ndarray]:
        """Vectors of these texts by digest: memory, then database, then model (passages, or
        queries with `query`)."""
        known: dict[str, np.ndarray] = {}
        for digest in texts:
            vector = self._vectors.lookup(digest)
            if vector is not None:
                known[digest] = vector
        wanted = [digest for digest in texts if digest not in known]
        if wanted:
            stored = await storage.cached_vectors(conn, wanted, self.model_id)
            missing = {digest: texts[digest] for digest in wanted if digest not in stored}
            if missing:
                embedder = self.runtime.embedder
                prefix = embedder.query_prefix if query else embedder.passage_prefix
                fresh = await self.runtime.embed([prefix + text for text in missing.values()])
                computed = dict(zip(missing, fresh, strict=True))
                await storage.store_vectors(conn, computed, self.model_id)
                stored.update(computed)
            for digest, vector in stored.items():
                self._vectors.put(digest, vector)
            known.update(stored)
        return known

    # --- the doctor -----------------------------------------------------------------------

    async def diagnose(
        self, project_id: str, roles: Sequence[str] = ()
    ) -> tuple[list[Finding], list[str]]:
        """Findings about a project's active talents, and the roles the role check used.

        Roles known = the request's roles + SATCHEL_TALENT_ROLES + roles that called
        ResolveTalents on the project; none known skips the role check. Findings are kept
        when they concern a talent active on the project (a cycle: when it passes through one).
        """
        async with self.runtime.pool.connection() as conn:
            refs = await storage.talent_refs(conn)
            active = set(await storage.active_talent_ids(conn, project_id))
            seen = await storage.project_roles(conn, project_id)
        known = sorted({*roles, *self.configured_roles, *seen})
        findings = diagnose([graph_node(ref) for ref in refs], active, known or None)
        return [f for f in findings if _concerns(f, active)], known


def _concerns(finding: Finding, active: set[str]) -> bool:
    if finding.code == FindingCode.REQUIRES_CYCLE:
        return any(part in active for part in finding.detail.split(" -> "))
    return finding.talent_id in active
