"""The LoCoMo harness: load conversations through the public gRPC API, ask every question as a
context call, measure evidence coverage, and compare with baselines packed into the same budget.
REALTALK's conversations (`realtalk`, same layout, no observations) run through it too.

Loading: each turn becomes an event (`conversation.message`, payload `{speaker, text}`,
`occurred_at` from its session's date, turns 15 s apart) and each observation a fact whose
statement is the observation and whose `source_event_ids` are its turns' events; one subject per
conversation, one fresh project per run.

The clock. The sessions are dated 2022-2024, and recency is measured from the instant of the
call. A point-in-time call (`as_of` at the end of the conversation) cannot be used: satchel's
`as_of` is bitemporal and shows only what was *recorded* by then, and everything here is recorded
today. With `clock="end"` (the default) each conversation's timeline is translated so that its
last turn is the moment of loading (every interval between turns is kept) and questions are
asked right after, without `as_of`: recency then weighs the last sessions as it would for an
agent asked at the end of the conversation. `clock="real"` keeps the real dates; every fact is
then years old and the recency term is ~0 for all.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
import structlog
from google.protobuf import struct_pb2, timestamp_pb2

from satchel.server.embedding.port import Embedder
from satchel.server.evaluation import datasets, locomo
from satchel.server.evaluation.locomo import CATEGORIES, Conversation, Question
from satchel.server.evaluation.metrics import (
    Bm25,
    Outcome,
    covered_turns,
    pack_ranked,
    rank,
    recall_at,
    summarise,
)
from satchel.server.memory.domain.rendering import excerpt
from satchel.server.platform.config import Settings
from satchel.server.platform.tokens import estimate_tokens
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

log = structlog.get_logger(__name__)
T = TypeVar("T")

EVENT_KIND = "conversation.message"
FACT_PREDICATE = "observation"
LOAD_BATCH = 500
"""Events or facts per batch call while loading."""

EPISODE_EXCERPT_CHARS = 600
"""Baselines pack each turn as satchel serves an episode (cut to this many characters)."""

DELETE_TIMEOUT_S = 120.0
"""How long deleting the run's project may take (every event, fact and trace of it)."""

RECALL_AT_K = (5, 10, 25, 50)
CLOCKS = ("end", "real")
SATCHEL, VECTOR, BM25 = "satchel", "vector", "bm25"
SYSTEM_LABELS = {
    SATCHEL: "satchel",
    VECTOR: "vector top-k over turns",
    BM25: "BM25 over turns (stemmed)",
}

PUBLISHED: dict[str, Any] = {
    "source": "../shared/data/SOURCES.md (full LoCoMo set, 10 conversations)",
    "dragon_recall_at_k": {"5": 0.567, "10": 0.662, "25": 0.767, "50": 0.827},
    "bm25_recall_at_5": 0.522,
    "bm25_packed_900_tokens": 0.662,
    "bm25_packed_900_tokens_without_adversarial": 0.640,
}
"""Reference figures: LoCoMo paper Table 3 (DRAGON over turns) and BM25 computed elsewhere."""


@dataclass(frozen=True)
class EvalOptions:
    """What to evaluate and how."""

    data: Path = field(default_factory=lambda: locomo.beside_checkout(locomo.DEFAULT_DATA))
    dataset: str = locomo.NAME
    """LoCoMo or REALTALK (`datasets.load`): only LoCoMo's report carries published figures."""
    errata: Path | None = None
    conversations: tuple[str, ...] = ()
    limit_questions: int | None = None
    clock: str = "end"
    baselines: bool = True
    details: bool = False


@dataclass
class LoadedConversation:
    """A conversation as stored in satchel: its subject, and which turn each event is."""

    conversation: Conversation
    subject_id: str
    turn_of_event: dict[str, str] = field(default_factory=dict)
    turn_text: dict[str, str] = field(default_factory=dict)


@dataclass
class QuestionRecord:
    """One question and what every system covered for it."""

    conversation: str
    question: Question
    outcomes: dict[str, Outcome]
    ranked: dict[str, list[str]] = field(default_factory=dict)


def _timestamp(value: datetime) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(value)
    return stamp


def clock_shift(conversation: Conversation, clock: str, now: datetime) -> timedelta:
    """How far a conversation's dates move: to end at `now` ("end"), or not at all ("real")."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}")
    return now - conversation.ends_at if clock == "end" else timedelta(0)


async def load_conversation(
    channel: grpc.aio.Channel,
    project_id: str,
    conversation: Conversation,
    shift: timedelta,
) -> LoadedConversation:
    """Record its turns as events, then its observations as facts sourced from their turns."""
    memory = memory_pb2_grpc.MemoryServiceStub(channel)
    loaded = LoadedConversation(conversation, subject_id=conversation.sample_id)
    event_of_turn: dict[str, str] = {}
    occurred: dict[str, datetime] = {}
    requests = []
    for turn in conversation.turns:
        # The turn id is bookkeeping: kept out of the payload, so out of the served text.
        payload = struct_pb2.Struct()
        payload.update({"speaker": turn.speaker, "text": turn.text})
        occurred[turn.dia_id] = turn.occurred_at + shift
        requests.append(
            memory_pb2.RecordEventRequest(
                project_id=project_id,
                subject_id=loaded.subject_id,
                kind=EVENT_KIND,
                payload=payload,
                occurred_at=_timestamp(occurred[turn.dia_id]),
                idempotency_key=f"locomo:{conversation.sample_id}:{turn.dia_id}",
            )
        )
    for start in range(0, len(requests), LOAD_BATCH):
        batch = requests[start : start + LOAD_BATCH]
        turns = conversation.turns[start : start + LOAD_BATCH]
        reply = await memory.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=batch))
        for turn, event in zip(turns, reply.events, strict=True):
            dia_id = turn.dia_id
            event_of_turn[dia_id] = event.id
            loaded.turn_of_event[event.id] = dia_id
            loaded.turn_text[dia_id] = event.text
    session_start: dict[int, datetime] = {}
    for turn in conversation.turns:
        session_start.setdefault(turn.session, occurred[turn.dia_id])
    facts = []
    for number, observation in enumerate(conversation.observations):
        sources = [event_of_turn[t] for t in observation.turn_ids]
        valid_from = min(
            (occurred[t] for t in observation.turn_ids),
            default=session_start.get(observation.session),
        )
        facts.append(
            memory_pb2.AssertFactRequest(
                project_id=project_id,
                subject_id=loaded.subject_id,
                predicate=FACT_PREDICATE,
                value=struct_pb2.Value(string_value=observation.text),
                statement=observation.text,
                valid_from=_timestamp(valid_from) if valid_from else None,
                source_event_ids=sources,
                idempotency_key=f"locomo:{conversation.sample_id}:obs{number}",
            )
        )
    for start in range(0, len(facts), LOAD_BATCH):
        await memory.BatchAssertFacts(
            memory_pb2.BatchAssertFactsRequest(requests=facts[start : start + LOAD_BATCH])
        )
    return loaded


async def ask(
    channel: grpc.aio.Channel, project_id: str, loaded: LoadedConversation, question: Question
) -> tuple[Outcome, int]:
    """One context call with the server's default budget; (outcome, the packet's budget)."""
    stub = context_pb2_grpc.ContextServiceStub(channel)
    started = time.perf_counter()
    reply = await stub.AssembleContext(
        context_pb2.AssembleContextRequest(
            project_id=project_id, subject_id=loaded.subject_id, query=question.text
        )
    )
    latency = (time.perf_counter() - started) * 1000
    packet = reply.packet
    covered = covered_turns(
        (e.event_id for e in packet.episodes),
        (f.source_event_ids for f in packet.facts),
        loaded.turn_of_event,
    )
    return Outcome(covered, packet.tokens_used, latency, reply.trace_id), packet.budget_tokens


def _embed_sorted(embedder: Embedder, texts: Sequence[str]) -> np.ndarray:
    """Embed texts in length order (less padding per model batch), rows in input order."""
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    vectors = embedder.embed([texts[i] for i in order])
    result = np.empty_like(vectors)
    result[order] = vectors
    return result


def baseline_rankings(
    embedder: Embedder, loaded: LoadedConversation, questions: Sequence[Question]
) -> tuple[dict[str, list[list[str]]], dict[str, int]]:
    """Turn rankings of each baseline for each question, and the tokens of each turn.

    Blocking (model and CPU): call it off the event loop.
    """
    turn_ids = [t.dia_id for t in loaded.conversation.turns]
    texts = [excerpt(loaded.turn_text[t], EPISODE_EXCERPT_CHARS) for t in turn_ids]
    tokens = {t: estimate_tokens(text) for t, text in zip(turn_ids, texts, strict=True)}
    turn_vectors = _embed_sorted(embedder, [embedder.passage_prefix + t for t in texts])
    query_vectors = _embed_sorted(embedder, [embedder.query_prefix + q.text for q in questions])
    bm25 = Bm25(texts)
    rankings: dict[str, list[list[str]]] = {VECTOR: [], BM25: []}
    for i, question in enumerate(questions):
        rankings[VECTOR].append(rank(turn_vectors @ query_vectors[i], turn_ids))
        rankings[BM25].append(rank(bm25.scores(question.text), turn_ids))
    return rankings, tokens


async def evaluate_on(
    channel: grpc.aio.Channel,
    conversations: Sequence[Conversation],
    options: EvalOptions,
    embedder: Embedder | None,
    *,
    project_id: str | None = None,
    progress: Any = None,
) -> dict[str, Any]:
    """Load, ask and measure on a server reachable through `channel`; the report as JSON.

    `embedder` (the server's model, loaded locally) is needed for the vector baseline only.
    """
    project_id = project_id or f"locomo-eval-{uuid.uuid4().hex[:10]}"
    records: list[QuestionRecord] = []
    budget = 0
    timings: dict[str, float] = {"load_s": 0.0, "questions_s": 0.0, "baselines_s": 0.0}
    for conversation in conversations:
        started = time.perf_counter()
        shift = clock_shift(conversation, options.clock, datetime.now(UTC))
        loaded = await load_conversation(channel, project_id, conversation, shift)
        timings["load_s"] += time.perf_counter() - started
        started = time.perf_counter()
        conversation_records = []
        for question in conversation.questions:
            outcome, budget = await ask(channel, project_id, loaded, question)
            conversation_records.append(
                QuestionRecord(conversation.sample_id, question, {SATCHEL: outcome})
            )
        timings["questions_s"] += time.perf_counter() - started
        if progress:
            progress(f"{conversation.sample_id}: {len(conversation.questions)} questions asked")
        if options.baselines and embedder is not None and conversation.questions:
            started = time.perf_counter()
            rankings, tokens = await asyncio.to_thread(
                baseline_rankings, embedder, loaded, conversation.questions
            )
            for system, ranked_lists in rankings.items():
                for record, ranked in zip(conversation_records, ranked_lists, strict=True):
                    packed, used = pack_ranked(ranked, tokens, budget)
                    record.outcomes[system] = Outcome(frozenset(packed), used)
                    record.ranked[system] = ranked[: max(RECALL_AT_K)]
            timings["baselines_s"] += time.perf_counter() - started
        records.extend(conversation_records)
    return build_report(records, options, budget, project_id, timings)


def _recall_at_k(records: Sequence[QuestionRecord], system: str, errata: bool) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for k in RECALL_AT_K:
        hit = total = 0
        for record in records:
            h, t = recall_at(record.ranked.get(system, []), record.question.gold(errata), k)
            hit, total = hit + h, total + t
        result[str(k)] = round(hit / total, 4) if total else None
    return result


def build_report(
    records: Sequence[QuestionRecord],
    options: EvalOptions,
    budget: int,
    project_id: str,
    timings: dict[str, float],
) -> dict[str, Any]:
    """Summaries per evidence view (original, and errata when applied), system and category."""
    systems = [s for s in (SATCHEL, VECTOR, BM25) if records and s in records[0].outcomes]
    views = {"original": False}
    if options.errata is not None:
        views["errata"] = True
    evidence: dict[str, Any] = {}
    for view, errata in views.items():
        evidence[view] = {}
        for system in systems:
            rows = [
                (r.question.category, r.question.gold(errata), r.outcomes[system]) for r in records
            ]
            summaries = summarise(rows, CATEGORIES, excluded_from_overall=(locomo.ADVERSARIAL,))
            evidence[view][system] = {name: s.to_json() for name, s in summaries.items()}
    recall_k = {
        view: {s: _recall_at_k(records, s, errata) for s in systems if s != SATCHEL}
        for view, errata in views.items()
    }
    report: dict[str, Any] = {
        "run": {
            "dataset": options.dataset,
            "data": str(options.data),
            "errata": str(options.errata) if options.errata else None,
            "errata_corrected_questions": sum(
                1 for r in records if r.question.corrected_evidence is not None
            ),
            "conversations": sorted({r.conversation for r in records}),
            "questions": len(records),
            "budget_tokens": budget,
            "clock": options.clock,
            "project_id": project_id,
            "timings_s": {k: round(v, 1) for k, v in timings.items()},
        },
        "systems": {s: SYSTEM_LABELS[s] for s in systems},
        "evidence": evidence,
        "recall_at_k": recall_k,
    }
    if options.dataset == locomo.NAME:
        report["published"] = PUBLISHED
    if options.details:
        report["questions"] = [_details(r) for r in records]
    return report


def _details(record: QuestionRecord) -> dict[str, Any]:
    question = record.question
    return {
        "question_id": question.question_id,
        "conversation": record.conversation,
        "category": question.category,
        "question": question.text,
        "evidence": list(question.evidence),
        "corrected_evidence": (
            list(question.corrected_evidence) if question.corrected_evidence is not None else None
        ),
        "trace_id": record.outcomes[SATCHEL].trace_id,
        "latency_ms": round(record.outcomes[SATCHEL].latency_ms or 0.0, 1),
        "tokens": {s: o.tokens for s, o in record.outcomes.items()},
        "covered": {s: sorted(o.covered) for s, o in record.outcomes.items()},
    }


async def finish(cleanup: Awaitable[T]) -> T:
    """Await `cleanup` to its end even when the task is cancelled meanwhile (Ctrl-C reaches
    `asyncio.run` as a cancellation, possibly as cleanup starts), then raise the cancellation."""
    task = asyncio.ensure_future(cleanup)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return task.result()


async def forget(address: str, project_id: str, progress: Any = None) -> bool:
    """Delete a project the harness loaded (DeleteProject through the SDK); False when that
    fails, with a message naming the project left behind."""
    from satchel.client import AsyncSatchelClient, SatchelError

    try:
        async with AsyncSatchelClient(address, timeout=DELETE_TIMEOUT_S) as client:
            await client.delete_project(project_id)
    except SatchelError as exc:
        message = f"could not delete project {project_id} on {address} ({exc}): it is left there"
        if progress:
            progress(message)
        else:
            log.warning(
                "locomo_project_left", project_id=project_id, address=address, error=str(exc)
            )
        return False
    return True


async def _evaluate_at(
    address: str,
    conversations: Sequence[Conversation],
    options: EvalOptions,
    embedder: Embedder | None,
    *,
    project_id: str,
    progress: Any,
    delete: bool,
    kept_in: str | None = None,
) -> tuple[dict[str, Any], bool]:
    """`evaluate_on` through a channel to `address`; with `delete`, the project is deleted
    afterwards, on an error or a cancellation too; with `kept_in` (where it stays), the
    project's id is reported through `progress`. (report, whether it was deleted)."""
    deleted = False
    if progress and (delete or kept_in):
        progress(f"loading into project {project_id} on {address}")
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            report = await evaluate_on(
                channel, conversations, options, embedder, project_id=project_id, progress=progress
            )
    finally:
        if delete:
            deleted = await finish(forget(address, project_id, progress))
        elif kept_in and progress:
            progress(f"project {project_id} kept {kept_in}")
    return report, deleted


def _project_fate(keep: bool, deleted: bool) -> str:
    return "kept" if keep else "deleted" if deleted else "left (DeleteProject failed)"


async def run(
    options: EvalOptions,
    settings: Settings,
    *,
    address: str | None = None,
    embedder: Embedder | None = None,
    progress: Any = None,
    conversations: Sequence[Conversation] | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """Run the harness against `address`, or against an in-process server on a scratch
    database (SATCHEL_DATABASE_URL, else an embedded PostgreSQL in a temporary directory
    under /var/tmp, removed afterwards).

    `conversations` (selected, errata applied) are read as `options` says when not given. The
    run loads one fresh project (the report's `run.project_id`). Where the database outlives
    the run (`address`, or SATCHEL_DATABASE_URL) it is deleted when the run ends, also on an
    error or a cancellation, unless `keep`; `settings.project` in the report says which.
    """
    if conversations is None:
        _, loaded = datasets.load(options.data)
        conversations = locomo.select(loaded, options.conversations, options.limit_questions)
        if options.errata is not None:
            conversations, _ = locomo.apply_errata(
                conversations, locomo.load_errata(options.errata)
            )
    project_id = f"locomo-eval-{uuid.uuid4().hex[:10]}"
    if address is not None:
        if embedder is None and options.baselines:
            from satchel.server.embedding import load_embedder

            embedder = await asyncio.to_thread(load_embedder, settings)
        report, deleted = await _evaluate_at(
            address,
            conversations,
            options,
            embedder,
            project_id=project_id,
            progress=progress,
            delete=not keep,
            kept_in=f"on {address}" if keep else None,
        )
        report["settings"] = {
            "server": address,
            "context": "as configured on that server",
            "project": _project_fate(keep, deleted),
        }
        return report

    from satchel.server.platform.app import SatchelServer

    scratch = None
    if not settings.database_url:
        scratch = Path(tempfile.mkdtemp(prefix="satchel-eval-", dir="/var/tmp"))
        settings = replace(settings, data_dir=scratch)
    settings = replace(settings, listen="127.0.0.1:0")
    server = SatchelServer(settings)

    async def stop() -> None:
        await server.stop()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    try:
        await server.start()
        runtime = server.runtime()
        report, deleted = await _evaluate_at(
            f"127.0.0.1:{server.port}",
            conversations,
            options,
            embedder or runtime.embedder,
            project_id=project_id,
            progress=progress,
            # A scratch database goes as a whole; SATCHEL_DATABASE_URL's stays: clean it.
            delete=scratch is None and not keep,
            kept_in="in SATCHEL_DATABASE_URL's database" if scratch is None and keep else None,
        )
        report["settings"] = {
            "server": "in-process",
            "database": "SATCHEL_DATABASE_URL" if scratch is None else "embedded (scratch)",
            "scratch_dir": str(scratch) if scratch is not None else None,
            "embedding_model": runtime.embedder.model_id,
            "context": asdict(settings.context),
            "project": (
                _project_fate(keep, deleted)
                if scratch is None
                else "removed with the scratch database"
            ),
        }
        return report
    finally:
        await finish(stop())
