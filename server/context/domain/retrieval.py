"""When two-phase retrieval may stop: the score bound of a fact that phase 1 did not return.

Pure: no I/O. Phase 1 of a context call has three sources, each of which returns its best facts
and, with them, a limit on what it left out: the newest facts of the scope (every one scored on
cosine and recency, the best kept), the K nearest facts by cosine, and the K best full-text
matches. Phase 2 scores their union. The union holds the true top N when its N-th score is at
least the best score an unseen fact could reach (the threshold algorithm).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from satchel.server.context.domain.score import Weights


@dataclass(frozen=True)
class SourceReport:
    """What phase 1's sources returned, reduced to what bounds the facts they left out.

    `window_*`: the newest facts read (at most `window_limit`; the oldest one's age) and the best
    of them kept (at most `newest_limit`, the lowest kept partial score: cosine + recency).
    `vector_*`: the nearest facts (at most `vector_limit`, the largest cosine distance).
    `text_*`: the best matches (at most `text_limit`, the lowest
    rank, capped at 1).
    """

    window_rows: int
    window_limit: int
    window_oldest_age_seconds: float | None
    newest_rows: int
    newest_limit: int
    newest_min_partial: float | None
    vector_rows: int
    vector_limit: int
    vector_max_distance: float | None
    text_rows: int
    text_limit: int
    text_min_rank: float | None


def unseen_score_bound(report: SourceReport, weights: Weights) -> float:
    """The highest hybrid score a fact outside the union could have (-inf: none is left out).

    An unseen fact of the newest window scores at most the lowest partial score kept from it,
    plus the text bound. When the window held every visible fact there is no other; else an
    unseen older fact has a cosine at most that of the K-th nearest and a recency at most that
    of the window's oldest fact. An unseen fact's text rank is at most the K-th best rank, or 0
    when the text source returned every match. A vector source that returned fewer than K rows
    gives no bound (+inf): HNSW's iterative scan stops after `hnsw.max_scan_tuples`, so a scope
    that is a small share of a large table can come back short.
    """
    # The K-th best text rank when the text source was full (else every match was returned).
    text_min_rank = report.text_min_rank if report.text_rows >= report.text_limit else None
    base = weights.text_rank * (text_min_rank if text_min_rank is not None else 0.0)
    bounds = [float("-inf")]
    if report.newest_limit and report.newest_rows >= report.newest_limit:
        bounds.append(base + (report.newest_min_partial or 0.0))
    if report.window_rows < report.window_limit:
        return max(bounds)  # the window held every visible fact
    if report.vector_rows < report.vector_limit or report.vector_max_distance is None:
        return float("inf")
    nearest = 1.0 - report.vector_max_distance
    edge = (
        1.0
        if report.window_oldest_age_seconds is None
        else weights.recency_of(report.window_oldest_age_seconds)
    )
    bounds.append(base + weights.similarity * nearest + weights.recency * edge)
    return max(bounds)


def holds_top(scores: Sequence[float], bound: float, top_n: int) -> bool:
    """True when no unseen fact scoring at most `bound` can enter the top `top_n` of `scores`
    (best first)."""
    if bound == float("-inf") or top_n == 0:
        return True
    return len(scores) >= top_n and scores[top_n - 1] >= bound
