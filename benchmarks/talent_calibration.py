"""Talent selection calibration: recall of gold talents, catalogue tokens served, gating.

    .venv/bin/python benchmarks/talent_calibration.py [--data ../shared/data] [--queries 1000]
        [--seed 7] [--equal-count-only] [--latency] [--latency-calls 300]

Reads the evaluation data from `../shared/data` at run time (never copied into the repo):

- MetaTool: the 199 tools of `plugin_des.json` as talents (name = tool, summary = body = its
  description, no tags), `--queries` labelled queries sampled from `all_clean_data.csv` with a
  fixed seed (one gold tool each), and the 497 queries of `multi_tool_query_golden.json`
  (two gold tools each).
- Coding catalogue: the 12 Anthropic skills (a SKILL.md front matter each; tokens from the
  real SKILL.md size) plus the 257 cursor rules (an `.mdc` each: description, globs, body),
  read by the same parser as `satchel talents import`; 25 coding tasks written here with
  their gold talents, and 10 off-domain tasks that should be gated.
- Our own labelled set (`data/talent_tasks.json`, loaded by `talent_tasks.py`): English coding
  tasks and their French twins over a slice of that catalogue, and off-domain tasks.

First, for the embedding model's server defaults: recall@k of BM25, the plain cosine, the
seed's score and the hybrid score; each selection's recall at the count it served beside BM25
and the plain cosine at that same count and budget (with the served count's distribution);
hybrid scoring's margin x cap and floor sweeps; English tasks beside their French twins.
Then, unless `--equal-count-only`, the seed scoring's calibration on the first three data sets:
a grid of FLOOR x BETA x MARGIN (budget 2000), the gate, then a budget sweep: recall of gold
talents, mean share of the candidates' tokens served, mean talents served, share of in-domain
queries wrongly gated, share of off-domain tasks gated.

Every selection goes through `satchel.server.talents.service.resolve_selection`, the function the
server's ResolveTalents calls, with vectors from the real embedder (passage/query prefixes as
the server adds them).

`--latency` also starts `satchel serve` (embedded PostgreSQL in a temporary directory, or
SATCHEL_DATABASE_URL), imports 200 talents through gRPC, and times ResolveTalents with
relevance on (talent vectors cached, each call embeds its task) from a client.
"""

from __future__ import annotations

import argparse
import csv
import functools
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from satchel.server.commands.talents import talent_from_text
from satchel.server.embedding import load_embedder
from satchel.server.embedding.port import Embedder
from satchel.server.platform.config import Settings, TalentSettings
from satchel.server.talents.domain.lexical import LexicalIndex
from satchel.server.talents.domain.selection import (
    CentredSpace,
    ScorableTalent,
    Scoring,
    SelectionParams,
    select,
    stems,
)
from satchel.server.talents.service import Resolution, default_params, resolve_selection, scorable
from satchel.server.talents.storage.catalogue import TalentRecord

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FLOORS = (0.10, 0.14, 0.18, 0.22, 0.26)
BETAS = (0.06, 0.12, 0.18)
MARGINS = (0.15, 0.20, 0.25, 0.30, 0.35)
BUDGETS = (500, 1000, 2000, 4000, 8000)
GATE_FLOORS = tuple(round(0.14 + 0.02 * i, 2) for i in range(11))
BASE_BUDGET = 2000

# Coding tasks and the talents that should serve them (ids as `satchel talents import` derives
# them from rules/<id>.mdc and skills/<name>/SKILL.md).
CODING_TASKS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Write Cypress end-to-end tests for the checkout flow of our web shop",
        ("rules.cypress-e2e-testing-cursorrules-prompt-file",),
    ),
    (
        "Add Playwright accessibility checks to the signup page tests",
        ("rules.playwright-accessibility-testing-cursorrules-prompt-file",),
    ),
    (
        "Write a multi-stage Dockerfile for our service that runs as a non-root user",
        ("rules.docker",),
    ),
    (
        "Add a safe PostgreSQL migration that creates an index and a timestamptz column",
        ("rules.postgresql",),
    ),
    (
        "Create an ERC-20 token contract in Solidity and test it with Foundry",
        ("rules.solidity-foundry-cursorrules-prompt-file",),
    ),
    (
        "Build a Pinia store for the shopping cart of our Vue 3 app",
        ("rules.vue-pinia-cursorrules-prompt-file",),
    ),
    ("Write a Blender add-on with an operator and a panel", ("rules.blender-python-addon",)),
    (
        "Set up a ROS2 node and a launch file that publishes lidar messages",
        ("rules.ros-ros2",),
    ),
    (
        "Write a conventional commit message for this change",
        ("rules.git-conventional-commit-messages",),
    ),
    (
        "Tune the hyperparameters of our PyTorch model with Ray Tune and Optuna",
        ("rules.automl-hyperparameter-optimization",),
    ),
    ("Build an MCP server that exposes our issue tracker as tools", ("skills.mcp-builder",)),
    ("Make an animated GIF for Slack to celebrate the release", ("skills.slack-gif-creator",)),
    (
        "Write this week's internal newsletter for the company in our usual format",
        ("skills.internal-comms",),
    ),
    ("Generate a flow-field generative art piece with p5.js", ("skills.algorithmic-art",)),
    (
        "Write a Fortran module for a finite-difference heat equation solver",
        ("rules.fortran",),
    ),
    (
        "Write STM32 HAL code to receive UART data with DMA and an interrupt",
        ("rules.embedded-stm32-hal",),
    ),
    (
        "Create a Jetpack Compose screen for the settings page of our Android app",
        ("rules.android-jetpack-compose-cursorrules-prompt-file",),
    ),
    (
        "Build Snowflake dynamic tables and streams for the ingestion pipeline",
        ("rules.snowflake-data-engineering-cursorrules-prompt-file",),
    ),
    (
        "Create a Shopify theme section in Liquid for featured products",
        ("rules.shopify-theme-dev-liquid",),
    ),
    (
        "Write a PySpark ETL job joining orders with customers using window functions",
        ("rules.pyspark-etl-best-practices-cursorrules-prompt-file",),
    ),
    ("Write a GameMaker GML script for the player object's movement", ("rules.gamemaker-gml",)),
    (
        "The dev server cannot reach the database: troubleshoot DNS and the firewall",
        ("rules.network-troubleshoot",),
    ),
    (
        "Add TanStack Query v5 query key factories and optimistic mutations",
        ("rules.tanstack-query-v5-cursorrules-prompt-file", "rules.tanstack-query"),
    ),
    (
        "Write Vitest unit tests for the date formatting utilities",
        ("rules.vitest-unit-testing-cursorrules-prompt-file",),
    ),
    (
        "Review this pull request for security, performance and missing tests",
        ("rules.pr-review-cursorrules-prompt-file",),
    ),
)

OFF_DOMAIN_TASKS: tuple[str, ...] = (
    "What is a good recipe for banana bread with walnuts?",
    "Plan a three-day sightseeing trip to Lisbon in May",
    "Translate this birthday card message into Italian",
    "Which houseplants survive in a dark bathroom?",
    "Summarise the causes of the French Revolution",
    "Recommend a beginner running plan to train for a 10k race",
    "How do I remove a red wine stain from a wool carpet?",
    "Write a short poem about autumn leaves for my grandmother",
    "What should I pack for a winter camping weekend?",
    "Explain the offside rule in football to a child",
)


@dataclass
class Query:
    """A task with its gold talent ids (empty: off-domain)."""

    task: str
    gold: frozenset[str]


@dataclass
class Dataset:
    """A catalogue (candidates, their vectors and BM25 index) and queries with their vectors."""

    name: str
    candidates: list[ScorableTalent]
    space: CentredSpace
    queries: list[Query]
    query_vectors: np.ndarray
    lexical: LexicalIndex

    def resolve(self, query: Query, vector: np.ndarray, params: SelectionParams) -> Resolution:
        """A query through `resolve_selection`, the function ResolveTalents calls."""
        return resolve_selection(
            self.candidates,
            self.space,
            vector,
            query.task,
            relevance=True,
            params=params,
            lexical=self.lexical,
        )

    @functools.cached_property
    def baselines(self) -> dict[str, list[list[str]]]:
        """Per query, every candidate ranked by BM25 and by the plain cosine."""
        ids = [t.id for t in self.candidates]
        return {
            "BM25": [_ranked(ids, self.lexical.scores(q.task)[0]) for q in self.queries],
            "cosine": [_ranked(ids, self.space.cosines(v)) for v in self.query_vectors],
        }


def own_task_set(
    coding: Sequence[ScorableTalent],
) -> tuple[list[ScorableTalent], list[Query], list[Query]]:
    """The own labelled set (benchmarks/data/talent_tasks.json): its slice of the coding
    catalogue, the English tasks then the English off-domain ones, and their French twins in
    the same order."""
    from talent_tasks import load_talent_tasks  # benchmarks/, beside this script

    tasks = load_talent_tasks()
    catalogue = [t for t in coding if t.id in set(tasks.catalogue_slice)]
    english = [t for t in (*tasks.tasks, *tasks.off_domain) if t.lang == "en"]
    en = [Query(t.text, frozenset(t.gold)) for t in english]
    fr = [Query(tasks.twin_of(t).text, frozenset(tasks.twin_of(t).gold)) for t in english]
    return catalogue, en, fr


def metatool_catalogue(data: Path) -> list[ScorableTalent]:
    """The 199 MetaTool tools as talents: the description is the summary and what is served."""
    tools = json.loads((data / "metatool" / "plugin_des.json").read_text())
    return [
        scorable(TalentRecord(id=name, name=name, summary=text, body=text))
        for name, text in sorted(tools.items())
    ]


def metatool_single(data: Path, count: int, seed: int) -> list[Query]:
    """`count` labelled queries sampled from all_clean_data.csv with a fixed seed."""
    with (data / "metatool" / "all_clean_data.csv").open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    random.Random(seed).shuffle(rows)
    return [Query(row["Query"], frozenset([row["Tool"]])) for row in rows[:count]]


def metatool_multi(data: Path) -> list[Query]:
    """The 497 queries with two gold tools each."""
    rows = json.loads((data / "metatool" / "multi_tool_query_golden.json").read_text())
    return [Query(row["query"], frozenset(row["tool"])) for row in rows]


def coding_catalogue(data: Path) -> list[ScorableTalent]:
    """Anthropic skills and cursor rules, as `satchel talents import` would read their files."""
    root = Path("/catalogue")
    talents: list[ScorableTalent] = []
    skills = json.loads((data / "skills_catalogues" / "anthropic_skills_apache.json").read_text())
    for skill in skills["skills"]:
        description = _yaml_value(skill["description"])
        text = f"---\nname: {skill['name']}\ndescription: {description}\n---\n"
        parsed = talent_from_text(text, root / "skills" / skill["name"] / "SKILL.md", root)
        talent = scorable(_record(parsed))
        # Only the front matter is in the data set: count the real SKILL.md's size.
        talents.append(replace(talent, tokens=max(1, skill["skill_md_chars"] // 4)))
    rules = json.loads((data / "skills_catalogues" / "awesome_cursorrules_rules.json").read_text())
    for rule in rules:
        text = (
            f"---\ndescription: {_yaml_value(rule['description'])}\nglobs: {rule['globs']}\n"
            f"alwaysApply: {rule['alwaysApply']}\n---\n{rule['body']}"
        )
        parsed = talent_from_text(text, root / "rules" / f"{rule['id']}.mdc", root)
        talents.append(scorable(_record(parsed)))
    return sorted(talents, key=lambda t: t.id)


def _yaml_value(text: str) -> str:
    """A front matter value: plain on one line, a literal block over several."""
    if "\n" not in text:
        return text
    return "|\n" + "\n".join(f"  {line}" for line in text.splitlines())


def _record(parsed: object) -> TalentRecord:
    lists = parsed.lists  # type: ignore[attr-defined]
    return TalentRecord(
        id=parsed.id,  # type: ignore[attr-defined]
        name=parsed.name,  # type: ignore[attr-defined]
        summary=parsed.summary,  # type: ignore[attr-defined]
        body=parsed.body,  # type: ignore[attr-defined]
        tags=tuple(lists.get("tags", ())),
        triggers=tuple(lists.get("triggers", ())),
        task_types=tuple(lists.get("task_types", ())),
    )


class VectorCache:
    """Vectors by sha256 of the exact text embedded, kept in a file between runs."""

    def __init__(self, embedder: Embedder, directory: Path) -> None:
        self.embedder = embedder
        model = re.sub(r"[^\w.-]", "_", embedder.model_id)
        self.path = directory / f"vectors-{model}.npz"
        self.vectors: dict[str, np.ndarray] = {}
        if self.path.exists():
            with np.load(self.path) as stored:
                self.vectors = {key: stored[key] for key in stored.files}
        self.fresh = 0  # texts embedded by this run

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
        missing = {key: text for key, text in zip(keys, texts, strict=True)}
        missing = {key: text for key, text in missing.items() if key not in self.vectors}
        if missing:
            fresh = self.embedder.embed(list(missing.values()))
            self.vectors.update(zip(missing, fresh, strict=True))
            self.fresh += len(missing)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(self.path, **self.vectors)
        return np.stack([self.vectors[key] for key in keys])


def embed_dataset(
    name: str, cache: VectorCache, candidates: list[ScorableTalent], queries: list[Query]
) -> Dataset:
    """Vectors as the server computes them: passage prefix for talents, query prefix for tasks."""
    ids = {talent.id for talent in candidates}
    unknown = {gold for query in queries for gold in query.gold} - ids
    if unknown:
        raise SystemExit(f"{name}: gold ids not in the catalogue: {sorted(unknown)}")
    embedder = cache.embedder
    vectors = cache.embed([embedder.passage_prefix + t.text for t in candidates])
    query_vectors = cache.embed([embedder.query_prefix + q.task for q in queries])
    lexical = LexicalIndex.of([t.text for t in candidates])
    return Dataset(name, candidates, CentredSpace.of(vectors), queries, query_vectors, lexical)


@dataclass
class Row:
    """Aggregated outcome of one dataset under one parameter set."""

    recall: float
    any_gold: float
    share: float
    served: float
    gated_in: float
    gated_off: float | None


def evaluate(dataset: Dataset, params: SelectionParams) -> Row:
    """Run every query of a dataset through resolve_selection with these parameters."""
    recalls, hits, shares, served, gated_in, gated_off = [], [], [], [], [], []
    for query, vector in zip(dataset.queries, dataset.query_vectors, strict=True):
        result = dataset.resolve(query, vector, params)
        kept = set(result.selected_ids)
        if query.gold:
            recalls.append(len(kept & query.gold) / len(query.gold))
            hits.append(bool(kept & query.gold))
            gated_in.append(result.out_of_domain)
            shares.append(result.tokens_selected / result.tokens_candidates)
            served.append(len(kept))
        else:
            gated_off.append(result.out_of_domain)
    return Row(
        recall=statistics.fmean(recalls),
        any_gold=statistics.fmean(hits),
        share=statistics.fmean(shares),
        served=statistics.fmean(served),
        gated_in=statistics.fmean(gated_in),
        gated_off=statistics.fmean(gated_off) if gated_off else None,
    )


RECALL_AT = (1, 3, 5, 10)
UNCUT = {"floor": -1.0, "margin": 10.0, "budget_tokens": 10**9, "max_served": 0}


def _ranked(ids: Sequence[str], scores: np.ndarray) -> list[str]:
    """Ids by descending score, ties by id (as selection breaks them)."""
    order = np.lexsort((np.array(ids), -np.asarray(scores)))
    return [ids[i] for i in order]


def rankings(dataset: Dataset, params: SelectionParams) -> dict[str, list[list[str]]]:
    """Per query, every candidate ranked by BM25, plain cosine, the seed's score and the
    hybrid score (the latter two through `select`, uncut, with `params`' beta and weight)."""
    found: dict[str, list[list[str]]] = {**dataset.baselines, "seed score": [], "hybrid": []}
    for query, vector in zip(dataset.queries, dataset.query_vectors, strict=True):
        for name, scoring in (("seed score", Scoring.SEED), ("hybrid", Scoring.HYBRID)):
            uncut = replace(params, scoring=scoring, **UNCUT)
            result = select(
                dataset.candidates,
                dataset.space,
                vector,
                stems(query.task),
                uncut,
                task=query.task,
                lexical=dataset.lexical,
            )
            found[name].append([d.id for d in (*result.kept, *result.excluded)])
    return found


def _recall(ranked: Sequence[str], gold: frozenset[str], count: int) -> float:
    return len(set(ranked[:count]) & gold) / len(gold)


def _packed(ranked: Sequence[str], count: int, tokens: dict[str, int], budget: int) -> list[str]:
    """The first `count` of a ranking that fit the budget together, taken as selection takes
    them (one that does not fit is skipped, the next may fit)."""
    packed, used = [], 0
    for talent_id in ranked:
        if len(packed) == count:
            break
        if used + tokens[talent_id] <= budget:
            packed.append(talent_id)
            used += tokens[talent_id]
    return packed


def ranking_table(datasets: Sequence[Dataset], params: SelectionParams) -> str:
    """Recall of gold talents among the first k of each ranking, per data set."""
    lines = [
        "| data set | ranking | " + " | ".join(f"recall@{k}" for k in RECALL_AT) + " |",
        "|---|---|" + "---|" * len(RECALL_AT),
    ]
    for d in datasets:
        labelled = [i for i, q in enumerate(d.queries) if q.gold]
        for name, ranked in rankings(d, params).items():
            cells = [
                statistics.fmean(_recall(ranked[i], d.queries[i].gold, k) for i in labelled)
                for k in RECALL_AT
            ]
            lines.append(f"| {d.name} | {name} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    return "\n".join(lines)


@dataclass
class EqualCount:
    """One selection over one data set, beside the baselines at the same count and budget."""

    recall: float
    served: float
    served_quantiles: tuple[float, float, int]
    bm25: float
    cosine: float
    gated: float
    gated_off: float | None

    @property
    def gain(self) -> float:
        """Points of recall over BM25 at the same count."""
        return 100 * (self.recall - self.bm25)


def equal_count_row(d: Dataset, params: SelectionParams) -> EqualCount:
    """Run `params` over every query of `d`; each query's served count also cuts BM25's and the
    plain cosine's rankings (first ones that fit the same budget, as selection takes them)."""
    ranked = d.baselines
    tokens = {t.id: t.tokens for t in d.candidates}
    recall, bm25, cosine, served, gated, gated_off = [], [], [], [], [], []
    for i, (query, vector) in enumerate(zip(d.queries, d.query_vectors, strict=True)):
        result = d.resolve(query, vector, params)
        if not query.gold:
            gated_off.append(result.out_of_domain)
            continue
        kept = result.selected_ids
        recall.append(len(set(kept) & query.gold) / len(query.gold))
        for found, name in ((bm25, "BM25"), (cosine, "cosine")):
            same = _packed(ranked[name][i], len(kept), tokens, params.budget_tokens)
            found.append(len(set(same) & query.gold) / len(query.gold))
        served.append(len(kept))
        gated.append(result.out_of_domain)
    deciles = statistics.quantiles(served, n=10, method="inclusive")
    return EqualCount(
        recall=statistics.fmean(recall),
        served=statistics.fmean(served),
        served_quantiles=(statistics.median(served), deciles[8], max(served)),
        bm25=statistics.fmean(bm25),
        cosine=statistics.fmean(cosine),
        gated=statistics.fmean(gated),
        gated_off=statistics.fmean(gated_off) if gated_off else None,
    )


def equal_count_table(datasets: Sequence[Dataset], selections: dict[str, SelectionParams]) -> str:
    """Each selection's recall at the count it served, beside BM25's and the plain cosine's
    first results at that same count and under the same budget, query by query; the served
    count's distribution."""
    lines = [
        "| data set | selection | recall | served mean | served p50 / p90 / max | BM25 same count"
        " | cosine same count | vs BM25 | gated | off-domain gated |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for d in datasets:
        for label, params in selections.items():
            row = equal_count_row(d, params)
            p50, p90, top = row.served_quantiles
            lines.append(
                f"| {d.name} | {label} | {row.recall:.3f} | {row.served:.2f} |"
                f" {p50:g} / {p90:g} / {top} | {row.bm25:.3f} | {row.cosine:.3f} |"
                f" {row.gain:+.1f} pts | {row.gated:.3f} | {_cell(row.gated_off)} |"
            )
    return "\n".join(lines)


HYBRID_FLOORS = (0.16, 0.18, 0.20, 0.22, 0.24, 0.26)
HYBRID_MARGINS = (0.15, 0.20, 0.25, 0.30, 0.35)
HYBRID_CAPS = (5, 8, 10)


def hybrid_cut_table(datasets: Sequence[Dataset], params: SelectionParams) -> str:
    """Hybrid scoring's margin x cap: recall, mean served and the gain over BM25 at the same
    count and budget, per data set (how the default cut was chosen)."""
    head = "| margin | at most |"
    rule = "|---|---|"
    for d in datasets:
        head += f" {d.name} recall | served | vs BM25 |"
        rule += "---|---|---|"
    lines = [head, rule]
    for margin in HYBRID_MARGINS:
        for cap in HYBRID_CAPS:
            line = f"| {margin:.2f} | {cap} |"
            for d in datasets:
                row = equal_count_row(d, replace(params, margin=margin, max_served=cap))
                line += f" {row.recall:.3f} | {row.served:.2f} | {row.gain:+.1f} |"
            lines.append(line)
    return "\n".join(lines)


def hybrid_gate_table(datasets: Sequence[Dataset], params: SelectionParams) -> str:
    """Hybrid scoring's floor on the plain cosine: in-domain tasks wrongly gated and off-domain
    tasks gated, per data set (how the default floor was chosen)."""
    head, rule = "| floor |", "|---|"
    for d in datasets:
        off = any(not q.gold for q in d.queries)
        head += f" {d.name} gated |" + (" off-domain gated |" if off else "")
        rule += "---|" + ("---|" if off else "")
    lines = [head, rule]
    for floor in HYBRID_FLOORS:
        line = f"| {floor:.2f} |"
        for d in datasets:
            row = equal_count_row(d, replace(params, floor=floor))
            line += f" {row.gated:.3f} |" + (
                f" {row.gated_off:.3f} |" if row.gated_off is not None else ""
            )
        lines.append(line)
    return "\n".join(lines)


def twins_table(
    dataset_en: Dataset, dataset_fr: Dataset, selections: dict[str, SelectionParams]
) -> str:
    """English tasks beside their French twins (same order), per selection: how often each
    serves a gold talent, and how often the twin serves the same set."""
    lines = [
        "| selection | twins | English serves a gold talent | French serves a gold talent"
        " | same set |",
        "|---|---|---|---|---|",
    ]
    labelled = [i for i, query in enumerate(dataset_en.queries) if query.gold]
    for label, params in selections.items():
        outcomes = []
        for i in labelled:
            en, fr = (
                set(d.resolve(d.queries[i], d.query_vectors[i], params).selected_ids)
                for d in (dataset_en, dataset_fr)
            )
            gold = dataset_en.queries[i].gold
            outcomes.append((bool(en & gold), bool(fr & gold), en == fr))
        en_hit, fr_hit, same = (statistics.fmean(o[k] for o in outcomes) for k in range(3))
        lines.append(f"| {label} | {len(outcomes)} | {en_hit:.3f} | {fr_hit:.3f} | {same:.3f} |")
    return "\n".join(lines)


def _cell(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def grid_table(datasets: Sequence[Dataset]) -> str:
    """FLOOR x BETA x MARGIN at BASE_BUDGET, one line per parameter set."""
    head = "| floor | beta | margin |"
    rule = "|---|---|---|"
    for d in datasets:
        head += f" {d.name} recall | share | served | gated |"
        rule += "---|---|---|---|"
    head += " off-domain gated |"
    rule += "---|"
    lines = [head, rule]
    for floor in FLOORS:
        for beta in BETAS:
            for margin in MARGINS:
                params = SelectionParams(floor, beta, margin, BASE_BUDGET)
                line = f"| {floor:.2f} | {beta:.2f} | {margin:.2f} |"
                off = None
                for d in datasets:
                    row = evaluate(d, params)
                    line += (
                        f" {row.recall:.3f} | {row.share:.3f} | {row.served:.1f} |"
                        f" {row.gated_in:.3f} |"
                    )
                    off = row.gated_off if row.gated_off is not None else off
                lines.append(line + f" {_cell(off)} |")
    return "\n".join(lines)


def gate_table(datasets: Sequence[Dataset], beta: float, margin: float) -> str:
    """The out-of-domain gate alone: FLOOR from 0.14 to 0.34 at fixed beta and margin."""
    lines = [
        "| floor | "
        + " | ".join(f"{d.name} recall | gated" for d in datasets)
        + " | off-domain gated |",
        "|---|" + "---|---|" * len(datasets) + "---|",
    ]
    for floor in GATE_FLOORS:
        line = f"| {floor:.2f} |"
        off = None
        for d in datasets:
            row = evaluate(d, SelectionParams(floor, beta, margin, BASE_BUDGET))
            line += f" {row.recall:.3f} | {row.gated_in:.3f} |"
            off = row.gated_off if row.gated_off is not None else off
        lines.append(line + f" {_cell(off)} |")
    return "\n".join(lines)


def budget_table(datasets: Sequence[Dataset], floor: float, beta: float, margin: float) -> str:
    """The budget sweep at fixed floor, beta and margin."""
    lines = [
        "| budget | dataset | recall | any gold | share | served | gated | off-domain gated |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for budget in BUDGETS:
        for d in datasets:
            row = evaluate(d, SelectionParams(floor, beta, margin, budget))
            lines.append(
                f"| {budget} | {d.name} | {row.recall:.3f} | {row.any_gold:.3f} |"
                f" {row.share:.3f} | {row.served:.1f} | {row.gated_in:.3f} |"
                f" {_cell(row.gated_off)} |"
            )
    return "\n".join(lines)


# --- latency through gRPC ----------------------------------------------------------------


def _wait_for_port(log_path: Path, proc: subprocess.Popen, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        match = re.search(r'"port": (\d+)', log_path.read_text())
        if match and '"server_ready"' in log_path.read_text():
            return int(match.group(1))
        if proc.poll() is not None:
            raise SystemExit(log_path.read_text())
        time.sleep(0.2)
    raise SystemExit("the server did not become ready")


def _server_durations(log_path: Path, sizes: Sequence[int]) -> list[list[float]]:
    """ResolveTalents durations the server logged (interceptor), split per run, warm-up out."""
    durations = []
    for line in log_path.read_text().splitlines():
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("method") == "/satchel.v1.TalentService/ResolveTalents":
                durations.append(float(event["duration_ms"]))
    runs, start = [], 0
    for size in sizes:
        runs.append(durations[start + 20 : start + size])
        start += size
    return runs


def measure_latency(data: Path, calls: int, seed: int, embedder: Embedder) -> str:
    """Median/p90/p99 of ResolveTalents over 200 talents, through gRPC, from a client; then the
    task embedding alone in this process, for comparison under the same machine load."""
    import grpc

    from satchel.v1 import talent_pb2, talent_pb2_grpc

    tools = json.loads((data / "metatool" / "plugin_des.json").read_text())
    talents = [
        talent_pb2.Talent(id=f"metatool.{name}", name=name, summary=text, body=text)
        for name, text in sorted(tools.items())
    ]
    talents.append(
        talent_pb2.Talent(
            id="architecture.hexagonal",
            name="Hexagonal architecture",
            summary="Ports and adapters: the domain depends on nothing external.",
            body="Keep the domain pure; adapters implement ports.",
            tags=["architecture", "hexagonal"],
        )
    )
    sample = [q.task for q in metatool_single(data, 2 * (calls + 20), seed + 1)]
    first, second = sample[: calls + 20], sample[calls + 20 :]
    with tempfile.TemporaryDirectory(prefix="satchel-latency-") as tmp:
        log_path = Path(tmp) / "serve.log"
        env = {
            **os.environ,
            "SATCHEL_DATA_DIR": str(Path(tmp) / "data"),
            "SATCHEL_LISTEN": "127.0.0.1:0",
            "SATCHEL_LOG_LEVEL": "info",  # server_ready and the port are read from the log
        }
        satchel = str(Path(sys.executable).parent / "satchel")
        with log_path.open("w") as log_file:
            proc = subprocess.Popen([satchel, "serve"], env=env, stdout=log_file, stderr=log_file)
        try:
            port = _wait_for_port(log_path, proc)
            project = "latency"
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = talent_pb2_grpc.TalentServiceStub(channel)
                started = time.perf_counter()
                for talent in talents:
                    stub.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
                    stub.SetTalentActivation(
                        talent_pb2.SetTalentActivationRequest(
                            project_id=project, talent_id=talent.id, active=True
                        )
                    )
                load_s = time.perf_counter() - started
                results = {}
                runs = (
                    ("embeddings, new tasks", talent_pb2.RELEVANCE_MODE_EMBEDDINGS, first),
                    ("off, new tasks", talent_pb2.RELEVANCE_MODE_OFF, second),
                    ("embeddings, repeated tasks", talent_pb2.RELEVANCE_MODE_EMBEDDINGS, first),
                )
                for label, mode, queries in runs:
                    timings = []
                    for index, task in enumerate(queries):
                        request = talent_pb2.ResolveTalentsRequest(
                            project_id=project, role="agent", task=task, relevance=mode
                        )
                        t0 = time.perf_counter()
                        reply = stub.ResolveTalents(request)
                        elapsed = (time.perf_counter() - t0) * 1000
                        if index >= 20:  # the first calls warm connections and caches
                            timings.append(elapsed)
                    assert reply.selection.tokens_candidates > 0
                    results[label] = timings
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        server_side = _server_durations(log_path, [len(queries) for _, _, queries in runs])
    timings = []
    for task in second[:calls]:
        t0 = time.perf_counter()
        embedder.embed([embedder.query_prefix + task])
        timings.append((time.perf_counter() - t0) * 1000)
    results["the task embedding alone (no gRPC)"] = timings
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    lines = [
        f"{len(talents)} talents imported and activated through gRPC in {load_s:.1f} s"
        " (each upsert embeds its talent once).",
        f"Load average after the run: {load} ({os.cpu_count()} CPUs).",
        "",
        "| relevance | calls | median ms | p90 ms | p99 ms | server median ms |",
        "|---|---|---|---|---|---|",
    ]
    for index, (label, timings) in enumerate(results.items()):
        q = np.percentile(timings, [50, 90, 99])
        server = f"{statistics.median(server_side[index]):.1f}" if index < len(runs) else "n/a"
        lines.append(
            f"| {label} | {len(timings)} | {q[0]:.1f} | {q[1]:.1f} | {q[2]:.1f} | {server} |"
        )
    ratio = statistics.median(results["embeddings, new tasks"]) / statistics.median(timings)
    lines.append(f"\nResolveTalents p50 / task embedding p50 (new tasks): {ratio:.2f}")
    return "\n".join(lines)


def _selection_label(name: str, params: SelectionParams) -> str:
    return f"{name} ({params.scoring}, margin {params.margin}, at most {params.max_served})"


def print_seed_calibration(
    datasets: Sequence[Dataset], no_grid: bool, floor: float, beta: float, margin: float
) -> None:
    """The seed scoring's grid, gate and budget sweep (how its defaults were chosen)."""
    if not no_grid:
        print(f"\n## Grid, seed scoring (budget {BASE_BUDGET})\n")
        print(grid_table(datasets))
    print(f"\n## Gate, seed scoring (beta {beta}, margin {margin}, budget {BASE_BUDGET})\n")
    print(gate_table(datasets, beta, margin))
    print(f"\n## Budget sweep, seed scoring (floor {floor}, beta {beta}, margin {margin})\n")
    print(budget_table(datasets, floor, beta, margin))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--data", type=Path, default=Path(os.environ.get("SATCHEL_EVAL_DATA", DEFAULT_DATA))
    )
    parser.add_argument("--queries", type=int, default=1000, help="MetaTool single-tool sample")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--floor", type=float, help="budget sweep floor (default: the model's)")
    parser.add_argument("--beta", type=float)
    parser.add_argument("--margin", type=float)
    parser.add_argument("--latency", action="store_true", help="also time ResolveTalents")
    parser.add_argument("--latency-calls", type=int, default=300)
    parser.add_argument("--no-grid", action="store_true", help="skip the grid")
    parser.add_argument(
        "--equal-count-only",
        action="store_true",
        help="only the rankings, the equal-count tables and the twins (no grid, gate, budget)",
    )
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    cache_dir = Path(tempfile.gettempdir()) / "satchel-calibration"
    embedder = load_embedder(replace(settings, data_dir=cache_dir))
    cache = VectorCache(embedder, cache_dir)
    from satchel.server.talents.service import model_defaults

    floor, beta, margin = model_defaults(embedder.model_id)
    floor = args.floor if args.floor is not None else floor
    beta = args.beta if args.beta is not None else beta
    margin = args.margin if args.margin is not None else margin

    started = time.perf_counter()
    metatool = metatool_catalogue(args.data)
    coding = coding_catalogue(args.data)
    coding_queries = [Query(task, frozenset(gold)) for task, gold in CODING_TASKS]
    coding_queries += [Query(task, frozenset()) for task in OFF_DOMAIN_TASKS]
    datasets = [
        embed_dataset(
            "MetaTool single",
            cache,
            metatool,
            metatool_single(args.data, args.queries, args.seed),
        ),
        embed_dataset("MetaTool multi", cache, metatool, metatool_multi(args.data)),
        embed_dataset("coding", cache, coding, coding_queries),
    ]
    own, own_en, own_fr = own_task_set(coding)
    datasets += [
        embed_dataset("own, English", cache, own, own_en),
        embed_dataset("own, French", cache, own, own_fr),
    ]
    print(f"model {embedder.model_id}; embedded in {time.perf_counter() - started:.0f} s")
    for d in datasets:
        tokens = sum(t.tokens for t in d.candidates)
        print(
            f"- {d.name}: {len(d.candidates)} talents ({tokens} tokens), {len(d.queries)} queries"
        )
    served = default_params(TalentSettings(), embedder.model_id)
    hybrid = default_params(TalentSettings(scoring=Scoring.HYBRID), embedder.model_id)
    seed = SelectionParams(floor, beta, margin, BASE_BUDGET)
    print(f"\n## Rankings (beta {hybrid.beta}, text weight {hybrid.text_weight})\n")
    print(ranking_table(datasets, hybrid))
    selections = {
        f"seed (centred, margin {margin}, no cap)": seed,
        _selection_label("server default", served): served,
    }
    if hybrid != served:
        selections[_selection_label("hybrid", hybrid)] = hybrid
    print("\n## Selection at equal count\n")
    print(equal_count_table(datasets, selections))
    print(f"\n## Hybrid cut: margin x at most (floor {hybrid.floor})\n")
    print(hybrid_cut_table(datasets, hybrid))
    print(f"\n## Hybrid gate: floor on the plain cosine (margin {hybrid.margin})\n")
    print(hybrid_gate_table(datasets, hybrid))
    print("\n## English tasks and their French twins\n")
    print(twins_table(datasets[-2], datasets[-1], selections))
    if not args.equal_count_only:
        print_seed_calibration(datasets[:3], args.no_grid, floor, beta, margin)
    if args.latency:
        print("\n## ResolveTalents latency through gRPC\n")
        print(measure_latency(args.data, args.latency_calls, args.seed, embedder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
