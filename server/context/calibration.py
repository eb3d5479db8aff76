"""Relevance-floor calibration: distance distributions of relevant and irrelevant candidates.

The floor (`SATCHEL_RECALL_MAX_DISTANCE`) gates candidates on cosine distance to the query. Its
right value depends on the embedder, so it is measured, never hard-coded: given labelled
(query, text, relevant) pairs, embed them with the configured model, compare the two distance
distributions, and propose the largest-recall threshold that keeps a target share of the
relevant candidates.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from satchel.server.embedding.port import Embedder
from satchel.server.memory.domain.rendering import render_event_text

_TURN_ID = re.compile(r"D\d+:\d+")


@dataclass(frozen=True)
class LabelledPair:
    query: str
    text: str
    relevant: bool


@dataclass(frozen=True)
class Calibration:
    """What the distributions say, and the proposed floor."""

    model_id: str
    relevant: int
    irrelevant: int
    relevant_percentiles: dict[str, float]
    irrelevant_percentiles: dict[str, float]
    keep: float
    threshold: float
    irrelevant_dropped: float

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def locomo_pairs(path: Path, negatives_per_question: int = 10, seed: int = 7) -> list[LabelledPair]:
    """LoCoMo questions against their gold evidence turns (relevant) and other turns of the
    same conversation (irrelevant); adversarial questions (category 5) are left out."""
    rng = random.Random(seed)
    pairs: list[LabelledPair] = []
    for sample in json.loads(path.read_text()):
        conversation = sample["conversation"]
        turns: dict[str, str] = {}
        for key, session in conversation.items():
            if key.startswith("session_") and isinstance(session, list):
                for turn in session:
                    payload = {"speaker": turn["speaker"], "text": turn["text"]}
                    turns[turn["dia_id"]] = render_event_text("conversation.message", payload)
        turn_ids = sorted(turns)
        for qa in sample["qa"]:
            if qa.get("category") == 5:
                continue
            gold = {t for ev in qa.get("evidence", []) for t in _TURN_ID.findall(ev) if t in turns}
            if not gold:
                continue
            pairs.extend(LabelledPair(qa["question"], turns[t], True) for t in sorted(gold))
            others = [t for t in turn_ids if t not in gold]
            for t in rng.sample(others, min(negatives_per_question, len(others))):
                pairs.append(LabelledPair(qa["question"], turns[t], False))
    return pairs


def jsonl_pairs(path: Path) -> list[LabelledPair]:
    """Pairs from a JSON-lines file of {"query", "text", "relevant"} objects."""
    pairs = []
    for line in path.read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            pairs.append(LabelledPair(row["query"], row["text"], bool(row["relevant"])))
    return pairs


def distances(embedder: Embedder, pairs: Sequence[LabelledPair]) -> np.ndarray:
    """Cosine distance of each pair, embedding each distinct text once."""
    queries = sorted({p.query for p in pairs})
    texts = sorted({p.text for p in pairs})
    q_vectors = embedder.embed([embedder.query_prefix + q for q in queries])
    t_vectors = embedder.embed([embedder.passage_prefix + t for t in texts])
    q_index = {q: i for i, q in enumerate(queries)}
    t_index = {t: i for i, t in enumerate(texts)}
    return np.array(
        [1.0 - float(q_vectors[q_index[p.query]] @ t_vectors[t_index[p.text]]) for p in pairs]
    )


def _percentiles(values: np.ndarray) -> dict[str, float]:
    return {f"p{q}": round(float(np.percentile(values, q)), 4) for q in (5, 25, 50, 75, 95)}


def calibrate(embedder: Embedder, pairs: Iterable[LabelledPair], keep: float = 0.95) -> Calibration:
    """Propose the floor that keeps `keep` of the relevant candidates."""
    pairs = list(pairs)
    labels = np.array([p.relevant for p in pairs])
    if labels.all() or not labels.any():
        raise ValueError("calibration needs both relevant and irrelevant pairs")
    measured = distances(embedder, pairs)
    relevant, irrelevant = measured[labels], measured[~labels]
    threshold = float(np.quantile(relevant, keep))
    return Calibration(
        model_id=embedder.model_id,
        relevant=int(labels.sum()),
        irrelevant=int((~labels).sum()),
        relevant_percentiles=_percentiles(relevant),
        irrelevant_percentiles=_percentiles(irrelevant),
        keep=keep,
        threshold=round(threshold, 4),
        irrelevant_dropped=round(float((irrelevant > threshold).mean()), 4),
    )
