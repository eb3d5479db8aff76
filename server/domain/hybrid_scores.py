"""The parts of the hybrid score, computed in memory as the context statements compute them.

Pure: no I/O. Cosine similarity as pgvector's `1 - (a <=> b)` (clamped to [-1, 1]), Okapi BM25
(k1 1.2, b 0.75) from postings with the scope's IDF and average length, the text rank (BM25
divided by the best of the documents scored, at most 1) and the recency decay
exp(-age / tau) floored like the statements' (ages in the future count as 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

BM25_K1 = 1.2
BM25_B = 0.75
MIN_TEXT_FULL = 1e-12  # the statements' floor of the best BM25 (no match: every rank 0)
MIN_EXPONENT = -700.0  # the statements' floor of the recency exponent

Postings = Mapping[str, tuple[np.ndarray, np.ndarray]]  # lexeme -> (positions, frequencies)


def postings_of(
    documents: Sequence[tuple[Sequence[str], Sequence[int]]],
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Each lexeme's positions and frequencies among documents given as (lexemes, frequencies)."""
    grouped: dict[str, tuple[list[int], list[int]]] = {}
    for position, (lexemes, frequencies) in enumerate(documents):
        for lexeme, frequency in zip(lexemes, frequencies, strict=True):
            at, tf = grouped.setdefault(lexeme, ([], []))
            at.append(position)
            tf.append(frequency)
    return {
        lexeme: (np.array(at, dtype=np.int64), np.array(tf, dtype=np.float64))
        for lexeme, (at, tf) in grouped.items()
    }


def cosine_similarity(vectors: np.ndarray, norms: np.ndarray, vector: np.ndarray) -> np.ndarray:
    """Each row's cosine with `vector` (float32 products, like pgvector's); none for no rows
    (an empty scope's matrix has no columns either)."""
    if len(vectors) == 0:
        return np.zeros(0)
    query = np.asarray(vector, dtype=np.float32)
    cosine = (vectors @ query) / (norms * float(np.linalg.norm(query)))
    return 1.0 - (1.0 - np.clip(cosine, -1.0, 1.0))  # the statements' 1 - distance


def bm25(
    postings: Postings,
    lengths: np.ndarray,
    terms: Sequence[str],
    idfs: Sequence[float],
    avg_tokens: float,
) -> np.ndarray:
    """Each document's raw BM25 for the searched lexemes; NaN where it holds none of them."""
    raw = np.full(len(lengths), np.nan)
    norm = BM25_K1 * ((1 - BM25_B) + BM25_B * lengths / avg_tokens)
    for term, idf in zip(terms, idfs, strict=True):
        posting = postings.get(term)
        if posting is None:
            continue
        at, tf = posting
        part = idf * tf * (BM25_K1 + 1) / (tf + norm[at])
        raw[at] = np.where(np.isnan(raw[at]), part, raw[at] + part)
    return raw


def text_ranks(
    raw: np.ndarray, scored: np.ndarray, full: float | None = None
) -> tuple[np.ndarray, float]:
    """The text rank of each document (0 without a match) and what the raw BM25 is divided by:
    `full` when given, else the best raw BM25 among the `scored` positions."""
    if full is None:
        matches = raw[scored]
        matches = matches[~np.isnan(matches)]
        full = max(float(matches.max()) if len(matches) else 0.0, MIN_TEXT_FULL)
    ranks = np.where(np.isnan(raw), 0.0, np.minimum(1.0, np.nan_to_num(raw) / full))
    return ranks, full


def decay(since_epoch: np.ndarray, at_epoch: float, tau_seconds: float) -> np.ndarray:
    """exp(-age / tau), ages in the future counting as 0, the exponent floored at -700."""
    exponent = np.minimum(since_epoch - at_epoch, 0.0) / tau_seconds
    return np.exp(np.maximum(exponent, MIN_EXPONENT))


def best(positions: np.ndarray, count: int, *keys: np.ndarray) -> np.ndarray:
    """The `count` positions lowest by `keys` (the first decides, the next break its ties)."""
    if len(positions) <= count:
        return positions
    first = keys[0][positions]
    near = positions[first <= np.partition(first, count - 1)[count - 1]]  # with the ties
    return near[np.lexsort(tuple(key[near] for key in reversed(keys)))[:count]]
