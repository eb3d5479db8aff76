"""Evaluation catalogues for talent selection, built from public tool-use data sets.

    .venv/bin/python benchmarks/catalogues.py            # validates every file, prints counts
    .venv/bin/python benchmarks/build_catalogues.py      # regenerates them from the snapshots

`data/catalogues/<name>.json.gz` each hold a tool catalogue and tasks labelled with their gold
tools (see `data/catalogues/SOURCES.md` for origins, licences and transformations):

    {"name", "source": {"repository", "commit", "paths", "licence"},
     "tools": [{"id", "name", "description", "parameters", "group", "language"}],
     "tasks": [{"id", "query", "gold": [tool ids], "language"}]}

`off_domain.json` holds requests that need no tool at all (gold empty), written by hand.

A name joining catalogues with `+` loads them merged into one (their tool and task ids must not
clash): `acebench_en+acebench_zh` is ACEBench's mixed English and Chinese catalogue (in two
files only to keep each under 3 MB). `MERGED` lists the merged catalogues worth evaluating.

    from catalogues import catalogue_names, load_catalogue, off_domain_tasks
    for name in catalogue_names():
        catalogue = load_catalogue(name)   # validated: unique ids, every gold id a tool
"""

from __future__ import annotations

import functools
import gzip
import json
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DIRECTORY = Path(__file__).resolve().parent / "data" / "catalogues"
OFF_DOMAIN = "off_domain"
MERGED = ("acebench_en+acebench_zh",)


@dataclass(frozen=True)
class Source:
    """Where a catalogue comes from: repository at a commit, the files read, their licence."""

    repository: str | None
    commit: str | None
    paths: tuple[str, ...]
    licence: str


@dataclass(frozen=True)
class Tool:
    """One tool of a catalogue. `parameters` is a JSON schema object (or None); `group` the
    MCP server, API provider or domain the tool belongs to (or None)."""

    id: str
    name: str
    description: str
    parameters: dict[str, Any] | None
    group: str | None
    language: str

    def parameter_lines(self) -> Iterator[str]:
        """`name: description` of each parameter, nested properties included, depth first."""

        def walk(schema: object, prefix: str) -> Iterator[str]:
            if not isinstance(schema, dict):
                return
            properties = schema.get("properties")
            if isinstance(properties, dict):
                for key, spec in properties.items():
                    description = spec.get("description", "") if isinstance(spec, dict) else ""
                    yield f"{prefix}{key}: {description}".rstrip(": ").rstrip()
                    yield from walk(spec, f"{prefix}{key}.")
            items = schema.get("items")
            if isinstance(items, dict):
                yield from walk(items, prefix)

        yield from walk(self.parameters, "")

    def text(self, *, group: bool = True) -> str:
        """The tool's full text: name, group (unless `group=False`), description, then one
        line a parameter (name and description)."""
        head = [self.name]
        if group and self.group:
            head.append(f"({self.group})")
        lines = [" ".join(head), self.description, *self.parameter_lines()]
        return "\n".join(line for line in lines if line.strip())


@dataclass(frozen=True)
class Task:
    """A request and the ids of the tools that serve it (empty: needs no tool)."""

    id: str
    query: str
    gold: tuple[str, ...]
    language: str


@dataclass(frozen=True)
class Catalogue:
    name: str
    source: Source
    tools: tuple[Tool, ...]
    tasks: tuple[Task, ...]

    def tool(self, tool_id: str) -> Tool:
        return self._by_id[tool_id]

    @functools.cached_property
    def _by_id(self) -> dict[str, Tool]:
        return {tool.id: tool for tool in self.tools}

    def summary(self) -> str:
        tasks = self.tasks
        mean_gold = sum(len(t.gold) for t in tasks) / len(tasks) if tasks else 0.0
        tool_langs = dict(Counter(t.language for t in self.tools))
        task_langs = dict(Counter(t.language for t in tasks))
        groups = len({t.group for t in self.tools if t.group})
        return (
            f"{self.name}: {len(self.tools)} tools {tool_langs}, {groups} groups; "
            f"{len(tasks)} tasks {task_langs}, mean gold {mean_gold:.2f}"
        )


def _path(name: str, directory: Path | None) -> Path:
    """`<name>.json.gz` (the catalogues, compressed), else `<name>.json`."""
    packed = (directory or DIRECTORY) / f"{name}.json.gz"
    return packed if packed.exists() else packed.with_suffix("")


def catalogue_names(directory: Path | None = None) -> list[str]:
    """The catalogues present (off_domain excluded), sorted."""
    files = [*(directory or DIRECTORY).glob("*.json"), *(directory or DIRECTORY).glob("*.json.gz")]
    found = sorted({p.name.removesuffix(".gz").removesuffix(".json") for p in files})
    return [name for name in found if name != OFF_DOMAIN]


def _read(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        data = json.load(handle)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a JSON object")
    return data


def _tasks(raw: list[dict[str, Any]], where: str) -> tuple[Task, ...]:
    tasks = tuple(
        Task(str(t["id"]), str(t["query"]), tuple(t.get("gold") or ()), str(t["language"]))
        for t in raw
    )
    repeated = [key for key, n in Counter(t.id for t in tasks).items() if n > 1]
    if repeated:
        raise ValueError(f"{where}: repeated task ids {repeated[:5]}")
    empty = [t.id for t in tasks if not t.query.strip()]
    if empty:
        raise ValueError(f"{where}: empty queries {empty[:5]}")
    return tasks


def load_catalogue(name: str, directory: Path | None = None) -> Catalogue:
    """Read and validate `<name>.json`: unique tool and task ids, every gold id a tool, every
    task with at least one gold tool. Raises ValueError on the first problem. `a+b` loads
    `a.json` and `b.json` merged into one catalogue."""
    if "+" in name:
        return merge(name, [load_catalogue(part, directory) for part in name.split("+")])
    path = _path(name, directory)
    data = _read(path)
    source = data["source"]
    tools = tuple(
        Tool(
            id=str(t["id"]),
            name=str(t["name"]),
            description=str(t.get("description") or ""),
            parameters=t.get("parameters"),
            group=t.get("group"),
            language=str(t["language"]),
        )
        for t in data["tools"]
    )
    repeated = [key for key, n in Counter(t.id for t in tools).items() if n > 1]
    if repeated:
        raise ValueError(f"{path}: repeated tool ids {repeated[:5]}")
    tasks = _tasks(data["tasks"], str(path))
    ids = {t.id for t in tools}
    for task in tasks:
        if not task.gold:
            raise ValueError(f"{path}: task {task.id} has no gold tool")
        unknown = set(task.gold) - ids
        if unknown:
            raise ValueError(f"{path}: task {task.id}: gold not in the catalogue {unknown}")
    return Catalogue(
        name=str(data["name"]),
        source=Source(
            repository=source.get("repository"),
            commit=source.get("commit"),
            paths=tuple(source.get("paths") or ()),
            licence=str(source.get("licence")),
        ),
        tools=tools,
        tasks=tasks,
    )


def merge(name: str, parts: list[Catalogue]) -> Catalogue:
    """One catalogue of the tools and tasks of `parts` (ids must not clash)."""
    tools = tuple(tool for part in parts for tool in part.tools)
    tasks = tuple(task for part in parts for task in part.tasks)
    for kind, ids in (("tool", [t.id for t in tools]), ("task", [t.id for t in tasks])):
        repeated = [key for key, n in Counter(ids).items() if n > 1]
        if repeated:
            raise ValueError(f"{name}: {kind} ids in more than one part {repeated[:5]}")

    def joined(values: list[str | None]) -> str | None:
        unique = list(dict.fromkeys(v for v in values if v))
        return " + ".join(unique) if unique else None

    sources = [part.source for part in parts]
    source = Source(
        repository=joined([s.repository for s in sources]),
        commit=joined([s.commit for s in sources]),
        paths=tuple(dict.fromkeys(path for s in sources for path in s.paths)),
        licence=joined([s.licence for s in sources]) or "",
    )
    return Catalogue(name=name, source=source, tools=tools, tasks=tasks)


def off_domain_tasks(directory: Path | None = None) -> tuple[Task, ...]:
    """Requests that need no tool from any catalogue (40 English, 10 French, 10 Chinese)."""
    path = _path(OFF_DOMAIN, directory)
    tasks = _tasks(_read(path)["tasks"], str(path))
    with_gold = [t.id for t in tasks if t.gold]
    if with_gold:
        raise ValueError(f"{path}: off-domain tasks with gold {with_gold[:5]}")
    return tasks


def main(argv: list[str] | None = None) -> int:
    directory = Path(argv[0]) if argv else None
    for name in [*catalogue_names(directory), *MERGED]:
        print(load_catalogue(name, directory).summary())
    off = off_domain_tasks(directory)
    print(f"{OFF_DOMAIN}: {len(off)} tasks {dict(Counter(t.language for t in off))}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
