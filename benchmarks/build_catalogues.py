"""Regenerate the evaluation catalogues in `benchmarks/data/catalogues/` from public snapshots.

    .venv/bin/python benchmarks/build_catalogues.py [--mirror /work/.mirror] [--only NAME ...]

Each catalogue is read from a bare git snapshot of its public repository at a pinned commit
(`git --git-dir <mirror>/<owner>+<name>/repo show <commit>:<path>`); `--mirror` (or
SATCHEL_MIRROR) is the directory holding those snapshots, laid out as the session's `fetch`
tool lays them out. A plain `git clone` of the repository also works: pass its parent
directory with the clone at `<owner>+<name>/repo` (a `.git` directory or a bare clone).

The sources, licences and transformations are documented in
`benchmarks/data/catalogues/SOURCES.md`; `off_domain.json` is written by hand, not built here.
Every random choice uses `random.Random(SEED)`, so a rebuild gives the same files.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "data" / "catalogues"
DEFAULT_MIRROR = Path(os.environ.get("SATCHEL_MIRROR", "/work/.mirror"))
SEED = 7
MAX_TASKS = 1000

JSON = dict[str, Any]


@dataclass(frozen=True)
class Source:
    repository: str
    commit: str
    licence: str


SEAL_TOOLS = Source(
    "fairyshine/Seal-Tools", "ce753ecd60ed08dd376984035de531ab8421f1c6", "Apache-2.0"
)
STABLE_TOOLBENCH = Source(
    "THUNLP-MT/StableToolBench", "aa4ed9f4737ad98bd706663f01d63623c3427812", "Apache-2.0"
)
AZURE_MCP = Source("microsoft/mcp", "557fca14350b3e3ca8dc503fb149e092bb12d2d9", "MIT")
ACEBENCH = Source("ACEBench/ACEBench", "e6db74b735ead22c24f27367606a9408573b848f", "MIT")


class Mirror:
    """Reads files of pinned commits from bare git snapshots."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def git_dir(self, repository: str) -> Path:
        base = self.root / repository.replace("/", "+") / "repo"
        return base / ".git" if (base / ".git").is_dir() else base

    def read(self, source: Source, path: str) -> str:
        result = subprocess.run(
            [
                "git",
                "--git-dir",
                str(self.git_dir(source.repository)),
                "show",
                f"{source.commit}:{path}",
            ],
            capture_output=True,
            check=False,
        )
        if result.returncode != 0:
            raise SystemExit(
                f"cannot read {source.repository}@{source.commit[:10]}:{path}: "
                f"{result.stderr.decode(errors='replace').strip()}"
            )
        return result.stdout.decode("utf-8")

    def jsonl(self, source: Source, path: str) -> list[JSON]:
        return [json.loads(line) for line in self.read(source, path).splitlines() if line.strip()]


# --------------------------------------------------------------------------- helpers

_TYPES = {
    "str": "string",
    "string": "string",
    "int": "integer",
    "integer": "integer",
    "float": "number",
    "number": "number",
    "double": "number",
    "bool": "boolean",
    "boolean": "boolean",
    "list": "array",
    "array": "array",
    "dict": "object",
    "object": "object",
    "enum": "string",
    "date": "string",
    "time": "string",
}


def _json_type(name: object) -> str | None:
    return _TYPES.get(str(name).strip().lower().split("[")[0])


def _schema(properties: dict[str, JSON], required: Iterable[str]) -> JSON:
    required = [name for name in required if name in properties]
    schema: JSON = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text or "").strip()


def _norm(text: str) -> str:
    return _squash(text).casefold()


def _dedupe_tasks(tasks: list[JSON]) -> list[JSON]:
    """Drop repeated queries (same normalised text): their gold sets are merged."""
    by_query: dict[str, JSON] = {}
    for task in tasks:
        key = _norm(task["query"])
        if key in by_query:
            kept = by_query[key]
            kept["gold"] = sorted(set(kept["gold"]) | set(task["gold"]))
        else:
            by_query[key] = dict(task, gold=sorted(set(task["gold"])))
    return list(by_query.values())


def _sample(tasks: list[JSON], limit: int = MAX_TASKS) -> list[JSON]:
    if len(tasks) <= limit:
        return tasks
    chosen = sorted(random.Random(SEED).sample(range(len(tasks)), limit))
    return [tasks[i] for i in chosen]


def _catalogue(
    name: str, source: Source, paths: list[str], tools: list[JSON], tasks: list[JSON]
) -> JSON:
    ids = [tool["id"] for tool in tools]
    duplicated = [key for key, count in Counter(ids).items() if count > 1]
    if duplicated:
        raise SystemExit(f"{name}: duplicated tool ids {duplicated[:5]}")
    known = set(ids)
    kept = [t for t in tasks if t["gold"] and set(t["gold"]) <= known and t["query"].strip()]
    dropped = len(tasks) - len(kept)
    if dropped:
        print(f"  {name}: dropped {dropped} tasks whose gold is not in the catalogue")
    return {
        "name": name,
        "source": {
            "repository": source.repository,
            "commit": source.commit,
            "paths": paths,
            "licence": source.licence,
        },
        "tools": tools,
        "tasks": kept,
    }


# --------------------------------------------------------------------------- Seal-Tools

SEAL_TOOL_PATH = "Seal-Tools_Dataset/tool.jsonl"
SEAL_TASK_PATHS = [
    "Seal-Tools_Dataset/test_in_domain.jsonl",
    "Seal-Tools_Dataset/test_out_domain.jsonl",
    "Seal-Tools_Dataset/dev.jsonl",
]


def _seal_tools(mirror: Mirror) -> list[JSON]:
    tools = []
    for row in mirror.jsonl(SEAL_TOOLS, SEAL_TOOL_PATH):
        properties = {}
        for pname, spec in (row.get("parameters") or {}).items():
            prop: JSON = {"description": _squash(spec.get("description", ""))}
            json_type = _json_type(spec.get("type"))
            if json_type:
                prop["type"] = json_type
            properties[pname] = prop
        tools.append(
            {
                "id": row["api_name"],
                "name": row["api_name"],
                "description": _squash(row["api_description"]),
                "parameters": _schema(properties, row.get("required") or []),
                "group": row.get("field"),
                "language": "en",
            }
        )
    return tools


def _seal_tasks(mirror: Mirror, multi: bool) -> list[JSON]:
    tasks = []
    for path in SEAL_TASK_PATHS:
        for row in mirror.jsonl(SEAL_TOOLS, path):
            gold = sorted({call["api"] for call in row["calling"]})
            if (len(gold) > 1) != multi:
                continue
            tasks.append(
                {"id": row["id"], "query": _squash(row["query"]), "gold": gold, "language": "en"}
            )
    return tasks


def build_seal_tools(mirror: Mirror) -> JSON:
    tasks = _sample(_dedupe_tasks(_seal_tasks(mirror, multi=False)))
    return _catalogue(
        "seal_tools", SEAL_TOOLS, [SEAL_TOOL_PATH, *SEAL_TASK_PATHS], _seal_tools(mirror), tasks
    )


def build_seal_tools_multi(mirror: Mirror) -> JSON:
    tasks = _sample(_dedupe_tasks(_seal_tasks(mirror, multi=True)))
    return _catalogue(
        "seal_tools_multi",
        SEAL_TOOLS,
        [SEAL_TOOL_PATH, *SEAL_TASK_PATHS],
        _seal_tools(mirror),
        tasks,
    )


# --------------------------------------------------------------------------- ToolBench

TOOLBENCH_FILES = [
    "G1_instruction",
    "G1_category",
    "G1_tool",
    "G2_instruction",
    "G2_category",
    "G3_instruction",
]
TOOLBENCH_PATHS = [f"solvable_queries/test_instruction/{f}.json" for f in TOOLBENCH_FILES]


def _toolbench_param(spec: JSON) -> JSON:
    prop: JSON = {"description": _squash(str(spec.get("description") or ""))}
    json_type = _json_type(spec.get("type"))
    if json_type:
        prop["type"] = json_type
    return prop


def build_toolbench(mirror: Mirror) -> JSON:
    tools: dict[tuple[str, str], JSON] = {}
    tasks = []
    for group, path in zip(TOOLBENCH_FILES, TOOLBENCH_PATHS, strict=True):
        for row in json.loads(mirror.read(STABLE_TOOLBENCH, path)):
            for api in row["api_list"]:
                key = (api["tool_name"], api["api_name"])
                if key in tools:
                    continue
                required = [p for p in api.get("required_parameters") or [] if p.get("name")]
                optional = [p for p in api.get("optional_parameters") or [] if p.get("name")]
                properties = {p["name"]: _toolbench_param(p) for p in required + optional}
                tools[key] = {
                    "id": f"{api['tool_name']}/{api['api_name']}",
                    "name": api["api_name"],
                    "description": _squash(api.get("api_description") or ""),
                    "parameters": _schema(properties, [p["name"] for p in required]),
                    "group": api["tool_name"],
                    "language": "en",
                }
            gold = sorted({f"{tool}/{api}" for tool, api in row["relevant APIs"]})
            tasks.append(
                {
                    "id": f"{group}-{row['query_id']}",
                    "query": _squash(row["query"]),
                    "gold": gold,
                    "language": "en",
                }
            )
    return _catalogue(
        "toolbench",
        STABLE_TOOLBENCH,
        TOOLBENCH_PATHS,
        list(tools.values()),
        _sample(_dedupe_tasks(tasks)),
    )


# --------------------------------------------------------------------------- Azure MCP

AZURE_COMMANDS = "servers/Azure.Mcp.Server/docs/azmcp-commands.md"
AZURE_PROMPTS = "servers/Azure.Mcp.Server/docs/e2eTestPrompts.md"
_ANNOTATION = re.compile(r"Destructive\s*\|.*Idempotent")
_OPTION = re.compile(r"(\[)?--([a-z0-9][a-z0-9-]*)(?:\s+<([^>]*)>)?")


def _azure_tools(text: str) -> list[JSON]:
    """Each `azmcp <words> --options` command of the reference with the `# ...` lines just
    above it as its description (the annotation line dropped), under its `### ...` section."""
    tools: dict[str, JSON] = {}
    section = None
    in_code = False
    comments: list[str] = []
    shared: list[str] = []  # a description written once above several adjacent commands
    lines = text.split("## Available Commands", 1)[1].splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].rstrip()
        i += 1
        if line.startswith("```"):
            in_code = not in_code
            comments, shared = [], []
            continue
        if not in_code:
            if line.startswith("### "):
                section = re.sub(r"\s+Operations$", "", line[4:].strip())
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            comment = stripped.lstrip("#").strip()
            if comment and not _ANNOTATION.search(comment):
                comments.append(comment)
            continue
        if not stripped.startswith("azmcp "):
            comments, shared = [], []
            continue
        comments = comments or shared
        command = stripped
        while command.endswith("\\") and i < len(lines):
            command = command[:-1] + " " + lines[i].strip()
            i += 1
        words = []
        for word in command.split()[1:]:
            if word.startswith(("-", "[", "<", "|")):
                break
            words.append(word)
        name = "_".join(words)
        if name and name not in tools and comments and section and section != "Server":
            properties: JSON = {}
            required = []
            for optional, option, placeholder in _OPTION.findall(command):
                pname = option.replace("-", "_")
                if pname in properties:
                    continue
                prop: JSON = {"type": "string"}
                if placeholder and "|" in placeholder:
                    prop["enum"] = [v.strip() for v in placeholder.split("|") if v.strip()]
                properties[pname] = prop
                if not optional:
                    required.append(pname)
            tools[name] = {
                "id": name,
                "name": name,
                "description": " ".join(comments),
                "parameters": _schema(properties, required) if properties else None,
                "group": section,
                "language": "en",
            }
        comments, shared = [], comments
    return list(tools.values())


def _azure_prompts(text: str) -> list[JSON]:
    tasks = []
    section = None
    for line in text.splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
            continue
        if not line.startswith("| ") or section is None:
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if len(cells) < 2 or cells[0] in ("Tool Name", "") or set(cells[0]) <= set(":-"):
            continue
        tool, prompt = cells[0], cells[1].replace("\\|", "|")
        interaction = cells[2] if len(cells) > 2 else "none"
        tasks.append({"tool": tool, "prompt": prompt, "interaction": interaction})
    return tasks


def build_azure_mcp(mirror: Mirror) -> JSON:
    tools = _azure_tools(mirror.read(AZURE_MCP, AZURE_COMMANDS))
    rows = _azure_prompts(mirror.read(AZURE_MCP, AZURE_PROMPTS))
    # the prompts spell some tool names with `_` where the reference has `-` (and back)
    by_key = {tool["id"].replace("-", "_"): tool["id"] for tool in tools}
    tasks = [
        {
            "id": f"e2e-{n}",
            "query": _squash(row["prompt"]),
            "gold": [by_key.get(row["tool"].replace("-", "_"), row["tool"])],
            "language": "en",
        }
        for n, row in enumerate(rows)
        # prompts whose routing the maintainers flag as unsettled are left out
        if row["interaction"] != "investigation-required"
    ]
    return _catalogue(
        "azure_mcp",
        AZURE_MCP,
        [AZURE_COMMANDS, AZURE_PROMPTS],
        tools,
        _sample(_dedupe_tasks(tasks)),
    )


# --------------------------------------------------------------------------- ACEBench

ACE_CATEGORIES = [
    "normal_single_turn_single_function",
    "normal_single_turn_parallel_function",
    "normal_similar_api",
    "normal_preference",
    "normal_atom_bool",
    "normal_atom_enum",
    "normal_atom_list",
    "normal_atom_number",
    "normal_atom_object_deep",
    "normal_atom_object_short",
]
SCHEMA_KEYS = ("parameters", "arguments", "_arguments")


def _ace_paths(lang: str, category: str) -> tuple[str, str]:
    base = f"data_all/data_{lang}"
    return f"{base}/data_{category}.json", f"{base}/possible_answer/data_{category}.json"


def _ace_query(question: str) -> str:
    """The user's turns of the question (a clarifying `system:` turn dropped)."""
    turns = re.split(r"(?m)^(user|system):\s*", question)
    said = [turns[i + 1] for i in range(1, len(turns) - 1, 2) if turns[i] == "user"]
    return _squash(" ".join(said) if said else question)


def _ace_gold_names(ground_truth: object) -> list[str]:
    items = ground_truth if isinstance(ground_truth, list) else [ground_truth]
    return [name for item in items if isinstance(item, dict) for name in item]


def build_acebench(mirror: Mirror, lang: str) -> JSON:
    """One language of ACEBench: the union of the candidate functions of its samples, and each
    sample's user turns with the functions its ground truth calls."""
    tools: dict[str, JSON] = {}
    variants: dict[tuple[str, str], dict[str, str]] = defaultdict(dict)  # (lang, name) -> def
    tasks = []
    paths = []
    for category in ACE_CATEGORIES:
        data_path, answer_path = _ace_paths(lang, category)
        paths += [data_path, answer_path]
        answers = {row["id"]: row for row in mirror.jsonl(ACEBENCH, answer_path)}
        for row in mirror.jsonl(ACEBENCH, data_path):
            local: dict[str, str] = {}
            for function in row.get("function") or []:
                # the schema is under "parameters", or "arguments" (or "_arguments")
                schema = next(
                    (function[k] for k in SCHEMA_KEYS if isinstance(function.get(k), dict)),
                    None,
                )
                body = json.dumps(
                    {"description": function.get("description"), "parameters": schema},
                    sort_keys=True,
                    ensure_ascii=False,
                )
                seen = variants[(lang, function["name"])]
                if body not in seen:
                    suffix = "" if not seen else f"~{len(seen) + 1}"
                    seen[body] = f"{lang}.{function['name']}{suffix}"
                    tools[seen[body]] = {
                        "id": seen[body],
                        "name": function["name"],
                        "description": _squash(function.get("description") or ""),
                        "parameters": schema,
                        "group": None,
                        "language": lang,
                    }
                local[function["name"]] = seen[body]
            answer = answers.get(row["id"])
            if answer is None:
                continue
            gold = set()
            for name in _ace_gold_names(answer["ground_truth"]):
                base = name if name in local else re.sub(r"_\d+$", "", name)
                gold.add(local.get(base, f"{lang}.?{name}"))
            tasks.append(
                {
                    "id": f"{lang}-{row['id']}",
                    "query": _ace_query(row["question"]),
                    "gold": sorted(gold),
                    "language": lang,
                }
            )
    return _catalogue(
        f"acebench_{lang}", ACEBENCH, paths, list(tools.values()), _dedupe_tasks(tasks)
    )


# --------------------------------------------------------------------------- output

BUILDERS: dict[str, Callable[[Mirror], JSON]] = {
    "seal_tools": build_seal_tools,
    "seal_tools_multi": build_seal_tools_multi,
    "toolbench": build_toolbench,
    "azure_mcp": build_azure_mcp,
    # two files, one a language (together over 3 MB); `catalogues.load_catalogue(
    # "acebench_en+acebench_zh")` merges them into the mixed English / Chinese catalogue
    "acebench_en": lambda mirror: build_acebench(mirror, "en"),
    "acebench_zh": lambda mirror: build_acebench(mirror, "zh"),
}


def dump(catalogue: JSON) -> str:
    """One tool or task a line: small, and diffs stay readable."""

    def line(value: object) -> str:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

    head = {k: catalogue[k] for k in ("name", "source")}
    parts = ["{", f'"name":{line(head["name"])},', f'"source":{line(head["source"])},']
    for key in ("tools", "tasks"):
        items = catalogue[key]
        parts.append(f'"{key}":[')
        parts += [line(item) + ("," if n < len(items) - 1 else "") for n, item in enumerate(items)]
        parts.append("]," if key == "tools" else "]")
    parts.append("}")
    return "\n".join(parts) + "\n"


def summary(catalogue: JSON) -> str:
    tasks = catalogue["tasks"]
    gold = sum(len(t["gold"]) for t in tasks) / max(len(tasks), 1)
    tool_langs = Counter(t["language"] for t in catalogue["tools"])
    task_langs = Counter(t["language"] for t in tasks)
    groups = len({t["group"] for t in catalogue["tools"] if t["group"]})
    return (
        f"{catalogue['name']}: {len(catalogue['tools'])} tools ({dict(tool_langs)}, "
        f"{groups} groups), {len(tasks)} tasks ({dict(task_langs)}), mean gold {gold:.2f}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mirror", type=Path, default=DEFAULT_MIRROR)
    parser.add_argument("--only", nargs="*", choices=sorted(BUILDERS))
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    mirror = Mirror(args.mirror)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or BUILDERS:
        catalogue = BUILDERS[name](mirror)
        path = args.out / f"{name}.json.gz"
        text = dump(catalogue)
        with path.open("wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as packed:
            packed.write(text.encode("utf-8"))  # mtime 0: the same bytes on every build
        print(f"{summary(catalogue)}; {len(text.encode()) / 1e6:.2f} MB -> {path.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
