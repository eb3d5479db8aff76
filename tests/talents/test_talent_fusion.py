"""Unit tests of fused talent relevance: words in any language, BM25F, the z-scored fusion, the
calibrated gate and the cut (pure maths; the real model is used in test_tool_search.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from satchel.server.talents.domain.fusion import (
    CONTRAST,
    GATE_QUANTILE,
    MAX_SUB_INTENTS,
    SIMILARITY_GATE_MIN,
    SUB_INTENT_DEPTH,
    WORD_GATE_QUANTILE,
    FusedSpace,
    Gate,
    GateReport,
    calibrate,
    merged_scores,
    sub_intents,
)
from satchel.server.talents.domain.lexical import FieldIndex, TalentFields
from satchel.server.talents.domain.selection import (
    FULL_TEXT_CHARS,
    NOTE_OUT_OF_DOMAIN,
    Reason,
    ScorableTalent,
    Scoring,
    SelectionParams,
    schema_text,
    select,
)
from satchel.server.talents.domain.terms import analyze, is_english, script_of, task_terms

FUSED = SelectionParams(floor=None, margin=4.0, scoring=Scoring.FUSED, max_served=8)


def unit_rows(matrix: list[list[float]]) -> np.ndarray:
    rows = np.asarray(matrix, dtype=np.float64)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def z(values: np.ndarray) -> np.ndarray:
    return (values - values.mean()) / values.std()


# --- words ------------------------------------------------------------------------------------


def test_words_are_split_stemmed_and_folded_in_their_language() -> None:
    assert analyze("getWeatherForecast") == ["get", "weather", "forecast"]
    assert analyze("the unit_testing of parsers") == ["unit", "test", "parser"]
    # French is stemmed as French, accents stripped after stemming.
    assert analyze("déployer les conteneurs") == ["deploi", "conteneur"]
    # A task's request words are dropped: they say how it asks, not what it is about.
    assert task_terms("Can you help me find the weather in Lisbon?") == ["weather", "lisbon"]


def test_a_french_task_also_searches_english_stems() -> None:
    terms = task_terms("Configurer les migrations Prisma pour la base de données")
    assert "prism" in terms  # French stemming of a borrowed name
    assert "prisma" in terms  # and the English one, which an English talent has


def test_english_is_told_from_other_languages() -> None:
    assert is_english("Why do cats purr?") and is_english("Book a flight to Oslo")
    assert not is_english("Quel temps fera-t-il demain à Lyon ?")  # no marker, an accent
    assert not is_english("Wie ist das Wetter in Berlin")
    assert not is_english("查询天气")


def test_cjk_runs_become_bigrams() -> None:
    assert analyze("查询汇率") == ["查询", "询汇", "汇率"]
    assert analyze("天") == ["天"]
    assert task_terms("帮我查一下美元兑人民币的汇率") == [
        "帮我", "我查", "查一", "一下", "下美", "美元", "元兑", "兑人", "人民", "民币",
        "币的", "的汇", "汇率",
    ]  # fmt: skip
    assert analyze("Redis缓存") == ["redi", "缓存"]


# --- BM25F ------------------------------------------------------------------------------------


def test_bm25f_weighs_the_name_above_the_body_and_scales_by_idf() -> None:
    index = FieldIndex.of(
        [
            TalentFields(name="weather", summary="Forecast for a city."),
            TalentFields(name="calendar", summary="Events.", body="weather: add a weather note"),
            TalentFields(name="email", summary="Send mail."),
        ]
    )
    scores = index.scores(["weather"])
    assert scores[0] > scores[1] > scores[2] == 0
    # Rarer terms count more: "weather" is in 2 of 3 talents, "mail" in 1.
    assert index.idf["mail"] > index.idf["weather"]
    assert index.most(["weather", "mail", "unknown"]) == pytest.approx(
        2.2 * (index.idf["weather"] + index.idf["mail"])
    )
    assert 0 < scores.max() <= index.most(["weather"])


def test_schema_text_reads_parameter_names_and_descriptions() -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"},
            "options": {
                "type": "object",
                "properties": {"units": {"type": "string", "description": "metric or imperial"}},
            },
            "stops": {"type": "array", "items": {"properties": {"airport": {"type": "string"}}}},
        },
    }
    assert schema_text(json.dumps(schema)).splitlines() == [
        "city: City name",
        "days",
        "options",
        "stops",
        "units: metric or imperial",
        "airport",
    ]
    assert schema_text("") == schema_text("not json") == schema_text("[1, 2]") == ""


def test_a_tool_is_served_as_its_definition_and_its_full_text_is_bounded() -> None:
    schema = json.dumps({"type": "object", "properties": {"city": {"description": "A city"}}})
    tool = ScorableTalent.build(
        id="weather", name="get_weather", summary="Forecast.", input_schema=schema
    )
    assert tool.body == f"Forecast.\n\nInput: {schema}"
    assert tool.input_schema == schema
    assert tool.fields is not None and tool.fields.body == "city: A city"
    assert tool.full_text == "get_weather\nForecast.\ncity: A city"
    long = ScorableTalent.build(id="x", name="x", summary="s", body="b" * 10_000)
    assert len(long.full_text) == FULL_TEXT_CHARS and long.tokens == 2500


# --- fusion, gate, cut ------------------------------------------------------------------------


def space_of(
    short: list[list[float]], full: list[list[float]], names: list[str], unrelated=None
) -> FusedSpace:
    return FusedSpace.of(
        unit_rows(short),
        unit_rows(full),
        FieldIndex.of([TalentFields(name=n) for n in names]),
        None if unrelated is None else unit_rows(unrelated),
    )


def talents(names: list[str], tokens: int = 10) -> list[ScorableTalent]:
    return [ScorableTalent.build(id=n, name=n, body="b" * 4 * tokens) for n in names]


def test_the_fused_score_is_the_sum_of_the_z_scored_signals() -> None:
    names = ["weather", "calendar", "email", "maps"]
    short = [[1, 0.1, 0], [0.2, 1, 0], [0, 0.3, 1], [0.5, 0.5, 0.5]]
    full = [[1, 0, 0.2], [0, 1, 0.4], [0.1, 0, 1], [0.3, 0.6, 0.2]]
    space = space_of(short, full, names)
    task = np.array([0.9, 0.3, 0.1])
    evidence = space.evidence(task, ["weather"])
    unit_task = task / np.linalg.norm(task)
    cos_short, cos_full = unit_rows(short) @ unit_task, unit_rows(full) @ unit_task
    bm25f = space.lexical.scores(["weather"])
    expected = z(cos_short) + z(cos_full) + z(bm25f)
    assert evidence.fused == pytest.approx(expected)
    assert evidence.best_similarity == pytest.approx(max(cos_short.max(), cos_full.max()))

    result = select(talents(names), space, task, set(), FUSED, task="weather")
    scores = {t.id: t.score for t in (*result.kept, *result.excluded)}
    assert scores == pytest.approx(dict(zip(names, expected, strict=True)))
    assert result.kept[0].id == "weather"
    assert 0.5 < result.kept[0].text_rank <= 1.0  # the only word, matched in the name
    assert {t.text_rank for t in result.excluded} == {0.0}
    assert result.gate is not None and result.gate.admitted


def test_the_margin_is_in_z_units_and_the_cap_and_budget_bound_it() -> None:
    names = ["a", "b", "c", "d", "e", "f"]
    basis = np.eye(6)
    space = space_of(basis.tolist(), basis.tolist(), names)
    task = np.array([1.0, 0.9, 0.1, 0.0, 0.0, 0.0])
    fused = space.evidence(task, []).fused
    order = list(np.argsort(-fused))
    assert [names[i] for i in order[:2]] == ["a", "b"]

    def kept(params: SelectionParams, tokens: int = 10) -> list[str]:
        return select(talents(names, tokens), space, task, set(), params, task="").kept_ids

    gap = fused[order[0]] - fused[order[1]]
    assert kept(SelectionParams(floor=-1, margin=gap / 2, scoring=Scoring.FUSED)) == ["a"]
    assert kept(SelectionParams(floor=-1, margin=gap * 1.01, scoring=Scoring.FUSED)) == ["a", "b"]
    # Candidates below the mean (negative z) are not cut for it: relevance is the gate's.
    wide = SelectionParams(floor=-1, margin=100, scoring=Scoring.FUSED)
    assert len(kept(wide)) == 6
    capped = select(
        talents(names), space, task, set(), SelectionParams(
            floor=-1, margin=100, scoring=Scoring.FUSED, max_served=2
        ), task="",
    )  # fmt: skip
    assert capped.kept_ids == ["a", "b"]
    assert {t.reason for t in capped.excluded} == {Reason.OVER_MAX_SERVED}
    budget = SelectionParams(floor=-1, margin=100, scoring=Scoring.FUSED, budget_tokens=25)
    assert kept(budget) == ["a", "b"]


def test_the_gate_is_calibrated_on_the_unrelated_tasks() -> None:
    names = ["weather", "calendar"]
    unrelated = [[0, 0, 1, 0.1 * i] for i in range(10)]
    space = space_of([[1, 0, 0, 0], [0, 1, 0, 0]], [[1, 0, 0.3, 0], [0, 1, 0, 0]], names, unrelated)
    vectors = unit_rows(unrelated)
    best = np.maximum(vectors @ space.short.T, vectors @ space.full.T).max(axis=1)
    level = float(np.quantile(best, GATE_QUANTILE))
    assert space.gate.calibration_tasks == 10
    assert space.gate.similarity == pytest.approx(max(level, SIMILARITY_GATE_MIN))

    off = select(talents(names), space, np.array([0, 0, 1, 0.5]), set(), FUSED, task="")
    assert off.out_of_domain and not off.kept
    assert {t.reason for t in off.excluded} == {Reason.OUT_OF_DOMAIN}
    assert off.note.startswith(f"{NOTE_OUT_OF_DOMAIN} (best similarity")
    assert "10 shipped unrelated tasks" in off.note
    on = select(talents(names), space, np.array([1, 0.1, 0, 0]), set(), FUSED, task="")
    assert not on.out_of_domain and on.kept_ids[0] == "weather"
    # A request's floor replaces the calibrated level.
    forced = select(
        talents(names), space, np.array([0, 0, 1, 0.5]), set(),
        SelectionParams(floor=-1.0, margin=4.0, scoring=Scoring.FUSED), task="",
    )  # fmt: skip
    assert forced.kept and forced.gate is not None and forced.gate.gate.similarity == -1.0


def test_an_english_task_nearer_an_unrelated_request_than_any_talent_is_gated() -> None:
    """The level alone lets a task through when its best talent is close enough; an English
    task must also be closer to that talent than to the nearest shipped unrelated request."""
    names = ["weather", "calendar"]
    unrelated = [[0.6, 0, 0.8, 0]] + [[0, 0, 1, 0.1 * i] for i in range(1, 10)]
    space = space_of([[1, 0, 0, 0], [0, 1, 0, 0]], [[1, 0, 0, 0], [0, 1, 0, 0]], names, unrelated)
    chat = np.array([0.6, 0, 0.8, 0])  # like the first unrelated request, and the weather tool
    evidence = space.evidence(chat, [])
    english = space.judge(evidence, chat, english=True)
    assert english.best_similarity >= space.gate.similarity  # the level alone would admit it
    assert english.unrelated_similarity == pytest.approx(1.0)
    assert english.nearer_unrelated and not english.admitted
    assert "to a request that needs no talent" in english.note()
    # Another language is not compared with the requests; it must share a word with a talent.
    french = space.judge(evidence, chat, english=False)
    assert french.unrelated_similarity is None and french.best_word_match == 0.0
    assert french.no_shared_word and not french.admitted
    assert "no talent shares a word with the task" in french.note()
    worded = space.judge(space.evidence(chat, ["weather"]), chat, english=False)
    assert worded.best_word_match is not None and worded.best_word_match > 0 and worded.admitted
    # A multilingual model's similarities cross languages: the level alone judges other ones.
    multilingual = FusedSpace.of(
        space.short, space.full, space.lexical, np.asarray(unrelated), multilingual=True
    )
    assert multilingual.judge(evidence, chat, english=False).admitted
    assert not multilingual.judge(evidence, chat, english=True).admitted
    result = select(talents(names), space, chat, set(), FUSED, task="Is it warm today?")
    assert result.out_of_domain and result.gate == english
    # A real task is closer to its talent than to any unrelated request.
    weather = np.array([1.0, 0, 0.1, 0])
    assert space.judge(space.evidence(weather, []), weather, english=True).admitted
    # A request's floor replaces the whole gate, the contrast with it.
    forced = SelectionParams(floor=0.0, margin=4.0, scoring=Scoring.FUSED)
    kept = select(talents(names), space, chat, set(), forced, task="Is it warm today?")
    assert kept.kept_ids[0] == "weather" and kept.gate is not None
    assert kept.gate.unrelated_similarity is None and kept.gate.best_word_match is None


CHINESE_TOOLS = [
    ("天气预报", "查询城市未来几天的天气预报和气温"),
    ("日历事件", "在日历中创建和管理会议事件"),
    ("汇率换算", "查询两种货币之间的实时汇率"),
    ("翻译文本", "把一段中文文本翻译成英文"),
]
CHINESE_UNRELATED = [
    "写一首关于天气的诗",
    "天气冷的时候吃什么好",
    "天气预报员是怎么工作的",
    "讲一个关于熊猫的笑话",
    "Écris un poème sur la météo",
    "Raconte une blague sur le calendrier",
    "Why is the sky blue?",
]


def test_a_task_in_another_language_must_match_words_as_the_unrelated_requests_do() -> None:
    """An English model gives every Chinese text a high cosine with every Chinese tool: beyond
    the level and a shared word, a task in another language must match the candidates' words
    (best BM25F) better than the shipped unrelated requests of its script that share a word
    with them do (their lower quartile), per catalogue."""
    fields = [TalentFields(name=name, summary=summary) for name, summary in CHINESE_TOOLS]
    lexical = FieldIndex.of(fields)
    tools = np.eye(4)
    unrelated = unit_rows([[0.2, 0.2, 0.2, 1.0]] * len(CHINESE_UNRELATED))
    space = FusedSpace.of(tools, tools, lexical, unrelated, unrelated_texts=CHINESE_UNRELATED)
    chinese = [t for t in CHINESE_UNRELATED if script_of(t) == "cjk"]
    assert len(chinese) == 4 and script_of("Raconte une blague") == "latin"
    best = [float(lexical.scores(task_terms(t)).max()) for t in chinese]
    accidental = [score for score in best if score > 0]
    assert len(accidental) == 3, "the joke request shares no word with these tools"
    level = float(np.quantile(accidental, WORD_GATE_QUANTILE))
    assert space.gate.word_level("cjk") == pytest.approx(level) and level > 0
    assert space.gate.word_level("latin") is None  # no French request shares a word here

    near_weather = unit_rows([[1.0, 0, 0, 0.2]])[0]  # past the level, like any Chinese text

    def judged(task: str) -> GateReport:
        evidence = space.evidence(near_weather, task_terms(task))
        return space.judge(evidence, near_weather, is_english(task), script_of(task))

    real = judged("帮我查一下北京明天的天气预报")
    assert real.admitted and real.word_score_level == pytest.approx(level)
    assert real.best_word_score is not None and real.best_word_score > level
    chat = judged("今天天气真好啊")  # shares "天气" with the weather tool, and nothing more
    assert chat.best_word_match is not None and chat.best_word_match > 0  # a shared word
    assert chat.few_words and not chat.admitted
    assert "what the shipped unrelated requests in its script reach by accident" in chat.note()
    english = judged("What will the weather be like in Beijing tomorrow?")
    assert english.best_word_score is None and english.word_score_level is None

    # With a multilingual model, or without the requests' texts, no word level.
    multilingual = FusedSpace.of(
        tools, tools, lexical, unrelated, multilingual=True, unrelated_texts=CHINESE_UNRELATED
    )
    assert multilingual.gate.word_levels == ()
    assert FusedSpace.of(tools, tools, lexical, unrelated).gate.word_levels == ()


def test_calibration_never_goes_below_the_minimum() -> None:
    assert calibrate([-0.5, -0.4, -0.3]) == Gate(SIMILARITY_GATE_MIN, 3, contrast=CONTRAST)
    assert calibrate([0.3] * 4 + [0.9]).similarity == pytest.approx(
        float(np.quantile([0.3] * 4 + [0.9], GATE_QUANTILE))
    )


def test_one_candidate_is_kept_when_the_gate_admits_it() -> None:
    space = space_of([[1, 0]], [[1, 0]], ["only"])
    result = select(talents(["only"]), space, np.array([1.0, 0.2]), set(), FUSED, task="")
    assert result.kept_ids == ["only"] and result.kept[0].score == 0.0  # no spread: z = 0


def test_fused_scoring_needs_its_space_and_the_others_refuse_it() -> None:
    space = space_of([[1, 0]], [[1, 0]], ["only"])
    with pytest.raises(ValueError, match="FusedSpace"):
        select(talents(["only"]), np.eye(2)[:1], np.array([1.0, 0.0]), set(), FUSED)
    with pytest.raises(ValueError, match="vectors"):
        select(talents(["only"]), space, np.array([1.0, 0.0]), set(), SelectionParams())
    with pytest.raises(ValueError, match="2 candidates"):
        select(talents(["a", "b"]), space, np.array([1.0, 0.0]), set(), FUSED)


# --- several intents --------------------------------------------------------------------------


def test_a_task_is_split_into_its_intents() -> None:
    assert sub_intents("Find a flight to Oslo and book a hotel near the station") == [
        "Find a flight to Oslo",
        "book a hotel near the station",
    ]
    assert sub_intents("Get the weather in Paris. Then send it to Ana by email; thanks") == [
        "Get the weather in Paris",
        "send it to Ana by email",
    ]
    assert sub_intents("查询北京的天气。然后把结果发邮件给小王。") == [
        "查询北京的天气",
        "然后把结果发邮件给小王",
    ]
    assert sub_intents("What is the weather in Paris?") == []  # one intent: no parts
    assert sub_intents("Salt and pepper") == []  # parts under three words
    assert len(sub_intents(". ".join(["Do the thing now"] * 9))) == MAX_SUB_INTENTS


def test_each_intent_gets_its_best_talent_inside_the_margin() -> None:
    whole = np.array([5.0, 4.5, 0.0, -1.0, -2.0])
    flight, hotel = np.array([0, 0, 0, 3.0, 0]), np.array([0, 0, 0, 0, 2.0])
    merged = merged_scores(whole, [flight, hotel], margin=4.0)
    floor = 5.0 - SUB_INTENT_DEPTH * 4.0
    assert merged[:3].tolist() == [5.0, 4.5, 0.0]  # the whole task's ranks stay
    assert merged[3] == pytest.approx(floor - 1e-3) and merged[4] == pytest.approx(floor - 2e-3)
    assert merged[4] >= 5.0 - 4.0  # inside the cut
    # A part that matches no word lifts nothing; without parts the scores are the whole task's.
    assert merged_scores(whole, [np.zeros(5)], 4.0).tolist() == whole.tolist()
    assert merged_scores(whole, [], 4.0) is whole
    # A part's best already above the lift keeps its score.
    assert merged_scores(whole, [np.array([0, 9.0, 0, 0, 0])], 4.0)[1] == 4.5


TRAVEL = ["flights", "hotels", "weather", "email", "maps"]
"""Five tools, each on its own axis of a 5-d space."""


def travel_space() -> FusedSpace:
    basis = np.eye(len(TRAVEL))
    fields = [TalentFields(name=n, summary=f"{n} tool") for n in TRAVEL]
    return FusedSpace.of(basis, basis, FieldIndex.of(fields))


def test_a_task_that_asks_for_two_things_is_served_both() -> None:
    names, space = TRAVEL, travel_space()
    task = "Search flights to Oslo and then book hotels near the station"
    vector = np.array([1.0, 0.1, 0.2, 0.0, 0.0])  # the embedding sees the flight mostly
    params = SelectionParams(floor=-1, margin=4.0, scoring=Scoring.FUSED, max_served=8)
    kept = select(talents(names), space, vector, set(), params, task=task).kept_ids
    assert kept[0] == "flights" and "hotels" in kept
    narrow = select(talents(names), space, vector, set(), replace(params, margin=0.0), task=task)
    assert narrow.kept_ids == ["flights"]  # the margin bounds the parts too


def test_a_part_with_its_own_vector_is_scored_like_the_whole_task() -> None:
    names, space = TRAVEL, travel_space()
    task = "Search flights to Oslo and then find somewhere to sleep near the station"
    vector = np.array([1.0, 0.1, 0.2, 0.0, 0.0])
    params = SelectionParams(floor=-1, margin=4.0, scoring=Scoring.FUSED, max_served=8)
    by_words = select(talents(names), space, vector, set(), params, task=task).kept_ids
    assert "hotels" not in by_words, "the second part shares no word with the hotel tool"
    parts = np.array([[1.0, 0, 0, 0, 0], [0.1, 1.0, 0, 0, 0.1]])  # the second part's vector
    pooled = select(talents(names), space, vector, set(), params, task=task, part_vectors=parts)
    assert pooled.kept_ids[0] == "flights" and "hotels" in pooled.kept_ids
    wrong = select(talents(names), space, vector, set(), params, task=task, part_vectors=parts[:1])
    assert wrong.kept_ids == by_words, "vectors that do not match the parts: by words"


def test_all_parts_are_scored_at_once_as_each_would_be_alone() -> None:
    rng = np.random.default_rng(3)
    names = [f"tool{i} alpha{i % 7}" for i in range(40)]
    fields = [TalentFields(name=n, summary=n) for n in names]
    short, full = rng.normal(size=(40, 16)), rng.normal(size=(40, 16))
    space = FusedSpace.of(short, full, FieldIndex.of(fields))
    vectors, terms = rng.normal(size=(3, 16)), [["alpha1"], ["tool3"], []]
    at_once = space.part_scores(vectors, terms)
    for scores, vector, words in zip(at_once, vectors, terms, strict=True):
        np.testing.assert_allclose(scores, space.evidence(vector, words).fused, atol=1e-5)
