"""The words of talents and tasks that lexical relevance counts, in any language.

Pure, no I/O. Identifiers are split at camelCase humps and underscores, words case-folded,
function words left out, stemmed with the Snowball stemmer of the text's language (English,
French, German or Spanish, told apart by their function words), then stripped of accents, so
that "unit testing" and "tests unitaires" both reach "test" and "déployer" meets "deployer". A
run of CJK characters (Chinese, Japanese kana, Korean) becomes its character bigrams: no
stemmer or word list applies to them, and bigrams are what Chinese retrieval indexes.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Sequence
from typing import Any

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
_WORD = re.compile(r"[^\W_]+")
_CJK_RANGES = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_CJK = re.compile(f"[{_CJK_RANGES}]+")
_ACCENTED = re.compile("[\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u00ff\u0152\u0153]")
CJK_CHARACTER = re.compile(f"[{_CJK_RANGES}]")

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

_MARKER_TEXT = {
    "english": "the and is are of to in it you that this for on with what how",
    "french": "le la les des une et est je que qui pour dans pas du au aux ce",
    "german": "der die das und ist ich nicht ein eine zu den mit von sie es",
    "spanish": "el los las y es que de en un una por para con del se no",
}
_LANGUAGE_MARKERS = {language: frozenset(text.split()) for language, text in _MARKER_TEXT.items()}


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


def is_english(text: str) -> bool:
    """Whether a text reads as English: no CJK character, no accented Latin letter (short
    French or Spanish texts often have no function word to tell them by), and English
    function words outnumber French, German and Spanish ones (none counts as English)."""
    if CJK_CHARACTER.search(text) or _ACCENTED.search(text):
        return False
    return text_language(_words(text)) == "english"


def script_of(text: str) -> str:
    """The script a text's words are matched in: "cjk" when it has a Chinese, Japanese or
    Korean character (matched as bigrams), else "latin" (matched as words). The gate groups
    tasks in other languages than English by it."""
    return "cjk" if CJK_CHARACTER.search(text) else "latin"


def _words(text: str) -> list[str]:
    return _WORD.findall(_CAMEL.sub(" ", text).casefold())


def _split(words: Sequence[str], drop: frozenset[str]) -> tuple[list[str], list[str]]:
    """(non-CJK content words, CJK bigram terms)."""
    latin: list[str] = []
    cjk: list[str] = []
    for word in words:
        if CJK_CHARACTER.search(word) is None:
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
