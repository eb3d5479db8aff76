"""Generic hybrid retrievers on the LoCoMo dev data, measured by satchel's harness rules.

    benchmarks/peers/.venv/bin/python benchmarks/peers/run.py [--json] [--conversations conv-26]
        [--limit-questions 20] [--systems txtai mem0]

Every system ranks the same documents of a conversation (each turn as "Speaker: text" cut to 600
characters, each observation as a fact sourced from its turns) with the same embedding model
(satchel's own, loaded offline); the ranking is packed greedily into 900 tokens
(`metrics.pack_ranked`) and a gold turn counts as covered when a packed turn is it or a packed
observation is sourced from it (`metrics.covered_turns`). Latency is the wall time of the
system's own retrieval call (query embedding included). Nothing is downloaded at run time.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from satchel.server.embedding.fastembed_adapter import FastEmbedEmbedder
from satchel.server.evaluation import datasets, locomo
from satchel.server.evaluation.locomo import ADVERSARIAL, CATEGORIES, Conversation
from satchel.server.evaluation.metrics import (
    Bm25,
    Outcome,
    analyze,
    covered_turns,
    pack_ranked,
    rank,
    summarise,
)
from satchel.server.memory.domain.rendering import excerpt
from satchel.server.platform.tokens import estimate_tokens

REPO = Path(__file__).resolve().parents[2]
BUDGET = 900
EXCERPT_CHARS = 600
WEIGHTS = (0.5, 0.5)
OFFLINE = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "MEM0_TELEMETRY": "False",
    "LANGSMITH_TRACING": "false",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Set before any peer library is imported (they are imported lazily): no download, no telemetry."""

Search = Callable[[str], list[str]]
"""A built retriever: question -> document ids, best first."""


@dataclass(frozen=True)
class Doc:
    id: str
    text: str
    tokens: int
    sources: tuple[str, ...]  # the turns it covers: itself for a turn, its sources for a fact
    is_turn: bool


def documents(conversation: Conversation) -> list[Doc]:
    """Every turn and every observation of a conversation, as the harness serves them."""
    docs = []
    for turn in conversation.turns:
        text = excerpt(f"{turn.speaker}: {turn.text}", EXCERPT_CHARS)
        docs.append(Doc(turn.dia_id, text, estimate_tokens(text), (turn.dia_id,), True))
    for i, obs in enumerate(conversation.observations):
        docs.append(Doc(f"obs{i}", obs.text, estimate_tokens(obs.text), obs.turn_ids, False))
    return docs


class SharedEmbedder:
    """satchel's model; document vectors are computed once per text and shared by every system
    (the model embeds one text per run, so a cached row equals a fresh one). Queries are never
    cached, so each system's latency includes embedding its query."""

    def __init__(self, model: FastEmbedEmbedder) -> None:
        self.model = model
        self._documents: dict[str, np.ndarray] = {}

    def warm(self, texts: Sequence[str]) -> None:
        missing = list(dict.fromkeys(t for t in texts if t not in self._documents))
        self._documents.update(zip(missing, self.model.embed(missing), strict=True))

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        rows = [self._documents.get(t) for t in texts]
        fresh = iter(self.model.embed([t for t, r in zip(texts, rows, strict=True) if r is None]))
        return np.stack([r if r is not None else next(fresh) for r in rows])


def langchain_embeddings(embed: SharedEmbedder) -> Any:
    from langchain_core.embeddings import Embeddings

    class SatchelEmbeddings(Embeddings):
        def embed_documents(self, texts: list[str]) -> list[list[float]]:
            return embed(texts).tolist()

        def embed_query(self, text: str) -> list[float]:
            return embed([text])[0].tolist()

    return SatchelEmbeddings()


def build_vector(docs: list[Doc], embed: SharedEmbedder) -> Search:
    matrix, ids = embed([d.text for d in docs]), [d.id for d in docs]
    return lambda q: rank(matrix @ embed([q])[0], ids)


def build_bm25(docs: list[Doc], embed: SharedEmbedder) -> Search:
    bm25, ids = Bm25([d.text for d in docs]), [d.id for d in docs]
    return lambda q: rank(bm25.scores(q), ids)


def build_langchain(docs: list[Doc], embed: SharedEmbedder, stemmed: bool) -> Search:
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever
    from langchain_core.documents import Document
    from langchain_core.vectorstores import InMemoryVectorStore

    lc_docs = [Document(page_content=d.text, metadata={"doc_id": d.id}) for d in docs]
    extra = {"preprocess_func": analyze} if stemmed else {}
    bm25 = BM25Retriever.from_documents(lc_docs, k=len(docs), **extra)
    store = InMemoryVectorStore(langchain_embeddings(embed))
    store.add_documents(lc_docs)
    vector = store.as_retriever(search_kwargs={"k": len(docs)})
    ensemble = EnsembleRetriever(retrievers=[bm25, vector], weights=list(WEIGHTS), id_key="doc_id")
    return lambda q: [d.metadata["doc_id"] for d in ensemble.invoke(q)]


def build_txtai(docs: list[Doc], embed: SharedEmbedder) -> Search:
    from txtai import Embeddings

    def transform(texts: list[str]) -> np.ndarray:  # a plain function: txtai calls others
        return embed(texts)

    index = Embeddings(hybrid=True, method="external", transform=transform, content=False)
    index.index([(d.id, d.text, None) for d in docs])
    limit = len(docs)
    return lambda q: [uid for uid, _ in index.search(q, limit, weights=WEIGHTS[0])]


def build_mem0(docs: list[Doc], embed: SharedEmbedder, scratch: Path) -> Search:
    from fastembed import SparseTextEmbedding
    from mem0 import Memory

    user = "locomo"
    memory = Memory.from_config(
        {
            "vector_store": {
                "provider": "qdrant",  # local mode (qdrant-client), in a scratch directory
                "config": {
                    "collection_name": "locomo",
                    "embedding_model_dims": embed.model.dimension,
                    "path": str(scratch / "qdrant"),
                    "on_disk": False,
                },
            },
            "embedder": {"provider": "langchain", "config": {"model": langchain_embeddings(embed)}},
            # infer=False never calls the LLM; mem0 only builds its client.
            "llm": {"provider": "openai", "config": {"api_key": "unused-offline"}},
            "history_db_path": str(scratch / "history.db"),
        }
    )
    # mem0's BM25 encoder is fastembed's "Qdrant/bm25", whose only files (stop-word lists) come
    # from the Hugging Face hub; offline it loads with none (same tokenizer and Snowball stemmer).
    empty = scratch / "bm25"
    empty.mkdir()
    memory.vector_store._bm25_encoder = SparseTextEmbedding(
        "Qdrant/bm25", specific_model_path=str(empty)
    )
    for d in docs:
        memory.add(d.text, user_id=user, metadata={"doc_id": d.id}, infer=False)
    limit = len(docs)

    def search(q: str) -> list[str]:
        found = memory.search(q, top_k=limit, filters={"user_id": user}, threshold=0.0)
        return [r["metadata"]["doc_id"] for r in found["results"]]

    return search


@dataclass(frozen=True)
class System:
    key: str
    label: str
    packages: tuple[str, ...]
    build: Callable[[list[Doc], SharedEmbedder, Path], Search]


SYSTEMS = (
    System("vector", "reference: vector only (same model)", (), lambda d, e, s: build_vector(d, e)),
    System("bm25", "reference: BM25 stemmed (satchel metrics.Bm25)", (),
           lambda d, e, s: build_bm25(d, e)),
    System("langchain", "LangChain EnsembleRetriever (BM25 + InMemoryVectorStore)",
           ("langchain-classic", "langchain-community", "rank-bm25"),
           lambda d, e, s: build_langchain(d, e, stemmed=False)),
    System("langchain-stemmed", "LangChain EnsembleRetriever, BM25 over metrics.analyze",
           ("langchain-classic", "langchain-community", "rank-bm25"),
           lambda d, e, s: build_langchain(d, e, stemmed=True)),
    System("txtai", "txtai Embeddings(hybrid=True)", ("txtai", "torch"),
           lambda d, e, s: build_txtai(d, e)),
    System("mem0", "Mem0 OSS (infer=False, local Qdrant)", ("mem0ai", "qdrant-client", "langchain"),
           build_mem0),
)  # fmt: skip


def unavailable(system: System) -> str | None:
    """Why a system cannot run here, or None."""
    for package in system.packages:
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            return f"not installed: {package} (run benchmarks/peers/setup.sh)"
    return None


def evaluate(
    conversations: Sequence[Conversation],
    systems: Sequence[System],
    embed: SharedEmbedder,
    progress: Callable[[str], None],
) -> dict[str, Any]:
    rows: dict[str, list[tuple[int, tuple[str, ...], Outcome]]] = {s.key: [] for s in systems}
    index_s = dict.fromkeys(rows, 0.0)
    failed: dict[str, str] = {}
    for conversation in conversations:
        docs = documents(conversation)
        by_id = {d.id: d for d in docs}
        tokens = {d.id: d.tokens for d in docs}
        identity = {t.dia_id: t.dia_id for t in conversation.turns}
        embed.warm([d.text for d in docs])
        questions = [q for q in conversation.questions if q.evidence]
        for system in systems:
            if system.key in failed:
                continue
            started = time.perf_counter()
            try:
                with tempfile.TemporaryDirectory(prefix=f"peers-{system.key}-") as scratch:
                    search = system.build(docs, embed, Path(scratch))
                    index_s[system.key] += time.perf_counter() - started
                    for question in questions:
                        started = time.perf_counter()
                        ranked = search(question.text)
                        latency = (time.perf_counter() - started) * 1000
                        packed, used = pack_ranked(ranked, tokens, BUDGET)
                        covered = covered_turns(
                            (d for d in packed if by_id[d].is_turn),
                            (by_id[d].sources for d in packed if not by_id[d].is_turn),
                            identity,
                        )
                        outcome = Outcome(covered, used, latency)
                        rows[system.key].append((question.category, question.evidence, outcome))
            except Exception as exc:  # a peer that breaks is reported, the others go on
                failed[system.key] = f"failed: {type(exc).__name__}: {exc}"[:300]
                continue
            progress(f"{conversation.sample_id}: {system.key} done")
    results: dict[str, Any] = {}
    for system in systems:
        if system.key in failed:
            results[system.key] = {"label": system.label, "status": failed[system.key]}
            continue
        summaries = summarise(rows[system.key], CATEGORIES, excluded_from_overall=(ADVERSARIAL,))
        results[system.key] = {
            "label": system.label,
            "status": "ok",
            "index_s": round(index_s[system.key], 1),
            **{name: s.to_json() for name, s in summaries.items()},
        }
    return results


def satchel_row(path: Path) -> dict[str, Any]:
    """satchel's own figures from its evaluation report (run in the project's .venv: its
    server does not install beside Mem0). Its latency is a whole AssembleContext over gRPC,
    from the harness to a `satchel serve` process (compare.sh), or to a server inside the
    harness's own event loop."""
    report = json.loads(path.read_text())
    summaries = report["evidence"]["original"]["satchel"]
    where = "server in the harness" if report["settings"]["server"] == "in-process" else "server"
    return {
        "label": f"satchel (AssembleContext over gRPC, defaults; {where} process)",
        "status": "ok",
        "index_s": float(report["run"]["timings_s"]["load_s"]),  # embedding included
        **summaries,
    }


def versions() -> dict[str, str]:
    names = ("satchel", "fastembed", "onnxruntime", "langchain-core", "langchain-classic",
             "langchain-community", "rank-bm25", "txtai", "torch", "faiss-cpu", "mem0ai",
             "qdrant-client")  # fmt: skip
    found = {}
    for name in names:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = "not installed"
    return found


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f} %"


def table(results: dict[str, Any]) -> str:
    lines = [
        "| system | evidence recall @900 | fully covered | adversarial recall | p50 ms | index s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results.values():
        if r["status"] != "ok":
            lines.append(f"| {r['label']} | {r['status']} | | | | |")
            continue
        overall, adversarial = r["overall"], r["adversarial"]
        p50 = overall["latency_p50_ms"]
        lines.append(
            f"| {r['label']} | {_pct(overall['evidence_recall'])} "
            f"| {_pct(overall['all_evidence_covered'])} | {_pct(adversarial['evidence_recall'])} "
            f"| {'n/a' if p50 is None else f'{p50:.1f}'} | {r['index_s']:.1f} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO / locomo.DEFAULT_DATA)
    parser.add_argument("--conversations", nargs="*", default=[], help="sample ids or positions")
    parser.add_argument("--limit-questions", type=int, default=None)
    parser.add_argument("--systems", nargs="*", default=[], help=" ".join(s.key for s in SYSTEMS))
    parser.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "peers")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--satchel",
        type=Path,
        help="a `satchel eval locomo --json` report of the same data, shown as the first row",
    )
    args = parser.parse_args()
    for name, value in OFFLINE.items():
        os.environ.setdefault(name, value)
    logging.basicConfig(level=logging.ERROR)
    chosen = [s for s in SYSTEMS if not args.systems or s.key in args.systems]
    dataset, loaded = datasets.load(args.data)
    conversations = locomo.select(loaded, args.conversations, args.limit_questions)
    runnable = [s for s in chosen if unavailable(s) is None]

    def progress(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    embed = SharedEmbedder(FastEmbedEmbedder(cache_dir=args.cache_dir))
    results = evaluate(conversations, runnable, embed, progress)
    for system in chosen:
        reason = unavailable(system)
        if reason is not None:
            results[system.key] = {"label": system.label, "status": reason}
    results = {s.key: results[s.key] for s in chosen}
    if args.satchel is not None:
        results = {"satchel": satchel_row(args.satchel), **results}
    questions = sum(1 for c in conversations for q in c.questions if q.evidence)
    report = {
        "run": {
            "dataset": dataset,
            "data": str(args.data),
            "conversations": [c.sample_id for c in conversations],
            "questions_with_evidence": questions,
            "budget_tokens": BUDGET,
            "embedding_model": embed.model.model_id,
            "seconds": round(time.perf_counter() - started, 1),
        },
        "versions": versions(),
        "systems": results,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        run = report["run"]
        print(
            f"{run['dataset']} {Path(run['data']).name}: {len(run['conversations'])} conversations,"
            f" {questions} questions with evidence, {BUDGET} tokens, {run['embedding_model']}"
        )
        print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
