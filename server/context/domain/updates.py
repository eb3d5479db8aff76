"""Knowledge updates: when a value was stated again later, the newer statement ranks first.

Pure, no I/O. Two facts of one scope state the same thing at different times when they share
their predicate and their vectors are close (cosine at least SATCHEL_NEWER_WINS_SIMILARITY; the
SQL finds those pairs among the candidates, `RESTATES` in context/storage/sql.py): "Ben
lives in
Paris" (two years ago) and "Ben lives in Nantes" (last week). Neither is superseded (nobody
linked them), so both stay candidates; the newer one's score is lifted just above the older's
when it was below, so that the newest is served first. Nothing is lowered: an old fact keeps
its rank, and facts that merely share a generic predicate ("observation") are left alone
unless they are that close.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace

from satchel.server.context.domain.packing import Candidate

STEP = 1e-6
"""How far above the older statement's score a newer one is put."""


def newer_first(
    candidates: Sequence[Candidate],
    since: Mapping[str, float],
    restates: Mapping[str, Collection[str]],
) -> list[Candidate]:
    """`candidates` with each fact's score lifted just above the score of every older fact it
    restates (`restates[id]`: ids of those, `since[id]`: when each became valid), when below."""
    scores = {c.id: c.score for c in candidates}
    older_of = {i: [o for o in restates.get(i, ()) if o in scores] for i in scores}
    # Oldest first: a fact's score is final once every older restatement has been applied.
    for newer in sorted((i for i in scores if older_of[i]), key=lambda i: since[i]):
        for older in older_of[newer]:
            scores[newer] = max(scores[newer], scores[older] + STEP)
    return [c if scores[c.id] == c.score else replace(c, score=scores[c.id]) for c in candidates]
