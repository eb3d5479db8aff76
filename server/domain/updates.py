"""Knowledge updates: when a value was stated again later, the newer statement ranks first.

Pure, no I/O. Two facts of one scope state the same thing at different times when they share
their predicate and their vectors are close (cosine at least `min_similarity`): "Ben lives in
Paris" (two years ago) and "Ben lives in Nantes" (last week). Neither is superseded (nobody
linked them), so both stay candidates; the newer one's score is lifted just above the older's
when it was below, so that the newest is served first. Nothing is lowered: an old fact keeps
its rank, and facts that merely share a generic predicate ("observation") are left alone
unless they are that close.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from .packing import Candidate

STEP = 1e-6
"""How far above the older statement's score a newer one is put."""


@dataclass(frozen=True)
class Statement:
    """What the rule needs of a fact: its predicate, when it became valid, its unit vector."""

    predicate: str
    since: float
    vector: np.ndarray


def newer_first(
    candidates: Sequence[Candidate], statements: Mapping[str, Statement], min_similarity: float
) -> list[Candidate]:
    """`candidates` with each newer restatement's score lifted above its older one's (facts
    absent from `statements`, and episodes, are unchanged); `min_similarity <= 0`: off."""
    if min_similarity <= 0:
        return list(candidates)
    scores = {c.id: c.score for c in candidates}
    known = [c for c in candidates if c.id in statements]
    # Oldest first: a fact's score is final once every older restatement has lifted it.
    known.sort(key=lambda c: statements[c.id].since)
    for i, older in enumerate(known):
        s_old = statements[older.id]
        for newer in known[i + 1 :]:
            s_new = statements[newer.id]
            if (
                s_new.predicate == s_old.predicate
                and s_new.since > s_old.since
                and float(s_old.vector @ s_new.vector) >= min_similarity
            ):
                scores[newer.id] = max(scores[newer.id], scores[older.id] + STEP)
    return [c if scores[c.id] == c.score else replace(c, score=scores[c.id]) for c in candidates]
