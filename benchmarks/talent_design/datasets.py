"""Every evaluation set as (talents, tasks), in one shape, for probe.py.

- the catalogues of `benchmarks/data/catalogues/` (benchmarks/catalogues.py): a tool becomes a
  talent named by its name, tagged with its group, its description the summary, one line a
  parameter the body (so `full_text` is `Tool.text()`);
- MetaTool (../shared/data/metatool): 199 tools (summary = the description, no body), 1,000
  single-tool queries sampled as benchmarks/talent_calibration.py samples them (seed 7), the
  497 two-tool queries;
- the coding catalogue (12 Anthropic skills + 257 cursor rules, read as `satchel talents
  import` reads them) with the 25 coding tasks of talent_calibration.py;
- our own labelled set (benchmarks/data/talent_tasks.json): its 71-talent slice, the 66
  English tasks and their 66 French twins, and its 12 + 12 off-domain tasks;
- the 60 off-domain tasks of off_domain.json (evaluation only) and the shipped calibration
  tasks (server/talents/unrelated_tasks.json).

DEV / validation: a task is DEV when the first hex digit of sha1(task id) is even, on the DEV
catalogues only (MetaTool single and multi, seal_tools, acebench_en, coding, own English).
Every other task (the other half of those, and every task of toolbench, azure_mcp,
seal_tools_multi, acebench_zh, own French) is validation.
"""

from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = HERE.parent
sys.path.insert(0, str(BENCHMARKS))
sys.path.insert(0, str(HERE))

from ranking import TalentText  # noqa: E402

DATA = BENCHMARKS.parents[1] / "shared" / "data"
DEV_SETS = ("metatool", "metatool_multi", "seal_tools", "acebench_en", "coding", "own_en")


@dataclass(frozen=True)
class Task:
    id: str
    text: str
    gold: frozenset[str]
    language: str
    dev: bool = False


@dataclass(frozen=True)
class Dataset:
    name: str
    talents: tuple[TalentText, ...]
    tasks: tuple[Task, ...]
    catalogue: str  # datasets sharing a catalogue share its vectors and index

    @property
    def ids(self) -> list[str]:
        return [t.id for t in self.talents]


def is_dev(set_name: str, task_id: str) -> bool:
    if set_name not in DEV_SETS:
        return False
    return int(hashlib.sha1(task_id.encode()).hexdigest()[0], 16) % 2 == 0


def _tasks(set_name: str, rows: list[tuple[str, str, frozenset[str], str]]) -> tuple[Task, ...]:
    return tuple(Task(i, text, gold, lang, is_dev(set_name, i)) for i, text, gold, lang in rows)


def catalogue_set(name: str) -> Dataset:
    from catalogues import load_catalogue

    catalogue = load_catalogue(name)
    talents = tuple(
        TalentText(
            id=tool.id,
            name=tool.name,
            summary=tool.description,
            tags=(tool.group,) if tool.group else (),
            body="\n".join(line for line in tool.parameter_lines() if line.strip()),
        )
        for tool in catalogue.tools
    )
    rows = [(t.id, t.query, frozenset(t.gold), t.language) for t in catalogue.tasks]
    key = "seal_tools" if name == "seal_tools_multi" else name
    return Dataset(name, talents, _tasks(name, rows), key)


def metatool_talents() -> tuple[TalentText, ...]:
    tools = json.loads((DATA / "metatool" / "plugin_des.json").read_text())
    return tuple(TalentText(id=n, name=n, summary=d, body=d) for n, d in sorted(tools.items()))


def metatool_sets() -> list[Dataset]:
    from talent_calibration import metatool_multi, metatool_single

    talents = metatool_talents()
    single = [
        (f"ms{i}", q.task, q.gold, "en") for i, q in enumerate(metatool_single(DATA, 1000, 7))
    ]
    multi = [(f"mm{i}", q.task, q.gold, "en") for i, q in enumerate(metatool_multi(DATA))]
    return [
        Dataset("metatool", talents, _tasks("metatool", single), "metatool"),
        Dataset("metatool_multi", talents, _tasks("metatool_multi", multi), "metatool"),
    ]


def coding_talents() -> tuple[TalentText, ...]:
    """The coding catalogue with its fields (talent_calibration.coding_catalogue keeps only
    the joined text)."""
    from talent_calibration import _record, _yaml_value

    from satchel.server.commands.talents import talent_from_text

    root = Path("/catalogue")
    records = []
    skills = json.loads((DATA / "skills_catalogues" / "anthropic_skills_apache.json").read_text())
    for skill in skills["skills"]:
        description = _yaml_value(skill["description"])
        text = f"---\nname: {skill['name']}\ndescription: {description}\n---\n"
        path = root / "skills" / skill["name"] / "SKILL.md"
        records.append(_record(talent_from_text(text, path, root)))
    rules = json.loads((DATA / "skills_catalogues" / "awesome_cursorrules_rules.json").read_text())
    for rule in rules:
        text = (
            f"---\ndescription: {_yaml_value(rule['description'])}\nglobs: {rule['globs']}\n"
            f"alwaysApply: {rule['alwaysApply']}\n---\n{rule['body']}"
        )
        records.append(_record(talent_from_text(text, root / "rules" / f"{rule['id']}.mdc", root)))
    return tuple(
        TalentText(
            id=r.id,
            name=r.name,
            summary=r.summary,
            tags=tuple(dict.fromkeys((*r.tags, *r.triggers, *r.task_types))),
            body=r.body,
        )
        for r in sorted(records, key=lambda r: r.id)
    )


def coding_sets() -> list[Dataset]:
    from talent_calibration import CODING_TASKS
    from talent_tasks import load_talent_tasks

    coding = coding_talents()
    rows = [(f"c{i}", text, frozenset(gold), "en") for i, (text, gold) in enumerate(CODING_TASKS)]
    sets = [Dataset("coding", coding, _tasks("coding", rows), "coding")]
    own = load_talent_tasks()
    slice_ids = set(own.catalogue_slice)
    talents = tuple(t for t in coding if t.id in slice_ids)
    for lang in ("en", "fr"):
        rows = [(t.id, t.text, frozenset(t.gold), t.lang) for t in own.tasks if t.lang == lang]
        name = f"own_{lang}"
        sets.append(Dataset(name, talents, _tasks(name, rows), "own"))
    return sets


def own_off_domain() -> dict[str, list[Task]]:
    """Our own off-domain tasks (12 English, 12 French twins) and the coding script's 10."""
    from talent_calibration import OFF_DOMAIN_TASKS
    from talent_tasks import load_talent_tasks

    own = load_talent_tasks()
    result = {
        lang: [Task(t.id, t.text, frozenset(), t.lang) for t in own.off_domain if t.lang == lang]
        for lang in ("en", "fr")
    }
    result["coding"] = [
        Task(f"co{i}", t, frozenset(), "en") for i, t in enumerate(OFF_DOMAIN_TASKS)
    ]
    return result


def off_domain() -> list[Task]:
    from catalogues import off_domain_tasks

    return [Task(t.id, t.query, frozenset(), t.language) for t in off_domain_tasks()]


def chat_requests() -> list[Task]:
    """A second set of requests that need no tool, by other authors: MT-Bench's and
    Vicuna-bench's first turns (data/no_tool_requests/fastchat.json, Apache-2.0)."""
    path = BENCHMARKS / "data" / "no_tool_requests" / "fastchat.json"
    data = json.loads(path.read_text("utf-8"))
    return [Task(t["id"], t["text"], frozenset(), "en") for t in data["tasks"]]


def calibration() -> list[Task]:
    data = json.loads((BENCHMARKS.parent / "server" / "unrelated_tasks.json").read_text("utf-8"))
    return [Task(t["id"], t["text"], frozenset(), t["language"]) for t in data["tasks"]]


CATALOGUE_SETS = (
    "seal_tools",
    "seal_tools_multi",
    "toolbench",
    "azure_mcp",
    "acebench_en",
    "acebench_zh",
)


def all_sets() -> list[Dataset]:
    """Every labelled set; the merged ACEBench catalogue is built from its two halves."""
    sets = [*metatool_sets(), *coding_sets()]
    sets += [catalogue_set(name) for name in CATALOGUE_SETS]
    en, zh = (s for s in sets if s.name in ("acebench_en", "acebench_zh"))
    sets.append(
        Dataset("acebench_en+zh", en.talents + zh.talents, en.tasks + zh.tasks, "acebench_en+zh")
    )
    return sets
