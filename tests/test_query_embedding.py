"""Where a query is embedded: short ones on the event loop, after the tasks already scheduled
(a context call's plan statement), long ones in the executor; the same vector either way."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

from satchel.server.config import Settings
from satchel.server.runtime import QUERY_ON_LOOP_MAX_CHARS, Runtime


class _Recording:
    """The real model, recording the thread each text was embedded on and what ran before."""

    def __init__(self, model) -> None:
        self.model = model
        self.model_id = model.model_id
        self.dimension = model.dimension
        self.query_prefix = model.query_prefix
        self.passage_prefix = model.passage_prefix
        self.events: list[tuple[str, int]] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.events.append(("embed", threading.get_ident()))
        return self.model.embed(texts)


async def test_a_short_query_is_embedded_on_the_loop_after_the_scheduled_tasks(embedder) -> None:
    recording = _Recording(embedder)
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=recording)
    loop_thread = threading.get_ident()

    async def statement() -> None:
        recording.events.append(("statement sent", threading.get_ident()))

    try:
        planning = asyncio.ensure_future(statement())
        vector = await runtime.embed_query("Where does Priya live?")
        await planning
        alone = embedder.embed(["Where does Priya live?"])[0]
    finally:
        runtime.executor.shutdown()
    assert recording.events == [("statement sent", loop_thread), ("embed", loop_thread)]
    assert np.array_equal(vector, alone)


async def test_a_long_query_is_embedded_in_the_executor(embedder) -> None:
    recording = _Recording(embedder)
    runtime = Runtime(settings=Settings.from_env({}), pool=None, embedder=recording)
    query = "Which city did Priya move to after her sister's wedding? " * 10
    assert len(query) > QUERY_ON_LOOP_MAX_CHARS
    try:
        vector = await runtime.embed_query(query)
    finally:
        runtime.executor.shutdown()
    [(_, thread)] = recording.events
    assert thread != threading.get_ident()
    assert np.array_equal(vector, embedder.embed([query])[0])
