"""REALTALK in the evaluation harness: parsing its conversation files, telling it from LoCoMo,
and `satchel eval realtalk` end to end on hand-made files against the real model and database."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest
from helpers.paths import ROOT

from satchel.server.evaluation import datasets, locomo, realtalk
from satchel.server.evaluation.report import render_text


def _message(dia_id: str, speaker: str, when: str, text: str) -> dict[str, object]:
    return {"clean_text": text, "speaker": speaker, "date_time": when, "img_file": [],
            "img_url": [], "dia_id": dia_id}  # fmt: skip


RECORD = {
    "name": {"speaker_1": "Ana", "speaker_2": "Ben"},
    # Session keys and the days of the turn ids differ in the published files.
    "session_2": [
        _message("D2:1", "Ben", "03.01.2024, 09:00:00", "I moved to Porto last week."),
        _message("D2:2", "Ana", "03.01.2024, 09:05:10", "Porto! Do you like the food there?"),
    ],
    "events_session_2": {"agent_a": [], "agent_b": []},
    "session_1": [
        _message("D1:1", "Ana", "29.12.2023, 22:42:04", "I adopted a dog, his name is Rex."),
        _message("D1:3", "Ben", "30.12.2023, 00:32:20", "Rex is a great name for a dog."),
    ],
    "session_1_date_time": "29.12.2023, 22:42:04",
    "qa": [
        {"question": "What is Ana's dog called?", "answer": "Rex", "evidence": ["D1:1", "D1:2"],
         "category": 1},
        {"question": "When did Ben move to Porto?", "answer": "late December 2023",
         "evidence": ["D2:1"], "category": 2},
        {"question": "Would Ben like port wine?", "answer": "likely", "evidence": [],
         "category": 3},
    ],
}  # fmt: skip


def _folder(tmp_path: Path) -> Path:
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("Chat_10_Cy_Dee", "Chat_2_Ana_Ben"):
        (folder / f"{name}.json").write_text(json.dumps(RECORD))
    (folder / "notes.json").write_text("{}")  # not a Chat_*.json: not read
    return folder


def test_a_conversation_gets_its_messages_dates_and_questions() -> None:
    conversation = realtalk.parse_conversation(4, "Chat_2_Ana_Ben", RECORD)
    assert [t.dia_id for t in conversation.turns] == ["D1:1", "D1:3", "D2:1", "D2:2"]
    first, _, third, _ = conversation.turns
    assert first.occurred_at == datetime(2023, 12, 29, 22, 42, 4, tzinfo=UTC)
    assert (first.session, third.session) == (1, 2), "the session is the turn id's day"
    assert third.text == "I moved to Porto last week." and third.speaker == "Ben"
    assert conversation.speakers == ("Ana", "Ben") and conversation.observations == ()
    assert [q.question_id for q in conversation.questions] == [
        "realtalk_4_qa0",
        "realtalk_4_qa1",
        "realtalk_4_qa2",
    ]
    assert [q.evidence for q in conversation.questions] == [("D1:1",), ("D2:1",), ()]
    assert [locomo.CATEGORIES[q.category] for q in conversation.questions] == [
        "multi-hop",
        "temporal",
        "open-domain",
    ]


def test_a_turn_id_used_twice_is_refused() -> None:
    record = {**RECORD, "session_3": [_message("D1:1", "Ana", "04.01.2024, 10:00:00", "again")]}
    with pytest.raises(ValueError, match="a turn id is used twice"):
        realtalk.parse_conversation(0, "Chat_1", record)


def test_the_data_folder_is_read_in_chat_order_and_told_from_locomo(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    name, conversations = datasets.load(folder)
    assert name == "REALTALK"
    assert [c.sample_id for c in conversations] == ["Chat_2_Ana_Ben", "Chat_10_Cy_Dee"]
    assert [c.index for c in conversations] == [0, 1]
    name, (one,) = datasets.load(folder / "Chat_10_Cy_Dee.json")
    assert name == "REALTALK" and one.sample_id == "Chat_10_Cy_Dee"
    locomo_file = tmp_path / "locomo.json"
    locomo_file.write_text(json.dumps([{"sample_id": "conv-1", "conversation": {}, "qa": []}]))
    name, (conversation,) = datasets.load(locomo_file)
    assert name == "LoCoMo" and conversation.sample_id == "conv-1"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match="no Chat_"):
        datasets.load(empty)
    (folder / "Chat_3_x.json").write_text("[]")
    with pytest.raises(ValueError, match=r"Chat_3_x\.json is not a REALTALK conversation"):
        datasets.load(folder)


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "satchel.server.cli", "eval", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )


def _env(test_root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env["SATCHEL_DATA_DIR"] = str(test_root / "eval-realtalk")
    return env


async def test_eval_realtalk_runs_on_a_scratch_database(test_root: Path, tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    env = _env(test_root)
    result = await asyncio.to_thread(
        _cli, "realtalk", "--data", str(folder), "--conversations", "Chat_2_Ana_Ben", "--json",
        env=env,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    run = report["run"]
    assert run["dataset"] == "REALTALK" and run["conversations"] == ["Chat_2_Ana_Ben"]
    assert run["questions"] == 3 and "published" not in report
    assert set(report["systems"]) == {"satchel", "vector", "bm25"}
    satchel = report["evidence"]["original"]["satchel"]
    assert satchel["overall"]["evidence_turns"] == 2, "the third question has no evidence"
    assert satchel["overall"]["evidence_recall"] == 1.0, "four turns fit any budget"
    assert satchel["single-hop"]["questions"] == 0
    text = render_text(report)
    assert text.startswith("REALTALK: 1 conversation(s) (Chat_2_Ana_Ben), 3 questions")
    assert "Published" not in text


def test_each_suite_reads_its_own_data(tmp_path: Path, test_root: Path) -> None:
    folder = _folder(tmp_path)
    env = _env(test_root)
    locomo_file = tmp_path / "locomo.json"
    locomo_file.write_text("[]")
    for args, problem in (
        (["realtalk"], "the following arguments are required: --data"),
        (["realtalk", "--data", str(tmp_path / "missing")], "no such file"),
        (["realtalk", "--data", str(locomo_file)], "not REALTALK conversations"),
        (["realtalk", "--data", str(tmp_path)], f"no Chat_*.json in {tmp_path}"),
        (["locomo", "--data", str(folder)], "not a file"),
        (
            ["locomo", "--data", str(folder / "Chat_2_Ana_Ben.json")],
            "REALTALK conversations, not a LoCoMo JSON file: use satchel eval realtalk",
        ),
        (["realtalk", "--data", str(folder), "--errata"], "unrecognized arguments: --errata"),
    ):
        result = _cli(*args, "--no-baselines", env=env)
        assert result.returncode == 2, (args, result.stderr)
        assert problem in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr and not result.stdout
