"""`satchel talents …` and `satchel doctor`: the talent catalogue from the command line.

- `satchel talents import DIR [--project P] [--activate]` reads talent files (`SKILL.md`,
  `*.mdc` rules, other `*.md` with front matter) and upserts them through the gRPC API.
- `satchel talents list|activate|resolve` and `satchel doctor` call the other RPCs.

They talk to the server through the SDK (`satchel.client`) and run next to any server.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import yaml
from google.protobuf import json_format
from google.protobuf.message import Message
from rich.text import Text

from satchel.client import SatchelClient, SatchelError
from satchel.server.commands import common, view
from satchel.server.platform.config import Settings
from satchel.v1 import talent_pb2

LIST_FIELDS: tuple[str, ...] = (
    "tags",
    "triggers",
    "task_types",
    "roles",
    "requires",
    "includes",
    "recommends",
)
SKILL_FILE = "skill.md"
TIMEOUT_SECONDS = 60.0

_HEADING = re.compile(r"^#\s+(.+?)\s*#*\s*$", re.MULTILINE)
# A one-line unquoted value (not continued on indented lines) of Cursor's raw `.mdc` keys (see
# parse_front_matter).
_RAW_CURSOR_VALUE = re.compile(
    r"^(description|globs)([ \t]*:[ \t]+)([^\s'\"\[{|>].*?)[ \t]*$(?!\n[ \t]+\S)", re.MULTILINE
)


class FrontMatterError(ValueError):
    """A talent file whose front matter cannot be read."""


# --- talent files -------------------------------------------------------------------------


def _unquote(text: str) -> str:
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def _split_commas(text: str) -> list[str]:
    """Split a one-line list on commas outside braces, brackets and quotes (`**/*.{ts,tsx}, a`
    has two items), each item stripped of spaces and of one pair of enclosing quotes."""
    items: list[str] = []
    depth, quote = 0, ""
    current: list[str] = []
    for ch in text:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{[(":
            depth += 1
        elif ch in "}])":
            depth -= 1
        elif ch == "," and depth == 0:
            items.append("".join(current))
            current = []
            continue
        current.append(ch)
    items.append("".join(current))
    return [_unquote(item) for item in items if _unquote(item)]


def _quote_raw(match: re.Match[str]) -> str:
    key, colon, value = match.groups()
    return key + colon + "'" + value.replace("'", "''") + "'"


def _yaml_problem(exc: Any) -> str:
    """A YAML error on one line, its places as line numbers of the file (the front matter
    starts on the file's second line)."""
    mark = getattr(exc, "problem_mark", None)  # a ReaderError (a control character) has none
    context, context_mark = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
    where = f" at line {mark.line + 2}, column {mark.column + 1}" if mark else ""
    started = f" started at line {context_mark.line + 2}" if context_mark else ""
    return f"invalid YAML front matter{where}: {problem}" + (
        f" ({context}{started})" if context else ""
    )


def _load_yaml(block: str) -> Any:
    try:
        return yaml.safe_load(block)
    except yaml.YAMLError as exc:
        raw = _RAW_CURSOR_VALUE.sub(_quote_raw, block)
        if raw == block:
            raise FrontMatterError(_yaml_problem(exc)) from exc
    try:  # the same lines: the problem, if any, is not Cursor's raw values
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise FrontMatterError(_yaml_problem(exc)) from exc


def parse_front_matter(text: str) -> tuple[dict[str, Any], str]:
    """Split a talent file into (front matter, body); the front matter is read as YAML
    (`yaml.safe_load`: nested maps and lists are kept as they are).

    The front matter is the lines between a leading `---` line and the next `---` (or `...`)
    line; a file without a leading `---` line has none. Invalid YAML raises a FrontMatterError
    naming the file's line and the problem, with one tolerance for Cursor's `.mdc` rules:
    Cursor writes `globs:` and `description:` raw on one line (`globs: **/*.ts` is an alias to
    YAML, `description: Rules: for X` a nested map), so when the front matter is not valid
    YAML, one-line unquoted values of these two keys are read again as the raw strings.
    """
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return {}, text.strip()
    try:
        end = next(i for i in range(1, len(lines)) if lines[i].strip() in ("---", "..."))
    except StopIteration as exc:
        raise FrontMatterError("front matter has no closing '---' line") from exc
    loaded = _load_yaml("\n".join(lines[1:end]))
    if loaded is None:  # empty, or only comments
        loaded = {}
    if not isinstance(loaded, dict):
        found = "a list" if isinstance(loaded, list) else f"the value {loaded!r}"
        raise FrontMatterError(f"front matter is {found}, not a map of keys to values")
    meta = {str(key): value for key, value in loaded.items()}
    return meta, "\n".join(lines[end + 1 :]).strip()


def _as_list(meta: dict[str, Any], key: str) -> list[str]:
    """A list field: a YAML list, or a string of comma-separated items (`roles: a, b`)."""
    value = meta.get(key)
    if value is None:
        return []
    if isinstance(value, dict) or (
        isinstance(value, list) and any(isinstance(v, dict | list) for v in value)
    ):
        raise FrontMatterError(f"{key}: expected a list of strings or a comma-separated string")
    if isinstance(value, list):
        return [str(v).strip() for v in value if v is not None and str(v).strip()]
    return _split_commas(str(value))


def _text(meta: dict[str, Any], key: str) -> str:
    """A string field (`id`, `name`, `description`…): a scalar, empty when absent or null."""
    value = meta.get(key)
    if isinstance(value, dict | list):
        raise FrontMatterError(f"{key}: a string, not a {type(value).__name__}")
    return "" if value is None else str(value).strip()


def talent_id_for(path: Path, root: Path) -> str:
    """A dotted id from a path under the import root.

    `architecture/hexagonal/SKILL.md` -> `architecture.hexagonal`, `rules/docker.mdc` ->
    `rules.docker`; lower case, spaces become dashes. A root-level SKILL.md takes the root's name.
    """
    relative = path.relative_to(root)
    parts = list(relative.parent.parts)
    if path.name.lower() != SKILL_FILE:
        parts.append(path.stem)
    elif not parts:
        parts = [root.resolve().name]
    return ".".join(re.sub(r"\s+", "-", part.strip()).lower() for part in parts if part.strip())


def _slug(name: str) -> str:
    """A tool name as the last part of a talent id: lower case, runs of other characters than
    letters, digits, `_` and `-` become one dash."""
    return re.sub(r"[^\w-]+", "-", name.strip()).strip("-").lower() or "tool"


@dataclass
class TalentFile:
    """A parsed talent file: the fields of a `satchel.v1.Talent`."""

    path: Path
    id: str
    name: str
    summary: str = ""
    body: str = ""
    lists: dict[str, list[str]] = field(default_factory=dict)
    pinned: bool = False
    input_schema: str = ""

    def message(self) -> talent_pb2.Talent:
        """The `satchel.v1.Talent` to upsert."""
        talent = talent_pb2.Talent(
            id=self.id,
            name=self.name,
            summary=self.summary,
            body=self.body,
            pinned=self.pinned,
            input_schema=self.input_schema,
        )
        for name, values in self.lists.items():  # repeated fields (LIST_FIELDS)
            getattr(talent, name).extend(values)
        return talent


def talent_from_text(text: str, path: Path, root: Path) -> TalentFile:
    """Read a talent file's text. Front matter: `id`, `name`, `description` (the summary), the
    list fields of a talent, `pinned`, and for `.mdc` rules `globs` (added to the triggers) and
    `alwaysApply` (pinned). The name falls back to the body's first `# heading`, then to the
    id's last part."""
    meta, body = parse_front_matter(text)
    talent_id = _text(meta, "id") or talent_id_for(path, root)
    heading = _HEADING.search(body)
    name = _text(meta, "name") or _text(meta, "title")
    if not name:
        name = heading.group(1) if heading else talent_id.rsplit(".", 1)[-1]
    lists = {key: _as_list(meta, key) for key in LIST_FIELDS}
    lists["triggers"] += [g for g in _as_list(meta, "globs") if g not in lists["triggers"]]
    return TalentFile(
        path=path,
        id=talent_id,
        name=name,
        summary=_text(meta, "description"),
        body=body,
        lists={key: values for key, values in lists.items() if values},
        pinned=_is_true(meta.get("pinned")) or _is_true(meta.get("alwaysApply")),
    )


def _is_true(value: Any) -> bool:
    return str(value).strip().lower() in ("true", "yes", "on", "1")


def parse_talent_file(path: Path, root: Path) -> list[TalentFile]:
    """Read one talent file under `root`: a tool list (`tools_from_json`) or one talent
    (`talent_from_text`)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        return tools_from_json(text, path, root)
    return [talent_from_text(text, path, root)]


def tools_from_json(text: str, path: Path, root: Path) -> list[TalentFile]:
    """The tools of an MCP `tools/list` result (`{"tools": [{"name", "description",
    "inputSchema"}]}`) as talents: id `<file id>.<tool name>`, the description as summary, the
    input schema kept, tagged with the file's name (the server they come from)."""
    try:
        document = json.loads(text)
    except ValueError as exc:
        raise FrontMatterError(f"not JSON: {exc}") from exc
    tools = document.get("tools") if isinstance(document, dict) else None
    if not isinstance(tools, list):
        raise FrontMatterError('a JSON talent file holds {"tools": [...]} (an MCP tools/list)')
    group = talent_id_for(path, root)
    talents = []
    for index, tool in enumerate(tools):
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name.strip():
            raise FrontMatterError(f"tools[{index}] has no name")
        schema = tool.get("inputSchema") or tool.get("input_schema") or tool.get("parameters")
        talents.append(
            TalentFile(
                path=path,
                id=f"{group}.{_slug(name)}",
                name=name.strip(),
                summary=str(tool.get("description") or "").strip(),
                lists={"tags": [group.rsplit(".", 1)[-1]]},
                input_schema=json.dumps(schema) if isinstance(schema, dict) else "",
            )
        )
    return talents


def talent_files(root: Path) -> Iterator[Path]:
    """Talent files under root, sorted: SKILL.md, *.mdc, *.json tool lists, and *.md starting
    with front matter.

    Hidden directories (`.git`…) are skipped.
    """
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts[:-1]) or not path.is_file():
            continue
        name = path.name.lower()
        if name == SKILL_FILE or name.endswith((".mdc", ".json")):
            yield path
        elif name.endswith(".md"):
            with path.open(encoding="utf-8", errors="replace") as handle:
                if handle.readline().strip() == "---":
                    yield path


# --- talking to the server ----------------------------------------------------------------


def server_address(args: argparse.Namespace, settings: Settings) -> str:
    """--address, else SATCHEL_ADDRESS, else SATCHEL_LISTEN (a wildcard host means loopback)."""
    return common.dialable(getattr(args, "address", None) or common.default_address())


def _client(args: argparse.Namespace, settings: Settings) -> SatchelClient:
    return SatchelClient(
        server_address(args, settings),
        api_key=getattr(args, "api_key", None),
        timeout=args.timeout,
    )


def describe_error(exc: SatchelError) -> str:
    """`CODE: message` plus one line per field violation of a rich status."""
    return str(exc)


def _to_json(message: Message) -> str:
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=2,
    )


def _fail(exc: SatchelError) -> int:
    print(f"satchel: {describe_error(exc)}", file=sys.stderr)
    return 1


# --- commands -------------------------------------------------------------------------------


def _import_file(
    api: SatchelClient, args: argparse.Namespace, root: Path, path: Path, seen: dict[str, Path]
) -> list[tuple[str, str]]:
    """Upsert (and activate) the talents of one file: for each, (`created`|`updated`|`failed`,
    what to print).

    UNAVAILABLE is raised: no other file would get through either.
    """
    try:
        talents = parse_talent_file(path, root)
    except (FrontMatterError, UnicodeDecodeError) as exc:
        return [("failed", f"skipped: {exc}")]
    outcomes = []
    for talent in talents:
        if talent.id in seen:
            outcomes.append(
                ("failed", f"skipped: id {talent.id} already used by {seen[talent.id]}")
            )
            continue
        seen[talent.id] = path.relative_to(root)
        try:
            reply = api.upsert_talent(talent.message())
            if args.activate:
                api.set_talent_activation(args.project, talent.id)
        except SatchelError as exc:
            if exc.code == grpc.StatusCode.UNAVAILABLE:
                raise
            outcomes.append(("failed", f"failed: {describe_error(exc)}"))
            continue
        verb = "created" if reply.created else "updated"
        outcomes.append((verb, f"{verb} {talent.id}" + (" (active)" if args.activate else "")))
    return outcomes


def cmd_import(args: argparse.Namespace, settings: Settings) -> int:
    """Upsert every talent file of a directory (and activate them on a project).

    A progress bar counts the files; each file's outcome is printed above it.
    """
    root: Path = args.directory
    if not root.is_dir():
        print(f"satchel: {root} is not a directory", file=sys.stderr)
        return 2
    if args.activate and not args.project:
        print("satchel: --activate needs --project", file=sys.stderr)
        return 2
    paths = list(talent_files(root))
    if not paths:
        print(f"no talent files under {root}")
        return 0
    tally: Counter[str] = Counter()
    seen: dict[str, Path] = {}
    out = view.console()
    try:
        with (
            _client(args, settings) as api,
            view.progress_steps(out, len(paths), "importing talents") as step,
        ):
            for path in paths:
                for status, what in _import_file(api, args, root, path, seen):
                    tally[status] += 1
                    style = "yellow" if status == "failed" else ""
                    line = f"{path.relative_to(root)}: {what}"
                    out.print(Text(line, style=style), soft_wrap=True)
                step()
            step("talents imported", advance=0)
    except SatchelError as exc:
        return _fail(exc)
    created, updated, failed = tally["created"], tally["updated"], tally["failed"]
    summary = f"imported {created + updated} talent(s): {created} created, {updated} updated"
    if args.activate:
        summary += f", {created + updated} activated on {args.project}"
    out.print(Text(summary + (f", {failed} failed" if failed else "")), soft_wrap=True)
    return 1 if failed else 0


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """List the catalogue, or a project's talents with their activation."""
    if args.active_only and not args.project:
        print("satchel: --active-only needs --project", file=sys.stderr)
        return 2
    with _client(args, settings) as api:
        reply = talent_pb2.ListTalentsResponse()
        token = ""
        try:
            while True:  # every page, merged
                page = api.list_talents(
                    args.project or "", active_only=args.active_only, page_token=token
                )
                reply.talents.extend(page.talents)
                reply.active_talent_ids.extend(page.active_talent_ids)
                if not (token := page.next_page_token):
                    break
        except SatchelError as exc:
            return _fail(exc)
    if args.json:
        print(_to_json(reply))
        return 0
    title = f"talents of {args.project}" if args.project else "talent catalogue"
    if args.active_only:
        title = f"talents active on {args.project}"
    out = view.console()
    out.print(view.talents_table(reply, title, project=bool(args.project)))
    active = f", {len(reply.active_talent_ids)} active" if args.project else ""
    out.print(f"{len(reply.talents)} talent(s){active}")
    return 0


def cmd_activate(args: argparse.Namespace, settings: Settings) -> int:
    """Turn talents on (or off with --off) for a project."""
    failed = 0
    with _client(args, settings) as api:
        for talent_id in args.talent_ids:
            try:
                api.set_talent_activation(args.project, talent_id, not args.off)
            except SatchelError as exc:
                failed += 1
                print(f"{talent_id}: {describe_error(exc)}", file=sys.stderr)
                continue
            print(f"{talent_id}: {'off' if args.off else 'on'} for {args.project}")
    return 1 if failed else 0


RELEVANCE_CHOICES = ("default", "off", "embeddings")


def cmd_resolve(args: argparse.Namespace, settings: Settings) -> int:
    """Ask which talents an agent of a role receives for a task."""
    with _client(args, settings) as api:
        try:
            reply = api.resolve_talents(
                args.project,
                args.task,
                role=args.role,
                relevance=args.relevance,
                budget_tokens=args.budget_tokens,
                floor=args.floor,
                beta=args.beta,
                margin=args.margin,
            )
        except SatchelError as exc:
            return _fail(exc)
    if args.json:
        print(_to_json(reply.selection))
    elif args.compiled:
        print(reply.selection.compiled)
    else:
        title = f"talents for {args.task!r}" + (f"  role {args.role}" if args.role else "")
        out = view.console()
        out.print(view.selection_view(reply.selection, title, out.width))
    return 0


def cmd_search(args: argparse.Namespace, settings: Settings) -> int:
    """Ask which tools an agent should load for a task (SearchTools)."""
    with _client(args, settings) as api:
        try:
            reply = api.search_tools(
                args.project, args.task, role=args.role, budget_tokens=args.budget_tokens
            )
        except SatchelError as exc:
            return _fail(exc)
    if args.json:
        print(_to_json(reply))
        return 0
    if reply.none_fits:
        print(reply.note)
    for tool in reply.tools:
        why = f" ({tool.reason}" + (f" of {tool.required_by})" if tool.required_by else ")")
        print(f"{tool.name}{why if tool.reason != 'relevance' else ''}: {tool.description}")
    return 0


def cmd_doctor(args: argparse.Namespace, settings: Settings) -> int:
    """Report what is wrong with a project's talents; exit 1 when anything is."""
    with _client(args, settings) as api:
        try:
            reply = api.diagnose_project(args.project, args.role or [])
        except SatchelError as exc:
            return _fail(exc)
    if args.json:
        print(_to_json(reply))
    else:
        view.console().print(view.findings_view(args.project, reply))
    return 1 if reply.findings else 0


def _address_option(parser: argparse.ArgumentParser) -> None:
    common.add_client_options(parser, timeout=TIMEOUT_SECONDS)


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `talents` (import, list, activate, resolve) and `doctor` to the `satchel` command."""
    talents = commands.add_parser("talents", help="the talent catalogue and selection")
    sub = talents.add_subparsers(dest="talents_command", required=True)

    imp = sub.add_parser("import", help="upsert the talent files of a directory")
    imp.add_argument("directory", type=Path)
    imp.add_argument("--project", help="project to activate the talents on")
    imp.add_argument("--activate", action="store_true", help="activate them on --project")
    _address_option(imp)
    imp.set_defaults(func=cmd_import)

    lst = sub.add_parser("list", help="list the catalogue or a project's talents")
    lst.add_argument("--project", help="mark the talents active on this project")
    lst.add_argument("--active-only", action="store_true", help="only the project's active set")
    lst.add_argument("--json", action="store_true", help="print the ListTalentsResponse as JSON")
    _address_option(lst)
    lst.set_defaults(func=cmd_list)

    act = sub.add_parser("activate", help="turn talents on (or --off) for a project")
    act.add_argument("talent_ids", nargs="+", metavar="TALENT_ID")
    act.add_argument("--project", required=True)
    act.add_argument("--off", action="store_true", help="deactivate instead")
    _address_option(act)
    act.set_defaults(func=cmd_activate)

    res = sub.add_parser("resolve", help="the talents an agent of a role receives for a task")
    res.add_argument("--project", required=True)
    res.add_argument("--role", default="", help="the agent's role (default: none)")
    res.add_argument("--task", required=True)
    res.add_argument("--relevance", choices=list(RELEVANCE_CHOICES), default="default")
    res.add_argument("--budget", dest="budget_tokens", type=int)
    res.add_argument("--floor", type=float)
    res.add_argument("--beta", type=float)
    res.add_argument("--margin", type=float)
    out = res.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the TalentSelection as JSON")
    out.add_argument("--compiled", action="store_true", help="print only the compiled block")
    _address_option(res)
    res.set_defaults(func=cmd_resolve)

    search = sub.add_parser("search", help="the tools an agent should load for a task")
    search.add_argument("--project", required=True)
    search.add_argument("--role", default="", help="the agent's role (default: none)")
    search.add_argument("--task", required=True)
    search.add_argument("--budget", dest="budget_tokens", type=int)
    search.add_argument("--json", action="store_true", help="print the SearchToolsResponse")
    _address_option(search)
    search.set_defaults(func=cmd_search)

    doctor = commands.add_parser("doctor", help="diagnose a project's talents")
    doctor.add_argument("--project", required=True)
    doctor.add_argument(
        "--role", action="append", help="a role the project's agents use (repeatable)"
    )
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")
    _address_option(doctor)
    doctor.set_defaults(func=cmd_doctor)
