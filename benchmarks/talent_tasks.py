"""Satchel's own labelled talent-selection tasks: English tasks with their French twins.

`data/talent_tasks.json` (issue 17, point 1) holds, over a slice of the coding catalogue that
`talent_calibration.coding_catalogue` builds from `../shared/data/skills_catalogues` (the 12
Anthropic skills and some of the cursor rules):

- `catalogue_slice`: the talent ids of the slice (`skills.<name>`, `rules.<id>`);
- `tasks`: requests to a coding agent, each with its gold talent ids (one, or two for a few)
  and a twin, the same request in the other language (`en` / `fr`) with the same gold;
- `off_domain`: requests unrelated to coding, paired the same way, that should select nothing.

    .venv/bin/python benchmarks/talent_tasks.py [path]   # prints the counts

`load_talent_tasks` validates the file and raises ValueError on the first problem found.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

DEFAULT_PATH = Path(__file__).resolve().parent / "data" / "talent_tasks.json"
LANGUAGES = ("en", "fr")


@dataclass(frozen=True)
class TalentTask:
    """One request, its language, its twin's id and its gold talent ids (empty: off-domain)."""

    id: str
    twin: str
    lang: str
    text: str
    gold: tuple[str, ...]


@dataclass(frozen=True)
class TalentTaskSet:
    """The slice of the catalogue, the labelled tasks and the off-domain tasks."""

    catalogue_slice: tuple[str, ...]
    tasks: tuple[TalentTask, ...]
    off_domain: tuple[TalentTask, ...]

    def in_language(self, lang: str) -> list[TalentTask]:
        """The labelled tasks written in `lang`."""
        return [task for task in self.tasks if task.lang == lang]

    def twin_of(self, task: TalentTask) -> TalentTask:
        """The same request in the other language."""
        for other in (*self.tasks, *self.off_domain):
            if other.id == task.twin:
                return other
        raise KeyError(task.twin)


def load_talent_tasks(path: Path = DEFAULT_PATH) -> TalentTaskSet:
    """Read and validate the task file; ValueError names the first problem."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON: {error}") from error
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: the top level must be an object")
    for key in ("catalogue_slice", "tasks", "off_domain"):
        if not isinstance(raw.get(key), list):
            raise ValueError(f"{path}: '{key}' must be a list")
    talents = tuple(raw["catalogue_slice"])
    if not all(isinstance(name, str) and name for name in talents):
        raise ValueError(f"{path}: catalogue_slice must hold non-empty strings")
    repeated = sorted(name for name, n in Counter(talents).items() if n > 1)
    if repeated:
        raise ValueError(f"{path}: catalogue_slice repeats {', '.join(repeated)}")
    tasks = tuple(_task(item, "tasks", labelled=True) for item in raw["tasks"])
    off_domain = tuple(_task(item, "off_domain", labelled=False) for item in raw["off_domain"])
    _check_ids(tasks + off_domain)
    known = set(talents)
    for task in tasks:
        unknown = [name for name in task.gold if name not in known]
        if unknown:
            raise ValueError(f"task {task.id}: gold {', '.join(unknown)} not in catalogue_slice")
    _check_twins(tasks)
    _check_twins(off_domain)
    return TalentTaskSet(catalogue_slice=talents, tasks=tasks, off_domain=off_domain)


def _task(item: object, section: str, *, labelled: bool) -> TalentTask:
    if not isinstance(item, dict):
        raise ValueError(f"{section}: every entry must be an object, got {item!r}")
    where = f"{section} entry {item.get('id', '?')!r}"
    for key in ("id", "twin", "lang", "text"):
        if not isinstance(item.get(key), str) or not item[key].strip():
            raise ValueError(f"{where}: '{key}' must be a non-empty string")
    if item["lang"] not in LANGUAGES:
        raise ValueError(f"{where}: lang {item['lang']!r} is not one of {LANGUAGES}")
    gold = item.get("gold", [])
    if not isinstance(gold, list) or not all(isinstance(name, str) for name in gold):
        raise ValueError(f"{where}: 'gold' must be a list of talent names")
    if labelled and not gold:
        raise ValueError(f"{where}: a labelled task needs at least one gold talent")
    if not labelled and gold:
        raise ValueError(f"{where}: an off-domain task has no gold talent")
    if len(set(gold)) != len(gold):
        raise ValueError(f"{where}: gold repeats a talent")
    return TalentTask(
        id=item["id"], twin=item["twin"], lang=item["lang"], text=item["text"], gold=tuple(gold)
    )


def _check_ids(tasks: tuple[TalentTask, ...]) -> None:
    repeated = sorted(task_id for task_id, n in Counter(t.id for t in tasks).items() if n > 1)
    if repeated:
        raise ValueError(f"task ids used more than once: {', '.join(repeated)}")


def _check_twins(tasks: tuple[TalentTask, ...]) -> None:
    by_id = {task.id: task for task in tasks}
    for task in tasks:
        twin = by_id.get(task.twin)
        if twin is None:
            raise ValueError(f"task {task.id}: its twin {task.twin} is missing")
        if twin.twin != task.id:
            raise ValueError(f"task {task.id}: its twin {twin.id} names {twin.twin} as its twin")
        if twin.lang == task.lang:
            raise ValueError(f"task {task.id}: its twin {twin.id} is also in {task.lang}")
        if set(twin.gold) != set(task.gold):
            raise ValueError(f"task {task.id}: its twin {twin.id} has other gold talents")


def main(argv: list[str] | None = None) -> int:
    """Print the counts of a task file."""
    args = sys.argv[1:] if argv is None else argv
    data = load_talent_tasks(Path(args[0]) if args else DEFAULT_PATH)
    gold = {name for task in data.tasks for name in task.gold}
    for lang in LANGUAGES:
        tasks = data.in_language(lang)
        pairs = sum(len(task.gold) > 1 for task in tasks)
        off = sum(task.lang == lang for task in data.off_domain)
        print(f"{lang}: {len(tasks)} tasks ({pairs} with two gold talents), {off} off-domain")
    print(f"slice: {len(data.catalogue_slice)} talents, {len(gold)} of them gold for some task")
    return 0


if __name__ == "__main__":
    sys.exit(main())
