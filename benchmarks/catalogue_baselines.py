"""Baselines on the evaluation catalogues: recall@k of BM25 and of the plain cosine, and how
far the best cosine tells real tasks from off-domain ones.

    .venv/bin/python benchmarks/catalogue_baselines.py [--only NAME ...] [--no-write]

For every catalogue of `data/catalogues/` (loaded by `catalogues.py`), and the merged ones of
`catalogues.MERGED` (with a row a language too), every tool's full text
(`Tool.text()`: name, group, description, one line a parameter with its description) is
ranked against each task:

- BM25 (k1 1.2, b 0.75) over stemmed words: camelCase and snake_case names split into words,
  lower-cased, the project's English and French stop words dropped, English Snowball stems
  (`py_rust_stemmers`); a run of CJK characters becomes its character bigrams (no stemmer
  applies to it).
- the plain cosine with the project's embedder (`satchel.server.embedding.load_embedder`,
  configured as the server is, from the environment), the passage prefix in front of tool
  texts and the query prefix in front of tasks, vectors cached on disk in
  `$TMPDIR/satchel-catalogues/`.

Recall@k is the mean over tasks of |gold ∩ top k| / |gold|. The gating columns compare the best
cosine over the catalogue for its real tasks with the best cosine for the 60 off-domain tasks
of `off_domain.json`: their quartiles, and the AUC (the chance that a real task's best cosine
beats an off-domain one's; 1 separates perfectly, 0.5 not at all).

The report is printed and written to `benchmarks/catalogue_baselines.md` (unless `--no-write`).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from catalogues import (
    MERGED,
    Catalogue,
    Task,
    catalogue_names,
    load_catalogue,
    off_domain_tasks,
)
from py_rust_stemmers import SnowballStemmer
from talent_calibration import VectorCache

from satchel.server.context.domain.text_query import STOP_WORDS
from satchel.server.embedding import load_embedder
from satchel.server.platform.config import Settings

RECALL_AT = (1, 3, 5, 10)
K1 = 1.2
B = 0.75
REPORT = Path(__file__).resolve().parent / "catalogue_baselines.md"
COMMAND = ".venv/bin/python benchmarks/catalogue_baselines.py"

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")
_STEMMER = SnowballStemmer("english")


def analyze(text: str) -> list[str]:
    """BM25 terms: words split at camelCase humps and underscores, lower-cased, stop words
    dropped, English Snowball stems; CJK runs as character bigrams."""
    terms: list[str] = []
    for word in _WORD.findall(_CAMEL.sub(" ", text)):
        for part in _CJK.split(word):
            low = part.casefold()
            if len(low) >= 2 and low not in STOP_WORDS:
                terms.append(low)
        for run in _CJK.findall(word):
            terms += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
    latin = [t for t in terms if not _CJK.match(t)]
    stems = iter(_STEMMER.stem_words(latin))
    return [t if _CJK.match(t) else next(stems) for t in terms]


class BM25:
    """Okapi BM25 over a fixed set of documents."""

    def __init__(self, texts: Sequence[str]) -> None:
        documents = [Counter(analyze(text)) for text in texts]
        lengths = np.array([sum(d.values()) for d in documents], dtype=np.float64)
        mean = float(lengths.mean()) if lengths.size and lengths.mean() > 0 else 1.0
        rows: dict[str, list[tuple[int, int]]] = {}
        for i, document in enumerate(documents):
            for term, count in document.items():
                rows.setdefault(term, []).append((i, count))
        n = len(documents)
        self.postings = {
            term: (np.array([i for i, _ in hits]), np.array([c for _, c in hits], dtype=float))
            for term, hits in rows.items()
        }
        self.idf = {t: math.log(1 + (n - len(h) + 0.5) / (len(h) + 0.5)) for t, h in rows.items()}
        self.norms = K1 * (1 - B + B * lengths / mean)

    def scores(self, query: str) -> np.ndarray:
        result = np.zeros(len(self.norms))
        for term in dict.fromkeys(analyze(query)):
            if term in self.postings:
                rows, tf = self.postings[term]
                result[rows] += self.idf[term] * tf * (K1 + 1) / (tf + self.norms[rows])
        return result


def top_k(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k best scores, best first, ties by catalogue order."""
    order = np.argsort(-scores, kind="stable")
    return order[:k]


def recalls(tasks: Sequence[Task], ids: Sequence[str], rows: list[np.ndarray]) -> list[float]:
    """Recall@k for each k of RECALL_AT, mean over tasks."""
    result = []
    for k in RECALL_AT:
        total = 0.0
        for task, scores in zip(tasks, rows, strict=True):
            found = {ids[i] for i in top_k(scores, k)}
            total += len(found & set(task.gold)) / len(task.gold)
        result.append(total / len(tasks))
    return result


def auc(positive: np.ndarray, negative: np.ndarray) -> float:
    """P(a positive scores above a negative), ties counting half (Mann-Whitney U / n m)."""
    if positive.size == 0 or negative.size == 0:
        return float("nan")
    greater = (positive[:, None] > negative[None, :]).sum()
    ties = (positive[:, None] == negative[None, :]).sum()
    return float((greater + 0.5 * ties) / (positive.size * negative.size))


@dataclass
class Result:
    name: str
    tools: int
    tasks: int
    mean_gold: float
    max_r1: float  # recall@1 of a perfect ranking: mean of 1 / |gold|
    bm25: list[float]
    cosine: list[float]
    best_real: np.ndarray
    best_off: np.ndarray
    languages: frozenset[str]  # of the tasks
    off_languages: tuple[str, ...]  # of each off-domain task

    @property
    def auc(self) -> float:
        return auc(self.best_real, self.best_off)

    @property
    def same_language(self) -> np.ndarray:
        """The best cosines of the off-domain tasks in the tasks' language(s)."""
        keep = [lang in self.languages for lang in self.off_languages]
        return np.asarray(self.best_off[np.array(keep, dtype=bool)], dtype=np.float64)


def evaluate(
    catalogue: Catalogue, cache: VectorCache, off: Sequence[Task], tasks: Sequence[Task]
) -> Result:
    embedder = cache.embedder
    texts = [tool.text() for tool in catalogue.tools]
    ids = [tool.id for tool in catalogue.tools]
    bm25 = BM25(texts)
    tool_vectors = cache.embed([embedder.passage_prefix + text for text in texts])
    task_vectors = cache.embed([embedder.query_prefix + t.query for t in tasks])
    off_vectors = cache.embed([embedder.query_prefix + t.query for t in off])
    cosines = task_vectors @ tool_vectors.T
    return Result(
        name=catalogue.name,
        tools=len(ids),
        tasks=len(tasks),
        mean_gold=sum(len(t.gold) for t in tasks) / len(tasks),
        max_r1=sum(1 / len(t.gold) for t in tasks) / len(tasks),
        bm25=recalls(tasks, ids, [bm25.scores(t.query) for t in tasks]),
        cosine=recalls(tasks, ids, list(cosines)),
        best_real=cosines.max(axis=1),
        best_off=(off_vectors @ tool_vectors.T).max(axis=1),
        languages=frozenset(t.language for t in tasks),
        off_languages=tuple(t.language for t in off),
    )


def _quartiles(values: np.ndarray) -> str:
    q1, q2, q3 = np.quantile(values, [0.25, 0.5, 0.75])
    return f"{q1:.2f} / {q2:.2f} / {q3:.2f}"


def report(results: Sequence[Result], model: str, off: Sequence[Task]) -> str:
    head = " | ".join(f"R@{k}" for k in RECALL_AT)
    lines = [
        "## Recall@k (BM25 | plain cosine)",
        "",
        "Tool text = name, group, description, one line a parameter (`Tool.text()`). BM25: "
        "English Snowball stems, stop words dropped, camelCase / snake_case split, CJK as "
        "character bigrams. Cosine: the embedder, prefixes as the server adds them. "
        "Recall@k = mean over tasks of |gold ∩ top k| / |gold|; `max R@1` is what a perfect "
        "ranking scores at k = 1 when tasks have several gold tools.",
        "",
        f"| catalogue | tools | tasks | gold/task | max R@1 | BM25 {head} | cosine {head} |",
        "|---|---:|---:|---:|---:|" + "---:|" * (2 * len(RECALL_AT)),
    ]
    for r in results:
        cells = [f"{v:.3f}" for v in r.bm25 + r.cosine]
        lines.append(
            f"| {r.name} | {r.tools} | {r.tasks} | {r.mean_gold:.2f} | {r.max_r1:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    langs = dict(Counter(t.language for t in off))
    lines += [
        "",
        f"## Best cosine: real tasks vs the {len(off)} off-domain tasks {langs}",
        "",
        "Quartiles (25% / median / 75%) of each task's best cosine over the catalogue; AUC = "
        "chance that a real task's best cosine beats an off-domain task's, against all the "
        "off-domain tasks and against those in the language(s) of the row's tasks only.",
        "",
        "| catalogue | real tasks | off-domain (all) | AUC (all) | off-domain (same language) "
        "| AUC (same language) |",
        "|---|---|---|---:|---|---:|",
    ]
    for r in results:
        same = r.same_language
        lines.append(
            f"| {r.name} | {_quartiles(r.best_real)} | {_quartiles(r.best_off)} | {r.auc:.3f} "
            f"| {_quartiles(same)} ({same.size}) | {auc(r.best_real, same):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="catalogue names (default: all)")
    parser.add_argument("--no-write", action="store_true", help=f"do not write {REPORT.name}")
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    cache_dir = Path(tempfile.gettempdir()) / "satchel-catalogues"
    embedder = load_embedder(replace(settings, data_dir=cache_dir))
    cache = VectorCache(embedder, cache_dir)
    off = off_domain_tasks()
    started = time.perf_counter()
    results = []
    for name in args.only or [*catalogue_names(), *MERGED]:
        catalogue = load_catalogue(name)
        results.append(evaluate(catalogue, cache, off, catalogue.tasks))
        languages = sorted({t.language for t in catalogue.tasks})
        if len(languages) > 1:  # a row a language as well
            for lang in languages:
                subset = [t for t in catalogue.tasks if t.language == lang]
                part = evaluate(catalogue, cache, off, subset)
                results.append(replace(part, name=f"{name} ({lang} tasks)"))
    elapsed = time.perf_counter() - started
    text = "\n".join(
        [
            "# Talent-selection baselines on the evaluation catalogues",
            "",
            f"`{COMMAND}` — model `{embedder.model_id}` (query prefix "
            f"{embedder.query_prefix!r}, passage prefix {embedder.passage_prefix!r}); "
            "catalogues in `benchmarks/data/catalogues/` (see SOURCES.md).",
            "",
            report(results, embedder.model_id, off),
            "",
        ]
    )
    print(text)
    print(f"({cache.fresh} texts embedded, {elapsed:.0f} s)", file=sys.stderr)
    if not args.no_write:
        REPORT.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
