"""`satchel talents …` and `satchel doctor` against the in-process server, as subprocesses
(run in a thread: the server shares this test's event loop)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import grpc
from helpers.talents import stub
from test_cli import table_rows

from satchel.v1 import talent_pb2

SATCHEL = str(Path(sys.executable).parent / "satchel")


async def satchel(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}  # tables 120 columns wide
    return await asyncio.to_thread(
        subprocess.run, [SATCHEL, *args], capture_output=True, text=True, timeout=120, env=env
    )


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def talent_directory(root: Path, project_id: str) -> None:
    """A skill, a cursor rule, a front-matter note and a README that is not a talent."""
    write(
        root,
        f"{project_id}/architecture/hexagonal/SKILL.md",
        f"""---
name: Hexagonal architecture
description: Ports and adapters; the domain depends on nothing external.
tags: [architecture, hexagonal]
triggers:
  - use case
requires: [{project_id}.architecture.ghost]
---
# Hexagonal

Keep the domain pure.
""",
    )
    write(
        root,
        f"{project_id}/rules/docker.mdc",
        """---
description: Docker production rules, multi-stage builds and non-root users
globs: Dockerfile, **/*.{yml,yaml}
alwaysApply: false
---
# Docker rules

Pin base image versions. Run as a non-root user.
""",
    )
    write(
        root,
        f"{project_id}/notes/testing.md",
        "---\nname: Unit testing\ndescription: Fast unit tests with pytest\n"
        "roles: [backend]\n---\nArrange, act, assert.\n",
    )
    write(root, f"{project_id}/README.md", "# Not a talent\n")


async def test_import_then_list_resolve_and_doctor(
    channel: grpc.aio.Channel, address: str, project_id: str, tmp_path: Path
) -> None:
    talent_directory(tmp_path, project_id)
    hexagonal = f"{project_id}.architecture.hexagonal"
    docker = f"{project_id}.rules.docker"
    testing = f"{project_id}.notes.testing"

    result = await satchel(
        "talents", "import", str(tmp_path), "--project", project_id, "--activate",
        "--address", address,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{project_id}/architecture/hexagonal/SKILL.md: created {hexagonal} (active)"
    assert len(lines) == 5, result.stdout  # a line a file, the progress bar, the summary
    assert re.fullmatch(r"talents imported\s+━+ 3/3", lines[3])  # its last frame
    assert lines[4] == f"imported 3 talent(s): 3 created, 0 updated, 3 activated on {project_id}"
    again = await satchel("talents", "import", str(tmp_path), "--address", address)
    assert again.returncode == 0
    assert again.stdout.splitlines()[-1] == "imported 3 talent(s): 0 created, 3 updated"

    listed = await stub(channel).ListTalents(
        talent_pb2.ListTalentsRequest(project_id=project_id, active_only=True)
    )
    by_id = {t.id: t for t in listed.talents}
    assert set(by_id) == {hexagonal, docker, testing}
    assert by_id[hexagonal].name == "Hexagonal architecture"
    assert list(by_id[hexagonal].tags) == ["architecture", "hexagonal"]
    assert list(by_id[hexagonal].requires) == [f"{project_id}.architecture.ghost"]
    assert by_id[hexagonal].body.startswith("# Hexagonal")
    assert by_id[docker].name == "Docker rules"
    assert list(by_id[docker].triggers) == ["Dockerfile", "**/*.{yml,yaml}"]
    assert list(by_id[testing].roles) == ["backend"]

    task = "Write a multi-stage Dockerfile that runs as a non-root user"
    resolved = await satchel(
        "talents", "resolve", "--project", project_id, "--role", "frontend", "--task", task,
        "--relevance", "embeddings", "--json", "--address", address,
    )  # fmt: skip
    assert resolved.returncode == 0, resolved.stderr
    selection = json.loads(resolved.stdout)
    assert selection["relevance"] == "RELEVANCE_MODE_EMBEDDINGS"
    assert selection["selected"][0]["talent_id"] == docker
    assert selection["selected"][0]["reason"] == "relevance"
    decided = {t["talent_id"] for t in selection["selected"] + selection["excluded"]}
    assert testing not in decided  # role backend only
    assert selection["params"]["budget_tokens"] == 2000
    assert selection["compiled"].startswith("<satchel_talents>\n## Docker rules")

    human = await satchel(
        "talents", "resolve", "--project", project_id, "--task", task, "--relevance", "off",
        "--address", address,
    )  # fmt: skip
    assert human.returncode == 0
    assert human.stdout.startswith(f"talents for {task!r}")
    rows = {row[0]: (row[1], row[-1]) for row in table_rows(human.stdout)}
    assert rows[docker] == rows[hexagonal] == ("selected", "relevance_off")
    outcome, reason = rows[f"{project_id}.architecture.ghost"]
    assert outcome == "excluded" and reason.startswith("not_active (required by")
    assert "".join(reason.split()).endswith(f"{hexagonal})")  # a long id may be folded
    assert "relevance off  floor" in human.stdout and "## Docker rules" in human.stdout

    compiled = await satchel(
        "talents", "resolve", "--project", project_id, "--task", task, "--compiled",
        "--relevance", "embeddings", "--address", address,
    )  # fmt: skip
    assert compiled.stdout.strip() == selection["compiled"]

    doctor = await satchel("doctor", "--project", project_id, "--json", "--address", address)
    assert doctor.returncode == 1  # findings
    report = json.loads(doctor.stdout)
    assert report["roles_known"] == ["frontend"]  # recorded by the resolve above
    assert report["findings"] == [
        {
            "code": "unknown_edge_target",
            "talent_id": hexagonal,
            "detail": f"requires {project_id}.architecture.ghost",
        },
        {
            "code": "unreachable_by_role",
            "talent_id": testing,
            "detail": "roles ['backend'] match none of ['frontend']",
        },
    ]

    doctor_text = await satchel(
        "doctor", "--project", project_id, "--role", "backend", "--address", address
    )
    assert doctor_text.returncode == 1
    lines = doctor_text.stdout.splitlines()
    assert lines[0] == f"project {project_id}: roles backend, frontend"
    assert table_rows(doctor_text.stdout) == [
        ["unknown_edge_target", hexagonal, f"requires {project_id}.architecture.ghost"]
    ]
    assert lines[-1] == "1 finding(s)"

    listing = await satchel("talents", "list", "--project", project_id, "--address", address)
    rows = {row[1]: row for row in table_rows(listing.stdout)}  # the catalogue, all projects'
    assert rows[docker][:3] == ["yes", docker, "Docker rules"]
    wrong = {t: row[0] for t, row in rows.items() if row[0] != ("yes" if t in by_id else "no")}
    assert not wrong, (wrong, listing.stdout)
    assert listing.stdout.splitlines()[-1] == f"{len(rows)} talent(s), {len(by_id)} active"
    as_json = await satchel(
        "talents", "list", "--project", project_id, "--active-only", "--json",
        "--address", address,
    )  # fmt: skip
    assert sorted(json.loads(as_json.stdout)["active_talent_ids"]) == sorted(by_id)


async def test_import_reports_broken_files_and_goes_on(
    address: str, project_id: str, tmp_path: Path
) -> None:
    write(tmp_path, f"{project_id}/good/SKILL.md", "---\nname: Good\n---\nFine.\n")
    write(tmp_path, f"{project_id}/broken/SKILL.md", "---\nname: Broken\nno closing line\n")
    write(tmp_path, f"{project_id}/invalid/SKILL.md", "---\nname: Invalid\ntags: [a, b\n---\n")
    write(tmp_path, f"{project_id}/self.md", f"---\nrequires: [{project_id}.self]\n---\nLoop.\n")
    result = await satchel("talents", "import", str(tmp_path), "--address", address)
    assert result.returncode == 1
    out = result.stdout
    assert "broken/SKILL.md: skipped: front matter has no closing '---' line" in out
    assert (
        "invalid/SKILL.md: skipped: invalid YAML front matter at line 3, column 12: expected ','"
        " or ']', but got '<stream end>' (while parsing a flow sequence started at line 3)"
    ) in out
    assert f"created {project_id}.good" in out
    assert "self.md: failed: INVALID_ARGUMENT" in out and "talent.requires" in out
    assert re.fullmatch(r"talents imported\s+━+ 4/4", out.splitlines()[-2])
    assert out.splitlines()[-1] == "imported 1 talent(s): 1 created, 0 updated, 3 failed"


async def test_cli_usage_and_server_errors(address: str, project_id: str, tmp_path: Path) -> None:
    no_project = await satchel("talents", "import", str(tmp_path), "--activate")
    assert no_project.returncode == 2 and "--activate needs --project" in no_project.stderr
    unknown = await satchel(
        "talents", "activate", "--project", project_id, f"{project_id}.nobody",
        "--address", address,
    )  # fmt: skip
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    bad = await satchel(
        "talents", "resolve", "--project", project_id, "--task", "x", "--budget", "0",
        "--address", address,
    )  # fmt: skip
    assert bad.returncode == 1
    assert "INVALID_ARGUMENT" in bad.stderr and "budget_tokens: must be in" in bad.stderr
    clean = await satchel("doctor", "--project", project_id, "--address", address)
    assert clean.returncode == 0 and clean.stdout.splitlines()[-1] == "no findings"


async def test_an_always_applied_rule_is_pinned_and_served_whatever_the_task(
    channel: grpc.aio.Channel, address: str, project_id: str, tmp_path: Path
) -> None:
    """`.mdc` `alwaysApply: true` imports as a pinned talent: served first to its roles, reason
    `pinned`, even for a task out of the catalogue's domain, which still gets nothing else."""
    talent_directory(tmp_path, project_id)
    write(
        tmp_path,
        f"{project_id}/rules/house-style.mdc",
        "---\ndescription: House style for every answer\nalwaysApply: true\n---\n"
        "# House style\n\nAnswer in British English. Keep answers short.\n",
    )
    imported = await satchel(
        "talents", "import", str(tmp_path), "--project", project_id, "--activate",
        "--address", address,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stdout + imported.stderr
    house = f"{project_id}.rules.house-style"
    listed = await stub(channel).ListTalents(
        talent_pb2.ListTalentsRequest(project_id=project_id, active_only=True)
    )
    assert {t.id for t in listed.talents if t.pinned} == {house}

    for task, others in (
        ("Bake a banana bread with walnuts", False),  # out of the catalogue's domain
        ("Write a multi-stage Dockerfile that runs as a non-root user", True),
    ):
        resolved = await satchel(
            "talents", "resolve", "--project", project_id, "--task", task,
            "--relevance", "embeddings", "--json", "--address", address,
        )  # fmt: skip
        assert resolved.returncode == 0, resolved.stderr
        selection = json.loads(resolved.stdout)
        first = selection["selected"][0]
        assert (first["talent_id"], first["reason"]) == (house, "pinned"), task
        assert all(t["talent_id"] != house for t in selection["excluded"])
        assert (len(selection["selected"]) > 1) == others, selection["selected"]
        compiled = selection["compiled"]
        assert compiled.startswith("<satchel_talents>\n## House style\nAnswer in British")
        assert compiled.count("House style") == 1


async def test_import_an_mcp_tool_list_then_search_tools(
    address: str, project_id: str, tmp_path: Path
) -> None:
    """A JSON file holding an MCP tools/list result imports one talent per tool, with its input
    schema; `talents search` answers with the tools to load, or says none fits."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    listing = {
        "tools": [
            {
                "name": "get_forecast",
                "description": "Weather forecast for a city for the next days.",
                "inputSchema": schema,
            },
            {"name": "send_sms", "description": "Send a text message to a phone number."},
            {"name": "track_parcel", "description": "Track a parcel by its tracking number."},
        ]
    }
    write(tmp_path, f"{project_id}/weather.json", json.dumps(listing))
    result = await satchel(
        "talents", "import", str(tmp_path), "--project", project_id, "--activate",
        "--address", address,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"created {project_id}.weather.get_forecast (active)" in result.stdout
    assert result.stdout.splitlines()[-1].startswith("imported 3 talent(s): 3 created")

    found = await satchel(
        "talents", "search", "--project", project_id, "--task",
        "Will it rain in Porto tomorrow?", "--json", "--address", address,
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    reply = json.loads(found.stdout)
    assert reply["tools"][0]["name"] == "get_forecast"
    assert json.loads(reply["tools"][0]["input_schema"]) == schema
    human = await satchel(
        "talents", "search", "--project", project_id, "--task", "Tell me about the Baroque era",
        "--address", address,
    )  # fmt: skip
    assert human.returncode == 0 and human.stdout.startswith("no tool fits this task")
