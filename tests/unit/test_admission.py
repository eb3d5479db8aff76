"""Fair admission (server/admission.py): turns rotate between clients, limits refuse at once."""

from __future__ import annotations

import asyncio

import pytest

from satchel.server.admission import FairAdmission
from satchel.server.errors import ResourceExhausted


async def _call(admission: FairAdmission, client: str, order: list[str], release: asyncio.Event):
    async with admission.slot(client):
        order.append(client)
        await release.wait()


async def test_a_flooding_client_delays_another_by_at_most_one_call_of_its_own() -> None:
    admission = FairAdmission(active=1, per_client=100, total=100)
    order: list[str] = []
    gates = [asyncio.Event() for _ in range(8)]
    flood = [asyncio.create_task(_call(admission, "flood", order, gates[i])) for i in range(6)]
    await asyncio.sleep(0)
    other = asyncio.create_task(_call(admission, "other", order, gates[6]))
    await asyncio.sleep(0)
    assert order == ["flood"] and admission.running == 1 and admission.waiting == 6
    for gate in gates[:2]:  # the running flood call ends, then the next one
        gate.set()
        await asyncio.sleep(0.01)
    assert order[:3] == ["flood", "flood", "other"], "other's turn came after one flood call"
    for gate in gates:
        gate.set()
    await asyncio.gather(*flood, other)
    assert admission.running == 0 and admission.waiting == 0


async def test_limits_refuse_at_once_per_client_and_in_all() -> None:
    admission = FairAdmission(active=1, per_client=2, total=3)
    release = asyncio.Event()
    order: list[str] = []
    held = [asyncio.create_task(_call(admission, "a", order, release)) for _ in range(2)]
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted) as mine:
        async with admission.slot("a"):
            pass
    assert mine.value.reason == "TOO_MANY_CALLS"
    third = asyncio.create_task(_call(admission, "b", order, release))
    await asyncio.sleep(0)
    with pytest.raises(ResourceExhausted) as busy:
        async with admission.slot("c"):
            pass
    assert busy.value.reason == "SERVER_BUSY"
    release.set()
    await asyncio.gather(*held, third)
    async with admission.slot("a"):  # room again
        pass


async def test_a_cancelled_waiting_call_gives_up_its_place() -> None:
    admission = FairAdmission(active=1, per_client=10, total=10)
    release = asyncio.Event()
    order: list[str] = []
    first = asyncio.create_task(_call(admission, "a", order, release))
    await asyncio.sleep(0)
    waiting = asyncio.create_task(_call(admission, "b", order, release))
    await asyncio.sleep(0)
    assert admission.waiting == 1
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert admission.waiting == 0
    release.set()
    await first
    assert order == ["a"] and admission.running == 0


async def test_a_call_past_its_lease_lets_the_next_one_run() -> None:
    """A call stuck (on a lock, say) holds the others back for one lease, not until it ends."""
    admission = FairAdmission(active=1, per_client=10, total=10, lease=0.05)
    stuck, done = asyncio.Event(), asyncio.Event()
    order: list[str] = []
    first = asyncio.create_task(_call(admission, "a", order, stuck))
    await asyncio.sleep(0)
    second = asyncio.create_task(_call(admission, "b", order, done))
    await asyncio.sleep(0.01)
    assert order == ["a"], "within the lease the next call waits"
    await asyncio.sleep(0.1)
    assert order == ["a", "b"], "past it, the next call runs"
    done.set()
    await second
    stuck.set()
    await first
    assert admission.running == 0 and admission.waiting == 0
