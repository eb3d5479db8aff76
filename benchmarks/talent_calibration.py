"""Talent selection calibration: recall of gold talents, catalogue tokens served, gating.

    .venv/bin/python benchmarks/talent_calibration.py [--data ../shared/data] [--queries 1000]
        [--seed 7] [--latency] [--latency-calls 300]

Reads the evaluation data from `../shared/data` at run time (never copied into the repo):

- MetaTool: the 199 tools of `plugin_des.json` as talents (name = tool, summary = body = its
  description, no tags), `--queries` labelled queries sampled from `all_clean_data.csv` with a
  fixed seed (one gold tool each), and the 497 queries of `multi_tool_query_golden.json`
  (two gold tools each).
- Coding catalogue: the 12 Anthropic skills (a SKILL.md front matter each; tokens from the
  real SKILL.md size) plus the 257 cursor rules (an `.mdc` each: description, globs, body),
  read by the same parser as `satchel talents import`; 25 coding tasks written here with
  their gold talents, and 10 off-domain tasks that should be gated.

Every selection goes through `satchel.server.talents.resolve_selection`, the function the
server's ResolveTalents calls, with vectors from the real embedder (passage/query prefixes as
the server adds them). For a grid of FLOOR x BETA x MARGIN (budget 2000), then a budget sweep,
it prints Markdown tables: recall of gold talents, mean share of the candidates' tokens
served, mean talents served, share of in-domain queries wrongly gated, share of off-domain
tasks gated.

`--latency` also starts `satchel serve` (embedded PostgreSQL in a temporary directory, or
SATCHEL_DATABASE_URL), imports 200 talents through gRPC, and times ResolveTalents with
relevance on (talent vectors cached, each call embeds its task) from a client.
"""

from __future__ import annotations

import argparse
import csv
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
from satchel.server.config import Settings
from satchel.server.domain.talent_selection import (
    CentredSpace,
    ScorableTalent,
    SelectionParams,
)
from satchel.server.embedding import load_embedder
from satchel.server.embedding.port import Embedder
from satchel.server.storage.talents import TalentRecord
from satchel.server.talents import resolve_selection, scorable

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
    """A catalogue (candidates and their vectors) and queries with their vectors."""

    name: str
    candidates: list[ScorableTalent]
    space: CentredSpace
    queries: list[Query]
    query_vectors: np.ndarray


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

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        keys = [hashlib.sha256(text.encode()).hexdigest() for text in texts]
        missing = {key: text for key, text in zip(keys, texts, strict=True)}
        missing = {key: text for key, text in missing.items() if key not in self.vectors}
        if missing:
            fresh = self.embedder.embed(list(missing.values()))
            self.vectors.update(zip(missing, fresh, strict=True))
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
    return Dataset(name, candidates, CentredSpace.of(vectors), queries, query_vectors)


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
        result = resolve_selection(
            dataset.candidates,
            dataset.space,
            vector,
            query.task,
            relevance=True,
            params=params,
        )
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
    return "\n".join(lines)


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
    args = parser.parse_args(argv)

    settings = Settings.from_env()
    cache_dir = Path(tempfile.gettempdir()) / "satchel-calibration"
    embedder = load_embedder(replace(settings, data_dir=cache_dir))
    cache = VectorCache(embedder, cache_dir)
    from satchel.server.talents import model_defaults

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
    print(f"model {embedder.model_id}; embedded in {time.perf_counter() - started:.0f} s")
    for d in datasets:
        tokens = sum(t.tokens for t in d.candidates)
        print(
            f"- {d.name}: {len(d.candidates)} talents ({tokens} tokens), {len(d.queries)} queries"
        )
    if not args.no_grid:
        print(f"\n## Grid (budget {BASE_BUDGET})\n")
        print(grid_table(datasets))
    print(f"\n## Gate (beta {beta}, margin {margin}, budget {BASE_BUDGET})\n")
    print(gate_table(datasets, beta, margin))
    print(f"\n## Budget sweep (floor {floor}, beta {beta}, margin {margin})\n")
    print(budget_table(datasets, floor, beta, margin))
    if args.latency:
        print("\n## ResolveTalents latency through gRPC\n")
        print(measure_latency(args.data, args.latency_calls, args.seed, embedder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
