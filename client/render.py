"""Prompt blocks: a context packet as `<satchel_memory>…</satchel_memory>`, a talent selection
as its compiled `<satchel_talents>` block. Nothing to say renders as the empty string, so a
caller can always write `prompt = render_packet(packet) + task`.
"""

from __future__ import annotations

import json
import re

from google.protobuf import json_format

from satchel.v1 import context_pb2, talent_pb2

MEMORY_OPEN = "<satchel_memory>"
MEMORY_CLOSE = "</satchel_memory>"

_SPACES = re.compile(r"\s+")
_CLOSING_TAG = re.compile(r"</\s*satchel_memory\s*>", re.IGNORECASE)


def _one_line(text: str) -> str:
    """Whitespace collapsed, and no closing tag that would end the block early."""
    return _CLOSING_TAG.sub("[/satchel_memory]", _SPACES.sub(" ", text).strip())


def _fact_text(fact: context_pb2.PacketFact) -> str:
    if fact.statement.strip():
        return fact.statement
    value = json_format.MessageToDict(fact.value) if fact.HasField("value") else None
    shown = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f"{fact.predicate}: {shown}"


def _fact_line(fact: context_pb2.PacketFact) -> str:
    notes = []
    if fact.HasField("valid_from"):
        notes.append(f"valid from {fact.valid_from.ToDatetime():%Y-%m-%d}")
    if 0 < fact.confidence < 1:
        notes.append(f"confidence {fact.confidence:.2f}")
    suffix = f" ({', '.join(notes)})" if notes else ""
    return f"- {_one_line(_fact_text(fact))}{suffix}"


def _episode_line(episode: context_pb2.PacketEpisode) -> str:
    when = (
        f"[{episode.occurred_at.ToDatetime():%Y-%m-%d %H:%M}] "
        if episode.HasField("occurred_at")
        else ""
    )
    kind = f"{episode.kind}: " if episode.kind else ""
    return f"- {when}{kind}{_one_line(episode.excerpt)}"


def render_packet(packet: context_pb2.ContextPacket) -> str:
    """A packet as a `<satchel_memory>` block for a prompt; "" when it has no fact and no episode.

    Facts (with their validity date and a confidence below 1), then episodes (date, kind,
    excerpt), then the packet's warnings, each on one line.
    """
    if not packet.facts and not packet.episodes:
        return ""
    lines = [MEMORY_OPEN]
    if packet.facts:
        lines.append("Known facts:")
        lines += [_fact_line(fact) for fact in packet.facts]
    if packet.episodes:
        lines.append("Relevant past episodes:")
        lines += [_episode_line(episode) for episode in packet.episodes]
    if packet.warnings:
        lines.append("Notes:")
        lines += [f"- {_one_line(warning)}" for warning in packet.warnings]
    lines.append(MEMORY_CLOSE)
    return "\n".join(lines)


def render_talents(selection: talent_pb2.TalentSelection) -> str:
    """The compiled `<satchel_talents>` block of a selection; "" when nothing was selected."""
    if not selection.selected:
        return ""
    return selection.compiled.strip()
