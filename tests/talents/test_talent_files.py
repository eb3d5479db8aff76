"""Unit tests of the talent file reader behind `satchel talents import`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from satchel.server.commands.talents import (
    FrontMatterError,
    parse_front_matter,
    parse_talent_file,
    talent_files,
    talent_from_text,
    talent_id_for,
)

ROOT = Path("/catalogue")


def test_front_matter_scalars_lists_and_blocks() -> None:
    text = """---
name: "Hexagonal: the rule"
description: 'It''s about ports'
tags: [architecture, "hexagonal"]
triggers:
  - use case
  - "application service"
summary: |
  first line
  second line
folded: >-
  one
  two
metadata:
  author: someone
# a comment
empty:
---
# Heading

Body text.
"""
    meta, body = parse_front_matter(text)
    assert meta["name"] == "Hexagonal: the rule"
    assert meta["description"] == "It's about ports"
    assert meta["tags"] == ["architecture", "hexagonal"]
    assert meta["triggers"] == ["use case", "application service"]
    assert meta["summary"] == "first line\nsecond line\n"  # YAML's literal block keeps one
    assert meta["folded"] == "one two"
    assert meta["metadata"] == {"author": "someone"} and meta["empty"] is None
    assert body == "# Heading\n\nBody text."


def test_nested_maps_and_lists_are_kept() -> None:
    """The old hand-written parser turned a nested map into ''."""
    meta, _ = parse_front_matter(
        "---\nmetadata: {a: 1, b: [x, y]}\nowner:\n  team: platform\n  contacts:\n"
        "    - name: Ada\n      email: ada@example.com\n---\nBody."
    )
    assert meta["metadata"] == {"a": 1, "b": ["x", "y"]}
    assert meta["owner"] == {
        "team": "platform",
        "contacts": [{"name": "Ada", "email": "ada@example.com"}],
    }


def test_lists_over_several_lines_with_comments_and_nesting() -> None:
    """The old parser read `[a,` as a string, kept comments in items and flattened nesting."""
    meta, _ = parse_front_matter(
        "---\ntags: [architecture,\n  hexagonal]\ntriggers:\n  - use case  # the main one\n"
        "  - [nested, list]\n---\n"
    )
    assert meta["tags"] == ["architecture", "hexagonal"]
    assert meta["triggers"] == ["use case", ["nested", "list"]]
    talent = talent_from_text("---\ntags: [a,\n  b]  # two\n---\nBody.", ROOT / "x.md", ROOT)
    assert talent.lists == {"tags": ["a", "b"]}


def test_quoted_strings_with_colons_escapes_and_comments() -> None:
    """The old parser kept the quotes when a comment followed, never read escapes, and cut a
    quoted string continued on the next line."""
    meta, _ = parse_front_matter(
        '---\nname: "Hexagonal: the rule"  # a comment\n'
        "description: 'Ports: adapters'\n"
        'title: "tab:\\there"\n'
        'summary: "first: part\n  second: part"\n---\n'
    )
    assert meta["name"] == "Hexagonal: the rule"
    assert meta["description"] == "Ports: adapters"
    assert meta["title"] == "tab:\there"
    assert meta["summary"] == "first: part second: part"


@pytest.mark.parametrize(
    ("front", "line", "problem"),
    [
        ("name: Bad\ntags: [a, b", 3, "expected ',' or ']'"),
        ("name: Bad: really", 2, "mapping values are not allowed here"),
        ('name: ok\ntitle: "unterminated', 3, "found unexpected end of stream"),
        ("name: ok\n  indented: wrong", 3, "mapping values are not allowed here"),
    ],
)
def test_invalid_yaml_names_the_line_of_the_file(front: str, line: int, problem: str) -> None:
    """The old parser read each of these as some string."""
    with pytest.raises(FrontMatterError, match=f"invalid YAML front matter at line {line}, ") as e:
        parse_front_matter(f"---\n{front}\n---\nBody.")
    assert problem in str(e.value)


def test_cursor_rules_raw_globs_and_description_are_read_as_written() -> None:
    """Cursor writes `globs: **/*.ts` (an alias to YAML) and descriptions with colons unquoted:
    those two keys are read as their raw text when the front matter is not valid YAML."""
    text = (
        "---\ndescription: Next.js rules: auth, params\nglobs: **/*.ts, *.{tsx,jsx}\n"
        "alwaysApply: true\n---\n# Rule\n"
    )
    talent = talent_from_text(text, ROOT / "rules" / "next.mdc", ROOT)
    assert talent.summary == "Next.js rules: auth, params"
    assert talent.lists == {"triggers": ["**/*.ts", "*.{tsx,jsx}"]} and talent.pinned
    with pytest.raises(FrontMatterError, match=r"at line 3, .*expected ',' or '\]'"):
        parse_front_matter("---\nglobs: **/*.ts\ntags: [a\n---\n")


def test_fields_of_the_wrong_shape_are_reported() -> None:
    """A map where a talent has a string or a list is an error (the old parser dropped it)."""
    for front, why in (
        ("tags: {a: 1}", "tags: expected a list"),
        ("roles: [{a: 1}]", "roles: expected a list"),
        ("name: {first: a}", "name: a string, not a dict"),
    ):
        with pytest.raises(FrontMatterError, match=why):
            talent_from_text(f"---\n{front}\n---\nBody.", ROOT / "x.md", ROOT)
    with pytest.raises(FrontMatterError, match="front matter is a list"):
        parse_front_matter("---\n- a\n---\n")


def test_no_front_matter_and_unclosed_front_matter() -> None:
    assert parse_front_matter("# Just a body\n") == ({}, "# Just a body")
    with pytest.raises(FrontMatterError):
        parse_front_matter("---\nname: x\nno end\n")
    with pytest.raises(FrontMatterError):
        parse_front_matter("---\n: no key\n---\n")


def test_ids_derive_from_paths() -> None:
    assert talent_id_for(ROOT / "architecture/hexagonal/SKILL.md", ROOT) == (
        "architecture.hexagonal"
    )
    assert talent_id_for(ROOT / "rules/Docker Rules.mdc", ROOT) == "rules.docker-rules"
    assert talent_id_for(ROOT / "notes.md", ROOT) == "notes"
    assert talent_id_for(ROOT / "SKILL.md", ROOT) == "catalogue"


def test_mdc_rule_globs_become_triggers_and_name_falls_back_to_heading() -> None:
    text = (
        "---\ndescription: Docker production rules\n"
        "globs: Dockerfile, **/*.{yml,yaml}, docker-compose.yml\nalwaysApply: false\n---\n"
        "# Docker rules\n\nPin versions."
    )
    talent = talent_from_text(text, ROOT / "rules" / "docker.mdc", ROOT)
    assert talent.id == "rules.docker"
    assert talent.name == "Docker rules"
    assert talent.summary == "Docker production rules"
    assert talent.lists["triggers"] == ["Dockerfile", "**/*.{yml,yaml}", "docker-compose.yml"]
    assert talent.body == "# Docker rules\n\nPin versions."
    message = talent.message()
    assert message.id == "rules.docker" and list(message.triggers) == talent.lists["triggers"]


def test_skill_front_matter_fields_and_explicit_id(tmp_path: Path) -> None:
    skill = tmp_path / "architecture" / "hexagonal" / "SKILL.md"
    skill.parent.mkdir(parents=True)
    skill.write_text(
        "---\nname: Hexagonal architecture\ndescription: Ports and adapters\n"
        "roles: backend, reviewer\nrequires: [architecture.dependency-rule]\n"
        "task_types:\n  - feature\n---\nKeep the domain pure.\n"
    )
    (talent,) = parse_talent_file(skill, tmp_path)
    assert talent.id == "architecture.hexagonal"
    assert talent.lists == {
        "roles": ["backend", "reviewer"],
        "requires": ["architecture.dependency-rule"],
        "task_types": ["feature"],
    }
    renamed = talent_from_text("---\nid: custom.id\n---\nbody", skill, tmp_path)
    assert renamed.id == "custom.id" and renamed.name == "id"


def test_talent_files_finds_skills_rules_and_front_matter_markdown(tmp_path: Path) -> None:
    files = {
        "a/SKILL.md": "---\nname: a\n---\n",
        "rules/r.mdc": "---\ndescription: r\n---\n",
        "notes/with.md": "---\nname: with\n---\n",
        "notes/README.md": "# no front matter\n",
        ".git/hidden/SKILL.md": "---\nname: hidden\n---\n",
        "other.txt": "---\n",
    }
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    found = [p.relative_to(tmp_path).as_posix() for p in talent_files(tmp_path)]
    assert found == ["a/SKILL.md", "notes/with.md", "rules/r.mdc"]


@pytest.mark.parametrize(
    ("front", "pinned"),
    [
        ("alwaysApply: true", True),
        ("alwaysApply: false", False),
        ("pinned: yes", True),
        ("description: no flag", False),
    ],
)
def test_always_applied_rules_are_pinned(front: str, pinned: bool) -> None:
    talent = talent_from_text(f"---\n{front}\n---\n# Rule\n\nBody.", ROOT / "r.mdc", ROOT)
    assert talent.pinned is pinned and talent.message().pinned is pinned


def test_an_mcp_tool_list_is_one_talent_per_tool(tmp_path: Path) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    listing = {
        "tools": [
            {"name": "get_weather", "description": "Forecast for a city.", "inputSchema": schema},
            {"name": "Send Mail!", "description": "Send an email."},
        ]
    }
    path = tmp_path / "servers" / "Weather.json"
    path.parent.mkdir()
    path.write_text(json.dumps(listing))
    assert list(talent_files(tmp_path)) == [path]
    weather, mail = parse_talent_file(path, tmp_path)
    assert (weather.id, weather.name, weather.summary) == (
        "servers.weather.get_weather",
        "get_weather",
        "Forecast for a city.",
    )
    assert json.loads(weather.input_schema) == schema and weather.lists == {"tags": ["weather"]}
    assert json.loads(weather.message().input_schema) == schema
    assert (mail.id, mail.input_schema) == ("servers.weather.send-mail", "")
    for bad, why in (("{", "not JSON"), ("[]", "tools/list"), ('{"tools": [{}]}', "no name")):
        path.write_text(bad)
        with pytest.raises(FrontMatterError, match=why):
            parse_talent_file(path, tmp_path)
