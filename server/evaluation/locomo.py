"""LoCoMo (Maharana et al. 2024) as the harness reads it: conversations, questions, errata.

Pure: parses the published JSON records without changing them. Turn ids are `D<session>:<turn>`;
evidence strings are parsed with the regex `D\\d+:\\d+` and kept only when they name a turn of
the conversation (a few are malformed or point to no turn). Categories follow the data set's
own README: 4 single-hop, 1 multi-hop, 2 temporal, 3 open-domain, 5 adversarial (other code
labels them differently). The data is CC BY-NC 4.0: it is read at run time, never shipped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

NAME = "LoCoMo"

DEFAULT_DATA = Path("../shared/data/locomo/locomo_dev.json")
DEFAULT_ERRATA = Path("../shared/data/locomo/locomo_dev_audit_errata.json")
"""Where a source checkout finds the dev conversations and their errata: relative to the
checkout's root (`beside_checkout`), in the `shared` folder beside it, never inside it."""

CHECKOUT = Path(__file__).resolve().parents[2]
"""The root of the source checkout this module runs from (an installed package has none)."""

SOURCE = (
    "satchel does not ship LoCoMo (CC BY-NC 4.0): download data/locomo10.json from its public"
    " release, https://github.com/snap-research/LoCoMo"
)
"""Where the data comes from, for messages."""

ERRATA_SOURCE = (
    "satchel does not ship them: errors.json of https://github.com/dial481/locomo-audit"
    " (question ids locomo_<conversation index>_qa<index>)"
)


def beside_checkout(default: Path) -> Path:
    """`default` (DEFAULT_DATA or DEFAULT_ERRATA) resolved against the root of the source
    checkout, whatever the working directory (for an installed package: beside its folder in
    site-packages, where nothing is found)."""
    return (CHECKOUT / default).resolve()


CATEGORIES: dict[int, str] = {
    4: "single-hop",
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    5: "adversarial",
}
"""Category number -> name, in the order reports list them."""

ADVERSARIAL = 5

TURN_INTERVAL = timedelta(seconds=15)
"""Turns of a session are this far apart, from the session's date on."""

TURN_ID = re.compile(r"D\d+:\d+")
_SESSION_KEY = re.compile(r"session_(\d+)")
_DATE_FORMATS = ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %B %Y", "%I:%M %p on %d %b, %Y")


@dataclass(frozen=True)
class Turn:
    """One message of a conversation."""

    dia_id: str
    speaker: str
    text: str
    session: int
    occurred_at: datetime


@dataclass(frozen=True)
class Observation:
    """A generated fact about a speaker, with the turns it was extracted from."""

    speaker: str
    text: str
    session: int
    turn_ids: tuple[str, ...]


@dataclass(frozen=True)
class Question:
    """A question with its gold evidence turns; `corrected_evidence` is set by the errata."""

    question_id: str
    text: str
    category: int
    evidence: tuple[str, ...]
    corrected_evidence: tuple[str, ...] | None = None

    def gold(self, errata: bool) -> tuple[str, ...]:
        """The evidence turns, corrected by the errata when asked and available."""
        if errata and self.corrected_evidence is not None:
            return self.corrected_evidence
        return self.evidence


@dataclass(frozen=True)
class Conversation:
    """One LoCoMo sample: dated turns, observations and questions."""

    index: int
    sample_id: str
    speakers: tuple[str, ...]
    turns: tuple[Turn, ...]
    observations: tuple[Observation, ...]
    questions: tuple[Question, ...]

    @property
    def ends_at(self) -> datetime:
        """When its last turn was said."""
        return max(t.occurred_at for t in self.turns)

    @property
    def turn_ids(self) -> frozenset[str]:
        return frozenset(t.dia_id for t in self.turns)


def parse_session_date(text: str) -> datetime:
    """A LoCoMo session date such as `"1:56 pm on 8 May, 2023"`, as a UTC datetime."""
    cleaned = " ".join(text.split())
    for fmt in _DATE_FORMATS:
        try:
            return datetime.strptime(cleaned, fmt).replace(tzinfo=UTC)
        except ValueError:
            continue
    raise ValueError(f"not a LoCoMo session date: {text!r}")


def turn_ids_in(values: Iterable[Any], known: frozenset[str] | None = None) -> tuple[str, ...]:
    """Turn ids found in evidence strings (regex `D\\d+:\\d+`), deduplicated in order.

    With `known`, ids that name no turn are dropped.
    """
    found: dict[str, None] = {}
    for value in values:
        for turn_id in TURN_ID.findall(str(value)):
            if known is None or turn_id in known:
                found.setdefault(turn_id, None)
    return tuple(found)


def parse_questions(
    prefix: str, records: Iterable[Mapping[str, Any]], known: frozenset[str]
) -> tuple[Question, ...]:
    """A conversation's questions, ids `<prefix>_qa<position>`, evidence among `known` turns."""
    return tuple(
        Question(
            question_id=f"{prefix}_qa{position}",
            text=qa["question"],
            category=int(qa["category"]),
            evidence=turn_ids_in(qa.get("evidence", []), known),
        )
        for position, qa in enumerate(records)
    )


def _sessions(
    conversation: Mapping[str, Any],
) -> list[tuple[int, datetime, list[dict[str, Any]]]]:
    sessions = []
    for key, value in conversation.items():
        match = _SESSION_KEY.fullmatch(key)
        if match and isinstance(value, list):
            number = int(match.group(1))
            started = parse_session_date(conversation[f"{key}_date_time"])
            sessions.append((number, started, value))
    return sorted(sessions, key=lambda s: s[0])


def parse_conversation(index: int, sample: Mapping[str, Any]) -> Conversation:
    """One record of the LoCoMo JSON list (its position is `index`)."""
    conversation = sample["conversation"]
    turns = []
    for number, started, messages in _sessions(conversation):
        for position, message in enumerate(messages):
            turns.append(
                Turn(
                    dia_id=message["dia_id"],
                    speaker=message["speaker"],
                    text=message.get("text", ""),
                    session=number,
                    occurred_at=started + position * TURN_INTERVAL,
                )
            )
    known = frozenset(t.dia_id for t in turns)
    observations = []
    for key, by_speaker in sample.get("observation", {}).items():
        match = _SESSION_KEY.match(key)
        session = int(match.group(1)) if match else 0
        for speaker, items in by_speaker.items():
            for text, source in items:
                ids = turn_ids_in(source if isinstance(source, list) else [source], known)
                observations.append(Observation(speaker, text, session, ids))
    questions = parse_questions(f"locomo_{index}", sample.get("qa", []), known)
    speakers = tuple(
        conversation[k] for k in ("speaker_a", "speaker_b") if isinstance(conversation.get(k), str)
    )
    return Conversation(
        index=index,
        sample_id=sample["sample_id"],
        speakers=speakers,
        turns=tuple(turns),
        observations=tuple(observations),
        questions=questions,
    )


def parse_conversations(records: Any) -> list[Conversation]:
    """Every conversation of a parsed LoCoMo JSON file, in file order (ValueError when it holds
    none)."""
    if not isinstance(records, list) or not records:
        raise ValueError("expected a non-empty JSON list of LoCoMo conversations")
    return [parse_conversation(i, s) for i, s in enumerate(records)]


def load_conversations(path: Path) -> list[Conversation]:
    """Every conversation of a LoCoMo JSON file, in file order (ValueError when it holds none)."""
    return parse_conversations(json.loads(path.read_text()))


def select(
    conversations: Sequence[Conversation],
    names: Sequence[str] = (),
    limit_questions: int | None = None,
) -> list[Conversation]:
    """The conversations named (sample ids such as `conv-26`, or positions), at most
    `limit_questions` questions each (the first ones)."""
    chosen = list(conversations)
    if names:
        wanted = set(names)
        unknown = wanted - {c.sample_id for c in chosen} - {str(c.index) for c in chosen}
        if unknown:
            raise ValueError(f"no such conversation: {', '.join(sorted(unknown))}")
        chosen = [c for c in chosen if c.sample_id in wanted or str(c.index) in wanted]
    if limit_questions is not None:
        chosen = [replace(c, questions=c.questions[:limit_questions]) for c in chosen]
    return chosen


@dataclass(frozen=True)
class Erratum:
    """A corrected citation of the third-party audit (`WRONG_CITATION`)."""

    question_id: str
    question: str
    correct_evidence: tuple[str, ...]


def load_errata(path: Path) -> list[Erratum]:
    """The `WRONG_CITATION` records of an audit errata file (other error types are answers)."""
    return [
        Erratum(r["question_id"], r.get("question", ""), turn_ids_in(r["correct_evidence"]))
        for r in json.loads(path.read_text())
        if r.get("error_type") == "WRONG_CITATION"
    ]


def apply_errata(
    conversations: Sequence[Conversation], errata: Iterable[Erratum]
) -> tuple[list[Conversation], int]:
    """Conversations whose questions carry the errata's corrected evidence, and how many
    questions were corrected. A record is applied only when its question id and text match a
    question and its corrected evidence names at least one turn of that conversation."""
    by_id = {e.question_id: e for e in errata}
    applied = 0
    result = []
    for conversation in conversations:
        known = conversation.turn_ids
        questions = []
        for question in conversation.questions:
            erratum = by_id.get(question.question_id)
            corrected = tuple(t for t in erratum.correct_evidence if t in known) if erratum else ()
            if erratum and corrected and erratum.question.strip() in ("", question.text.strip()):
                question = replace(question, corrected_evidence=corrected)
                applied += 1
            questions.append(question)
        result.append(replace(conversation, questions=tuple(questions)))
    return result, applied
