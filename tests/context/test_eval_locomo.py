"""The LoCoMo harness: date and evidence parsing, errata, the coverage arithmetic on hand-made
data, and whole runs on a slice of one conversation against the real model and database; where
the data comes from, and that a run leaves no project behind."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc
import pytest
from helpers.paths import ROOT

from satchel.client import AsyncSatchelClient
from satchel.server.cli import build_parser
from satchel.server.evaluation import harness, locomo
from satchel.server.evaluation.metrics import (
    Bm25,
    Outcome,
    Summary,
    analyze,
    covered_turns,
    pack_ranked,
    rank,
    recall_at,
    summarise,
)
from satchel.server.evaluation.report import render_text
from satchel.server.platform.config import ConfigError, Settings
from satchel.v1 import context_pb2, context_pb2_grpc, memory_pb2, memory_pb2_grpc

REPO = ROOT
DATA = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev.json"
ERRATA = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev_audit_errata.json"

SAMPLE = {
    "sample_id": "conv-x",
    "conversation": {
        "speaker_a": "Ana",
        "speaker_b": "Ben",
        "session_1_date_time": "1:56 pm on 8 May, 2023",
        "session_1": [
            {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a dog."},
            {"speaker": "Ben", "dia_id": "D1:2", "text": "What is its name?"},
            {"speaker": "Ana", "dia_id": "D1:3", "text": "Rex, after my grandfather."},
        ],
        "session_2_date_time": "10:37 am on 27 June, 2023",
        "session_2": [{"speaker": "Ben", "dia_id": "D2:1", "text": "I moved to Porto."}],
    },
    "observation": {
        "session_1_observation": {
            "Ana": [["Ana adopted a dog named Rex.", "D1:1"], ["Ana misses him.", ["D1:3", "D9:9"]]]
        },
        "session_2_observation": {"Ben": [["Ben lives in Porto.", "D2:1"]]},
    },
    "qa": [
        {"question": "What is Ana's dog called?", "evidence": ["D1:3; D1:1"], "category": 4},
        {"question": "Where did Ben move?", "evidence": ["D:2:1", "D2:1"], "category": 2},
        {"question": "What does Ben fear?", "evidence": ["D7:1"], "category": 5},
    ],
}


def test_session_dates_parse_to_utc() -> None:
    assert locomo.parse_session_date("1:56 pm on 8 May, 2023") == datetime(
        2023, 5, 8, 13, 56, tzinfo=UTC
    )
    assert locomo.parse_session_date(" 10:37  am on 27 June, 2023") == datetime(
        2023, 6, 27, 10, 37, tzinfo=UTC
    )
    assert locomo.parse_session_date("12:05 am on 1 January, 2024").hour == 0
    with pytest.raises(ValueError, match="not a LoCoMo session date"):
        locomo.parse_session_date("yesterday")


def test_evidence_ids_are_found_by_regex_and_kept_when_they_name_a_turn() -> None:
    assert locomo.turn_ids_in(["D8:6; D9:17", "D", "D:11:26", "D8:6"]) == ("D8:6", "D9:17")
    assert locomo.turn_ids_in(["D8:6; D9:17"], known=frozenset({"D9:17"})) == ("D9:17",)


def test_a_conversation_gets_dated_turns_sourced_observations_and_question_ids() -> None:
    conversation = locomo.parse_conversation(3, SAMPLE)
    assert [t.dia_id for t in conversation.turns] == ["D1:1", "D1:2", "D1:3", "D2:1"]
    first, _, third, fourth = conversation.turns
    assert first.occurred_at == datetime(2023, 5, 8, 13, 56, tzinfo=UTC)
    assert third.occurred_at - first.occurred_at == 2 * locomo.TURN_INTERVAL
    assert fourth.occurred_at == datetime(2023, 6, 27, 10, 37, tzinfo=UTC) == conversation.ends_at
    assert [o.turn_ids for o in conversation.observations] == [("D1:1",), ("D1:3",), ("D2:1",)]
    assert [q.question_id for q in conversation.questions] == [
        "locomo_3_qa0",
        "locomo_3_qa1",
        "locomo_3_qa2",
    ]
    assert [q.evidence for q in conversation.questions] == [("D1:3", "D1:1"), ("D2:1",), ()]
    assert conversation.speakers == ("Ana", "Ben")


def test_errata_replace_the_evidence_of_wrong_citations_only(tmp_path: Path) -> None:
    conversation = locomo.parse_conversation(0, SAMPLE)
    records = [
        {
            "question_id": "locomo_0_qa0",
            "question": "What is Ana's dog called?",
            "error_type": "WRONG_CITATION",
            "correct_evidence": ["D1:3", "D5:5"],
        },
        {
            "question_id": "locomo_0_qa1",
            "question": "Where did Ben move?",
            "error_type": "HALLUCINATION",
            "correct_evidence": ["D1:2"],
        },
        {
            "question_id": "locomo_0_qa2",
            "question": "A different question",
            "error_type": "WRONG_CITATION",
            "correct_evidence": ["D1:2"],
        },
    ]
    path = tmp_path / "errata.json"
    path.write_text(json.dumps(records))
    errata = locomo.load_errata(path)
    assert [e.question_id for e in errata] == ["locomo_0_qa0", "locomo_0_qa2"]
    (corrected,), applied = locomo.apply_errata([conversation], errata)
    assert applied == 1, "a record whose question text differs is not applied"
    first, second, third = corrected.questions
    assert first.corrected_evidence == ("D1:3",), "turns that do not exist are dropped"
    assert first.gold(errata=True) == ("D1:3",) and first.gold(errata=False) == ("D1:3", "D1:1")
    assert second.gold(errata=True) == second.evidence == ("D2:1",)
    assert third.corrected_evidence is None


def test_the_shipped_errata_match_dev_questions() -> None:
    conversations = locomo.load_conversations(DATA)
    _, applied = locomo.apply_errata(conversations, locomo.load_errata(ERRATA))
    assert applied == 34


def test_coverage_counts_episodes_and_fact_sources() -> None:
    turn_of_event = {"e1": "D1:1", "e2": "D1:2", "e3": "D1:3", "e4": "D2:1"}
    covered = covered_turns(["e2", "unknown"], [["e1"], ["e1", "e4"], []], turn_of_event)
    assert covered == {"D1:1", "D1:2", "D2:1"}

    summary = Summary()
    summary.add(("D1:1", "D1:3"), Outcome(covered, 800, 20.0))  # 1 of 2
    summary.add(("D2:1",), Outcome(covered, 600, 40.0))  # 1 of 1
    summary.add((), Outcome(frozenset(), 0, 30.0))  # no evidence: left out of recall
    assert (summary.evidence_turns, summary.covered_turns) == (3, 2)
    assert summary.recall == pytest.approx(2 / 3)
    assert summary.all_covered_share == pytest.approx(1 / 2)
    figures = summary.to_json()
    assert figures["questions"] == 3 and figures["questions_without_evidence"] == 1
    assert figures["mean_tokens"] == pytest.approx(466.7)
    assert figures["latency_p50_ms"] == 30.0
    assert figures["latency_p95_ms"] == pytest.approx(39.0)
    assert Summary().recall is None and Summary().to_json()["latency_p50_ms"] is None


def test_summaries_per_category_and_without_adversarial() -> None:
    hit = Outcome(frozenset({"a"}), 10)
    rows = [(4, ("a",), hit), (5, ("b",), hit), (1, ("a", "b"), hit)]
    summaries = summarise(rows, locomo.CATEGORIES, excluded_from_overall=(5,))
    assert summaries["overall"].recall == pytest.approx(2 / 4)
    assert summaries["overall_without_adversarial"].recall == pytest.approx(2 / 3)
    assert summaries["single-hop"].recall == 1.0
    assert summaries["adversarial"].recall == 0.0
    assert summaries["multi-hop"].all_covered_share == 0.0
    assert summaries["temporal"].questions == 0 and summaries["temporal"].recall is None


def test_baseline_packing_ranking_and_recall_at_k() -> None:
    tokens = {"a": 500, "b": 600, "c": 300, "d": 100}
    assert pack_ranked(["a", "b", "c", "d"], tokens, 900) == (["a", "c", "d"], 900)
    assert analyze("What did the dogs paint?") == ["dog", "paint"]
    bm25 = Bm25(["the dog barks", "the cat sleeps", "a dog, a cat and a bird"])
    scores = bm25.scores("Which cat?")
    assert scores[0] == 0.0 and scores[1] > scores[2] > 0.0, "shorter match ranks first"
    assert rank(scores, ["x", "y", "z"]) == ["y", "z", "x"]
    assert recall_at(["y", "z", "x"], {"x", "y"}, 2) == (1, 2)


def test_clock_end_moves_the_last_turn_to_now() -> None:
    conversation = locomo.parse_conversation(0, SAMPLE)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    shift = harness.clock_shift(conversation, "end", now)
    assert conversation.ends_at + shift == now
    assert harness.clock_shift(conversation, "real", now) == timedelta(0)
    with pytest.raises(ValueError):
        harness.clock_shift(conversation, "later", now)


async def _event_turns(
    channel: grpc.aio.Channel, project_id: str, conversation: locomo.Conversation
) -> dict[str, str]:
    """Event id -> turn id, as the server knows them: recording each turn again with the
    harness's idempotency key returns the stored event (the turn id is not in the payload)."""
    memory = memory_pb2_grpc.MemoryServiceStub(channel)
    requests = [
        memory_pb2.RecordEventRequest(
            project_id=project_id,
            subject_id=conversation.sample_id,
            kind=harness.EVENT_KIND,
            idempotency_key=f"locomo:{conversation.sample_id}:{turn.dia_id}",
        )
        for turn in conversation.turns
    ]
    reply = await memory.BatchRecordEvents(memory_pb2.BatchRecordEventsRequest(requests=requests))
    return {e.id: t.dia_id for e, t in zip(reply.events, conversation.turns, strict=True)}


async def _recount(
    channel: grpc.aio.Channel, project_id: str, record: dict, dia: dict[str, str]
) -> set[str]:
    """The turns covered by a traced call, recomputed from the trace and the stored rows."""
    context = context_pb2_grpc.ContextServiceStub(channel)
    memory = memory_pb2_grpc.MemoryServiceStub(channel)
    trace = (
        await context.GetTrace(
            context_pb2.GetTraceRequest(project_id=project_id, trace_id=record["trace_id"])
        )
    ).trace
    included = [d for d in trace.decisions if d.outcome == context_pb2.DECISION_OUTCOME_INCLUDED]
    facts = await memory.ListFacts(
        memory_pb2.ListFactsRequest(
            project_id=project_id, subject_id=record["conversation"], page_size=1000
        )
    )
    sources = {f.id: list(f.source_event_ids) for f in facts.facts}
    turns = set()
    for decision in included:
        if decision.candidate_kind == context_pb2.CANDIDATE_KIND_EPISODE:
            turns.add(dia[decision.candidate_id])
        else:
            turns.update(dia[e] for e in sources[decision.candidate_id])
    return turns


async def test_the_harness_on_a_slice_of_one_conversation(channel, embedder) -> None:
    conversations = locomo.select(locomo.load_conversations(DATA), ["conv-30"], 20)
    conversations, applied = locomo.apply_errata(conversations, locomo.load_errata(ERRATA))
    options = harness.EvalOptions(data=DATA, errata=ERRATA, details=True)
    report = await harness.evaluate_on(channel, conversations, options, embedder)

    run = report["run"]
    assert run["questions"] == 20 and run["conversations"] == ["conv-30"]
    assert run["budget_tokens"] == 900 and run["clock"] == "end"
    assert run["errata_corrected_questions"] == applied
    assert set(report["systems"]) == {"satchel", "vector", "bm25"}
    assert set(report["evidence"]) == {"original", "errata"}
    names = {"overall", "overall_without_adversarial", *locomo.CATEGORIES.values()}
    questions = report["questions"]
    for view, errata in (("original", False), ("errata", True)):
        for system, summaries in report["evidence"][view].items():
            assert set(summaries) == names
            overall = summaries["overall"]
            per_category = [summaries[n] for n in locomo.CATEGORIES.values()]
            assert sum(s["evidence_turns"] for s in per_category) == overall["evidence_turns"]
            assert sum(s["covered_turns"] for s in per_category) == overall["covered_turns"]
            gold = [
                set(
                    q["corrected_evidence"] if errata and q["corrected_evidence"] else q["evidence"]
                )
                for q in questions
            ]
            covered = [
                len(g & set(q["covered"][system])) for g, q in zip(gold, questions, strict=True)
            ]
            assert overall["covered_turns"] == sum(covered)
            assert overall["evidence_turns"] == sum(len(g) for g in gold)
            assert overall["evidence_recall"] == pytest.approx(
                sum(covered) / sum(map(len, gold)), abs=1e-4
            )
            assert 0 < overall["mean_tokens"] <= 900
    satchel = report["evidence"]["original"]["satchel"]["overall"]
    assert satchel["evidence_recall"] >= 0.5, "satchel finds most evidence on this slice"
    assert satchel["latency_p50_ms"] > 0 and satchel["latency_p95_ms"] >= satchel["latency_p50_ms"]
    assert set(report["recall_at_k"]["original"]) == {"vector", "bm25"}
    assert report["published"]["bm25_packed_900_tokens"] == 0.662
    dia = await _event_turns(channel, run["project_id"], conversations[0])
    events = await memory_pb2_grpc.MemoryServiceStub(channel).ListEvents(
        memory_pb2.ListEventsRequest(project_id=run["project_id"], subject_id="conv-30")
    )
    assert events.events and set(dia) >= {e.id for e in events.events}
    for event in events.events:  # bookkeeping ids stay out of what is embedded and served
        assert "dia_id" not in event.text and "dia_id" not in event.payload
    for record in questions[:3]:
        assert await _recount(channel, run["project_id"], record, dia) == set(
            record["covered"]["satchel"]
        )
    text = render_text(report)
    assert "Evidence recall (evidence as published)" in text and "BM25 over turns (stemmed)" in text


def _cli(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "satchel.server.cli", "eval", "locomo", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=180,
    )


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}


async def test_one_command_runs_on_a_scratch_database(test_root: Path) -> None:
    env = _env()
    env["SATCHEL_DATA_DIR"] = str(test_root / "eval-cli")
    result = await asyncio.to_thread(
        _cli, "--conversations", "conv-30", "--limit-questions", "4", "--no-baselines",
        "--json", env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["run"]["questions"] == 4 and report["settings"]["server"] == "in-process"
    assert report["settings"]["database"] == "embedded (scratch)"
    assert report["settings"]["context"]["default_budget_tokens"] == 900
    assert set(report["systems"]) == {"satchel"}
    scratch = Path(report["settings"]["scratch_dir"])
    assert scratch.parent == Path("/var/tmp") and not scratch.exists(), "removed after the run"
    bad = await asyncio.to_thread(_cli, "--conversations", "conv-99", env=env)
    assert bad.returncode == 2 and "no such conversation: conv-99" in bad.stderr


def test_data_that_is_missing_or_not_locomo_stops_with_where_locomo_comes_from(
    tmp_path: Path,
) -> None:
    env = _env()
    not_json = tmp_path / "not.json"
    not_json.write_text("LoCoMo?")
    not_a_list = tmp_path / "object.json"
    not_a_list.write_text("{}")
    not_records = tmp_path / "records.json"
    not_records.write_text('[{"sample_id": "conv-1"}]')
    for path, problem in (
        (tmp_path / "missing.json", "no such file"),
        (tmp_path, "not a file"),
        (not_json, "not a LoCoMo JSON file"),
        (not_a_list, "not a LoCoMo JSON file"),
        (not_records, "not a LoCoMo JSON file"),
    ):
        result = _cli("--data", str(path), "--no-baselines", env=env)
        assert result.returncode == 2, (path, result.stderr)
        assert f"satchel: --data {path}: {problem}" in result.stderr
        assert "does not ship LoCoMo" in result.stderr
        assert "data/locomo10.json" in result.stderr and "snap-research/LoCoMo" in result.stderr
        assert "Traceback" not in result.stderr and not result.stdout
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps([SAMPLE]))
    result = _cli("--data", str(sample), "--errata", "--errata-file", str(not_json), env=env)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"--errata-file {not_json}: not an errata file" in result.stderr
    assert "dial481/locomo-audit" in result.stderr
    result = _cli("--data", str(sample), "--keep", env=env)
    assert result.returncode == 2 and "--keep" in result.stderr and "Traceback" not in result.stderr


def test_the_default_data_is_found_beside_the_checkout_or_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert locomo.beside_checkout(locomo.DEFAULT_DATA) == DATA.resolve()
    assert locomo.beside_checkout(locomo.DEFAULT_ERRATA) == ERRATA.resolve()
    # An installed package, or a checkout with no shared/ beside it: say what to pass.
    monkeypatch.setattr(locomo, "CHECKOUT", tmp_path / "site-packages" / "satchel")
    for argv, expected, source in (
        (["eval", "locomo"], "no LoCoMo data: pass --data PATH", "snap-research/LoCoMo"),
        (
            ["eval", "locomo", "--data", str(DATA), "--errata"],
            "no errata for --errata: pass --errata-file PATH",
            "dial481/locomo-audit",
        ),
    ):
        args = build_parser().parse_args(argv)
        with pytest.raises(ConfigError) as raised:
            args.func(args, Settings.from_env({}))
        message = str(raised.value)
        assert expected in message and source in message
        assert str(tmp_path / "site-packages" / "shared" / "data" / "locomo") in message


async def _leftovers(address: str, project_id: str, subject_id: str) -> tuple[int, int, int]:
    """Events and facts the project still holds, and the rows DeleteProject then deletes."""
    async with AsyncSatchelClient(address) as client:
        events = await client.list_events(project_id, subject_id)
        facts = await client.list_facts(project_id, subject_id, include_inactive=True)
        deleted = (await client.delete_project(project_id)).deleted
    rows = deleted.events + deleted.facts + deleted.conflicts + deleted.traces
    return len(events.events), len(facts.facts), rows + deleted.trace_decisions


async def test_an_eval_on_a_running_server_deletes_its_project_unless_kept(
    address: str, tmp_path: Path
) -> None:
    sample = tmp_path / "sample.json"
    sample.write_text(json.dumps([SAMPLE]))
    args = ("--data", str(sample), "--address", address, "--no-baselines", "--json")
    result = await asyncio.to_thread(_cli, *args, env=_env(), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    project_id = report["run"]["project_id"]
    assert report["run"]["questions"] == 3 and report["settings"]["project"] == "deleted"
    assert f"loading into project {project_id} on {address}" in result.stderr
    assert await _leftovers(address, project_id, "conv-x") == (0, 0, 0)

    kept = await asyncio.to_thread(_cli, *args, "--keep", env=_env(), cwd=tmp_path)
    assert kept.returncode == 0, kept.stderr
    project_id = json.loads(kept.stdout)["run"]["project_id"]
    assert f"project {project_id} kept on {address}" in kept.stderr
    events, facts, rows = await _leftovers(address, project_id, "conv-x")
    assert (events, facts) == (4, 3) and rows > 7, "the loaded turns, observations and calls"


async def test_a_failed_or_cancelled_run_deletes_its_project(address: str, settings) -> None:
    conversations = [locomo.parse_conversation(0, SAMPLE)]
    options = harness.EvalOptions(data=Path("sample.json"), baselines=False)
    projects: list[str] = []

    def failing(message: str) -> None:
        if message.startswith("loading into project "):
            projects.append(message.split()[3])
        elif message.endswith("questions asked"):
            raise RuntimeError("the run fails once loaded and asked")

    with pytest.raises(RuntimeError, match="fails once loaded"):
        await harness.run(
            options, settings, address=address, conversations=conversations, progress=failing
        )

    task: asyncio.Task[dict] | None = None

    def interrupting(message: str) -> None:
        if message.startswith("loading into project "):
            projects.append(message.split()[3])
        elif message.endswith("questions asked"):
            assert task is not None
            task.cancel()  # as asyncio.run does on Ctrl-C; delivered as cleanup begins

    task = asyncio.create_task(
        harness.run(
            options, settings, address=address, conversations=conversations, progress=interrupting
        )
    )
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(projects) == 2
    for project_id in projects:
        assert await _leftovers(address, project_id, "conv-x") == (0, 0, 0)


async def test_an_in_process_run_on_a_database_url_deletes_its_project(
    address: str, settings
) -> None:
    assert settings.database_url, "the in-process server shares the test database"
    conversations = [locomo.parse_conversation(0, SAMPLE)]
    options = harness.EvalOptions(data=Path("sample.json"), baselines=False)
    report = await harness.run(options, settings, conversations=conversations)
    assert report["settings"]["database"] == "SATCHEL_DATABASE_URL"
    assert report["settings"]["project"] == "deleted"
    assert await _leftovers(address, report["run"]["project_id"], "conv-x") == (0, 0, 0)
