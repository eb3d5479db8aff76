"""The conversation sets the harness reads: LoCoMo's JSON list, or REALTALK's files."""

from __future__ import annotations

import json
from pathlib import Path

from satchel.server.evaluation import locomo, realtalk
from satchel.server.evaluation.locomo import Conversation


def load(path: Path) -> tuple[str, list[Conversation]]:
    """The name of the set at `path` and its conversations: a LoCoMo JSON file (such as
    locomo10.json), REALTALK's data folder, or one REALTALK conversation file. ValueError when
    it is none of them."""
    if path.is_dir():
        return realtalk.NAME, realtalk.load_conversations(path)
    record = json.loads(path.read_text())
    if realtalk.is_realtalk(record):
        return realtalk.NAME, [realtalk.parse_conversation(0, path.stem, record)]
    return locomo.NAME, locomo.parse_conversations(record)
