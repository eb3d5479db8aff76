"""Helpers for the TalentService tests: stubs, upserts, activation, rich error details."""

from __future__ import annotations

import json
from collections.abc import Iterable

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

from satchel.v1 import talent_pb2, talent_pb2_grpc


def stub(channel: grpc.aio.Channel) -> talent_pb2_grpc.TalentServiceStub:
    return talent_pb2_grpc.TalentServiceStub(channel)


async def upsert(
    talents: talent_pb2_grpc.TalentServiceStub, talent_id: str, name: str = "", **fields: object
) -> talent_pb2.UpsertTalentResponse:
    """Upsert a talent; name defaults to the id, body to one sentence."""
    fields.setdefault("body", f"How to apply {name or talent_id}.")
    talent = talent_pb2.Talent(id=talent_id, name=name or talent_id, **fields)
    return await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))


async def activate(
    talents: talent_pb2_grpc.TalentServiceStub,
    project_id: str,
    talent_ids: Iterable[str],
    active: bool = True,
) -> None:
    for talent_id in talent_ids:
        await talents.SetTalentActivation(
            talent_pb2.SetTalentActivationRequest(
                project_id=project_id, talent_id=talent_id, active=active
            )
        )


async def resolve(
    talents: talent_pb2_grpc.TalentServiceStub,
    project_id: str,
    task: str,
    *,
    role: str = "",
    relevance: int = talent_pb2.RELEVANCE_MODE_EMBEDDINGS,
    **overrides: float | int,
) -> talent_pb2.TalentSelection:
    request = talent_pb2.ResolveTalentsRequest(
        project_id=project_id, role=role, task=task, relevance=relevance, **overrides
    )
    return (await talents.ResolveTalents(request)).selection


def field_violations(error: grpc.aio.AioRpcError) -> dict[str, str]:
    """The BadRequest field violations of a rich error, by field."""
    status = rpc_status.from_call(error)
    assert status is not None, "the error carries no google.rpc.Status"
    found: dict[str, str] = {}
    for detail in status.details:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            found.update({v.field: v.description for v in bad.field_violations})
    return found


def error_reason(error: grpc.aio.AioRpcError) -> str:
    """The ErrorInfo reason of a rich error."""
    status = rpc_status.from_call(error)
    assert status is not None
    for detail in status.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            return info.reason
    return ""


def reasons(selection: talent_pb2.TalentSelection) -> dict[str, str]:
    """Every decision of a selection: talent id -> reason."""
    return {
        **{t.talent_id: t.reason for t in selection.excluded},
        **{t.talent_id: t.reason for t in selection.selected},
    }


# --- a catalogue of tools (input schemas, one `requires`, one Chinese description) ----------


def schema(**properties: str) -> str:
    return json.dumps(
        {
            "type": "object",
            "properties": {n: {"type": "string", "description": d} for n, d in properties.items()},
            "required": list(properties)[:1],
        }
    )


TOOLS: dict[str, tuple[str, str, str]] = {
    "get_weather": (
        "Current weather and the forecast for the next days in a city.",
        schema(city="City name", days="How many days of forecast"),
        "",
    ),
    "search_flights": (
        "Find flights between two airports on a date, with prices.",
        schema(origin="IATA code of the departure airport", destination="IATA code", date="Date"),
        "",
    ),
    "book_table": (
        "Book a table at a restaurant for a number of guests at a time.",
        schema(restaurant="Restaurant id", guests="Number of guests", time="ISO time"),
        "find_restaurant",
    ),
    "find_restaurant": (
        "Find restaurants near a place by cuisine.",
        schema(near="Address or place", cuisine="Kind of food"),
        "",
    ),
    "send_email": (
        "Send an email to a recipient with a subject and a body.",
        schema(to="Recipient address", subject="Subject line", body="Text of the message"),
        "",
    ),
    "convert_currency": (
        "Convert an amount of money from one currency to another at today's exchange rate.",
        schema(amount="Amount", source="ISO currency code", target="ISO currency code"),
        "",
    ),
    "stock_quote": (
        "The latest price of a stock by its ticker symbol.",
        schema(ticker="Ticker symbol such as AAPL"),
        "",
    ),
    "create_event": (
        "Create a calendar event with a title, a start and an end time, and attendees.",
        schema(title="Title", start="Start time", end="End time", attendees="Emails"),
        "",
    ),
    "translate_text": (
        "Translate a text into another language.",
        schema(text="The text", target_language="Language code"),
        "",
    ),
    "get_directions": (
        "Driving, walking or transit directions between two places, with the travel time.",
        schema(origin="Start address", destination="End address", mode="driving|walking|transit"),
        "",
    ),
    "exchange_rate_cn": (
        "查询两种货币之间的实时汇率",
        schema(base="基础货币", quote="报价货币"),
        "",
    ),
    "track_package": (
        "Track a parcel by its tracking number and carrier.",
        schema(tracking_number="Tracking number", carrier="Carrier name"),
        "",
    ),
}


async def upsert_tools(channel: grpc.aio.Channel, project_id: str) -> dict[str, str]:
    talents = stub(channel)
    ids = {name: f"{project_id}.{name}" for name in TOOLS}
    for name, (description, input_schema, requires) in TOOLS.items():
        talent = talent_pb2.Talent(
            id=ids[name],
            name=name,
            summary=description,
            input_schema=input_schema,
            requires=[ids[requires]] if requires else [],
        )
        stored = await talents.UpsertTalent(talent_pb2.UpsertTalentRequest(talent=talent))
        assert json.loads(stored.talent.input_schema) == json.loads(input_schema)
    await activate(talents, project_id, ids.values())
    return ids
