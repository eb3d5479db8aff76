"""`satchel mcp` driven as a host drives it, with the MCP SDK's own client, over stdio and over
Streamable HTTP, against a real satchel server (embedded PostgreSQL, the bundled model)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import httpx2
import pytest
from helpers.servers import new_key, running
from helpers.talents import TOOLS, upsert_tools
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp_types import CallToolResult

from satchel.server.mcp_server import TOOL_ANNOTATIONS, McpOptions, build_server
from satchel.server.platform.config import Settings

SATCHEL = str(Path(sys.executable).parent / "satchel")
TOOL_NAMES = {
    "assemble_context",
    "record_event",
    "assert_fact",
    "supersede_fact",
    "retire_fact",
    "list_facts",
    "delete_event",
    "delete_subject",
    "resolve_talents",
    "get_trace",
}
UNRELATED_TASK = "What are the main differences between Stoicism and Epicureanism?"


def print_config(*args: str) -> dict[str, Any]:
    """The mcpServers entry `satchel mcp --print-config ARGS` prints."""
    done = subprocess.run(
        [SATCHEL, "mcp", "--print-config", *args], capture_output=True, text=True, check=True
    )
    return json.loads(done.stdout)["mcpServers"]["satchel"]


def stdio_client(entry: dict[str, Any]) -> Client:
    """An MCP client that launches `entry` as a desktop host would."""
    parameters = StdioServerParameters(
        command=entry["command"], args=entry["args"], env=entry.get("env")
    )
    return Client(parameters)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@asynccontextmanager
async def http_mcp(*args: str) -> AsyncIterator[str]:
    """`satchel mcp --http` in a subprocess; yields its URL once it accepts connections."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        SATCHEL, "mcp", "--http", f"127.0.0.1:{port}", *args, stderr=asyncio.subprocess.PIPE
    )
    try:
        for _ in range(300):
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                assert process.returncode is None, await process.stderr.read()  # type: ignore[union-attr]
                await asyncio.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        await process.wait()


def http_client(url: str, key: str | None = None) -> Client:
    headers = {"Authorization": f"Bearer {key}"} if key else None
    return Client(streamable_http_client(url, http_client=create_mcp_http_client(headers=headers)))


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if block.type == "text")


async def ok(client: Client, tool: str, **arguments: Any) -> CallToolResult:
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, text(result)
    return result


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments)
    assert result.is_error, f"{tool} {arguments} should fail: {text(result)}"
    message = text(result)
    assert "Traceback" not in message
    return message


async def check_tools(client: Client) -> None:
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == TOOL_NAMES
    for name, tool in tools.items():
        schema = tool.input_schema
        assert schema["type"] == "object" and tool.description, name
        assert "ctx" not in schema["properties"], name
        hints = tool.annotations
        assert hints is not None and hints.read_only_hint is (TOOL_ANNOTATIONS[name].read_only_hint)
        assert hints.destructive_hint is name.startswith("delete_"), name
    assert tools["assemble_context"].input_schema["required"] == ["query"]
    assert set(tools["record_event"].input_schema["required"]) == {"kind", "payload"}
    assert tools["resolve_talents"].input_schema["required"] == ["task"]
    assert {"project_id", "subject_id"} <= set(tools["list_facts"].input_schema["properties"])


async def exercise(client: Client, project: str, subject: str) -> None:
    """Everything the issue asks of the tools, resources and prompt, on one scope."""
    await check_tools(client)
    event = (
        await ok(
            client,
            "record_event",
            kind="conversation.message",
            payload={"speaker": "Maya", "text": "I finally moved to Porto last spring."},
        )
    ).structured_content
    assert event is not None
    event_id = event["event"]["id"]
    fact = await ok(
        client,
        "assert_fact",
        predicate="home_city",
        value="Porto",
        statement="Maya lives in Porto.",
        source_event_ids=[event_id],
    )
    assert fact.structured_content is not None
    fact_id = fact.structured_content["fact"]["id"]

    context = await ok(client, "assemble_context", query="Where does Maya live?")
    assert "<satchel_memory>" in text(context) and "Maya lives in Porto." in text(context)
    data = context.structured_content
    assert data is not None and "Maya lives in Porto." in data["memory"]
    trace_id = data["trace_id"]
    why = await ok(client, "get_trace", trace_id=trace_id)
    assert fact_id in text(why) and "relevance" in text(why)
    assert why.structured_content is not None
    assert why.structured_content["query"] == "Where does Maya live?"
    resource = await client.read_resource(f"satchel://trace/{trace_id}")
    stored = json.loads(resource.contents[0].text)  # type: ignore[union-attr]
    assert fact_id in {d["candidate_id"] for d in stored["decisions"]}
    prompt = await client.get_prompt("context_for_task", {"task": "Where does Maya live?"})
    assert "Maya lives in Porto." in prompt.messages[0].content.text  # type: ignore[union-attr]

    # Supersede, retire, list.
    newer = await ok(
        client,
        "assert_fact",
        predicate="home_city",
        value="Lisbon",
        statement="Maya lives in Lisbon.",
    )
    assert newer.structured_content is not None
    newer_id = newer.structured_content["fact"]["id"]
    await ok(client, "supersede_fact", fact_id=fact_id, superseded_by_fact_id=newer_id)
    listed = await ok(client, "list_facts")
    assert newer_id in text(listed) and fact_id not in text(listed)
    await ok(client, "retire_fact", fact_id=newer_id, reason="left Portugal")
    everything = await ok(client, "list_facts", include_inactive=True)
    assert fact_id in text(everything) and newer_id in text(everything)
    assert text(await ok(client, "list_facts")) == "no facts"
    facts = await client.read_resource(f"satchel://facts/{subject}")
    assert json.loads(facts.contents[0].text) == {}  # type: ignore[union-attr]

    # Another scope by override, then forgotten.
    other = f"{subject}-other"
    kept = await ok(
        client,
        "assert_fact",
        predicate="pet",
        value="cat",
        statement="Theo has a cat named Miso.",
        subject_id=other,
    )
    assert kept.structured_content is not None
    assert "Miso" in text(await ok(client, "list_facts", subject_id=other))
    gone = await ok(client, "delete_subject", subject_id=other)
    assert "forgot 0 event(s), 1 fact(s)" in text(gone)
    assert (
        gone.structured_content is not None and gone.structured_content["deleted"]["facts"] == "1"
    )
    assert text(await ok(client, "list_facts", subject_id=other)) == "no facts"
    empty = await ok(
        client, "assemble_context", query="What is Theo's cat called?", subject_id=other
    )
    assert "Nothing in memory is relevant" in text(empty)
    deleted = await ok(client, "delete_event", event_id=event_id)
    assert deleted.structured_content is not None
    assert deleted.structured_content["deleted"]["events"] == "1"

    # Tool search: a fitting tool with its input schema, and an explicit "none fits".
    found = await ok(client, "resolve_talents", task="What's the weather in Lisbon on Friday?")
    assert found.structured_content is not None
    first = found.structured_content["tools"][0]
    assert first["name"] == "get_weather" and first["input_schema"] == json.loads(
        TOOLS["get_weather"][1]
    )
    assert "## get_weather" in text(found)
    nothing = await ok(client, "resolve_talents", task=UNRELATED_TASK)
    assert nothing.structured_content is not None and nothing.structured_content["none_fits"]
    assert text(nothing).startswith("No tool fits this task")

    # Bad arguments: the SDK's schema check, and satchel's own with its field violation.
    assert "query" in await refused(client, "assemble_context")
    bad_budget = await refused(client, "assemble_context", query="x", budget_tokens=-5)
    assert bad_budget.count("INVALID_ARGUMENT") == 1 and "budget_tokens" in bad_budget
    unknown = await refused(client, "get_trace", trace_id=str(uuid.uuid4()))
    assert "NOT_FOUND" in unknown
    assert "INVALID_ARGUMENT" in await refused(client, "get_trace", trace_id="not-a-uuid")


async def test_stdio_as_a_host_launches_it_from_the_printed_entry(
    address: str, channel: grpc.aio.Channel, project_id: str
) -> None:
    await upsert_tools(channel, project_id)
    entry = print_config("--address", address, "--project", project_id, "--subject", "maya")
    assert Path(entry["command"]).is_file() and entry["args"][0] == "mcp"
    async with stdio_client(entry) as client:
        await exercise(client, project_id, "maya")


async def test_streamable_http(address: str, channel: grpc.aio.Channel, project_id: str) -> None:
    await upsert_tools(channel, project_id)
    async with (
        http_mcp("--address", address, "--project", project_id, "--subject", "maya") as url,
        http_client(url) as client,
    ):
        await exercise(client, project_id, "maya")


async def test_a_server_that_is_down_is_a_tool_error_and_the_mcp_server_keeps_running(
    project_id: str,
) -> None:
    entry = print_config("--address", f"127.0.0.1:{free_port()}", "--project", project_id)
    entry["args"] += ["--subject", "maya", "--timeout", "2"]
    async with stdio_client(entry) as client:
        for _ in range(2):
            message = await refused(client, "assemble_context", query="Where does Maya live?")
            assert "UNAVAILABLE" in message and "Is it running" in message
        assert len((await client.list_tools()).tools) == len(TOOL_NAMES)


async def test_without_a_configured_scope_the_tool_says_what_to_pass(address: str) -> None:
    async with stdio_client(print_config("--address", address)) as client:
        message = await refused(client, "list_facts")
        assert "no project" in message and "--project" in message


async def test_over_http_callers_bring_their_own_satchel_key(
    settings: Settings, pg_dsn: str, project_id: str
) -> None:
    key = await asyncio.to_thread(new_key, pg_dsn, project_id)
    async with (
        running(settings, auth="required") as server,
        http_mcp("--address", f"127.0.0.1:{server.port}", "--project", project_id) as url,
    ):
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {}}
        async with httpx2.AsyncClient() as raw:
            for headers in ({}, {"Authorization": "Bearer satchel_not-a-key"}):
                refused_call = await raw.post(url, json=initialize, headers=headers)
                assert refused_call.status_code == 401, headers
                assert refused_call.headers["www-authenticate"].startswith("Bearer")
        async with http_client(url, key) as client:
            written = await ok(
                client,
                "assert_fact",
                predicate="team",
                value="infra",
                statement="Ana works in the infrastructure team.",
                subject_id="ana",
            )
            assert written.structured_content is not None
            listed = await ok(client, "list_facts", subject_id="ana")
            assert "infrastructure team" in text(listed)
            denied = await refused(
                client, "list_facts", subject_id="ana", project_id=f"{project_id}-other"
            )
            assert "PERMISSION_DENIED" in denied
            # resources and prompts call with the caller's key too
            facts = await client.read_resource("satchel://facts/ana")
            assert "infrastructure team" in facts.contents[0].text  # type: ignore[union-attr]
            prompt = await client.get_prompt(
                "context_for_task", {"task": "Which team is Ana in?", "subject_id": "ana"}
            )
            assert "infrastructure team" in prompt.messages[0].content.text  # type: ignore[union-attr]


async def test_a_pinned_scope_leaves_no_override_in_the_schemas() -> None:
    options = McpOptions(address="127.0.0.1:1", project_id="p", subject_id="s", pinned=True)
    server, gateway = build_server(options)
    async with Client(server) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name, tool in tools.items():
        properties = set(tool.input_schema["properties"])
        assert "project_id" not in properties, name
        assert ("subject_id" in properties) is (name == "delete_subject"), name
    await gateway.close()


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--pin", "--project", "p"], "--pin needs --project and --subject"),
        (["--http", "nowhere"], "--http wants HOST:PORT"),
    ],
)
def test_bad_command_lines_fail_fast(args: list[str], expected: str) -> None:
    done = subprocess.run(
        [SATCHEL, "mcp", *args], capture_output=True, text=True, timeout=60, env=os.environ
    )
    assert done.returncode == 2 and expected in done.stderr


def test_the_http_recipe_points_at_the_mcp_endpoint_with_the_key() -> None:
    assert print_config("--http", "0.0.0.0:8765", "--api-key", "satchel_k") == {
        "type": "http",
        "url": "http://127.0.0.1:8765/mcp",
        "headers": {"Authorization": "Bearer satchel_k"},
    }


def test_without_the_sdk_the_command_says_what_to_install() -> None:
    hide_sdk = (
        "import sys; sys.modules['mcp'] = None; from satchel.server.cli import main; "
        "sys.exit(main(['mcp', '--project', 'p']))"
    )
    done = subprocess.run([sys.executable, "-c", hide_sdk], capture_output=True, text=True)
    assert done.returncode == 2 and "pip install 'satchel[mcp]'" in done.stderr
