"""Settings read from the environment: types converted, bad values named."""

from __future__ import annotations

import os
import re

import pytest

from satchel.server.platform.config import (
    MAX_DEPTH_SCALE,
    ConfigError,
    ContextSettings,
    Settings,
    unknown_variables,
)


@pytest.mark.parametrize(
    ("raw", "expected"), [("off", False), ("FALSE", False), ("0", False), ("on", True), ("1", True)]
)
def test_boolean_settings(raw: str, expected: bool) -> None:
    settings = Settings.from_env({"SATCHEL_SKIP_SERVED_EPISODES": raw})
    assert settings.context.skip_served_episodes is expected


def test_booleans_default_and_refuse_other_words() -> None:
    assert Settings.from_env({}).context.skip_served_episodes is True
    with pytest.raises(ConfigError, match="SATCHEL_SKIP_SERVED_EPISODES='maybe'"):
        Settings.from_env({"SATCHEL_SKIP_SERVED_EPISODES": "maybe"})


def test_hybrid_ranking_is_the_default_and_the_seed_formula_is_reachable() -> None:
    hybrid = Settings.from_env({}).context
    assert hybrid.ranking == "hybrid"
    assert (hybrid.weight_similarity, hybrid.weight_text_rank, hybrid.weight_recency) == (
        0.7,
        0.3,
        0.02,
    )
    seed = Settings.from_env({"SATCHEL_RANKING": "seed"}).context
    assert (seed.weight_similarity, seed.weight_text_rank, seed.weight_recency) == (
        0.6,
        0.25,
        0.15,
    )
    mixed = Settings.from_env({"SATCHEL_RANKING": "seed", "SATCHEL_WEIGHT_RECENCY": "0"}).context
    assert (mixed.weight_similarity, mixed.weight_recency) == (0.6, 0.0)  # set ones win


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("SATCHEL_RANKING", "bm25", "SATCHEL_RANKING is hybrid|seed"),
        ("SATCHEL_WEIGHT_SIMILARITY", "nan", "SATCHEL_WEIGHT_SIMILARITY.* finite"),
        ("SATCHEL_WEIGHT_TEXT_RANK", "-1", "SATCHEL_WEIGHT_TEXT_RANK must be a finite"),
        ("SATCHEL_WEIGHT_RECENCY", "inf", "SATCHEL_WEIGHT_RECENCY.* finite"),
        ("SATCHEL_EPISODE_CONTEXT_WEIGHT", "1.5", "SATCHEL_EPISODE_CONTEXT_WEIGHT must be in"),
        ("SATCHEL_EPISODE_CONTEXT_GAP_SECONDS", "-1", "SATCHEL_EPISODE_CONTEXT_GAP_SECONDS"),
        ("SATCHEL_EPISODE_POOL", "0", "SATCHEL_EPISODE_POOL must be positive"),
        ("SATCHEL_NEWER_WINS_SIMILARITY", "1.5", "SATCHEL_NEWER_WINS_SIMILARITY must be in"),
        ("SATCHEL_SCOPE_CACHE_VECTORS", "int8", "SATCHEL_SCOPE_CACHE_VECTORS is float32|float16"),
    ],
)
def test_bad_ranking_settings_stop_the_server(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({name: raw})


@pytest.mark.parametrize(
    ("name", "raw", "message"),
    [
        ("SATCHEL_LISTEN", "127.0.0.1:99999", "SATCHEL_LISTEN must be host:port with a port in"),
        ("SATCHEL_LISTEN", "127.0.0.1:", "SATCHEL_LISTEN must be host:port"),
        ("SATCHEL_LISTEN", ":51110", "SATCHEL_LISTEN must be host:port"),
        ("SATCHEL_LISTEN", "[]:50051", "SATCHEL_LISTEN must be host:port"),
        ("SATCHEL_METRICS_LISTEN", "127.0.0.1:x", "SATCHEL_METRICS_LISTEN must be host:port"),
        ("SATCHEL_LOG_LEVEL", "loud", "SATCHEL_LOG_LEVEL is debug|info|warning|error|critical"),
        ("SATCHEL_DB_POOL_TIMEOUT", "nan", "SATCHEL_DB_POOL_TIMEOUT='nan' is not a valid finite"),
        ("SATCHEL_RECENCY_TAU_DAYS", "inf", "SATCHEL_RECENCY_TAU_DAYS='inf' is not a valid finite"),
        ("SATCHEL_TRACE_RETENTION_DAYS", "-1", "SATCHEL_TRACE_RETENTION_DAYS must not be negative"),
        ("SATCHEL_TRACE_MAINTENANCE_SECONDS", "0", "SATCHEL_TRACE_MAINTENANCE_SECONDS must be"),
        ("SATCHEL_SCOPE_INDEX_MAX", "-1", "SATCHEL_SCOPE_INDEX_MAX must not be negative"),
        ("SATCHEL_SCOPE_INDEX_TOP_K", "0", "SATCHEL_SCOPE_INDEX_TOP_K must be positive"),
        ("SATCHEL_SCOPE_INDEX_MAINTENANCE_SECONDS", "0", "SATCHEL_SCOPE_INDEX_MAINTENANCE_SECONDS"),
        ("SATCHEL_SCOPE_INDEX_BUILD_MEMORY_MB", "8", "SATCHEL_SCOPE_INDEX_BUILD_MEMORY_MB must be"),
        ("SATCHEL_DEPTH_BUDGET_TOKENS", "-1", "SATCHEL_DEPTH_BUDGET_TOKENS must not be negative"),
    ],
)
def test_bad_values_stop_the_server_naming_the_variable(name: str, raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        Settings.from_env({name: raw})


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "localhost:50051", "[::1]:65535", "0.0.0.0:1"])
def test_good_addresses_are_accepted(listen: str) -> None:
    assert Settings.from_env({"SATCHEL_LISTEN": listen}).listen == listen


def test_unknown_variables_are_named_with_the_closest_setting() -> None:
    env = {
        "SATCHEL_WIEGHT_RECENCY": "0",
        "SATCHEL_TALENT_MARGN": "0.2",
        "SATCHEL_NOTHING_LIKE_IT": "1",
        "SATCHEL_LISTEN": "127.0.0.1:0",
        "SATCHEL_API_KEY": "k",
        "SATCHEL_TALENT_MARGIN": "0.2",
        "PATH": "/bin",
    }
    assert unknown_variables(env) == [
        ("SATCHEL_NOTHING_LIKE_IT", None),
        ("SATCHEL_TALENT_MARGN", "SATCHEL_TALENT_MARGIN"),
        ("SATCHEL_WIEGHT_RECENCY", "SATCHEL_WEIGHT_RECENCY"),
    ]


def test_processes_default_to_one_and_are_bounded() -> None:
    assert Settings.from_env({}).processes == 1
    assert Settings.from_env({"SATCHEL_PROCESSES": "4"}).processes == 4
    for raw in ("0", "65"):
        with pytest.raises(ConfigError, match="SATCHEL_PROCESSES must be 1 to 64"):
            Settings.from_env({"SATCHEL_PROCESSES": raw})


def test_processes_must_fit_the_embedded_databases_connections() -> None:
    """4 processes x (2 pools of 10 + 2) = 88 connections fit the embedded PostgreSQL; 5 do not,
    unless the pools are smaller or the database is the operator's own."""
    assert Settings.from_env({"SATCHEL_PROCESSES": "4"}).connections_per_process() == 22
    with pytest.raises(ConfigError, match="SATCHEL_PROCESSES x"):
        Settings.from_env({"SATCHEL_PROCESSES": "5"})
    Settings.from_env({"SATCHEL_PROCESSES": "5", "SATCHEL_DB_POOL_MAX": "5"})
    Settings.from_env({"SATCHEL_PROCESSES": "16", "SATCHEL_DATABASE_URL": "postgresql://db/x"})


def test_running_calls_default_to_the_cores_shared_by_the_processes() -> None:
    cores = os.cpu_count() or 1
    assert Settings.from_env({}).active_calls() == cores
    two = Settings.from_env({"SATCHEL_PROCESSES": "2", "SATCHEL_DB_POOL_MAX": "5"})
    assert two.active_calls() == max(1, cores // 2)
    many = Settings.from_env({"SATCHEL_PROCESSES": "64", "SATCHEL_DATABASE_URL": "postgresql://x"})
    assert many.active_calls() == 1
    set_ = Settings.from_env({"SATCHEL_PROCESSES": "2", "SATCHEL_MAX_ACTIVE_CALLS": "3"})
    assert set_.active_calls() == 3


def test_a_larger_budget_reads_proportionally_deeper_up_to_a_bound() -> None:
    base = Settings.from_env({}).context
    assert (base.depth_budget_tokens, base.candidate_limit, base.episode_top_k) == (900, 24, 48)
    assert base.for_budget(900) is base and base.for_budget(100) is base
    double = base.for_budget(1800)
    assert (double.candidate_limit, double.episode_top_k, double.episode_pool) == (48, 96, 96)
    assert double.retrieval_top_k == base.retrieval_top_k and double.ranking == base.ranking
    assert base.for_budget(1000).candidate_limit == 27, "rounded up"
    widest = base.for_budget(100_000)
    assert widest.episode_top_k == MAX_DEPTH_SCALE * base.episode_top_k
    fixed = ContextSettings(depth_budget_tokens=0)
    assert fixed.for_budget(100_000) is fixed
