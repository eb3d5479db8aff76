"""`satchel mcp`: serve satchel to MCP hosts (stdio, or Streamable HTTP with `--http`), and
`satchel mcp --print-config`: the `mcpServers` entry that runs it from this install.

The MCP server (`satchel.server.mcp_server`) talks to a running satchel server through the SDK.
It needs the `mcp` package (`pip install 'satchel[mcp]'`; scripts/setup installs it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from satchel.server.commands import common
from satchel.server.platform.config import Settings, is_address

MISSING_SDK = (
    "satchel mcp needs the MCP SDK: pip install 'satchel[mcp]' (scripts/setup installs it)"
)


def options(args: argparse.Namespace) -> Any:
    """The `McpOptions` of the command line."""
    from satchel.server.mcp_server import McpOptions

    return McpOptions(
        address=common.server_address(args),
        api_key=args.api_key,
        project_id=args.project or "",
        subject_id=args.subject or "",
        role=args.role or "",
        pinned=args.pin,
        timeout=args.timeout,
        http=args.http is not None,
    )


def host_entry(args: argparse.Namespace) -> dict[str, Any]:
    """The `mcpServers` entry of a host's configuration for these options."""
    if args.http is not None:
        url = f"http://{common.dialable(args.http)}/mcp"
        remote: dict[str, Any] = {"type": "http", "url": url}
        if args.api_key:
            remote["headers"] = {"Authorization": f"Bearer {args.api_key}"}
        return {"satchel": remote}
    command = Path(sys.executable).with_name("satchel")
    arguments = ["mcp", "--address", common.server_address(args)]
    for flag, value in (("--project", args.project), ("--subject", args.subject)):
        if value:
            arguments += [flag, value]
    if args.role:
        arguments += ["--role", args.role]
    if args.pin:
        arguments.append("--pin")
    entry: dict[str, Any] = {"command": str(command), "args": arguments}
    if args.api_key:
        entry["env"] = {"SATCHEL_API_KEY": args.api_key}
    return {"satchel": entry}


def cmd_mcp(args: argparse.Namespace, settings: Settings) -> int:
    """Serve MCP until the host closes stdin (stdio) or until Ctrl-C (HTTP)."""
    if args.print_config:
        print(json.dumps({"mcpServers": host_entry(args)}, indent=2))
        return 0
    if args.pin and not (args.project and args.subject):
        print("satchel: --pin needs --project and --subject", file=sys.stderr)
        return 2
    if args.http is not None and not is_address(args.http):
        print(f"satchel: --http wants HOST:PORT, got {args.http!r}", file=sys.stderr)
        return 2
    try:
        from satchel.server import mcp_server
    except ImportError as exc:
        if exc.name is None or not exc.name.startswith("mcp"):
            raise
        print(f"satchel: {MISSING_SDK}", file=sys.stderr)
        return 2
    if args.http is None:
        asyncio.run(mcp_server.serve_stdio(options(args)))
        return 0
    if args.api_key:
        print(
            "satchel: over HTTP each caller sends its own key ('Authorization: Bearer KEY'): "
            "SATCHEL_API_KEY / --api-key is not used",
            file=sys.stderr,
        )
    host, _, port = args.http.rpartition(":")
    print(f"satchel: MCP over Streamable HTTP at http://{args.http}/mcp", file=sys.stderr)
    try:
        asyncio.run(mcp_server.serve_http(options(args), host.strip("[]"), int(port)))
    except KeyboardInterrupt:
        return 130
    return 0


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `mcp`."""
    parser = commands.add_parser(
        "mcp",
        help="serve satchel to MCP hosts (stdio; --http for Streamable HTTP)",
        description="An MCP server (tools, resources, a prompt) in front of a running satchel "
        "server. The project and subject of the tools default to --project and --subject; a "
        "call may name others unless --pin.",
    )
    parser.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve Streamable HTTP at http://HOST:PORT/mcp instead of stdio; callers send "
        "their satchel key as 'Authorization: Bearer KEY'",
    )
    parser.add_argument(
        "--project",
        default=os.environ.get("SATCHEL_PROJECT"),
        help="the project of the tools' calls (default: SATCHEL_PROJECT)",
    )
    parser.add_argument(
        "--subject",
        default=os.environ.get("SATCHEL_SUBJECT"),
        help="the subject (user, agent, conversation) of the memory tools (default: "
        "SATCHEL_SUBJECT)",
    )
    parser.add_argument(
        "--role",
        default=os.environ.get("SATCHEL_ROLE"),
        help="the agent role of resolve_talents (default: SATCHEL_ROLE, else none)",
    )
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the tools take no project_id or subject_id: every call uses --project and --subject",
    )
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the JSON mcpServers entry that runs this command from this install, and exit",
    )
    common.add_client_options(parser)
    parser.set_defaults(func=cmd_mcp)
