"""The full-text side of a context query: which words of the user's text are searched.

Pure, no I/O. `websearch_to_tsquery` ANDs every word of its input, so a whole question ("When
did Caroline go to the LGBTQ support group?") matches almost no fact. The query is therefore
reduced to its content words (function words of English and French left out), which the SQL
joins with `or` and still parses with `websearch_to_tsquery` (any text is accepted): a fact
matching more of the content words ranks higher. The SQL divides `ts_rank_cd` by
`TS_RANK_UNIT` per searched word, so a fact holding every word once scores about 1.
"""

from __future__ import annotations

import re

from satchel.server.context.domain.entities import SENTENCE_STARTERS

MAX_QUERY_TERMS = 16
"""At most this many distinct content words are searched (the first ones)."""

MIN_TERM_CHARS = 2

TS_RANK_UNIT = 0.1
"""What `ts_rank_cd` gives one occurrence of one query term in an unweighted document."""

_ENGLISH = """
am be been being do done doing got has have having is isn may might must ought shall
any both each either every few many more most much neither nor or other others same such
than too very whom whose why how what when where which who into onto upon over under up
down out off by via per against between through during until till within without ago
s t d ll ve re m don didn doesn won cannot kind sort thing things like lot lots
ever still again already yet even only own quite rather really
"""
_FRENCH = """
à aux ou où est sont été être était avoir ont ai as avons avez eu ne ni se sa leurs nos
vos notre votre qu quels quelles lequel laquelle lesquels comment pourquoi combien y on
"""
STOP_WORDS: frozenset[str] = SENTENCE_STARTERS | frozenset((_ENGLISH + _FRENCH).split())
"""Function words of English and French, lower-cased: never searched."""

_TERM = re.compile(r"[^\W_]+")


def query_terms(query: str, max_terms: int = MAX_QUERY_TERMS) -> list[str]:
    """The content words of `query`: lower-cased letter/digit runs of at least two characters,
    minus stop words, deduplicated in order, at most `max_terms`."""
    terms: dict[str, None] = {}
    for word in _TERM.findall(query.casefold()):
        if len(word) >= MIN_TERM_CHARS and word not in STOP_WORDS:
            terms.setdefault(word, None)
            if len(terms) == max_terms:
                break
    return list(terms)
