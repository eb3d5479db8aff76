"""Where a query is embedded: short ones on the event loop, after the tasks already scheduled
(a context call's plan statement), long ones in the executor; the same vector either way."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
from helpers.embedding import RecordingEmbedder

from satchel.server.platform.config import Settings
from satchel.server.platform.runtime import QUERY_ON_LOOP_MAX_CHARS, Runtime


async def test_a_short_query_is_embedded_on_the_loop_after_the_scheduled_tasks(embedder) -> None:
    recording = RecordingEmbedder(embedder)
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=recording)
    embedded_before_statement: list[int] = []

    async def statement() -> None:
        embedded_before_statement.append(len(recording.texts))

    try:
        planning = asyncio.ensure_future(statement())
        vector = await runtime.embed_query("Where does Priya live?")
        await planning
        alone = embedder.embed(["Where does Priya live?"])[0]
    finally:
        runtime.executor.shutdown()
    assert embedded_before_statement == [0]
    assert recording.texts == [["Where does Priya live?"]]
    assert recording.threads == [threading.get_ident()]
    assert np.array_equal(vector, alone)


async def test_a_long_query_is_embedded_in_the_executor(embedder) -> None:
    recording = RecordingEmbedder(embedder)
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=recording)
    query = "Which city did Priya move to after her sister's wedding? " * 10
    assert len(query) > QUERY_ON_LOOP_MAX_CHARS
    try:
        vector = await runtime.embed_query(query)
    finally:
        runtime.executor.shutdown()
    [thread] = recording.threads
    assert thread != threading.get_ident()
    assert np.array_equal(vector, embedder.embed([query])[0])
