"""Server settings, read once from SATCHEL_* environment variables.

Every knob lives here with its default; `Settings.from_env` validates them and fails fast
with a message naming the variable.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

DEFAULT_EMBED_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
OTEL_MODES = ("off", "otlp", "console", "global")
MAX_PROCESSES = 64
# PostgreSQL's default max_connections (100), less room for the maintenance and for commands.
EMBEDDED_MAX_CONNECTIONS = 90


class ConfigError(ValueError):
    """A SATCHEL_* variable has a value the server cannot run with."""


def _default_data_dir() -> Path:
    # The embedded PostgreSQL wheel makes every ancestor of its data directory world-readable
    # and, as root, runs postgres as another user: keep the default out of /root.
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path("/var/lib/satchel")
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "satchel"


@dataclass(frozen=True)
class ContextSettings:
    """Knobs of context assembly (weights and limits are configuration, not contract)."""

    default_budget_tokens: int = 900
    retrieval_top_k: int = 128
    # The best facts handed to packing: with the default budget the main pass leaves room for
    # the multi-hop facts and the episodes (measured in benchmarks/locomo.md).
    candidate_limit: int = 24
    # A scope with at most this many active facts is scored exactly, fact by fact: below it,
    # that costs less than two phases (benchmarks/context.md).
    exact_scope_max: int = 10_000
    # Two-phase: the newest facts of the scope are all scored on cosine and recency; the best
    # of them go to phase 2 (an exact source where recency weighs most).
    newest_window: int = 3584
    newest_top_k: int = 64
    retrieval_top_k_max: int = 1024
    # Phase 1's K for a scope served by indexes of its own (README "Large scopes"): its own
    # graph is walked less widely than the global one under a filter, and a K this large keeps
    # its top-10 exact on near-duplicate facts (benchmarks/context.md). Taken within
    # [retrieval_top_k, retrieval_top_k_max].
    scope_index_top_k: int = 512
    # A query word found in more facts of the scope than this is too common to rank by.
    text_term_max_facts: int = 1024
    exact_top_n: int = 10
    # Nearest events packed into what remains after the facts; an event that is the source of
    # an included fact is left out (its fact already carries it) unless this is off.
    episode_top_k: int = 24
    skip_served_episodes: bool = True
    # Relevance floor (cosine distance); None: the one calibrated for the embedding model
    # (RECALL_FLOORS), 0: off. A request's max_distance overrides it.
    recall_max_distance: float | None = None
    # How facts and episodes are ranked (README "Context assembly"): `hybrid` ranks both in one
    # list on cosine + BM25 (stemmed, IDF-weighted), recency a tie-breaker, each episode lifted
    # by its conversation neighbours; `seed` is the seed's design (ts_rank_cd, facts first, then
    # episodes on cosine only). Unset weights take the ranking's defaults (RANKING_WEIGHTS).
    ranking: str = "hybrid"
    weight_similarity: float | None = None
    weight_text_rank: float | None = None
    weight_recency: float | None = None
    recency_tau_days: float = 30.0
    # Hybrid episodes: phase 1 takes this many events per source (nearest, best BM25); an
    # event's score is at least CONTEXT_WEIGHT x its best neighbour's + the rest x its own, its
    # neighbours being the events just before and after it within CONTEXT_GAP_SECONDS.
    episode_pool: int = 48
    episode_context_weight: float = 0.6
    episode_context_gap_seconds: float = 3600.0
    # Hybrid ranking in memory for the scopes read without changing (server/scope_cache.py):
    # at most this many MB of events and facts held (0: off), and no scope of more events (or
    # facts) than this. Facts are held only for scopes scored exactly (`exact_scope_max`).
    scope_cache_mb: int = 256
    scope_cache_max_rows: int = 50_000
    # Hybrid: of two facts with one predicate whose vectors are at least this close, the newer
    # ranks first (a value stated again later; domain/updates.py). 0: off.
    newer_wins_similarity: float = 0.6
    multi_hop_max_entities: int = 2
    multi_hop_max_per_entity: int = 5
    # WatchTraces: calls queued per watcher before whole calls are dropped for it.
    watch_queue_traces: int = 64
    # A trace is committed before the reply either way (GetTrace finds it); durable: the commit
    # also waits for its WAL to reach the disk. Off (the default), a crash of PostgreSQL or of
    # the machine may lose the traces of the last ~0.6 s (synchronous_commit = off for trace
    # writes only: memory writes always wait).
    trace_durable_commit: bool = False

    def with_ranking(self, ranking: str) -> ContextSettings:
        """These settings under another ranking, with that ranking's default weights."""
        return replace(self, ranking=ranking, **dict.fromkeys(WEIGHT_FIELDS))

    def __post_init__(self) -> None:
        defaults = RANKING_WEIGHTS.get(self.ranking, RANKING_WEIGHTS["hybrid"])
        for name, value in zip(WEIGHT_FIELDS, defaults, strict=True):
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)


# `satchel calibrate-floor` on the LoCoMo dev questions: the cosine distance that keeps 95 % of
# the relevant turns (all-MiniLM-L6-v2 int8: 0.752, dropping 52 % of the irrelevant ones;
# all-mpnet-base-v2 int8: 0.786, dropping 54 %; multilingual-e5-small int8: 0.216, dropping 49 %,
# its cosines being compressed; benchmarks/models.md).
RECALL_FLOORS: dict[str, float] = {
    "all-minilm-l6-v2": 0.75,
    "all-mpnet-base-v2": 0.79,
    "multilingual-e5-small": 0.22,
}


def recall_floor(settings: ContextSettings, model_id: str) -> float:
    """SATCHEL_RECALL_MAX_DISTANCE when set, else the floor calibrated for the model, else 0."""
    if settings.recall_max_distance is not None:
        return settings.recall_max_distance
    lowered = model_id.lower()
    return next((v for pattern, v in RECALL_FLOORS.items() if pattern in lowered), 0.0)


WEIGHT_FIELDS = ("weight_similarity", "weight_text_rank", "weight_recency")
RANKING_WEIGHTS: dict[str, tuple[float, float, float]] = {
    "hybrid": (0.7, 0.3, 0.02),  # measured on LoCoMo (benchmarks/locomo.md)
    "seed": (0.6, 0.25, 0.15),  # the seed's formula
}


@dataclass(frozen=True)
class TalentSettings:
    """Defaults of talent selection; requests may override floor, beta, margin, budget and
    max_served.

    `relevance`: `embeddings` (select by relevance, the default) or `off` (every active talent
    of the role, the seed's "compile"). `scoring`: `fused` or empty (the default: two cosines
    and BM25F on one scale, an out-of-domain gate calibrated per catalogue, see
    `satchel.server.domain.talent_fusion`), `hybrid` (cosine, stems and BM25, weighted
    `text_weight`), or `seed` (the spec's centred similarity and stems). Unset floor/beta/margin
    take the scoring's defaults (fused: the calibrated gate; the others: the embedding model's,
    `satchel.server.talents.MODEL_DEFAULTS`). `max_served`: at most this many talents kept by
    relevance (0: no cap; unset: 8). `gate_quantile`: where fused scoring's out-of-domain gate
    sits among the best similarities of the shipped unrelated tasks on the catalogue (higher:
    fewer unrelated tasks served, more real ones gated). `roles` is a comma separated list of
    roles the doctor always knows. The seed's exact behaviour: relevance=off, or scoring=seed
    with max_served=0.
    """

    relevance: str = "embeddings"
    floor: float | None = None
    beta: float | None = None
    margin: float | None = None
    budget_tokens: int = 2000
    roles: str = ""
    scoring: str = ""
    text_weight: float = 0.3
    max_served: int | None = None
    gate_quantile: float = 0.75


@dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment."""

    database_url: str | None = None
    # Streaming replicas that context calls, lists and GetTrace read from, comma-separated DSNs
    # (README "Read replicas"); writes and traces go to the primary. A read given a consistency
    # token waits at most `read_replica_max_wait_seconds` for a replica that replayed it, then
    # reads the primary.
    database_read_urls: str = ""
    read_replica_max_wait_seconds: float = 0.25
    # false: SATCHEL_DATABASE_URL is required, never the embedded PostgreSQL (the production
    # image sets it, and ships without the embedded server).
    embedded_database: bool = True
    data_dir: Path = field(default_factory=_default_data_dir)
    listen: str = "127.0.0.1:50051"
    # Server processes sharing the listen port (SO_REUSEPORT; README "Several processes"): the
    # first runs the embedded database and the maintenance, the others serve calls only.
    processes: int = 1
    embed_model: str = DEFAULT_EMBED_MODEL
    embed_model_path: Path | None = None
    embed_threads: int = 1
    db_pool_min: int = 2
    db_pool_max: int = 10
    hnsw_ef_search: int = 100
    shutdown_grace_seconds: float = 10.0
    # A connection older than this (gRPC adds +-10 % jitter) is sent GOAWAY: its client opens a
    # new one for new calls, so replicas added behind a load balancer get traffic; 0: never.
    # In-flight calls then get the grace (0: as long as they need) before it is closed.
    max_connection_age_seconds: float = 300.0
    max_connection_age_grace_seconds: float = 0.0
    # Reliability and security (README "Security" and "Operations").
    auth: str = ""  # required | disabled; empty: required unless listening on loopback only
    auth_cache_seconds: float = 5.0
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    max_streams_per_client: int = 16
    max_watches_per_client: int = 16
    # Fair admission (server/admission.py): calls running at once (0: one per core), and calls
    # running or waiting per client and in all.
    max_active_calls: int = 0
    max_calls_per_client: int = 256
    max_calls: int = 1024
    db_pool_timeout: float = 5.0
    db_connect_timeout: int = 5
    db_statement_timeout_seconds: float = 60.0
    db_probe_seconds: float = 1.0
    # Trace retention (README "Trace retention"): a call's trace is kept this many days, up to
    # one more (whole days are dropped; 0: kept forever), by a maintenance run at start and
    # then every `trace_maintenance_seconds` (one replica at a time).
    trace_retention_days: int = 7
    trace_maintenance_seconds: float = 3600.0
    # Scope indexes (README "Large scopes"): a scope with more active facts than
    # SATCHEL_EXACT_SCOPE_MAX gets HNSW and GIN indexes of its own, kept down to half of that;
    # at most `scope_index_max` scopes, the largest (0: none, and those built are dropped).
    # Built by a maintenance run as the server starts, then every
    # `scope_index_maintenance_seconds` (one replica at a time), with this much
    # maintenance_work_mem (a 100,000-fact scope's graph needs ~200 MB to build in memory).
    scope_index_max: int = 64
    scope_index_maintenance_seconds: float = 600.0
    scope_index_build_memory_mb: int = 512
    log_level: str = "info"
    log_format: str = "json"
    # Prometheus metrics endpoint (host:port); empty: off.
    metrics_listen: str = ""
    # OpenTelemetry spans: off | otlp | console | global.
    otel: str = "off"
    context: ContextSettings = field(default_factory=ContextSettings)
    talents: TalentSettings = field(default_factory=TalentSettings)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        """Build settings from SATCHEL_* variables (or `env`), validating each."""
        env = dict(os.environ if env is None else env)
        top = _read(cls, env, "SATCHEL_", skip=_NESTED)
        context = ContextSettings(**_read(ContextSettings, env, "SATCHEL_"))
        talents = TalentSettings(**_read(TalentSettings, env, "SATCHEL_TALENT_"))
        settings = cls(**top, context=context, talents=talents)
        settings.validate()
        return settings

    def validate(self) -> None:
        """Raise ConfigError on values the server cannot run with."""
        c, t = self.context, self.talents
        checks = [
            (self.embed_threads >= 1, "SATCHEL_EMBED_THREADS must be at least 1"),
            (
                1 <= self.processes <= MAX_PROCESSES,
                f"SATCHEL_PROCESSES must be 1 to {MAX_PROCESSES}",
            ),
            (
                bool(self.database_url)
                or self.processes * self.connections_per_process() <= EMBEDDED_MAX_CONNECTIONS,
                f"SATCHEL_PROCESSES x (2 x SATCHEL_DB_POOL_MAX + 2) must be at most "
                f"{EMBEDDED_MAX_CONNECTIONS}, the embedded PostgreSQL's connections",
            ),
            (1 <= self.db_pool_min <= self.db_pool_max, "need 1 <= SATCHEL_DB_POOL_MIN <= MAX"),
            (self.hnsw_ef_search >= 1, "SATCHEL_HNSW_EF_SEARCH must be positive"),
            (c.default_budget_tokens > 0, "SATCHEL_DEFAULT_BUDGET_TOKENS must be positive"),
            (c.retrieval_top_k > 0, "SATCHEL_RETRIEVAL_TOP_K must be positive"),
            (c.candidate_limit > 0, "SATCHEL_CANDIDATE_LIMIT must be positive"),
            (c.newest_top_k >= 0, "SATCHEL_NEWEST_TOP_K must not be negative"),
            (c.newest_window >= 0, "SATCHEL_NEWEST_WINDOW must not be negative"),
            (c.exact_scope_max >= 0, "SATCHEL_EXACT_SCOPE_MAX must not be negative"),
            (c.text_term_max_facts >= 1, "SATCHEL_TEXT_TERM_MAX_FACTS must be positive"),
            (
                c.retrieval_top_k_max >= c.retrieval_top_k,
                "SATCHEL_RETRIEVAL_TOP_K_MAX must be at least SATCHEL_RETRIEVAL_TOP_K",
            ),
            (c.scope_index_top_k > 0, "SATCHEL_SCOPE_INDEX_TOP_K must be positive"),
            (c.exact_top_n >= 0, "SATCHEL_EXACT_TOP_N must not be negative"),
            (c.episode_top_k >= 0, "SATCHEL_EPISODE_TOP_K must not be negative"),
            (
                c.recall_max_distance is None or 0.0 <= c.recall_max_distance <= 2.0,
                "SATCHEL_RECALL_MAX_DISTANCE must be in [0, 2]",
            ),
            (c.recency_tau_days > 0, "SATCHEL_RECENCY_TAU_DAYS must be positive"),
            (c.ranking in RANKING_WEIGHTS, "SATCHEL_RANKING is hybrid|seed"),
            *(
                (
                    math.isfinite(getattr(c, name)) and getattr(c, name) >= 0,
                    f"SATCHEL_{name.upper()} must be a finite number >= 0",
                )
                for name in WEIGHT_FIELDS
            ),
            (c.episode_pool >= 1, "SATCHEL_EPISODE_POOL must be positive"),
            (c.scope_cache_mb >= 0, "SATCHEL_SCOPE_CACHE_MB must not be negative"),
            (c.scope_cache_max_rows >= 0, "SATCHEL_SCOPE_CACHE_MAX_ROWS must not be negative"),
            (
                0.0 <= c.newer_wins_similarity <= 1.0,
                "SATCHEL_NEWER_WINS_SIMILARITY must be in [0, 1]",
            ),
            (
                0.0 <= c.episode_context_weight <= 1.0,
                "SATCHEL_EPISODE_CONTEXT_WEIGHT must be in [0, 1]",
            ),
            (
                0.0 <= c.episode_context_gap_seconds < 1e9,
                "SATCHEL_EPISODE_CONTEXT_GAP_SECONDS must be in [0, 1e9)",
            ),
            (t.relevance in ("off", "embeddings"), "SATCHEL_TALENT_RELEVANCE is off|embeddings"),
            (t.budget_tokens > 0, "SATCHEL_TALENT_BUDGET_TOKENS must be positive"),
            (t.beta is None or t.beta >= 0, "SATCHEL_TALENT_BETA must not be negative"),
            (t.margin is None or t.margin >= 0, "SATCHEL_TALENT_MARGIN must not be negative"),
            (t.floor is None or -1 <= t.floor <= 1, "SATCHEL_TALENT_FLOOR must be in [-1, 1]"),
            (
                t.scoring in ("", "fused", "hybrid", "seed"),
                "SATCHEL_TALENT_SCORING is fused|hybrid|seed",
            ),
            (0 <= t.text_weight <= 10, "SATCHEL_TALENT_TEXT_WEIGHT must be in [0, 10]"),
            (
                0 <= t.gate_quantile <= 1,
                "SATCHEL_TALENT_GATE_QUANTILE must be in [0, 1]",
            ),
            (
                t.max_served is None or t.max_served >= 0,
                "SATCHEL_TALENT_MAX_SERVED must not be negative",
            ),
            (self.log_format in ("json", "console"), "SATCHEL_LOG_FORMAT is json|console"),
            (
                self.log_level.lower() in LOG_LEVELS,
                f"SATCHEL_LOG_LEVEL is {'|'.join(LOG_LEVELS)} (got {self.log_level!r})",
            ),
            (
                is_address(self.listen),
                f"SATCHEL_LISTEN must be host:port with a port in 0-65535 (got {self.listen!r};"
                " every interface: 0.0.0.0:PORT or [::]:PORT)",
            ),
            (self.auth in ("", "required", "disabled"), "SATCHEL_AUTH is required|disabled"),
            (self.auth_cache_seconds >= 0, "SATCHEL_AUTH_CACHE_SECONDS must not be negative"),
            (
                (self.tls_cert is None) == (self.tls_key is None),
                "SATCHEL_TLS_CERT and SATCHEL_TLS_KEY go together",
            ),
            (
                self.tls_client_ca is None or self.tls_cert is not None,
                "SATCHEL_TLS_CLIENT_CA needs SATCHEL_TLS_CERT and SATCHEL_TLS_KEY",
            ),
            (self.max_streams_per_client >= 1, "SATCHEL_MAX_STREAMS_PER_CLIENT must be positive"),
            (self.max_watches_per_client >= 1, "SATCHEL_MAX_WATCHES_PER_CLIENT must be positive"),
            (self.max_active_calls >= 0, "SATCHEL_MAX_ACTIVE_CALLS must not be negative"),
            (self.max_calls_per_client >= 1, "SATCHEL_MAX_CALLS_PER_CLIENT must be positive"),
            (
                self.max_calls >= self.max_calls_per_client,
                "SATCHEL_MAX_CALLS must be at least SATCHEL_MAX_CALLS_PER_CLIENT",
            ),
            (self.db_pool_timeout > 0, "SATCHEL_DB_POOL_TIMEOUT must be positive"),
            (self.db_connect_timeout >= 1, "SATCHEL_DB_CONNECT_TIMEOUT must be at least 1"),
            (
                self.db_statement_timeout_seconds >= 0,
                "SATCHEL_DB_STATEMENT_TIMEOUT_SECONDS must not be negative",
            ),
            (self.db_probe_seconds > 0, "SATCHEL_DB_PROBE_SECONDS must be positive"),
            (
                self.read_replica_max_wait_seconds >= 0,
                "SATCHEL_READ_REPLICA_MAX_WAIT_SECONDS must not be negative",
            ),
            (self.trace_retention_days >= 0, "SATCHEL_TRACE_RETENTION_DAYS must not be negative"),
            (
                self.trace_maintenance_seconds > 0,
                "SATCHEL_TRACE_MAINTENANCE_SECONDS must be positive",
            ),
            (self.scope_index_max >= 0, "SATCHEL_SCOPE_INDEX_MAX must not be negative"),
            (
                self.scope_index_maintenance_seconds > 0,
                "SATCHEL_SCOPE_INDEX_MAINTENANCE_SECONDS must be positive",
            ),
            (
                64 <= self.scope_index_build_memory_mb <= 1_048_576,
                "SATCHEL_SCOPE_INDEX_BUILD_MEMORY_MB must be in [64, 1048576]",
            ),
            (
                0 <= self.max_connection_age_seconds < 1e9,
                "SATCHEL_MAX_CONNECTION_AGE_SECONDS must be in [0, 1e9) (0: never)",
            ),
            (
                0 <= self.max_connection_age_grace_seconds < 1e9,
                "SATCHEL_MAX_CONNECTION_AGE_GRACE_SECONDS must be in [0, 1e9) (0: no limit)",
            ),
            (
                not self.metrics_listen or is_address(self.metrics_listen),
                "SATCHEL_METRICS_LISTEN must be host:port with a port in 0-65535 (or empty: off)",
            ),
            (self.otel in OTEL_MODES, "SATCHEL_OTEL is off|otlp|console|global"),
            (c.watch_queue_traces >= 1, "SATCHEL_WATCH_QUEUE_TRACES must be at least 1"),
        ]
        for ok, message in checks:
            if not ok:
                raise ConfigError(message)
        for name, path in (
            ("SATCHEL_TLS_CERT", self.tls_cert),
            ("SATCHEL_TLS_KEY", self.tls_key),
            ("SATCHEL_TLS_CLIENT_CA", self.tls_client_ca),
        ):
            if path is not None and not path.is_file():
                raise ConfigError(f"{name} {path} is not a file")
        if self.embed_model_path is not None and not self.embed_model_path.is_dir():
            raise ConfigError(
                f"SATCHEL_EMBED_MODEL_PATH {self.embed_model_path} is not a directory"
            )
        self.read_urls()

    def read_urls(self) -> list[str]:
        """The read replicas' DSNs (SATCHEL_DATABASE_READ_URLS), each checked as a DSN."""
        # Imported here: the peer comparison's environment reads these settings without psycopg.
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        urls = [url.strip() for url in self.database_read_urls.split(",") if url.strip()]
        for url in urls:
            try:
                conninfo_to_dict(url)
            except psycopg.ProgrammingError as exc:
                raise ConfigError(f"SATCHEL_DATABASE_READ_URLS: {url!r} is not a DSN") from exc
        return urls

    def require_embedded_database(self) -> None:
        """Raise ConfigError when no DSN is set and the embedded PostgreSQL is not allowed."""
        if not self.database_url and not self.embedded_database:
            raise ConfigError(
                "SATCHEL_DATABASE_URL is required: this installation runs no embedded"
                " PostgreSQL (SATCHEL_EMBEDDED_DATABASE=false)"
            )

    def connections_per_process(self) -> int:
        """Database connections one server process may hold: its two pools, the watch listener
        and the health probe."""
        return 2 * self.db_pool_max + 2

    def active_calls(self) -> int:
        """SATCHEL_MAX_ACTIVE_CALLS, else one per core, shared by the SATCHEL_PROCESSES (at least
        one each): a call admitted next waits for about one call per core, not for every call in
        flight (benchmarks/fairness.md, 2 cores: one running gave x2.65 under a flood but 53
        calls/s at 8 workers, one per core x3 and 71/s, two per core x4.7 and 77/s; two processes
        with one each: as many calls/s as with two each, p99 2.2x p50 against 2.7x,
        benchmarks/load.md)."""
        return self.max_active_calls or max(1, (os.cpu_count() or 1) // self.processes)

    def auth_required(self) -> bool:
        """Whether satchel.v1 calls need an API key (SATCHEL_AUTH, else: not on loopback only)."""
        if self.auth:
            return self.auth == "required"
        return not listens_on_loopback_only(self.listen)


def listens_on_loopback_only(listen: str) -> bool:
    """True when `host:port` binds a loopback address only (127.0.0.0/8, ::1, localhost)."""
    host = listen.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name other than localhost, or a wildcard such as "" or 0.0.0.0
        return False


LOG_LEVELS = ("debug", "info", "warning", "error", "critical")


def is_address(listen: str) -> bool:
    """`host:port` with a host (a name, an IPv4 address or a bracketed IPv6 one) and a port in
    0-65535 (0: any free port)."""
    host, colon, port = listen.rpartition(":")
    return bool(colon and host.strip("[]") and port.isdigit() and int(port) <= 65535)


# SATCHEL_* variables read outside Settings: by the CLI and the SDK (the server's address and
# API key), by `satchel mcp` (the scope and role of its tools) and by scripts/run.
OTHER_VARIABLES = frozenset(
    {
        "SATCHEL_ADDRESS",
        "SATCHEL_API_KEY",
        "SATCHEL_PROJECT",
        "SATCHEL_SUBJECT",
        "SATCHEL_ROLE",
        "SATCHEL_RUN_DEMO",
    }
)


def known_variables() -> frozenset[str]:
    """Every SATCHEL_* variable satchel reads."""
    names = {"SATCHEL_" + f.name.upper() for f in fields(Settings) if f.name not in _NESTED} | {
        "SATCHEL_" + f.name.upper() for f in fields(ContextSettings)
    }
    names |= {"SATCHEL_TALENT_" + f.name.upper() for f in fields(TalentSettings)}
    return frozenset(names) | OTHER_VARIABLES


def unknown_variables(env: Mapping[str, str] | None = None) -> list[tuple[str, str | None]]:
    """The SATCHEL_* variables of `env` that satchel does not read (a typo is otherwise silently
    ignored), each with the closest known name (None when nothing is close)."""
    env = os.environ if env is None else env
    known = {name.removeprefix("SATCHEL_"): name for name in known_variables()}

    def closest(name: str) -> str | None:
        found = difflib.get_close_matches(name.removeprefix("SATCHEL_"), known, n=1, cutoff=0.75)
        return known[found[0]] if found else None

    return [
        (name, closest(name))
        for name in sorted(env)
        if name.startswith("SATCHEL_") and name.removeprefix("SATCHEL_") not in known
    ]


_NESTED = {"context", "talents"}


def _read(cls: type, env: dict[str, str], prefix: str, skip: set[str] = frozenset()) -> dict:
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.name in skip:
            continue
        name = prefix + f.name.upper()
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        values[f.name] = _convert(name, raw, str(f.type))
    return values


BOOLEANS = {"true": True, "on": True, "1": True, "false": False, "off": False, "0": False}


def _convert(name: str, raw: str, type_name: str) -> Any:
    type_name = type_name.removesuffix(" | None")
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            number = float(raw)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return number
        if "Path" in type_name:
            return Path(raw).expanduser()
        if type_name == "bool":
            word = raw.strip().lower()
            if word not in BOOLEANS:
                raise ValueError(f"{word} is not one of {', '.join(BOOLEANS)}")
            return BOOLEANS[word]
    except ValueError as exc:
        what = "finite number" if type_name == "float" else type_name
        raise ConfigError(f"{name}={raw!r} is not a valid {what}") from exc
    return raw
