"""The sample memory and talent catalogue of `satchel demo` (an invented conversation).

Maya, a data engineer, talks with an assistant over twelve days. Dates are relative to the
first load; every write carries an idempotency key, so loading again changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from satchel.v1 import talent_pb2

SUBJECT = "maya"
QUERY = "Help Maya plan her trip to Lisbon"
TALENT_TASK = "Plan a three-day Lisbon trip itinerary with vegetarian restaurants"
BUDGET_TOKENS = 90


@dataclass(frozen=True)
class SampleEvent:
    key: str
    days_ago: float
    speaker: str
    text: str


@dataclass(frozen=True)
class SampleFact:
    key: str
    predicate: str
    value: object
    statement: str
    sources: tuple[str, ...] = ()
    confidence: float | None = None
    days_ago: float | None = None
    stale_after: timedelta | None = None


EVENTS: tuple[SampleEvent, ...] = (
    SampleEvent(
        "e01", 12.0, "maya", "Hi! I'm Maya, a data engineer at Northwind. Mostly Python and SQL."
    ),
    SampleEvent("e02", 11.9, "assistant", "Nice to meet you, Maya. What are you working on?"),
    SampleEvent(
        "e03",
        11.0,
        "maya",
        "A nightly pipeline that loads invoices into PostgreSQL. It keeps timing out.",
    ),
    SampleEvent("e04", 9.0, "maya", "Please keep answers short: bullet points work best for me."),
    SampleEvent("e05", 7.0, "maya", "I'm going to Lisbon for the PyData conference next month!"),
    SampleEvent("e06", 6.0, "maya", "I might take the train from Madrid instead of flying."),
    SampleEvent(
        "e07", 5.0, "maya", "My flight to Lisbon leaves on the 14th... or was it the 15th?"
    ),
    SampleEvent("e08", 3.0, "maya", "I'm in Berlin this week for a client workshop."),
    SampleEvent(
        "e09",
        2.0,
        "maya",
        "Found it: the pipeline timeouts came from a missing index on invoice_date.",
    ),
    SampleEvent(
        "e10", 1.0, "maya", "I'm vegetarian, so keep that in mind for restaurants in Lisbon."
    ),
)

FACTS: tuple[SampleFact, ...] = (
    SampleFact(
        "f01", "job", "data engineer at Northwind", "Maya is a data engineer at Northwind", ("e01",)
    ),
    SampleFact(
        "f02", "languages", ["Python", "SQL"], "Maya mostly writes Python and SQL", ("e01",)
    ),
    SampleFact("f03", "home_city", "Porto", "Maya lives in Porto", confidence=0.7),
    SampleFact(
        "f04",
        "project",
        "invoice pipeline",
        "Maya maintains a nightly pipeline that loads invoices into PostgreSQL",
        ("e03",),
    ),
    SampleFact(
        "f05",
        "answer_style",
        "short bullet points",
        "Maya prefers short answers in bullet points",
        ("e04",),
    ),
    SampleFact(
        "f06",
        "trip",
        {"city": "Lisbon", "why": "PyData"},
        "Maya is going to Lisbon for the PyData conference next month",
        ("e05",),
    ),
    SampleFact(
        "f07",
        "travel_mode",
        "train from Madrid",
        "Maya may take the train from Madrid to Lisbon instead of flying",
        ("e06",),
        confidence=0.6,
    ),
    SampleFact(
        "f08", "flight_date", "the 14th", "Maya's flight to Lisbon leaves on the 14th", ("e07",)
    ),
    SampleFact(
        "f09", "flight_date", "the 15th", "Maya's flight to Lisbon leaves on the 15th", ("e07",)
    ),
    SampleFact(
        "f10",
        "current_location",
        "Berlin",
        "Maya is in Berlin this week for a client workshop",
        ("e08",),
        days_ago=3.0,
        stale_after=timedelta(days=2),
    ),
    SampleFact(
        "f11",
        "pipeline_fix",
        "index on invoice_date",
        "The invoice pipeline timeouts came from a missing index on invoice_date",
        ("e09",),
    ),
    SampleFact("f12", "diet", "vegetarian", "Maya is vegetarian", ("e10",)),
)

CONFLICT = ("f08", "f09")
CONFLICT_NOTE = "Maya was unsure of her flight date"
CONFLICT_SUMMARY = "one open conflict (her flight to Lisbon leaves on the 14th, or the 15th?)"
VOLATILE = "f10"
VOLATILE_SUMMARY = "one volatile fact, now expired (in Berlin this week: true for 2 days)"
"""How `satchel demo` announces the conflict and the volatile fact (see FACTS)."""


def talents(prefix: str) -> list[talent_pb2.Talent]:
    """The sample catalogue, ids under `prefix` (a required edge included)."""
    return [
        talent_pb2.Talent(
            id=f"{prefix}.travel.itinerary",
            name="Trip itineraries",
            summary="Plan day-by-day trip itineraries around fixed events",
            body="Start from the fixed dates (flights, conferences), then fill each day with "
            "at most three activities close to each other. Give travel times.",
            tags=["travel", "itinerary", "trip"],
            triggers=["plan a trip", "itinerary"],
            task_types=["planning"],
            requires=[f"{prefix}.style.concise"],
        ),
        talent_pb2.Talent(
            id=f"{prefix}.food.vegetarian",
            name="Vegetarian restaurants",
            summary="Recommend vegetarian-friendly restaurants and dishes",
            body="Prefer places with several vegetarian mains; name one dish per place.",
            tags=["food", "restaurants", "vegetarian"],
            triggers=["restaurant", "vegetarian"],
        ),
        talent_pb2.Talent(
            id=f"{prefix}.style.concise",
            name="Concise answers",
            summary="Answer in short bullet points",
            body="Answer in at most five bullet points; no preamble.",
            tags=["style"],
        ),
        talent_pb2.Talent(
            id=f"{prefix}.sql.performance",
            name="SQL performance",
            summary="Diagnose slow PostgreSQL queries with EXPLAIN and indexes",
            body="Run EXPLAIN (ANALYZE, BUFFERS); look for sequential scans on large tables "
            "and add the missing index.",
            tags=["sql", "postgresql", "performance", "index"],
            triggers=["slow query", "timeout"],
        ),
        talent_pb2.Talent(
            id=f"{prefix}.python.testing",
            name="Python testing",
            summary="Write fast unit tests with pytest",
            body="Arrange, act, assert; one behaviour per test; no network in unit tests.",
            tags=["python", "pytest", "testing"],
            triggers=["unit test"],
        ),
    ]
