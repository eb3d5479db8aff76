"""The client commands of `satchel` (context, trace, watch, facts, events, stats, demo, and the
SDK-based talents resolve / doctor), as subprocesses against the in-process server (run in a
thread: the server shares this test's event loop)."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import re
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_client import Recorder, WatchingContext
from test_context import assert_facts, trace_of

from satchel.v1 import context_pb2_grpc

SATCHEL = str(Path(sys.executable).parent / "satchel")
CLIENT_ENV_VARS = ("SATCHEL_ADDRESS", "SATCHEL_API_KEY", "COLUMNS")


async def satchel(
    *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_VARS}
    return await asyncio.to_thread(
        subprocess.run,
        [SATCHEL, *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**base, **(env or {})},
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def table_rows(text: str) -> list[list[str]]:
    """The rows of the boxed rich tables in `text` as cell texts, wrapped lines joined
    (panels, with one cell a line, are left out)."""
    rows: list[list[str]] = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("│").split("│")]
        if not line.startswith("│") or len(cells) < 2:
            continue
        if rows and not cells[0] and len(cells) == len(rows[-1]):
            rows[-1] = [f"{a} {b}".strip() for a, b in zip(rows[-1], cells, strict=True)]
        else:
            rows.append(cells)
    return rows


def first_line(lines: list[str], predicate: Callable[[str], object]) -> int:
    """The index of the first line matching `predicate`."""
    return next(i for i, line in enumerate(lines) if predicate(line))


DECISION_ROW = re.compile(r"^\s*\d+\s+(fact|ep\.)\s")
BUDGET_BAR = re.compile(r"budget \S+\s+(\d+)/90 tokens")
ANSI = re.compile(r"\x1b(\[[0-9;?]*[A-Za-z]|\][^\x07]*\x07)")


async def demo(address: str, project_id: str) -> list[dict[str, Any]]:
    out = ok(await satchel("demo", "--project", project_id, "--json", "--address", address))
    return json_lines(out)


async def test_demo_loads_the_sample_and_streams_a_context_call(
    address: str, project_id: str
) -> None:
    lines = await demo(address, project_id)
    loaded = lines[0]["demo"]
    assert loaded == {
        "address": address,
        "embedded": False,
        "project_id": project_id,
        "subject_id": "maya",
        "events": 10,
        "facts": 12,
        "open_conflicts": 1,
        "talents": 5,
    }
    stream, talents = lines[1:-1], lines[-1]["talents"]
    decisions = [m["decision"] for m in stream[:-1]]
    packet = stream[-1]["packet"]
    assert len({m["trace_id"] for m in stream}) == 1
    assert [d["sequence"] for d in decisions] == list(range(1, len(decisions) + 1))
    reasons = [d["reason_code"] for d in decisions]
    assert reasons.count("conflict_open") == 2 and reasons.count("volatility_expired") == 1
    assert "over_budget" in reasons  # the demo budget is small on purpose
    assert packet["status"] == "PACKET_STATUS_DEGRADED" and len(packet["warnings"]) == 2
    assert 0 < packet["tokens_used"] <= packet["budget_tokens"] == 90
    assert talents["selected"] and talents["compiled"].startswith("<satchel_talents>")
    assert talents["relevance"] == "RELEVANCE_MODE_EMBEDDINGS"

    again = await demo(address, project_id)  # idempotent: nothing is written twice
    assert again[0]["demo"]["facts"] == 12
    facts = json.loads(
        ok(
            await satchel(
                "facts",
                "--project",
                project_id,
                "--subject",
                "maya",
                "--all",
                "--json",
                "--address",
                address,
            )
        )
    )
    assert len(facts["facts"]) == 12
    events = json.loads(
        ok(
            await satchel(
                "events",
                "--project",
                project_id,
                "--subject",
                "maya",
                "--json",
                "--address",
                address,
            )
        )
    )
    assert len(events["events"]) == 10


async def test_demo_human_output_streams_the_decisions_then_the_packet(
    address: str, project_id: str
) -> None:
    out = ok(await satchel("demo", "--project", project_id, "--pace", "0", "--address", address))
    lines = out.splitlines()
    loaded = first_line(lines, lambda line: line.startswith("sample memory loaded"))
    assert lines[loaded].endswith(" 28/28")  # the progress bar's last frame
    header = first_line(lines, lambda line: "candidate" in line and "outcome" in line)
    rows = [i for i, line in enumerate(lines) if DECISION_ROW.match(line)]
    assert len(rows) >= 10
    text = [lines[i] for i in rows]
    flight = [line for line in text if "Maya's flight to Lisbon" in line]
    assert len(flight) == 2 and all("blocked" in r and "conflict_open" in r for r in flight)
    # The two sides of the conflict differ only in their last word: both must show it.
    assert sorted(day for r in flight for day in ("14th", "15th") if day in r) == ["14th", "15th"]
    assert any(
        "Maya is in Berlin" in r and "excluded" in r and "volatility_expired" in r for r in text
    )
    assert any("included" in r and "relevance" in r for r in text)
    assert any("excluded" in r and "over_budget" in r for r in text)
    bar = first_line(lines, BUDGET_BAR.match)
    legend = first_line(lines, lambda line: line.strip() == "legend")
    summary = first_line(lines, lambda line: line.startswith("packet facts "))
    status = first_line(lines, lambda line: line.startswith("status degraded"))
    packet = first_line(lines, lambda line: "<satchel_memory>" in line)
    talents = first_line(lines, lambda line: line.startswith("talents for "))
    assert loaded < header < rows[0] and rows[-1] < bar < legend < summary < status < packet
    assert packet < talents
    tokens = BUDGET_BAR.match(lines[bar]).group(1)  # type: ignore[union-attr]
    assert f"tokens {tokens}/90" in lines[summary]
    assert_legend_explains(text, lines[legend:summary], with_parts=True)
    # "degraded" is what the memory held back, not a fault of the server.
    assert lines[status].startswith("status degraded: some facts were held back")
    assert "not a server fault" in lines[status]
    held = [line.strip() for line in lines[status + 1 : packet]]
    assert held[:2] == [
        "held back: open_conflict: 2 fact(s) hidden pending conflict resolution",
        "held back: volatility_expired: 1 fact(s) hidden past their volatility horizon",
    ]
    intro = " ".join(lines[loaded:header])  # the first screen says what follows
    assert "the 14th, or the 15th" in intro and "The legend under the table" in intro
    talent_rows = table_rows(out)  # the selection after the packet
    assert any(r[0].startswith("demo.") and r[1] == "selected" for r in talent_rows)


LEGEND_WORDS = {
    "ep.": "episode",
    "score": "sim = cosine similarity",
    "tok": "tokens the candidate costs the budget",
}
REASON_WORDS = {
    "relevance": "among the best scores",
    "multi_hop_expansion": "multi-hop",
    "over_budget": "did not fit",
    "below_relevance_floor": "relevance floor",
    "conflict_open": "open conflict",
    "volatility_expired": "volatility horizon",
    "source_already_served": "already holds its source",
    "source_facts_hidden": "facts are all hidden",
}


def assert_legend_explains(rows: list[str], legend: list[str], with_parts: bool) -> None:
    """The legend under a decision table names every abbreviation and every outcome and reason
    of its `rows`, each with words that explain it."""
    explained: dict[str, str] = {}
    for line in legend[1:]:
        if line[:1].isspace() and explained:  # a meaning wrapped onto the next line
            explained[list(explained)[-1]] += " " + line.strip()
        elif line.strip():
            term, _, meaning = line.partition("  ")
            explained[term] = meaning.strip()
    for term, words in LEGEND_WORDS.items():
        if term != "score" or with_parts:
            assert words in explained.get(term, ""), (term, explained)
    if with_parts:
        assert "fts = full-text rank" in explained["score"], explained
        assert "rec = recency" in explained["score"], explained
    shown = {tuple(re.findall(r"\s(included|excluded|blocked)\s+(\w+)", row)[-1]) for row in rows}
    assert len(shown) >= 5, shown
    for outcome, reason in shown:
        assert REASON_WORDS[reason] in explained.get(f"{outcome} {reason}", ""), (
            outcome,
            reason,
            explained,
        )


def run_in_terminal(*args: str) -> str:
    """Run `satchel ARGS` on a pseudo-terminal; its output without escape sequences."""
    controller, terminal = pty.openpty()
    base = {k: v for k, v in os.environ.items() if k not in (*CLIENT_ENV_VARS, "NO_COLOR")}
    env = {**base, "COLUMNS": "120", "TERM": "xterm-256color"}
    proc = subprocess.Popen([SATCHEL, *args], stdout=terminal, stderr=terminal, env=env)
    os.close(terminal)
    chunks: list[bytes] = []
    try:
        while chunk := os.read(controller, 65536):
            chunks.append(chunk)
    except OSError:  # EIO: the child closed the terminal
        pass
    finally:
        os.close(controller)
    assert proc.wait(timeout=240) == 0, b"".join(chunks).decode(errors="replace")
    return ANSI.sub("", b"".join(chunks).decode(errors="replace"))


async def test_demo_on_a_terminal_redraws_the_budget_as_decisions_stream(
    address: str, project_id: str
) -> None:
    args = ("demo", "--project", project_id, "--pace", "0.05", "--address", address)
    out = await asyncio.to_thread(run_in_terminal, *args)
    streamed, _, after = out.partition("\nlegend")  # printed once, under the last frame
    assert after and "<satchel_memory>" in after and "status degraded: some facts" in after
    used = [int(n) for n in BUDGET_BAR.findall(streamed)]
    assert len(set(used)) >= 3, used  # frames drawn while the budget filled
    peak = len(used) - 1 - used[::-1].index(max(used))  # it fills, then shows the packet's
    assert used[: peak + 1] == sorted(used[: peak + 1]) and used[0] < used[peak]
    assert set(used[peak + 1 :]) <= {used[-1]}
    assert f"tokens {used[-1]}/90" in after
    assert "conflict_open" in streamed and "over_budget" in streamed


async def test_events_human_output_is_a_table_newest_first(address: str, project_id: str) -> None:
    await demo(address, project_id)
    scope = ("--project", project_id, "--subject", "maya", "--address", address)
    out = ok(await satchel("events", *scope, "--limit", "3"))
    lines = out.splitlines()
    assert lines[0].startswith(f"events of {project_id}/maya, newest first")
    rows = table_rows(out)
    assert [r[2] for r in rows] == ["conversation.message"] * 3
    assert [r[3][:20] for r in rows] == [
        "maya: I'm vegetarian",
        "maya: Found it: the ",
        "maya: I'm in Berlin ",
    ]
    assert [r[1] for r in rows] == sorted((r[1] for r in rows), reverse=True)
    assert lines[-1] == "3 event(s), more beyond --limit 3"


async def test_context_trace_facts_events_and_stats_json(address: str, project_id: str) -> None:
    await demo(address, project_id)
    scope = ("--project", project_id, "--subject", "maya", "--address", address)

    lines = json_lines(
        ok(await satchel("context", *scope, "--query", "What does Maya eat?", "--json"))
    )
    assert all("decision" in m for m in lines[:-1]) and "packet" in lines[-1]
    packet = lines[-1]["packet"]
    assert packet["budget_tokens"] == 900
    assert "Maya is vegetarian" in [f["statement"] for f in packet["facts"]]
    trace_id = lines[0]["trace_id"]

    trace = json.loads(
        ok(
            await satchel(
                "trace", trace_id, "--project", project_id, "--json", "--address", address
            )
        )
    )
    assert trace["trace_id"] == trace_id and trace["query"] == "What does Maya eat?"
    assert [d["candidate_id"] for d in trace["decisions"]] == [
        m["decision"]["candidate_id"] for m in lines[:-1]
    ]

    active = json.loads(ok(await satchel("facts", *scope, "--json")))["facts"]
    assert len(active) == 12 and {f["status"] for f in active} == {"FACT_STATUS_ACTIVE"}
    before = json.loads(ok(await satchel("facts", *scope, "--as-of", "2001-01-01", "--json")))
    assert before["facts"] == []
    limited = json.loads(ok(await satchel("facts", *scope, "--limit", "3", "--json")))
    assert len(limited["facts"]) == 3

    events = json.loads(ok(await satchel("events", *scope, "--limit", "4", "--json")))["events"]
    assert len(events) == 4
    times = [e["occurred_at"] for e in events]
    assert times == sorted(times, reverse=True)

    stats = json.loads(
        ok(await satchel("stats", "--project", project_id, "--json", "--address", address))
    )
    assert stats["context_calls"] == "2"  # int64 is a JSON string
    assert stats["injection_rate"] == 1.0 and stats["hit_rate"] == 1.0

    prompt = ok(await satchel("context", *scope, "--query", "What does Maya eat?", "--prompt"))
    assert prompt.startswith("<satchel_memory>\nKnown facts:\n")
    assert prompt.rstrip().endswith("</satchel_memory>")


async def test_human_output_tables_and_budget_bar(address: str, project_id: str) -> None:
    await demo(address, project_id)
    scope = ("--project", project_id, "--subject", "maya", "--address", address)
    out = ok(await satchel("context", *scope, "--query", "Lisbon trip", "--budget", "40"))
    assert "candidate" in out and "conflict_open" in out and "over_budget" in out
    assert "source_facts_hidden" in out  # the flight episode and the expired Berlin one
    assert "budget" in out and "/40 tokens" in out
    assert "<satchel_memory>" in out and "status degraded: some facts were held back" in out
    trace_id = out.split("replay: satchel trace ")[1].split()[0]
    replay = ok(await satchel("trace", trace_id, "--project", project_id, "--address", address))
    assert "volatility_expired" in replay and "/40 tokens" in replay
    for shown in (out, replay):  # the same table, legend and status words in both
        lines = shown.splitlines()
        legend = first_line(lines, lambda line: line.strip() == "legend")
        after = first_line(lines, lambda line: line.startswith(("packet facts", "tokens ")))
        rows = [line for line in lines if DECISION_ROW.match(line)]
        assert_legend_explains(rows, lines[legend:after], with_parts=True)
        assert "status degraded: some facts were held back" in shown
    narrow = ok(await satchel("context", *scope, "--query", "Lisbon trip", env={"COLUMNS": "80"}))
    lines = narrow.splitlines()
    legend = first_line(lines, lambda line: line.strip() == "legend")
    assert "sim = cosine" not in narrow  # no score parts in the table, none in the legend
    rows = [line for line in lines if DECISION_ROW.match(line)]
    summary = first_line(lines, lambda line: line.startswith("packet facts"))
    assert_legend_explains(rows, lines[legend:summary], with_parts=False)
    facts = ok(await satchel("facts", *scope, "--all"))
    assert "Maya is vegetarian" in facts and "12 fact(s)" in facts
    stats = ok(await satchel("stats", "--project", project_id, "--address", address))
    assert "injection rate" in stats and "100.0%" in stats


async def test_talents_resolve_and_doctor_through_the_sdk(address: str, project_id: str) -> None:
    await demo(address, project_id)
    selection = json.loads(
        ok(
            await satchel(
                "talents",
                "resolve",
                "--project",
                project_id,
                "--task",
                "Fix a slow SQL query timeout",
                "--relevance",
                "embeddings",
                "--json",
                "--address",
                address,
            )
        )
    )
    assert selection["selected"][0]["talent_id"] == "demo.sql.performance"
    doctor = await satchel("doctor", "--project", project_id, "--json", "--address", address)
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)["findings"] == []

    human = ok(
        await satchel(
            "talents", "resolve", "--project", project_id, "--task",
            "Fix a slow SQL query timeout", "--relevance", "embeddings", "--address", address,
        )
    )  # fmt: skip
    rows = table_rows(human)
    assert rows[0][:2] == ["demo.sql.performance", "selected"]
    decided = [("selected", t) for t in selection["selected"]]
    decided += [("excluded", t) for t in selection["excluded"]]
    assert [(r[0], r[1], r[-1].split(" (")[0]) for r in rows] == [
        (t["talent_id"], outcome, t["reason"]) for outcome, t in decided
    ]
    assert "relevance embeddings  gate" in human and "## SQL performance" in human
    doctor_text = await satchel("doctor", "--project", project_id, "--address", address)
    assert doctor_text.returncode == 0, doctor_text.stderr
    assert doctor_text.stdout.splitlines() == [
        f"project {project_id}: roles none known (role check skipped)",
        "no findings",
    ]


async def test_errors_exit_1_with_the_field_violations(address: str, project_id: str) -> None:
    bad = await satchel(
        "context",
        "--project",
        project_id,
        "--subject",
        "s",
        "--query",
        "q",
        "--budget",
        "0",
        "--address",
        address,
    )
    assert bad.returncode == 1 and bad.stdout == ""
    assert bad.stderr == (
        "satchel: INVALID_ARGUMENT: budget_tokens: must be a positive integer at most 100000\n"
    )
    missing = await satchel(
        "trace",
        "00000000-0000-0000-0000-000000000000",
        "--project",
        project_id,
        "--address",
        address,
    )
    assert missing.returncode == 1 and "NOT_FOUND" in missing.stderr
    down = await satchel("stats", "--project", project_id, "--address", "127.0.0.1:1")
    assert down.returncode == 1 and "UNAVAILABLE" in down.stderr and "127.0.0.1:1" in down.stderr


@pytest.fixture
async def watch_server() -> AsyncIterator[str]:
    server = grpc.aio.server()
    context_pb2_grpc.add_ContextServiceServicer_to_server(WatchingContext(Recorder()), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield f"127.0.0.1:{port}"
    await server.stop(0)


async def test_watch_prints_json_lines(watch_server: str) -> None:
    out = ok(
        await satchel(
            "watch", "--project", "p", "--subject", "s-9", "--json", "--address", watch_server
        )
    )
    lines = json_lines(out)
    assert [("decision" in m, "packet" in m) for m in lines] == [
        (True, False),
        (True, False),
        (False, True),
    ]
    assert {m["subject_id"] for m in lines} == {"s-9"}
    human = ok(await satchel("watch", "--project", "p", "--address", watch_server))
    assert "watching p on" in human and "packet of t-1: 0 fact(s)" in human


async def test_watch_explains_a_server_without_watch_traces() -> None:
    bare = grpc.aio.server()  # no service at all: every method is UNIMPLEMENTED
    port = bare.add_insecure_port("127.0.0.1:0")
    await bare.start()
    try:
        result = await satchel("watch", "--project", "p", "--address", f"127.0.0.1:{port}")
    finally:
        await bare.stop(0)
    assert result.returncode == 1
    assert "does not stream traces yet (WatchTraces is UNIMPLEMENTED there)" in result.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def test_demo_without_a_server_starts_an_embedded_one(
    pg_dsn: str, project_id: str, tmp_path: Path
) -> None:
    env = {
        "SATCHEL_DATABASE_URL": pg_dsn,
        "SATCHEL_DATA_DIR": str(tmp_path),
        "SATCHEL_LISTEN": f"127.0.0.1:{free_port()}",  # nothing serves there
    }
    result = await satchel("demo", "--project", project_id, "--json", env=env)
    lines = json_lines(ok(result))
    assert lines[0]["demo"]["embedded"] is True
    assert lines[0]["demo"]["address"] != env["SATCHEL_LISTEN"]
    assert "packet" in lines[-2] and lines[-2]["packet"]["facts"]
    assert "talents" in lines[-1]
    # What people read on stderr: satchel's own console lines, no gRPC notices, no JSON logs.
    grpc_notices = re.compile(r"^[IWEF]\d{4} \d\d:\d\d")  # gRPC's own log line format
    noise = [
        line
        for line in result.stderr.splitlines()
        if grpc_notices.match(line) or line.startswith("{")
    ]
    assert not noise, result.stderr


async def test_watch_follows_the_calls_of_the_real_server(address: str, project_id: str) -> None:
    from satchel.v1 import context_pb2

    base = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_VARS}
    proc = await asyncio.create_subprocess_exec(
        SATCHEL,
        "watch",
        "--project",
        project_id,
        "--json",
        "--address",
        address,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=base,
    )
    trace_ids: set[str] = set()
    seen: list[dict[str, Any]] = []
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = context_pb2_grpc.ContextServiceStub(channel)
            request = context_pb2.AssembleContextRequest(
                project_id=project_id, subject_id="watched", query="anything new?"
            )
            for _ in range(60):  # the watcher registers a moment after it starts
                trace_ids.add((await stub.AssembleContext(request)).trace_id)
                try:
                    line = await asyncio.wait_for(proc.stdout.readline(), timeout=0.5)
                except TimeoutError:
                    continue
                seen.append(json.loads(line))
                break
            while "packet" not in seen[-1]:
                seen.append(json.loads(await asyncio.wait_for(proc.stdout.readline(), 30)))
    finally:
        proc.terminate()
        await proc.wait()
    assert seen, "the watcher printed nothing"
    assert seen[-1]["trace_id"] in trace_ids and seen[-1]["subject_id"] == "watched"
    assert {m["trace_id"] for m in seen} == {seen[-1]["trace_id"]}


WATCH_DECISION = re.compile(r"^(\S+) +\S+ +#(\d+) .* tok +(\d+) +packet +(\d+)")


async def test_watch_tells_calls_of_the_same_second_apart(address: str, project_id: str) -> None:
    """Trace ids are UUIDv7: their first 8 hex digits are a timestamp that changes every ~65 s,
    their end is random. Each line of `watch` names its call by the end of its id (the packet's
    line by the whole id), and its `tok` is the candidate's tokens, as in `satchel context` (the
    packet's tokens after the decision are `packet`)."""
    from satchel.v1 import context_pb2

    base = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_VARS}
    proc = await asyncio.create_subprocess_exec(
        SATCHEL, "watch", "--project", project_id, "--address", address,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**base, "COLUMNS": "200"},
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[str] = []

    async def read_until(seen: Callable[[], bool], timeout: float) -> bool:
        assert proc.stdout is not None
        while not seen():
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), timeout)
            except TimeoutError:
                return False
            lines.append(line.decode().rstrip("\n"))
        return True

    try:
        async with grpc.aio.insecure_channel(address) as channel:
            await assert_facts(channel, project_id, ["Maya lives in Porto", "Maya is vegetarian"])
            stub = context_pb2_grpc.ContextServiceStub(channel)
            request = context_pb2.AssembleContextRequest(
                project_id=project_id, subject_id="user-1", query="Where does Maya live?"
            )
            for _ in range(60):  # the watcher registers a moment after it starts
                await stub.AssembleContext(request)
                if await read_until(lambda: any("packet of" in line for line in lines), 0.5):
                    break
            assert any("packet of" in line for line in lines), lines
            started = asyncio.get_running_loop().time()
            first = (await stub.AssembleContext(request)).trace_id
            second = (await stub.AssembleContext(request)).trace_id
            assert asyncio.get_running_loop().time() - started < 1.0
            both = (f"packet of {first}:", f"packet of {second}:")
            assert await read_until(lambda: all(any(p in x for x in lines) for p in both), 30)
            traces = [await trace_of(channel, project_id, t) for t in (first, second)]
    finally:
        proc.terminate()
        await proc.wait()
    labels = []
    for trace in traces:
        (packet_line,) = [line for line in lines if f"packet of {trace.trace_id}:" in line]
        label = packet_line.split()[0]
        assert label in trace.trace_id, (label, trace.trace_id)
        labels.append(label)
        decisions = [m.groups() for m in map(WATCH_DECISION.match, lines) if m and m[1] == label]
        assert decisions, lines
        assert [(int(n), int(tok), int(used)) for _, n, tok, used in decisions] == [
            (d.sequence, d.tokens, d.budget_used) for d in trace.decisions
        ], lines
    assert labels[0] != labels[1], lines

    # `satchel trace` (the table of `satchel context`) shows the same tokens in its tok column.
    replay = ok(await satchel("trace", first, "--project", project_id, "--address", address))
    tok = [int(line.split()[-3]) for line in replay.splitlines() if DECISION_ROW.match(line)]
    assert tok == [d.tokens for d in traces[0].decisions]


async def test_output_cut_short_by_its_reader_ends_quietly(address: str, project_id: str) -> None:
    """`satchel context --json | head` (or --prompt) when the reader has gone: here a reader
    that exits at once, so every write meets a closed pipe."""
    await demo(address, project_id)
    scope = ["--project", project_id, "--subject", "maya", "--address", address]
    base = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV_VARS}
    for output in ("--json", "--prompt"):
        reader = subprocess.Popen(["true"], stdin=subprocess.PIPE)
        assert reader.wait(timeout=10) == 0
        writer = await asyncio.to_thread(
            subprocess.run,
            [SATCHEL, "context", *scope, "--query", "What does Maya eat?", output],
            stdout=reader.stdin,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            env=base,
        )
        reader.stdin.close()
        assert "Traceback" not in writer.stderr, writer.stderr
        assert writer.returncode == 141, writer.stderr


async def test_healthcheck_takes_an_address(address: str) -> None:
    result = await satchel("healthcheck", "--address", address)
    assert result.returncode == 0 and result.stdout.strip() == f"{address}: SERVING"
    result = await satchel("healthcheck", "--address", "127.0.0.1:1", "--timeout", "1")
    assert result.returncode == 1 and "127.0.0.1:1: UNAVAILABLE" in result.stderr
