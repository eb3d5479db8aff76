"""`satchel facts | events`: read a scope's memory through the SDK (tables, or `--json`)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from itertools import islice
from typing import TypeVar

from satchel.client import SatchelError
from satchel.server.commands.common import (
    add_client_options,
    client,
    fail,
    parse_instant,
    print_json,
    server_address,
)
from satchel.server.commands.view import console, events_table, facts_table
from satchel.server.platform.config import Settings
from satchel.v1 import memory_pb2

T = TypeVar("T")
PAGE_SIZE = 200


def _take(items: Iterator[T], limit: int) -> tuple[list[T], bool]:
    """At most `limit` items (0: all) and whether more were left."""
    if limit <= 0:
        return list(items), False
    taken = list(islice(items, limit + 1))
    return taken[:limit], len(taken) > limit


def cmd_facts(args: argparse.Namespace, settings: Settings) -> int:
    """List the facts of a scope: active now, as of an instant, or all (--all)."""
    address = server_address(args)
    try:
        with client(args, address) as api:
            facts, more = _take(
                api.iter_facts(
                    args.project,
                    args.subject,
                    as_of=args.as_of,
                    include_inactive=args.all,
                    page_size=PAGE_SIZE,
                ),
                args.limit,
            )
    except SatchelError as exc:
        return fail(exc, address)
    if args.json:
        print_json(memory_pb2.ListFactsResponse(facts=facts))
        return 0
    scope = f"{args.project}/{args.subject}"
    when = f" as of {args.as_of:%Y-%m-%d %H:%M}" if args.as_of else ""
    kind = "facts (all statuses)" if args.all else "active facts"
    out = console()
    out.print(facts_table(facts, f"{kind} of {scope}{when}"))
    out.print(f"{len(facts)} fact(s)" + (f", more beyond --limit {args.limit}" if more else ""))
    return 0


def cmd_events(args: argparse.Namespace, settings: Settings) -> int:
    """List the events of a scope, newest first: all, or those that had occurred as of an
    instant."""
    address = server_address(args)
    try:
        with client(args, address) as api:
            events, more = _take(
                api.iter_events(args.project, args.subject, as_of=args.as_of, page_size=PAGE_SIZE),
                args.limit,
            )
    except SatchelError as exc:
        return fail(exc, address)
    if args.json:
        print_json(memory_pb2.ListEventsResponse(events=events))
        return 0
    out = console()
    when = f" as of {args.as_of:%Y-%m-%d %H:%M}" if args.as_of else ""
    title = f"events of {args.project}/{args.subject}{when}, newest first"
    out.print(events_table(events, title))
    out.print(f"{len(events)} event(s)" + (f", more beyond --limit {args.limit}" if more else ""))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `facts` and `events`."""
    facts = commands.add_parser("facts", help="list the facts of a scope")
    facts.add_argument("--project", required=True)
    facts.add_argument("--subject", required=True)
    facts.add_argument("--as-of", type=parse_instant, help="as valid and recorded then (ISO 8601)")
    facts.add_argument("--all", action="store_true", help="also retired and superseded facts")
    facts.add_argument("--limit", type=int, default=100, help="at most N facts (0: all)")
    add_client_options(facts, json_help="print a ListFactsResponse as JSON")
    facts.set_defaults(func=cmd_facts)

    events = commands.add_parser("events", help="list the events of a scope, newest first")
    events.add_argument("--project", required=True)
    events.add_argument("--subject", required=True)
    events.add_argument(
        "--as-of", type=parse_instant, help="occurred and recorded by then (ISO 8601)"
    )
    events.add_argument("--limit", type=int, default=50, help="at most N events (0: all)")
    add_client_options(events, json_help="print a ListEventsResponse as JSON")
    events.set_defaults(func=cmd_events)
