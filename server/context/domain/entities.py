"""Rule-based entity detection for the multi-hop expansion (no NER, no model)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence

MULTI_HOP_MAX_ENTITIES = 2
"""At most this many entities seed the multi-hop pass."""

MULTI_HOP_MAX_PER_ENTITY = 5
"""At most this many facts are fetched per entity (one hop, never recursive)."""

# The seed's regex, anchored so that it matches whole words only ("McDonald" and "JavaScript"
# are not entities "Donald" and "Java").
ENTITY_PATTERN = re.compile(r"(?<!\w)[A-ZÀ-Ý][a-zà-ÿ]{2,}(?!\w)")

_WORD = re.compile(r"\w+")

_ENGLISH_STARTERS = """
a about after all also an and are as at because before but can could did does for from
had has have he her here hey him his how however i if in it its just last let maybe me my next no
not now of on one our please she should since so some sure thanks that the their them then there
these they this those to today tomorrow was we well were what when where which while who why will
with would wow yeah yes yesterday you your
according additionally although anyway being besides both currently despite during each either
every feeling finally fortunately having hopefully honestly instead lately luckily meanwhile
moreover most overall recently sadly several such though thus together unfortunately whether
"""
# Day and month names are capitalised by convention, not things to hop on.
_CALENDAR = """
monday tuesday wednesday thursday friday saturday sunday january february march april may june
july august september october november december lundi mardi mercredi jeudi vendredi samedi
dimanche janvier février mars avril mai juin juillet août septembre octobre novembre décembre
"""
_FRENCH_STARTERS = """
alors après au aujourd aussi avant avec bien bonjour car ce ceci cela ces cet cette chez
comme dans de demain depuis des donc du elle elles en enfin ensuite est et hier il ils je la le les
leur leurs lui ma mais merci mes mon non nous oui par pas pour puis quand que quel quelle qui quoi
sa ses si son sous sur ta tes ton tous tout toutes très un une vous ça
"""
SENTENCE_STARTERS: frozenset[str] = frozenset(
    (_ENGLISH_STARTERS + _FRENCH_STARTERS + _CALENDAR).split()
)
"""Capitalised words that start sentences (or date things) rather than name things, lower-cased."""


def extract_entities(
    texts: Sequence[str], query: str, max_entities: int = MULTI_HOP_MAX_ENTITIES
) -> list[str]:
    """Capitalised words of `texts` ranked by frequency (ties: first appearance).

    Sentence starters, words present in `query` (case-insensitively) and words the texts also
    use in lower case ("Dancing is fun. I love dancing": a common word, not a name) are left
    out; at most `max_entities` are returned.
    """
    if max_entities <= 0:
        return []
    joined = "\n".join(texts)  # one scan of all texts: words never span the line breaks
    query_words = {word.casefold() for word in _WORD.findall(query)}
    query_words.update(w for w in set(_WORD.findall(joined)) if w.islower())
    counts: Counter[str] = Counter()
    first_seen: dict[str, int] = {}
    for word in ENTITY_PATTERN.findall(joined):
        folded = word.casefold()
        if folded not in SENTENCE_STARTERS and folded not in query_words:
            counts[word] += 1
            first_seen.setdefault(word, len(first_seen))
    ranked = sorted(counts, key=lambda word: (-counts[word], first_seen[word]))
    return ranked[:max_entities]
