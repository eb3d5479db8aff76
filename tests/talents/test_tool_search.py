"""Talents that are tools, selected by default and served by SearchTools (real server, embedded
PostgreSQL, the bundled model): input schemas, the calibrated gate's "none fits", the closure,
other languages, and the seed's compile-everything still reachable."""

from __future__ import annotations

import json
from dataclasses import replace

import grpc
import pytest
from helpers.servers import channel_to, running
from helpers.talents import TOOLS, activate, field_violations, schema, stub, upsert_tools

from satchel.server.platform.config import Settings
from satchel.server.talents.domain.selection import LISTED_EXCLUSIONS
from satchel.v1 import talent_pb2


async def search(channel: grpc.aio.Channel, project_id: str, task: str, **limits: int):
    request = talent_pb2.SearchToolsRequest(project_id=project_id, task=task, **limits)
    return await stub(channel).SearchTools(request)


async def test_search_tools_serves_the_definitions_an_agent_loads(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    ids = await upsert_tools(channel, project_id)
    found = await search(channel, project_id, "What's the weather going to be in Lisbon on Friday?")
    assert not found.none_fits and found.note == ""
    first = found.tools[0]
    assert (first.talent_id, first.name, first.reason) == (
        ids["get_weather"],
        "get_weather",
        "relevance",
    )
    assert first.description == TOOLS["get_weather"][0]
    assert json.loads(first.input_schema) == json.loads(TOOLS["get_weather"][1])
    assert len(found.tools) <= 3  # a clear winner is not served with the whole catalogue
    assert found.tokens == sum(
        (len(t.name) + len(t.description) + len(t.input_schema)) // 4 for t in found.tools
    )
    assert found.selection.params.scoring == "fused"
    assert found.selection.gate.calibration_tasks > 0


async def test_each_part_of_a_task_is_read_with_a_vector_of_its_own(
    channel: grpc.aio.Channel, project_id: str, settings: Settings
) -> None:
    """The second part shares no word with the mail tool: pooled from the task's own run, its
    vector finds it; scored by its words (SATCHEL_TALENT_SUB_INTENTS=words), it finds none."""
    await upsert_tools(channel, project_id)
    task = "Find flights from Lisbon to Oslo on Friday and then write a note to Ana's inbox"
    pooled = [t.name for t in (await search(channel, project_id, task)).tools]
    assert pooled[0] == "search_flights" and "send_email" in pooled
    words = replace(settings.talents, sub_intents="words")
    async with running(settings, talents=words) as other, channel_to(other) as by_words:
        found = await search(by_words, project_id, task)
    assert "send_email" not in [t.name for t in found.tools]


async def test_the_closure_comes_with_the_tool_that_requires_it(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    ids = await upsert_tools(channel, project_id)
    found = await search(channel, project_id, "Reserve a table for four at 8 pm tonight")
    by_id = {t.talent_id: t for t in found.tools}
    assert found.tools[0].talent_id == ids["book_table"]
    helper = by_id[ids["find_restaurant"]]
    assert helper.reason in {"relevance", "requires_closure"}
    if helper.reason == "requires_closure":
        assert helper.required_by == ids["book_table"]


async def test_an_unrelated_task_gets_an_explicit_none_fits(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    await upsert_tools(channel, project_id)
    for task in (
        "What are the main differences between Stoicism and Epicureanism?",
        "Summarise the plot of Romeo and Juliet in a paragraph.",
    ):
        found = await search(channel, project_id, task)
        assert found.none_fits and not found.tools, task
        assert found.note.startswith("no tool fits this task (best similarity")
        assert found.selection.out_of_domain


async def test_a_chinese_tool_is_found_by_its_words(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """MiniLM reads Chinese poorly; the CJK bigrams of the lexical signal still rank the tool
    whose description shares the task's words first (the gate is set aside to look at the
    ranking alone)."""
    ids = await upsert_tools(channel, project_id)
    request = talent_pb2.ResolveTalentsRequest(
        project_id=project_id,
        task="帮我查一下美元兑人民币的汇率",
        relevance=talent_pb2.RELEVANCE_MODE_EMBEDDINGS,
        floor=-1.0,
    )
    selection = (await stub(channel).ResolveTalents(request)).selection
    assert selection.selected[0].talent_id == ids["exchange_rate_cn"]
    assert selection.selected[0].text_rank > 0


async def test_a_catalogue_of_many_tools_serves_a_handful(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """The defaults select on a catalogue of hundreds as on one of twelve: a few tools, under
    the cap, never the whole catalogue."""
    talents = stub(channel)
    ids = await upsert_tools(channel, project_id)
    filler = []
    for i in range(300):
        talent_id = f"{project_id}.filler{i:03d}"
        topic = ("inventory", "payroll", "ticketing", "analytics", "fleet")[i % 5]
        talent = talent_pb2.Talent(
            id=talent_id,
            name=f"{topic}_op_{i}",
            summary=f"Operation {i} of the {topic} system: reads or updates {topic} records.",
            input_schema=schema(record_id=f"The {topic} record"),
        )
        await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
        filler.append(talent_id)
    await activate(talents, project_id, filler)
    found = await search(channel, project_id, "Send an email to Ana with the meeting notes")
    assert found.tools[0].talent_id == ids["send_email"]
    assert 1 <= len(found.tools) <= 8
    listed = found.selection.excluded
    assert len(listed) == LISTED_EXCLUSIONS  # the best-scored exclusions; the rest are counted
    assert len(listed) + found.selection.excluded_unlisted == len(TOOLS) + 300 - len(found.tools)
    assert [t.score for t in listed] == sorted((t.score for t in listed), reverse=True)
    assert listed[-1].reason == "below_margin"


async def test_search_tools_and_schemas_are_validated(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    talents = stub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await talents.SearchTools(
            talent_pb2.SearchToolsRequest(project_id="", task="", budget_tokens=0, max_served=-1)
        )
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert set(field_violations(caught.value)) == {
        "project_id",
        "task",
        "budget_tokens",
        "max_served",
    }
    for bad, why in (("{not json", "JSON text"), ("[1, 2]", "JSON object")):
        talent = talent_pb2.Talent(id=f"{project_id}.bad", name="bad", input_schema=bad)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert why in field_violations(caught.value)["talent.input_schema"]
    # A project without talents: nothing fits, and it says so.
    empty = await search(channel, f"{project_id}-empty", "Book a flight to Oslo")
    assert empty.none_fits and not empty.tools and empty.note


async def test_the_seed_compile_everything_stays_reachable(
    settings: Settings, channel: grpc.aio.Channel, project_id: str
) -> None:
    """SATCHEL_TALENT_RELEVANCE=off: a request without a relevance mode gets every active
    talent of its role, as the seed compiles them."""
    from satchel.server.platform.app import SatchelServer

    ids = await upsert_tools(channel, project_id)
    srv = SatchelServer(replace(settings, talents=replace(settings.talents, relevance="off")))
    await srv.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{srv.port}") as off_channel:
            request = talent_pb2.ResolveTalentsRequest(project_id=project_id, task="anything")
            selection = (await stub(off_channel).ResolveTalents(request)).selection
    finally:
        await srv.stop()
    assert selection.relevance == talent_pb2.RELEVANCE_MODE_OFF
    assert {t.talent_id for t in selection.selected} == set(ids.values())


CHINESE_TOOLS = {
    "weather_cn": "查询城市未来几天的天气预报和气温",
    "calendar_cn": "在日历中创建和管理会议事件",
    "translate_cn": "把一段中文文本翻译成英文",
    "exchange_cn": "查询两种货币之间的实时汇率",
    "idioms_cn": "查询成语和古诗词的出处与意思",
    "jokes_cn": "按主题随机返回一个笑话或故事",
}


async def test_a_chinese_request_must_match_the_words_as_a_real_task_does(
    channel: grpc.aio.Channel, project_id: str
) -> None:
    """MiniLM gives any Chinese text a high cosine with any Chinese tool, so the level alone
    let Chinese chit-chat through on one common bigram ("天的", in "几天的天气"): a task in
    another language must match the tools' words better than the shipped unrelated requests
    of its script do by accident on this catalogue."""
    talents = stub(channel)
    ids = [f"{project_id}.{name}" for name in CHINESE_TOOLS]
    for talent_id, (name, summary) in zip(ids, CHINESE_TOOLS.items(), strict=True):
        talent = talent_pb2.Talent(id=talent_id, name=name, summary=summary)
        await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
    await activate(talents, project_id, ids)

    found = await search(channel, project_id, "帮我查一下北京明天的天气预报")
    assert [t.talent_id for t in found.tools][:1] == [f"{project_id}.weather_cn"]
    gate = found.selection.gate
    assert gate.HasField("word_score_threshold") and gate.word_score_threshold > 0
    assert gate.best_word_score > gate.word_score_threshold
    for chat in ("今天天气真好啊\uff0c你觉得呢\uff1f", "写一首关于春天的五言绝句。"):
        found = await search(channel, project_id, chat)
        assert found.none_fits and not found.tools, chat
        gate = found.selection.gate
        assert gate.best_similarity >= gate.similarity_threshold, "the level alone admits it"
        assert gate.best_word_match > 0, "it shares a word with a tool"
        assert 0 < gate.best_word_score <= gate.word_score_threshold
        assert "by accident" in found.note
    english = await search(channel, project_id, "What will the weather be in Beijing tomorrow?")
    assert not english.selection.gate.HasField("word_score_threshold")
