"""Fair admission (server/platform/admission.py): turns rotate between clients, limits refuse at
once."""

from __future__ import annotations

import asyncio

import pytest

from satchel.server.platform.admission import FairAdmission
from satchel.server.platform.errors import ResourceExhausted


async def _call(admission: FairAdmission, client: str, order: list[str], release: asyncio.Event):
    async with admission.slot(client):
        order.append(client)
        await release.wait()


async def test_a_client_with_nothing_running_runs_at_once_beside_a_flood() -> None:
    admission = FairAdmission(active=1, per_client=100, total=100, newcomers=1)
    order: list[str] = []
    release = asyncio.Event()
    flood = [asyncio.create_task(_call(admission, "flood", order, release)) for _ in range(6)]
    await asyncio.sleep(0)
    other = asyncio.create_task(_call(admission, "other", order, release))
    await asyncio.sleep(0)
    assert order == ["flood", "other"] and admission.running == 2 and admission.waiting == 5
    third = asyncio.create_task(_call(admission, "third", order, release))
    await asyncio.sleep(0)
    assert order == ["flood", "other"], "beyond active + newcomers, a newcomer waits its turn"
    release.set()
    await asyncio.gather(*flood, other, third)
    assert admission.running == 0 and admission.waiting == 0


async def test_while_another_client_is_present_a_flood_runs_only_its_share() -> None:
    admission = FairAdmission(active=2, per_client=100, total=100, lease=0.2)
    order: list[str] = []
    gates = [asyncio.Event() for _ in range(7)]
    flood = [asyncio.create_task(_call(admission, "flood", order, gates[i])) for i in range(6)]
    await asyncio.sleep(0)
    assert order == ["flood", "flood"], "alone, a client runs as many calls as there are slots"
    other = asyncio.create_task(_call(admission, "other", order, gates[6]))
    await asyncio.sleep(0)
    assert order == ["flood", "flood", "other"] and admission.share() == 1
    gates[0].set()
    await asyncio.sleep(0.01)
    assert admission.running == 2, "the flood is at its share (1), the other call runs"
    gates[6].set()  # the other client's call ends; it stays present for a lease
    await other
    await asyncio.sleep(0.01)
    assert admission.running == 1 and admission.waiting == 4, "a slot stays free for the other"
    gates[1].set()  # the flood's running call ends: its next one runs, one only
    await asyncio.sleep(0.01)
    assert order.count("flood") == 3 and admission.running == 1
    await asyncio.sleep(0.25)  # the other client is gone: the flood's share is both slots again
    gates[2].set()
    await asyncio.sleep(0.01)
    assert order.count("flood") == 5 and admission.running == 2
    for gate in gates:
        gate.set()
    await asyncio.gather(*flood)
    assert admission.running == 0 and admission.waiting == 0


async def test_turns_rotate_between_waiting_clients() -> None:
    """Without newcomer slots, a flood delays another client by at most one call of its own."""
    admission = FairAdmission(active=1, per_client=100, total=100, newcomers=0)
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
    admission = FairAdmission(active=1, per_client=10, total=10, newcomers=0)
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
    admission = FairAdmission(active=1, per_client=10, total=10, lease=0.05, newcomers=0)
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


async def test_a_clients_waiting_call_runs_before_its_next_one() -> None:
    """A client whose running call ends has its waiting call run at once, as a newcomer's
    would: never overtaken by its own next call (a caller with two calls at a time among many
    clients waited 0.6-1.7 s so, `benchmarks/load.md`)."""
    admission = FairAdmission(active=1, per_client=10, total=10, newcomers=1)
    order: list[str] = []
    gates = {label: asyncio.Event() for label in ("busy", "a1", "a2", "a3")}

    async def call(client: str, label: str) -> None:
        async with admission.slot(client):
            order.append(label)
            await gates[label].wait()

    tasks = [asyncio.create_task(call("busy", "busy")), asyncio.create_task(call("a", "a1"))]
    await asyncio.sleep(0)
    tasks.append(asyncio.create_task(call("a", "a2")))
    await asyncio.sleep(0)
    assert order == ["busy", "a1"] and admission.waiting == 1
    gates["a1"].set()
    await asyncio.sleep(0.01)
    assert order == ["busy", "a1", "a2"], "its waiting call runs once it has none running"
    tasks.append(asyncio.create_task(call("a", "a3")))
    await asyncio.sleep(0)
    assert order == ["busy", "a1", "a2"], "beside its running call, its next one waits"
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks)
    assert order[-1] == "a3" and admission.running == 0 and admission.waiting == 0
