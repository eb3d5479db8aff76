"""The SDK pages ListConflicts and ListTalents (AIP-158): `page_size`/`page_token` on the list
methods, `iter_conflicts`/`iter_talents` through every page, in both clients."""

from __future__ import annotations

import asyncio

from satchel.client import AsyncSatchelClient, SatchelClient, fact_request
from satchel.v1 import talent_pb2

SUBJECT = "user-1"


async def _seed(client: AsyncSatchelClient, project_id: str) -> tuple[list[str], list[str]]:
    """Three open conflicts (oldest first) and three talents active on the project (by id)."""
    facts = await client.batch_assert_facts(
        [fact_request(project_id, SUBJECT, "city", i) for i in range(6)]
    )
    ids = [f.id for f in facts.facts]
    conflicts = [
        (await client.open_conflict(project_id, SUBJECT, ids[i : i + 2])).conflict.id
        for i in range(0, 6, 2)
    ]
    talents = [f"{project_id}.t{i}" for i in range(3)]
    for talent_id in talents:
        await client.upsert_talent(talent_pb2.Talent(id=talent_id, name=talent_id, body="b"))
        await client.set_talent_activation(project_id, talent_id)
    return conflicts, talents


def _sync_reads(address: str, project_id: str) -> dict[str, object]:
    with SatchelClient(address) as client:
        page = client.list_conflicts(project_id, SUBJECT, page_size=2)
        rest = client.list_conflicts(
            project_id, SUBJECT, page_size=2, page_token=page.next_page_token
        )
        return {
            "pages": [[c.id for c in page.conflicts], [c.id for c in rest.conflicts]],
            "last_token": rest.next_page_token,
            "conflicts": [c.id for c in client.iter_conflicts(project_id, SUBJECT, page_size=1)],
            "talents": [
                t.id for t in client.iter_talents(project_id, active_only=True, page_size=2)
            ],
        }


async def test_both_clients_page_conflicts_and_talents(address: str, project_id: str) -> None:
    async with AsyncSatchelClient(address) as client:
        conflicts, talents = await _seed(client, project_id)
        newest_first = conflicts[::-1]
        page = await client.list_talents(project_id, active_only=True, page_size=2)
        assert [t.id for t in page.talents] == talents[:2] and page.next_page_token
        assert list(page.active_talent_ids) == talents[:2]
        listed = [c.id async for c in client.iter_conflicts(project_id, SUBJECT, page_size=2)]
        assert listed == newest_first
        listed = [
            t.id async for t in client.iter_talents(project_id, active_only=True, page_size=1)
        ]
        assert listed == talents
    seen = await asyncio.to_thread(_sync_reads, address, project_id)
    assert seen["pages"] == [newest_first[:2], newest_first[2:]]
    assert seen["last_token"] == ""
    assert seen["conflicts"] == newest_first
    assert seen["talents"] == talents
