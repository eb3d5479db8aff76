"""Talent selection with the server's defaults, per catalogue, beside BM25 and cosine.

    .venv/bin/python benchmarks/talent_selection.py [--model minilm|e5|mpnet] [--sets a,b]
        [--gate-sweep] [--leaks] [--word-quantile Q]

Runs the server's own selection (`satchel.server.talents.domain.selection.select` over a
`FusedSpace` calibrated with the shipped unrelated tasks, as `TalentService` builds it) on every
labelled set of benchmarks/talent_design/datasets.py: the public catalogues of
benchmarks/data/catalogues/ (SOURCES.md), MetaTool, the coding catalogue and our own set. Per
set it prints:

- served: mean talents served per real task (relevance-kept, no closure: these sets have no
  edges); recall: gold recall among the served; BM25 and cosine at the same count per task
  (stemmed BM25 over the full text, benchmarks/catalogue_baselines.py; the cosine of the short
  text), and the gap to BM25 in points;
- R@1/3/5/10 of the fused ranking, and of BM25;
- gated: real tasks that got nothing (out of domain); off: of the 60 unrelated tasks of
  off_domain.json, how many got a talent; chat: the same per 20 of the 133 requests of
  data/no_tool_requests/fastchat.json (MT-Bench and Vicuna-bench, written by other authors).

`--leaks` lists, per set, the unrelated tasks of off_domain.json that got a talent, with it.
`--gate-sweep` also prints the gate's trade-off over the set: unrelated tasks served per 20 and
real tasks gated, by the level's quantile and the contrast for English tasks.

Vectors are cached under $TMPDIR/satchel-catalogues (the first run embeds every catalogue: ~10
minutes on 2 cores per model).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "talent_design"))
sys.path.insert(0, str(HERE))

from catalogue_baselines import BM25  # noqa: E402
from datasets import Dataset, all_sets, chat_requests, off_domain  # noqa: E402
from vectors import Vectors  # noqa: E402

from satchel.server.embedding.spans import part_spans  # noqa: E402
from satchel.server.platform.config import TalentSettings  # noqa: E402
from satchel.server.talents.domain.fusion import (  # noqa: E402
    GATE_QUANTILE,
    SIMILARITY_GATE_MIN,
    WORD_GATE_QUANTILE,
    FusedSpace,
    merged_scores,
    sub_intents,
)
from satchel.server.talents.domain.lexical import FieldIndex  # noqa: E402
from satchel.server.talents.domain.selection import (  # noqa: E402
    ScorableTalent,
    SelectionParams,
    select,
    stems,
)
from satchel.server.talents.domain.terms import is_english, script_of, task_terms  # noqa: E402
from satchel.server.talents.service import default_params, unrelated_tasks  # noqa: E402

KS = (1, 3, 5, 10)


def candidates(dataset: Dataset) -> list[ScorableTalent]:
    return [
        ScorableTalent.build(id=t.id, name=t.name, summary=t.summary, body=t.body, tags=t.tags)
        for t in dataset.talents
    ]


def fused_space(
    talents: list[ScorableTalent],
    vectors: Vectors,
    quantile: float = GATE_QUANTILE,
    word_quantile: float = WORD_GATE_QUANTILE,
) -> FusedSpace:
    return FusedSpace.of(
        vectors.passages([t.text for t in talents]),
        vectors.passages([t.full_text for t in talents]),
        FieldIndex.of([t.fields for t in talents if t.fields is not None]),
        vectors.queries(unrelated_tasks()),
        quantile,
        multilingual=vectors.model == "e5",
        unrelated_texts=unrelated_tasks(),
        word_quantile=word_quantile,
    )


def part_vectors(vectors: Vectors, text: str, pooled: bool) -> np.ndarray | None:
    """The task's sub-intent vectors as the server pools them (`Runtime.embed_query_parts`),
    or None (scored by their words)."""
    parts = sub_intents(text)
    if not pooled or not parts:
        return None
    prefix = vectors.query_prefix
    spans = part_spans(text, parts, offset=len(prefix))
    if spans is None:
        return None
    result = vectors.embedder.embed_with_spans(prefix + text, spans)
    return None if result is None else result[1]


def recall(ranked: list[str], gold: frozenset[str]) -> float:
    return len(gold & set(ranked)) / len(gold)


def evaluate(
    dataset: Dataset,
    talents: list[ScorableTalent],
    space: FusedSpace,
    vectors: Vectors,
    params: SelectionParams,
    off: list[str],
    chat: list[str],
    pool_parts: bool = True,
    leaks: list[str] | None = None,
) -> dict[str, float]:
    """The figures of one set (`pool_parts`: sub-intents scored with pooled vectors, else by
    their words); each of the `off` requests that got a talent described in `leaks`."""
    ids = [t.id for t in talents]
    bm25 = BM25([t.full_text for t in talents])
    tasks = [t for t in dataset.tasks if t.gold]
    queries = vectors.queries([t.text for t in tasks])
    figures: dict[str, list[float]] = {}

    def add(key: str, value: float) -> None:
        figures.setdefault(key, []).append(value)

    for task, query in zip(tasks, queries, strict=True):
        pooled = part_vectors(vectors, task.text, pool_parts)
        result = select(
            talents, space, query, stems(task.text), params, task=task.text, part_vectors=pooled
        )
        served = result.kept_ids
        evidence = space.evidence(query, task_terms(task.text))
        texts = sub_intents(task.text)
        if pooled is None:
            parts = [space.word_scores(task_terms(part)) for part in texts]
        else:
            parts = space.part_scores(pooled, [task_terms(part) for part in texts])
        fused = merged_scores(evidence.fused, parts, params.margin)
        fused_order = [ids[i] for i in np.argsort(-fused, kind="stable")]
        bm25_order = [ids[i] for i in np.argsort(-bm25.scores(task.text), kind="stable")]
        cosine_order = [ids[i] for i in np.argsort(-evidence.short, kind="stable")]
        n = len(served)
        add("served", n)
        add("gated", float(result.out_of_domain))
        add("recall", recall(served, task.gold))
        add("bm25", recall(bm25_order[:n], task.gold))
        add("cosine", recall(cosine_order[:n], task.gold))
        add("capped", float(any(d.reason == "over_max_served" for d in result.excluded)))
        for k in KS:
            add(f"R@{k}", recall(fused_order[:k], task.gold))
            add(f"bm25 R@{k}", recall(bm25_order[:k], task.gold))
    means = {key: float(np.mean(values)) for key, values in figures.items()}
    means["off"] = served_count(talents, space, vectors, params, off, leaks)
    means["chat"] = served_count(talents, space, vectors, params, chat) * 20 / len(chat)
    means["tasks"] = len(tasks)
    return means


def served_count(
    talents: list[ScorableTalent],
    space: FusedSpace,
    vectors: Vectors,
    params: SelectionParams,
    texts: list[str],
    leaks: list[str] | None = None,
) -> int:
    """How many of these unrelated requests got a talent (each described in `leaks`: its
    first talent, best similarity and, in another language, best word score)."""
    served = 0
    for text, query in zip(texts, vectors.queries(texts), strict=True):
        result = select(talents, space, query, stems(text), params, task=text)
        if result.kept and leaks is not None and result.gate is not None:
            words = result.gate.best_word_score
            leaks.append(
                f"{text[:60]} -> {result.kept[0].id} (similarity"
                f" {result.gate.best_similarity:.2f}"
                + ("" if words is None else f", word score {words:.1f}")
                + ")"
            )
        served += bool(result.kept)
    return served


SWEEP: list[tuple[float, float | None, str]] = [
    *((q, None, "words") for q in (0.5, 0.6, 0.7, 0.9, 0.95)),
    *((q, c, "words") for q in (0.75, 0.8, 0.85) for c in (None, -0.1, -0.05, -0.02, 0.0)),
    (0.75, -0.05, "shared"),
    (0.75, -0.05, "level"),
    (0.75, -0.05, "all"),
]
"""(level quantile, contrast, what judges the other languages: see `admitted`)."""


def gate_figures(
    talents: list[ScorableTalent], space: FusedSpace, vectors: Vectors, texts: list[str]
) -> np.ndarray:
    """Per task: best similarity to a talent, to the nearest shipped unrelated request, whether
    it is English (the contrast's condition), its best word match, and whether it passes the
    server's word test for other languages (a shared word, and a best BM25F above what the
    shipped requests of its script reach by accident)."""
    queries = vectors.queries(texts)
    unrelated = space.unrelated if space.unrelated is not None else np.zeros((1, queries.shape[1]))
    rows = []
    for text, query in zip(texts, queries, strict=True):
        unit = query / np.linalg.norm(query)
        evidence = space.evidence(query, task_terms(text))
        words = float(evidence.word_match.max()) if len(evidence.word_match) else 0.0
        report = space.judge(evidence, query, False, script_of(text))
        rows.append(
            (
                evidence.best_similarity,
                float((unrelated @ unit).max()),
                float(is_english(text)),
                words,
                float(not (report.no_shared_word or report.few_words)),
            )
        )
    return np.array(rows)


def calibration_best(space: FusedSpace) -> np.ndarray:
    """The best similarity of each shipped unrelated request on this catalogue."""
    assert space.unrelated is not None
    return np.maximum(space.unrelated @ space.short.T, space.unrelated @ space.full.T).max(axis=1)


def admitted(
    x: np.ndarray, level: float, contrast: float | None, mode: str = "words"
) -> np.ndarray:
    """Which tasks (rows of `gate_figures`) a gate at `level` with `contrast` lets through.
    `mode` says what judges tasks in another language than English: "words" (the server's rule
    with an English model: a shared word, and more word match than the shipped requests of its
    script reach by accident), "shared" (a shared word alone, the rule before 2026-12-07),
    "level" (nothing more), "all" (the contrast)."""
    passes = x[:, 0] >= level
    if contrast is None:
        return passes
    english, contrasted = x[:, 2] == 1, x[:, 0] - x[:, 1] > contrast
    other = {
        "words": x[:, 4] == 1,
        "shared": x[:, 3] > 0,
        "level": np.ones(len(x), dtype=bool),
        "all": contrasted,
    }[mode]
    return passes & np.where(english, contrasted, other)


def sweep(rows: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """The gate's trade-off over (level quantile, contrast for English tasks)."""
    print("\n| level | contrast | unrelated served per 20 (mean / worst) |", end="")
    print(" real gated (mean / worst) |")
    print("|---|---|---|---|")
    for quantile, contrast, mode in SWEEP:
        served, gated = [], []
        for calibration, off, real in rows.values():
            level = max(float(np.quantile(calibration, quantile)), SIMILARITY_GATE_MIN)
            served.append(admitted(off, level, contrast, mode).sum() * 20 / len(off))
            gated.append(1 - admitted(real, level, contrast, mode).mean())
        label = (
            "none"
            if contrast is None
            else f"{contrast}" + ("" if mode == "words" else f" ({mode})")
        )
        print(
            f"| {quantile} | {label} |"
            f" {np.mean(served):.1f} / {max(served):.1f} |"
            f" {100 * np.mean(gated):.1f} % / {100 * max(gated):.1f} % |",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm", choices=("minilm", "e5", "mpnet"))
    parser.add_argument("--sets", default="", help="comma-separated set names (default: all)")
    parser.add_argument("--margin", type=float, default=None)
    parser.add_argument("--max-served", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--gate-quantile", type=float, default=None)
    parser.add_argument(
        "--word-quantile",
        type=float,
        default=WORD_GATE_QUANTILE,
        help="the word level of tasks in other languages (fusion.WORD_GATE_QUANTILE)",
    )
    parser.add_argument(
        "--sub-intents",
        choices=("pooled", "words"),
        default=TalentSettings().sub_intents,
        help="how a task's parts are scored (SATCHEL_TALENT_SUB_INTENTS)",
    )
    parser.add_argument(
        "--gate-sweep", action="store_true", help="also print the gate's trade-off table"
    )
    parser.add_argument(
        "--leaks", action="store_true", help="also list the unrelated tasks served, per set"
    )
    args = parser.parse_args()
    vectors = Vectors(args.model)
    params = default_params(TalentSettings(), vectors.embedder.model_id)
    if args.margin is not None:
        params = replace(params, margin=args.margin)
    if args.max_served is not None:
        params = replace(params, max_served=args.max_served)
    wanted = {name for name in args.sets.split(",") if name}
    off = [t.text for t in off_domain()]
    chat = [t.text for t in chat_requests()]
    spaces: dict[str, tuple[list[ScorableTalent], FusedSpace]] = {}
    gates: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    rows = {}
    header = (
        f"{'set':16} {'tasks':>5} {'served':>6} {'recall':>6} {'bm25':>6} {'cos':>6} {'gap':>6}"
        f" {'capped':>6} {'R@1':>5} {'R@3':>5} {'R@5':>5} {'R@10':>5} {'bR@5':>5}"
        f" {'gated':>6} {'off/60':>6} {'chat/20':>7}"
    )
    print(f"model {args.model}, sub-intents {args.sub_intents}, {params}")
    print(header)
    for dataset in all_sets():
        if wanted and dataset.name not in wanted:
            continue
        if dataset.catalogue not in spaces:
            talents = candidates(dataset)
            quantile = GATE_QUANTILE if args.gate_quantile is None else args.gate_quantile
            space = fused_space(talents, vectors, quantile, args.word_quantile)
            spaces[dataset.catalogue] = (talents, space)
        talents, space = spaces[dataset.catalogue]
        if args.gate_sweep:
            real = [t.text for t in dataset.tasks if t.gold]
            gates[dataset.name] = (
                calibration_best(space),
                gate_figures(talents, space, vectors, off),
                gate_figures(talents, space, vectors, real),
            )
        pooled = args.sub_intents == "pooled"
        leaks: list[str] | None = [] if args.leaks else None
        f = evaluate(dataset, talents, space, vectors, params, off, chat, pooled, leaks)
        if leaks:
            print("\n".join(f"    served, unrelated: {leak}" for leak in leaks))
        rows[dataset.name] = f
        print(
            f"{dataset.name:16} {f['tasks']:>5.0f} {f['served']:>6.2f} {f['recall']:>6.3f}"
            f" {f['bm25']:>6.3f} {f['cosine']:>6.3f} {100 * (f['recall'] - f['bm25']):>+6.1f}"
            f" {f['capped']:>6.1%} {f['R@1']:>5.3f} {f['R@3']:>5.3f} {f['R@5']:>5.3f}"
            f" {f['R@10']:>5.3f} {f['bm25 R@5']:>5.3f} {f['gated']:>6.1%} {f['off']:>6.0f}"
            f" {f['chat']:>7.1f}",
            flush=True,
        )
    if args.gate_sweep:
        sweep(gates)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
