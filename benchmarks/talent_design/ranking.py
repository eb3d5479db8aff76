"""Talent selection, redesigned: fused ranking, a self-calibrating gate, an evidence cut.

Pure numpy (plus `py_rust_stemmers`, which satchel already ships through fastembed); no I/O.
Meant to be ported into `server/domain/`. Every constant is documented where it is defined;
the measurements behind them are in `results.md` (reproduced by `probe.py`).

Life cycle:

1. When a catalogue changes: `TalentIndex.build(talents, short_vectors, full_vectors)`, with
   the vectors of `short_text(t)` and `full_text(t)` (passage prefix added by the caller), then
   `calibrate_gate(index, calibration_texts, calibration_vectors)` with the shipped generic
   tasks (`server/unrelated_tasks.json`, embedded once per model with the query prefix).
2. Per task: `scores = score_task(index, task, task_vector)` (one task embedding, no other),
   `gate.admits(scores)`, then `cut(scores.fused)` gives the talents to serve, best first;
   the caller applies the token budget to that list.
"""

from __future__ import annotations

import functools
import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

# --- texts ---------------------------------------------------------------------------------

FULL_TEXT_CHARS = 1500
"""The full text (name, tags, summary, body) is cut here before embedding and indexing: the
embedding models read at most 256 (MiniLM) / 512 (e5) tokens anyway, and a long rule body's
tail is mostly examples that dilute BM25's length normalisation."""

SHORT_TEXT_CHARS = 600
"""The short text (name, tags, summary) is cut here: it is what the talent is *for*."""


@dataclass(frozen=True)
class TalentText:
    """What selection reads of a talent. For a tool: `name` its name, `tags` its group (MCP
    server, API provider...), `summary` its description, `body` one line a parameter."""

    id: str
    name: str
    summary: str = ""
    tags: tuple[str, ...] = ()
    body: str = ""


def _head(talent: TalentText) -> str:
    tags = ", ".join(t for t in talent.tags if t.strip())
    return f"{talent.name} ({tags})" if tags else talent.name


def short_text(talent: TalentText) -> str:
    """Name (tags) and summary: one line each."""
    lines = [_head(talent), talent.summary.strip()]
    return "\n".join(line for line in lines if line)[:SHORT_TEXT_CHARS]


def full_text(talent: TalentText) -> str:
    """Name (tags), summary, body, cut at FULL_TEXT_CHARS. For a catalogue tool this is
    `Tool.text()` of benchmarks/catalogues.py, cut."""
    body = talent.body.strip()
    lines = [_head(talent), talent.summary.strip(), "" if body == talent.summary.strip() else body]
    return "\n".join(line for line in lines if line)[:FULL_TEXT_CHARS]


# --- words ---------------------------------------------------------------------------------

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK = re.compile(f"[{_CJK_RANGES}]+")
_CJK_CHAR = re.compile(f"[{_CJK_RANGES}]")

# Function words of the languages the stemmers below cover; never indexed nor searched.
_STOP_TEXT = """
a an the and or but if then else of to in on at by for with from into onto over under about
as is are was were be been being am do does did done doing have has had having it its this
that these those there here i me my mine we us our you your yours he him his she her they
them their what which who whom whose when where why how all any both each every few more
most other some such no nor not only own same so than too very can could will would shall
should may might must s t d ll ve re m just also please up out off via per etc e g i e
le la les l un une des du de d et ou mais donc car ni que qu qui quoi dont où ce cet cette
ces se sa son ses mon ma mes ton ta tes notre nos votre vos leur leurs je tu il elle nous
vous ils elles on y en au aux par pour sur sous dans avec sans chez est sont été être était
avoir ai as a avons avez ont eu ne pas plus très aussi comme si c n s j m
der die das den dem des ein eine einen einem einer eines und oder aber dass ist sind war
waren sein bin bist hat habe haben wird werden ich du er sie es wir ihr mich mir dich dir
uns euch sich nicht kein keine mit von zu zum zur auf aus bei nach für über unter um an
im am vom wie was wer wo wann warum auch noch nur sehr so dann
el los las lo una unos unas y o pero que de del al en con sin por para es son fue ser estar
está están he ha han yo tú él ella nosotros ellos ellas mi mis tu tus su sus se me te le
les nos no más muy como cuando donde qué quién cómo este esta estos estas ese esa
"""
STOP_WORDS: frozenset[str] = frozenset(_STOP_TEXT.split())

# Request words: how a task asks, not what it is about. Dropped from the task only (a
# talent's own text keeps them): "Can you help me find a tool to ..." should not match every
# talent whose description says "helps you find".
_REQUEST_TEXT = """
want need like help find get give show tell let know use using used make please thanks
thank hi hello hey could would can able way something anything someone somebody also
veux voudrais besoin aide aider trouver donne donner montre montrer dis dire merci bonjour
möchte brauche hilf finde gib zeig sag bitte danke hallo quiero necesito ayuda ayudar
encontrar dame muestra dime gracias hola
"""
REQUEST_WORDS: frozenset[str] = frozenset(_REQUEST_TEXT.split())


def _word_set(words: str) -> frozenset[str]:
    return frozenset(words.split())


_LANGUAGE_MARKERS: dict[str, frozenset[str]] = {
    "english": _word_set("the and is are of to in it you that this for on with what how"),
    "french": _word_set("le la les des une et est je que qui pour dans pas du au aux ce"),
    "german": _word_set("der die das und ist ich nicht ein eine zu den mit von sie es"),
    "spanish": _word_set("el los las y es que de en un una por para con del se no"),
}


@functools.cache
def _stemmer(language: str) -> Any:
    from py_rust_stemmers import SnowballStemmer  # ships with fastembed, a satchel dependency

    return SnowballStemmer(language)


def _fold(word: str) -> str:
    decomposed = unicodedata.normalize("NFKD", word)
    return "".join(ch for ch in decomposed if not unicodedata.combining(ch))


def text_language(words: Sequence[str]) -> str:
    """The Snowball language whose function words are most frequent in `words` (English on
    a tie or none)."""
    counts = {lang: sum(w in markers for w in words) for lang, markers in _LANGUAGE_MARKERS.items()}
    best = max(counts, key=lambda lang: (counts[lang], lang == "english"))
    return best if counts[best] > 0 else "english"


def _words(text: str) -> list[str]:
    return _WORD.findall(_CAMEL.sub(" ", text).casefold())


def _split(words: Sequence[str], drop: frozenset[str]) -> tuple[list[str], list[str]]:
    """(non-CJK content words, CJK bigram terms)."""
    latin: list[str] = []
    cjk: list[str] = []
    for word in words:
        if _CJK_CHAR.search(word) is None:
            if len(word) >= 2 and word not in STOP_WORDS and word not in drop:
                latin.append(word)
            continue
        for part in _CJK.split(word):
            if len(part) >= 2 and part not in STOP_WORDS and part not in drop:
                latin.append(part)
        for run in _CJK.findall(word):
            cjk += [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]
    return latin, cjk


def analyze(text: str, *, drop: frozenset[str] = frozenset()) -> list[str]:
    """The terms lexical scoring counts. Identifiers are split at camelCase humps and
    underscores; words are case-folded, function words (and `drop`) left out, stemmed with
    the Snowball stemmer of the text's language, then stripped of accents ("déployer" and
    "deployer" meet). A run of CJK characters (Chinese, Japanese kana, Korean) becomes its
    character bigrams, a lone character itself: no stemmer or word list applies to them."""
    words = _words(text)
    latin, cjk = _split(words, drop)
    stemmer = _stemmer(text_language(words))
    return [_fold(stem) for stem in stemmer.stem_words(latin)] + cjk


def task_terms(task: str) -> list[str]:
    """A task's distinct terms, request words left out. A task in another language than
    English also searches the English stems of its words: talents are mostly written in
    English, and a French stemmer turns the names a French task borrows ("Prisma", "Kafka",
    "Scala") into stems no English text has ("prism", "kafk", "scal")."""
    words = _words(task)
    latin, cjk = _split(words, REQUEST_WORDS)
    language = text_language(words)
    terms = [_fold(s) for s in _stemmer(language).stem_words(latin)]
    if language != "english":
        terms += [_fold(s) for s in _stemmer("english").stem_words(latin)]
    return list(dict.fromkeys(terms + cjk))


# --- lexical index (BM25F) -------------------------------------------------------------------

K1 = 1.2
"""BM25 term-frequency saturation (the usual value)."""

B = 0.75
"""BM25 length normalisation, per field (the usual value)."""

FIELD_WEIGHTS: dict[str, float] = {"name": 3.0, "tags": 1.5, "summary": 2.0, "body": 1.0}
"""BM25F: a term's frequency in each field, length-normalised within the field, is weighted
by these and summed before saturation. The name and the summary say what a talent is for;
the body (parameters, rule text) mostly how. Tuned on the DEV sets (results.md)."""


def _fields(talent: TalentText) -> dict[str, str]:
    body = talent.body.strip()
    summary = talent.summary.strip()
    return {
        "name": talent.name,
        "tags": " ".join(talent.tags),
        "summary": summary,
        "body": "" if body == summary else body[:FULL_TEXT_CHARS],
    }


@dataclass(frozen=True, eq=False)
class LexicalIndex:
    """BM25F over a fixed talent set. `postings[term]` holds the rows containing `term` and
    each row's whole contribution idf x saturated weighted tf (it does not depend on the
    task, so a task's score is one sum per term). `idf_unknown` is the IDF a term in no
    talent would have (for the coverage of a task's terms)."""

    postings: dict[str, tuple[np.ndarray, np.ndarray]]
    idf: dict[str, float]
    idf_unknown: float
    size: int

    @classmethod
    def build(
        cls, talents: Sequence[TalentText], weights: dict[str, float] | None = None
    ) -> LexicalIndex:
        weights = FIELD_WEIGHTS if weights is None else weights
        names = list(weights)
        per_field = {f: [Counter(analyze(_fields(t)[f])) for t in talents] for f in names}
        n = len(talents)
        norms = {}
        for f in names:
            lengths = np.array([sum(c.values()) for c in per_field[f]], dtype=np.float64)
            mean = float(lengths.mean()) if n and lengths.mean() > 0 else 1.0
            norms[f] = 1 - B + B * lengths / mean
        weighted: dict[str, dict[int, float]] = {}
        for f in names:
            w = weights[f]
            if w == 0:
                continue
            for i, counts in enumerate(per_field[f]):
                for term, tf in counts.items():
                    row = weighted.setdefault(term, {})
                    row[i] = row.get(i, 0.0) + w * tf / norms[f][i]
        postings = {}
        idf = {}
        for term, rows in weighted.items():
            df = len(rows)
            idf[term] = math.log(1 + (n - df + 0.5) / (df + 0.5))
            tf = np.fromiter(rows.values(), dtype=np.float64, count=df)
            postings[term] = (
                np.fromiter(rows.keys(), dtype=np.intp, count=df),
                idf[term] * tf * (K1 + 1) / (tf + K1),
            )
        return cls(postings, idf, math.log(1 + (n + 0.5) / 0.5), n)

    def scores(self, terms: Iterable[str]) -> np.ndarray:
        """Every talent's BM25F for these (distinct) terms."""
        result = np.zeros(self.size)
        for term in terms:
            posting = self.postings.get(term)
            if posting is not None:
                result[posting[0]] += posting[1]
        return result
