"""`satchel demo`: load a small sample memory and talent catalogue, then show a streamed
context call and a talent selection.

With `--address` (or SATCHEL_ADDRESS) it talks to that server. Without, it uses the server at
SATCHEL_LISTEN when one is serving there, else starts an embedded server in this process for
the length of the demo.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rich.console import Console
from rich.text import Text

from satchel.client import SatchelClient, SatchelError
from satchel.server.commands import demo_data as sample
from satchel.server.commands.common import (
    add_client_options,
    as_dict,
    client,
    default_address,
    dialable,
    fail,
    print_json_line,
)
from satchel.server.commands.context_cmds import show_stream
from satchel.server.commands.view import console, progress_steps, selection_view
from satchel.server.platform.config import Settings
from satchel.server.platform.logs import configure_logging

DEMO_PROJECT = "demo"
KEY_PREFIX = "satchel-demo-"
START_TIMEOUT_SECONDS = 300.0


@contextmanager
def embedded_server(settings: Settings) -> Iterator[str]:
    """Run a satchel server on a free loopback port in a background thread; yield its address."""
    from satchel.server.platform.app import SatchelServer

    server = SatchelServer(replace(settings, listen="127.0.0.1:0"))
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="satchel-demo-server", daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(server.start(), loop).result(START_TIMEOUT_SECONDS)
        yield f"127.0.0.1:{server.port}"
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(START_TIMEOUT_SECONDS)
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()


def is_serving(address: str) -> bool:
    """True when a server at `address` answers its health check with SERVING."""
    try:
        with SatchelClient(address, timeout=1.0) as probe:
            return probe.health() == "SERVING"
    except SatchelError:
        return False


def load_sample(
    api: SatchelClient, project_id: str, subject_id: str, step: Callable[[str], None]
) -> dict[str, int]:
    """Write the sample events, facts, conflict and talents; `step` is called after each write.

    Idempotent: a second load returns the first rows (idempotency keys, upserts).
    """
    now = datetime.now(UTC)
    event_ids: dict[str, str] = {}
    for event in sample.EVENTS:
        recorded = api.record_event(
            project_id,
            subject_id,
            "conversation.message",
            {"speaker": event.speaker, "text": event.text},
            occurred_at=now - timedelta(days=event.days_ago),
            idempotency_key=KEY_PREFIX + event.key,
        )
        event_ids[event.key] = recorded.event.id
        step("events")
    fact_ids: dict[str, str] = {}
    for fact in sample.FACTS:
        asserted = api.assert_fact(
            project_id,
            subject_id,
            fact.predicate,
            fact.value,
            statement=fact.statement,
            confidence=fact.confidence,
            valid_from=None if fact.days_ago is None else now - timedelta(days=fact.days_ago),
            source_event_ids=[event_ids[key] for key in fact.sources],
            stale_after=fact.stale_after,
            idempotency_key=KEY_PREFIX + fact.key,
        )
        fact_ids[fact.key] = asserted.fact.id
        step("facts")
    members = {fact_ids[key] for key in sample.CONFLICT}
    conflicts = api.list_conflicts(project_id, subject_id, include_resolved=True).conflicts
    if not any(members <= set(conflict.fact_ids) for conflict in conflicts):
        api.open_conflict(project_id, subject_id, sorted(members), sample.CONFLICT_NOTE)
    step("conflict")
    catalogue = sample.talents(DEMO_PROJECT)
    for talent in catalogue:
        api.upsert_talent(talent)
        api.set_talent_activation(project_id, talent.id)
        step("talents")
    return {
        "events": len(event_ids),
        "facts": len(fact_ids),
        "open_conflicts": 1,
        "talents": len(catalogue),
    }


def _load_with_progress(
    out: Console, api: SatchelClient, args: argparse.Namespace
) -> dict[str, int]:
    total = len(sample.EVENTS) + len(sample.FACTS) + 1 + len(sample.talents(DEMO_PROJECT))
    with progress_steps(out, total, "loading the sample memory", disable=args.json) as step:
        counts = load_sample(
            api, args.project, args.subject, lambda what: step(f"loading the sample {what}")
        )
        step("sample memory loaded", advance=0)
    return counts


def _run(out: Console, api: SatchelClient, args: argparse.Namespace, about: dict[str, Any]) -> int:
    counts = _load_with_progress(out, api, args)
    if args.json:
        print_json_line({"demo": {**about, **counts}})
    else:
        out.print(
            f"sample memory of [bold]{args.project}/{args.subject}[/]: {counts['events']} events,"
            f" {counts['facts']} facts, {counts['talents']} talents; among the facts, "
            f"{sample.CONFLICT_SUMMARY} and {sample.VOLATILE_SUMMARY}\n",
            highlight=False,
        )
        out.print(
            Text(
                "Each row below is one decision of a context call: a fact or an episode of the"
                " memory, scored against the query, then served or left out as the"
                f" {args.budget}-token budget (small on purpose) fills. The legend under the table"
                " explains its columns and reasons.\n"
            )
        )
    stream = api.stream_context(args.project, args.subject, args.query, budget_tokens=args.budget)
    if args.json:
        trace_id = ""
        for message in stream:
            trace_id = message.trace_id
            print_json_line(message)
    else:
        title = f"streamed context call  query {args.query!r}"
        trace_id, _ = show_stream(out, stream, title, args.budget, pace=args.pace)
    selection = api.resolve_talents(
        args.project, sample.TALENT_TASK, relevance="embeddings"
    ).selection
    if args.json:
        print_json_line({"talents": as_dict(selection)})
        return 0
    out.print()
    out.print(selection_view(selection, f"talents for {sample.TALENT_TASK!r}", out.width))
    target = f" --address {about['address']}" if not about["embedded"] else ""
    scope = f"--project {args.project} --subject {args.subject}"
    out.print(
        Text(
            "\nnext:\n"
            f"  .venv/bin/satchel context {scope} --query 'What does Maya eat?'{target}\n"
            f"  .venv/bin/satchel facts {scope} --all{target}\n"
            f"  .venv/bin/satchel trace {trace_id} --project {args.project}{target}"
            + ("\n(the embedded server stops with this demo: run `scripts/run` to keep one)"
               if about["embedded"] else ""),
            style="dim",
        )
    )  # fmt: skip
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Load the sample into a server (or an embedded one) and show a streamed context call."""
    explicit = args.address or os.environ.get("SATCHEL_ADDRESS")
    address = dialable(explicit or default_address())
    out = console()
    with ExitStack() as stack:
        embedded = False
        if not explicit and not is_serving(address):
            configure_logging("warning", settings.log_format)
            notice = Console(stderr=True)
            with notice.status(f"no server at {address}: starting an embedded one…"):
                address = stack.enter_context(embedded_server(settings))
            embedded = True
        about = {
            "address": address,
            "embedded": embedded,
            "project_id": args.project,
            "subject_id": args.subject,
        }
        try:
            with client(args, address) as api:
                return _run(out, api, args, about)
        except SatchelError as exc:
            return fail(exc, address)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `demo`."""
    demo = commands.add_parser(
        "demo", help="load a sample memory and talents, then stream a context call"
    )
    demo.add_argument("--project", default=DEMO_PROJECT)
    demo.add_argument("--subject", default=sample.SUBJECT)
    demo.add_argument("--query", default=sample.QUERY)
    demo.add_argument("--budget", type=int, default=sample.BUDGET_TOKENS, help="token budget")
    demo.add_argument(
        "--pace",
        type=float,
        default=0.08,
        help="seconds between displayed decisions, to watch the budget fill (0: as they come)",
    )
    add_client_options(demo, json_help="print JSON lines: the load, the stream, the talents")
    demo.set_defaults(func=cmd_demo)
