"""`satchel context | trace | watch | stats`: context calls and their traces, through the SDK.

`context` shows each decision as it streams (a live table and budget bar), then the packet;
`--json` prints the stream as JSON lines. `trace` replays a stored trace, `watch` follows
every call of a project, `stats` prints the overview.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterable
from itertools import chain

import grpc
from rich.console import Console
from rich.live import Live
from rich.text import Text

from satchel.client import SatchelError, render_packet
from satchel.server.commands.common import (
    add_client_options,
    client,
    fail,
    parse_instant,
    print_json,
    print_json_line,
    server_address,
)
from satchel.server.commands.view import (
    KIND_NAME,
    OUTCOME_STYLE,
    DecisionLegend,
    DecisionTable,
    console,
    packet_view,
    shorten,
    stats_table,
    trace_view,
)
from satchel.server.platform.config import Settings
from satchel.v1 import context_pb2


def show_stream(
    out: Console,
    messages: Iterable[context_pb2.StreamContextResponse],
    title: str,
    budget: int | None,
    pace: float = 0.0,
) -> tuple[str, context_pb2.ContextPacket | None]:
    """Render a StreamContext call live (table + budget bar), then its legend and its packet.

    The first message is awaited before the table appears, so a rejected call prints nothing.
    `pace` (seconds) slows the display of each decision so that people can follow it.
    """
    table = DecisionTable(title, budget)
    trace_id, packet = "", None
    pending = iter(messages)
    first = next(pending, None)
    with Live(table, console=out, refresh_per_second=12, vertical_overflow="visible"):
        for message in chain([first] if first is not None else [], pending):
            trace_id = message.trace_id
            if message.HasField("decision"):
                table.add(message.decision)
                if pace > 0:
                    time.sleep(pace)
            else:
                packet = message.packet
                table.budget = packet.budget_tokens
                table.used = packet.tokens_used
    if not out.is_terminal:
        out.line()  # a non-terminal Live prints its last frame without a final newline
    out.print(DecisionLegend(table.rows))
    if packet is not None:
        out.print(packet_view(packet, trace_id))
    return trace_id, packet


def cmd_context(args: argparse.Namespace, settings: Settings) -> int:
    """Stream a context call: live decisions, then the packet (or JSON lines, or the block)."""
    address = server_address(args)
    with client(args, address) as api:
        try:
            stream = api.stream_context(
                args.project, args.subject, args.query, budget_tokens=args.budget, as_of=args.as_of
            )
            if args.json:
                for message in stream:
                    print_json_line(message)
                return 0
            if args.prompt:
                packets = [m.packet for m in stream if m.HasField("packet")]
                print(render_packet(packets[-1]) if packets else "")
                return 0
            title = f"{args.project}/{args.subject}  query {args.query!r}"
            trace_id, _ = show_stream(console(), stream, title, args.budget)
        except SatchelError as exc:
            return fail(exc, address)
    hint = f"replay: satchel trace {trace_id} --project {args.project}"
    console().print(Text(hint, style="dim"))
    return 0


def cmd_trace(args: argparse.Namespace, settings: Settings) -> int:
    """Show a stored trace with the same table as `context`."""
    address = server_address(args)
    with client(args, address) as api:
        try:
            trace = api.get_trace(args.project, args.trace_id).trace
        except SatchelError as exc:
            return fail(exc, address)
    if args.json:
        print_json(trace)
    else:
        console().print(trace_view(trace))
    return 0


CALL_LABEL_CHARS = 8
WATCH_LEGEND = (
    f"each line: the call (the last {CALL_LABEL_CHARS} characters of its trace id), the subject,"
    " the decision's #, kind, outcome, reason and score; tok = the tokens the candidate costs"
    " the budget (as in `satchel context`), packet = the packet's tokens after the decision"
)


def call_label(trace_id: str) -> str:
    """A short label that tells calls apart: the end of the trace id. A UUIDv7 starts with its
    timestamp (the first 8 hex digits change every ~65 s); it ends with random bits."""
    return trace_id[-CALL_LABEL_CHARS:]


def _watch_line(message: context_pb2.WatchTracesResponse, width: int) -> Text:
    """One message as one line of at most `width` cells: a decision's preview takes what the
    terminal leaves (none below 10 cells), anything longer is cut with an ellipsis. A packet's
    line names the whole trace id (for `satchel trace`)."""
    head = f"{call_label(message.trace_id)} {message.subject_id[:12]:<12} "
    if message.HasField("packet"):
        p = message.packet
        line = Text(
            f"{head}packet of {message.trace_id}: {len(p.facts)} fact(s),"
            f" {len(p.episodes)} episode(s), {p.tokens_used}/{p.budget_tokens} tokens"
            + (", some facts held back" if p.warnings else ""),
            style="bold",
        )
    else:
        d = message.decision
        outcome, style = OUTCOME_STYLE.get(d.outcome, ("?", ""))
        line = Text.assemble(
            head,
            f"#{d.sequence:<3} {KIND_NAME.get(d.candidate_kind, '?'):<4} ",
            (f"{outcome:<8}", style),
            f" {d.reason_code:<21} score {d.score:.3f}  tok {d.tokens:>4}"
            f"  packet {d.budget_used:>5}",
        )
        room = width - line.cell_len - 2
        if room >= 10:
            line.append("  " + shorten(" ".join(d.preview.split()), room), style="dim")
    line.truncate(width, overflow="ellipsis")
    return line


def cmd_watch(args: argparse.Namespace, settings: Settings) -> int:
    """Follow the decisions of every context call of a project until Ctrl-C."""
    address = server_address(args)
    out = console()
    with client(args, address) as api:
        stream = api.watch_traces(args.project, subject_id=args.subject)
        if not args.json:
            scope = args.project + (f"/{args.subject}" if args.subject else "")
            out.print(Text(f"watching {scope} on {address} (Ctrl-C to stop)", style="dim"))
            out.print(Text(WATCH_LEGEND, style="dim"))
        try:
            for message in stream:
                if args.json:
                    print_json_line(message)
                else:
                    out.print(_watch_line(message, out.width), no_wrap=True)
        except KeyboardInterrupt:
            stream.cancel()
            return 0
        except SatchelError as exc:
            if exc.code == grpc.StatusCode.UNIMPLEMENTED:
                print(
                    f"satchel: the server at {address} does not stream traces yet "
                    "(WatchTraces is UNIMPLEMENTED there); replay one call with "
                    "`satchel trace TRACE_ID --project P` instead",
                    file=sys.stderr,
                )
                return 1
            return fail(exc, address)
    return 0


def cmd_stats(args: argparse.Namespace, settings: Settings) -> int:
    """Print a project's injection rate, call counts and latencies."""
    address = server_address(args)
    with client(args, address) as api:
        try:
            stats = api.get_stats_overview(args.project)
        except SatchelError as exc:
            return fail(exc, address)
    if args.json:
        print_json(stats)
    else:
        console().print(stats_table(args.project, stats))
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `context`, `trace`, `watch` and `stats`."""
    ctx = commands.add_parser("context", help="stream a context call: decisions, then the packet")
    ctx.add_argument("--project", required=True)
    ctx.add_argument("--subject", required=True)
    ctx.add_argument("--query", required=True)
    ctx.add_argument("--budget", type=int, help="token budget (default: the server's)")
    ctx.add_argument("--as-of", type=parse_instant, help="point in time (ISO 8601)")
    ctx.add_argument("--prompt", action="store_true", help="print only the <satchel_memory> block")
    add_client_options(ctx, json_help="print the stream as JSON lines")
    ctx.set_defaults(func=cmd_context)

    trace = commands.add_parser("trace", help="show the stored trace of a context call")
    trace.add_argument("trace_id")
    trace.add_argument("--project", required=True)
    add_client_options(trace, json_help="print the Trace as JSON")
    trace.set_defaults(func=cmd_trace)

    watch = commands.add_parser("watch", help="follow the decisions of a project's calls")
    watch.add_argument("--project", required=True)
    watch.add_argument("--subject", help="only the calls of this subject")
    add_client_options(watch, json_help="print each message as a JSON line")
    watch.set_defaults(func=cmd_watch)

    stats = commands.add_parser("stats", help="a project's injection rate, calls and latency")
    stats.add_argument("--project", required=True)
    add_client_options(stats, json_help="print the overview as JSON")
    stats.set_defaults(func=cmd_stats)
