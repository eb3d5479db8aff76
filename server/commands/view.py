"""Rich renderings for the client commands: the decision table, the budget bar, packets,
traces, facts, events, stats, talent selections, doctor findings and the progress bar of long
loads. Only the CLI imports rich; `satchel.client` never does."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime

from google.protobuf import json_format
from google.protobuf.timestamp_pb2 import Timestamp
from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.panel import Panel
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from satchel.client import render_packet, render_talents
from satchel.v1 import context_pb2, memory_pb2, talent_pb2

OUTCOME_STYLE = {
    context_pb2.DECISION_OUTCOME_INCLUDED: ("included", "green"),
    context_pb2.DECISION_OUTCOME_EXCLUDED: ("excluded", "yellow"),
    context_pb2.DECISION_OUTCOME_BLOCKED: ("blocked", "bold red"),
}
KIND_NAME = {
    context_pb2.CANDIDATE_KIND_FACT: "fact",
    context_pb2.CANDIDATE_KIND_EPISODE: "ep.",
}
KIND_LEGEND = {"ep.": "episode: a recorded event, served as an excerpt"}
SCORE_PARTS_LEGEND = (
    "weighs sim = cosine similarity to the query, fts = full-text rank, rec = recency (1 = now)"
)
TOKENS_LEGEND = "the tokens the candidate costs the budget (the bar: the packet's tokens)"
REASON_LEGEND = {
    "relevance": "among the best scores, and it fit in the budget",
    "multi_hop_expansion": "a fact about an entity that an included fact names",
    "over_budget": "did not fit in what was left of the budget",
    "below_relevance_floor": "too far from the query (under the relevance floor)",
    "conflict_open": "in an open conflict: no side is served until it is resolved",
    "volatility_expired": "past its volatility horizon (stale_after): may no longer be true",
    "source_already_served": "the packet already holds its source, or what was drawn from it",
    "source_facts_hidden": "an episode whose facts are all hidden: it would bring them back",
}
"""What each reason code means, for the legend under a decision table (as in ReasonCode)."""
STATUS_WORDING: dict[int, tuple[str, str, str]] = {
    context_pb2.PACKET_STATUS_OK: ("ok", "green", "nothing was held back"),
    context_pb2.PACKET_STATUS_DEGRADED: (
        "degraded",
        "cyan",
        "some facts were held back, as the notes below say (not a server fault)",
    ),
}
"""A packet status as people should read it: `degraded` is the memory's state, not the
server's."""
NARROW_WIDTH = 100
"""Below this many columns the decision table shows the score without its parts."""
PIPE_WIDTH = 120
"""Columns when stdout is not a terminal and COLUMNS is unset (rich would assume 80)."""


def console() -> Console:
    """The stdout console (colour only on a terminal; NO_COLOR is honoured)."""
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return Console(highlight=False, width=PIPE_WIDTH if piped else None)


def when(stamp: Timestamp, with_time: bool = True) -> str:
    """A timestamp as `YYYY-MM-DD HH:MM` UTC (or the date only)."""
    moment: datetime = stamp.ToDatetime()
    return f"{moment:%Y-%m-%d %H:%M}" if with_time else f"{moment:%Y-%m-%d}"


def shorten(text: str, width: int) -> str:
    """`text` on one line, cut to `width` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _common_prefix(a: str, b: str) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _cut_around(text: str, at: int, width: int) -> str:
    """`text` in `width` characters: its start, an ellipsis, then the words from the one that
    holds `text[at]` on (to its end, or as much as half the width allows)."""
    start = text.rfind(" ", 0, at) + 1  # the first word that differs
    tail = text[start:]
    if len(tail) > width // 2:
        tail = tail[: width // 2 - 1] + "…"
    head = text[: width - 1 - len(tail)]
    if text[len(head) : len(head) + 1] not in ("", " ") and " " in head[len(head) * 2 // 3 :]:
        head = head[: head.rindex(" ")]  # end the head on a word
    return f"{head}…{tail}"


def fit_apart(texts: list[str], width: int) -> list[str]:
    """Each text on one line in `width` characters, cut with an ellipsis like `shorten`; texts
    that would be cut to the same line (the two sides of a conflict, say) show where they
    differ instead: their start, an ellipsis, and the part that tells them apart."""
    texts = [" ".join(text.split()) for text in texts]
    cut = [shorten(text, width) for text in texts]
    shown = list(cut)
    for i, text in enumerate(texts):
        rivals = [t for j, t in enumerate(texts) if cut[j] == cut[i] and t != text]
        if rivals and width >= 8:
            shown[i] = _cut_around(text, max(_common_prefix(text, t) for t in rivals), width)
    return shown


class DecisionTable:
    """The decisions of one context call, growing as they stream, with a budget bar."""

    def __init__(self, title: str, budget: int | None = None) -> None:
        self.title = title
        self.budget = budget
        self.used = 0
        self.rows: list[context_pb2.Decision] = []

    def add(self, decision: context_pb2.Decision) -> None:
        self.rows.append(decision)
        self.used = max(self.used, decision.budget_used)

    def table(self, width: int = PIPE_WIDTH) -> Table:
        """The decision rows; the score parts are shown when `width` leaves room for them."""
        reason_width = max([6, *(len(d.reason_code) for d in self.rows)])
        parts = ("sim", "fts", "rec") if width >= NARROW_WIDTH else ()
        fixed = 3 + 4 + 6 * (1 + len(parts)) + 4 + 8 + reason_width
        gaps = 3 * (6 + len(parts))  # padding, separator, padding between columns
        candidate = max(12, width - fixed - gaps)
        table = Table(
            title=self.title,
            title_justify="left",
            box=box.SIMPLE_HEAD,
            show_edge=False,
            pad_edge=False,
        )
        table.add_column("#", justify="right", style="dim", no_wrap=True, width=3)
        table.add_column("kind", no_wrap=True, width=4)
        table.add_column("candidate", no_wrap=True, width=candidate, overflow="ellipsis")
        for name in ("score", *parts):
            table.add_column(name, justify="right", no_wrap=True, width=6)
        table.add_column("tok", justify="right", no_wrap=True, width=4)
        table.add_column("outcome", no_wrap=True, width=8)
        table.add_column("reason", no_wrap=True, width=reason_width)
        previews = fit_apart([d.preview or d.candidate_id for d in self.rows], candidate)
        for d, preview in zip(self.rows, previews, strict=True):
            outcome, style = OUTCOME_STYLE.get(d.outcome, ("?", ""))
            scores = [d.score, d.similarity, d.text_rank, d.recency][: 1 + len(parts)]
            table.add_row(
                str(d.sequence),
                KIND_NAME.get(d.candidate_kind, "?"),
                preview,
                *(f"{value:.3f}" for value in scores),
                str(d.tokens),
                Text(outcome, style=style),
                Text(d.reason_code, style=style),
            )
        return table

    def bar(self) -> RenderableType:
        """The budget bar: tokens used of the budget (pulsing while the budget is unknown)."""
        total = self.budget
        label = f" {self.used}/{total} tokens" if total else f" {self.used} tokens"
        bar = ProgressBar(total=total, completed=self.used, width=40)
        grid = Table.grid(padding=(0, 1))
        grid.add_row(Text("budget", style="bold"), bar, Text(label))
        return grid

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.table(options.max_width)
        yield self.bar()


class DecisionLegend:
    """What the abbreviations of a decision table and the reasons in it mean: only those the
    table shows (the score's parts when the width leaves room for them, as the table does)."""

    def __init__(self, decisions: Iterable[context_pb2.Decision]) -> None:
        self.decisions = list(decisions)

    def grid(self, width: int = PIPE_WIDTH) -> Table:
        kinds = {KIND_NAME.get(d.candidate_kind, "") for d in self.decisions}
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column(overflow="fold")
        for kind, meaning in KIND_LEGEND.items():
            if kind in kinds:
                grid.add_row(kind, meaning)
        if width >= NARROW_WIDTH:
            grid.add_row("score", SCORE_PARTS_LEGEND)
        grid.add_row("tok", TOKENS_LEGEND)
        shown = {(d.outcome, d.reason_code) for d in self.decisions}
        for outcome, (name, style) in OUTCOME_STYLE.items():
            for reason, meaning in REASON_LEGEND.items():
                if (outcome, reason) in shown:
                    grid.add_row(Text(f"{name} {reason}", style=style), meaning)
        return grid

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        if self.decisions:
            yield Text("legend", style="bold")
            yield self.grid(options.max_width)


def status_line(status: int) -> Text:
    """`status ok: …` or `status degraded: …`, in words that say what the status means."""
    word, colour, meaning = STATUS_WORDING.get(
        status, (context_pb2.PacketStatus.Name(status).removeprefix("PACKET_STATUS_"), "", "")
    )
    return Text.assemble(
        ("status ", "bold"), (word.lower(), colour), f": {meaning}" if meaning else ""
    )


def packet_view(packet: context_pb2.ContextPacket, trace_id: str = "") -> RenderableType:
    """The packet as the agent would receive it: what it holds, its status in words and what
    was held back, the trace id."""
    header = Text.assemble(
        ("packet ", "bold"),
        f"facts {len(packet.facts)}  episodes {len(packet.episodes)}",
        f"  tokens {packet.tokens_used}/{packet.budget_tokens}",
        (f"  trace {trace_id}" if trace_id else ""),
    )
    parts: list[RenderableType] = [header, status_line(packet.status)]
    parts += [Text(f"  held back: {w}", style="cyan") for w in packet.warnings]
    block = render_packet(packet)
    if block:
        parts.append(Panel(Text(block), title="packet", title_align="left", expand=False))
    else:
        reason = f" ({packet.empty_reason})" if packet.empty_reason else ""
        parts.append(Text(f"empty packet{reason}: no memory block", style="dim"))
    return Group(*parts)


def trace_view(trace: context_pb2.Trace) -> RenderableType:
    """A stored trace: its call, the decision table with the budget bar and its legend,
    timings, the status in words."""
    table = DecisionTable(
        f"trace {trace.trace_id}  {trace.project_id}/{trace.subject_id}  "
        f"{when(trace.created_at)}  query {trace.query!r}",
        budget=trace.budget_tokens,
    )
    for decision in trace.decisions:
        table.add(decision)
    table.used = trace.tokens_used
    t = trace.timings
    summary = Text(
        f"tokens {trace.tokens_used}/{trace.budget_tokens}"
        f"  embed {t.embed_ms:.1f} ms  retrieve {t.retrieve_ms:.1f} ms  pack {t.pack_ms:.1f} ms"
        f"  total {t.total_ms:.1f} ms"
        + (f"  as of {when(trace.as_of)}" if trace.HasField("as_of") else "")
        + (f"  empty: {trace.empty_reason}" if trace.empty_reason else "")
    )
    held = [Text(f"  held back: {w}", style="cyan") for w in trace.warnings]
    return Group(table, DecisionLegend(trace.decisions), summary, status_line(trace.status), *held)


def _fact_value(fact: memory_pb2.Fact) -> str:
    return json_format.MessageToJson(fact.value, indent=None) if fact.HasField("value") else ""


def facts_table(facts: Iterable[memory_pb2.Fact], title: str) -> Table:
    """Facts with status, validity and confidence."""
    table = Table(title=title, title_justify="left")
    for name in ("id", "predicate", "statement", "status", "valid from", "valid to", "conf"):
        table.add_column(name, justify="right" if name == "conf" else "left")
    for f in facts:
        status = memory_pb2.FactStatus.Name(f.status).removeprefix("FACT_STATUS_").lower()
        table.add_row(
            f.id[:8],
            f.predicate,
            shorten(f.statement or _fact_value(f), 60),
            Text(status, style="green" if status == "active" else "dim"),
            when(f.valid_from, False) if f.HasField("valid_from") else "",
            when(f.valid_to, False) if f.HasField("valid_to") else "",
            f"{f.confidence:.2f}",
        )
    return table


def events_table(events: Iterable[memory_pb2.Event], title: str) -> Table:
    """Events, newest first, with their text rendering."""
    table = Table(title=title, title_justify="left")
    for name in ("id", "occurred", "kind", "text"):
        table.add_column(name)
    for e in events:
        table.add_row(e.id[:8], when(e.occurred_at), e.kind, shorten(e.text, 70))
    return table


def stats_table(project_id: str, stats: context_pb2.GetStatsOverviewResponse) -> Table:
    """The stats overview of a project."""
    table = Table(title=f"stats of {project_id}", title_justify="left", show_header=False)
    table.add_column("figure", style="bold")
    table.add_column("value", justify="right")
    rows = (
        ("context calls", f"{stats.context_calls}"),
        ("injection rate", f"{stats.injection_rate:.1%}"),
        ("calls serving facts", f"{stats.calls_serving_facts}"),
        ("empty calls", f"{stats.calls_empty}"),
        ("latency p50 / p95 / p99", (
            f"{stats.latency_p50_ms:.1f} / {stats.latency_p95_ms:.1f} / "
            f"{stats.latency_p99_ms:.1f} ms"
        )),
        ("mean tokens used", f"{stats.mean_tokens_used:.1f}"),
    )  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table


@contextmanager
def progress_steps(
    out: Console, total: int, description: str, *, disable: bool = False
) -> Iterator[Callable[..., None]]:
    """A progress bar of `total` steps (its last frame only when `out` is not a terminal).

    Yields `step(description=None, advance=1)`; `out.print` meanwhile prints above the bar.
    """
    columns = (TextColumn("{task.description:<28}"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=out, disable=disable, transient=False) as progress:
        task = progress.add_task(description, total=total)

        def step(description: str | None = None, advance: int = 1) -> None:
            progress.update(task, advance=advance, description=description)

        yield step


def _why(talent: talent_pb2.SelectedTalent | talent_pb2.ExcludedTalent) -> str:
    return talent.reason + (f" (required by {talent.required_by})" if talent.required_by else "")


def selection_table(
    selection: talent_pb2.TalentSelection, title: str, width: int = PIPE_WIDTH
) -> Table:
    """The selected talents, then the excluded ones, each with why; the parameters in effect
    as the caption. The score parts (sim, hits) are shown when `width` leaves room for them."""
    mode = talent_pb2.RelevanceMode.Name(selection.relevance).removeprefix("RELEVANCE_MODE_")
    p = selection.params
    gate = selection.gate
    threshold = (
        f"gate {gate.similarity_threshold:.2f} (best {gate.best_similarity:.2f})"
        if selection.HasField("gate")
        else f"floor {p.floor:g}"
    )
    table = Table(
        title=title,
        title_justify="left",
        caption=f"relevance {mode.lower()}  {threshold}  beta {p.beta:g}"
        f"  margin {p.margin:g}  budget {p.budget_tokens}",
        caption_justify="left",
        min_width=min(len(title), width),  # a long task would wrap the title
    )
    wide = width >= NARROW_WIDTH
    parts = ("sim", "hits", "text") if wide else ()
    table.add_column("talent", no_wrap=wide, overflow="fold")  # ids whole when there is room
    table.add_column("outcome", no_wrap=True)
    for name in ("score", *parts, "tok"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("reason", overflow="fold")
    rows: list[tuple[talent_pb2.SelectedTalent | talent_pb2.ExcludedTalent, str, str]]
    rows = [(t, "selected", "green") for t in selection.selected]
    rows += [(t, "excluded", "yellow") for t in selection.excluded]
    for t, outcome, style in rows:
        details = (f"{t.similarity:+.3f}", str(t.stem_hits), f"{t.text_rank:.2f}")[: len(parts)]
        table.add_row(
            t.talent_id,
            Text(outcome, style=style),
            f"{t.score:+.3f}",
            *details,
            str(t.tokens),
            Text(_why(t), style=style),
        )
    return table


def selection_view(
    selection: talent_pb2.TalentSelection, title: str, width: int = PIPE_WIDTH
) -> RenderableType:
    """A TalentSelection for people: the talent table, the tokens, any note, the block."""
    parts: list[RenderableType] = [
        selection_table(selection, title, width),
        Text(
            f"selected {len(selection.selected)} talent(s): {selection.tokens_selected} of"
            f" {selection.tokens_candidates} candidate tokens"
        ),
    ]
    if selection.out_of_domain:
        parts.append(Text("out of domain", style="yellow"))
    if selection.note:
        parts.append(Text(f"note: {selection.note}", style="yellow"))
    block = render_talents(selection)
    if block:
        parts.append(Panel(Text(block), title="talent block", title_align="left", expand=False))
    return Group(*parts)


def findings_view(project_id: str, report: talent_pb2.DiagnoseProjectResponse) -> RenderableType:
    """The doctor's report: the roles checked, a table of findings, their count."""
    roles = ", ".join(report.roles_known) or "none known (role check skipped)"
    header = Text(f"project {project_id}: roles {roles}")
    if not report.findings:
        return Group(header, Text("no findings", style="green"))
    table = Table(title=f"findings of {project_id}", title_justify="left")
    for name in ("code", "talent", "detail"):
        table.add_column(name)
    for finding in report.findings:
        table.add_row(Text(finding.code, style="red"), finding.talent_id, finding.detail)
    return Group(header, table, Text(f"{len(report.findings)} finding(s)", style="bold red"))


def talents_table(reply: talent_pb2.ListTalentsResponse, title: str, project: bool) -> Table:
    """The talent catalogue; with a project, whether each talent is active on it."""
    active = set(reply.active_talent_ids)
    table = Table(title=title, title_justify="left")
    if project:
        table.add_column("active", no_wrap=True)
    table.add_column("talent", no_wrap=True)  # ids whole: they are what commands take
    for name in ("name", "roles", "summary"):
        table.add_column(name, overflow="fold")
    for talent in reply.talents:
        mark = [Text("yes", style="green") if talent.id in active else Text("no")]
        row = [talent.id, talent.name, ", ".join(talent.roles), talent.summary]
        table.add_row(*(mark if project else []), *row)
    return table
