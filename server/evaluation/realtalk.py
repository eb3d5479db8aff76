"""REALTALK (Lee et al. 2025) as the harness reads it: real conversations, LoCoMo's questions.

REALTALK is ten conversations between people who messaged each other for 21 days, with
memory-probing questions and evidence turns in LoCoMo's layout and numbering (1 multi-hop,
2 temporal, 3 open-domain; no single-hop, no adversarial). Unlike LoCoMo it has no generated
observations, so a run measures episodes alone, and every message carries its own date. Its
evidence cites turns by `D<day>:<turn>` ids, which are kept as published (ids that name no turn
are dropped, as for LoCoMo). The repository states no licence: it is read at run time, never
shipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from satchel.server.evaluation.locomo import Conversation, Turn, parse_questions

NAME = "REALTALK"

SOURCE = (
    "satchel does not ship REALTALK: pass --data with the data folder (or one Chat_*.json) of"
    " https://github.com/danny911kr/REALTALK"
)
"""Where the data comes from, for messages."""

_SESSION_KEY = re.compile(r"session_(\d+)")
_CHAT_NUMBER = re.compile(r"Chat_(\d+)")
_DAY = re.compile(r"D(\d+):")
DATE_FORMAT = "%d.%m.%Y, %H:%M:%S"


def is_realtalk(record: Any) -> bool:
    """Whether a parsed JSON document is one REALTALK conversation."""
    return isinstance(record, dict) and "qa" in record and "session_1" in record


def parse_conversation(index: int, sample_id: str, record: Mapping[str, Any]) -> Conversation:
    """One REALTALK conversation file, parsed (`index`: its position in the run)."""
    turns = []
    for key, messages in record.items():
        if not (_SESSION_KEY.fullmatch(key) and isinstance(messages, list)):
            continue
        for message in messages:
            day = _DAY.match(message["dia_id"])
            turns.append(
                Turn(
                    dia_id=message["dia_id"],
                    speaker=message["speaker"],
                    text=message.get("clean_text") or message.get("text", ""),
                    session=int(day.group(1)) if day else 0,
                    occurred_at=datetime.strptime(message["date_time"], DATE_FORMAT).replace(
                        tzinfo=UTC
                    ),
                )
            )
    turns.sort(key=lambda t: t.occurred_at)
    known = frozenset(t.dia_id for t in turns)
    if len(known) != len(turns):
        raise ValueError(f"{sample_id}: a turn id is used twice")
    names = record.get("name", {})
    return Conversation(
        index=index,
        sample_id=sample_id,
        speakers=tuple(v for v in names.values() if isinstance(v, str)),
        turns=tuple(turns),
        observations=(),
        questions=parse_questions(f"realtalk_{index}", record["qa"], known),
    )


def _chat_order(path: Path) -> tuple[int, str]:
    match = _CHAT_NUMBER.match(path.stem)
    return (int(match.group(1)) if match else 1 << 30, path.stem)


def load_conversations(path: Path) -> list[Conversation]:
    """REALTALK's data folder (every `Chat_*.json` directly in it, by chat number) or one of
    its files (ValueError when there is none, or one is not a REALTALK conversation)."""
    files = sorted(path.glob("Chat_*.json"), key=_chat_order) if path.is_dir() else [path]
    if not files:
        raise ValueError(f"no Chat_*.json in {path}")
    conversations = []
    for index, file in enumerate(files):
        record = json.loads(file.read_text())
        if not is_realtalk(record):
            raise ValueError(f"{file.name} is not a REALTALK conversation")
        conversations.append(parse_conversation(index, file.stem, record))
    return conversations
