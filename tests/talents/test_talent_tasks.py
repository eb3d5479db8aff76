"""The labelled talent tasks (benchmarks/data/talent_tasks.json): counts, twins, gold talents
within the slice and within the real coding catalogue, and the loader's validation."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest
from helpers.paths import ROOT

REPO = ROOT
DATA = REPO.parent / "shared" / "data"
TASKS = REPO / "benchmarks" / "data" / "talent_tasks.json"


def _benchmark(name: str) -> ModuleType:
    """A module of benchmarks/, registered so that its dataclasses find it."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


talent_tasks = _benchmark("talent_tasks")


def test_the_task_file_has_english_and_french_twins_over_the_slice() -> None:
    data = talent_tasks.load_talent_tasks(TASKS)
    english, french = data.in_language("en"), data.in_language("fr")
    assert len(data.tasks) >= 60
    assert len(english) >= 36
    assert len(french) == len(english) == len(data.tasks) / 2
    for task in data.tasks:
        twin = data.twin_of(task)
        assert twin.twin == task.id and twin.lang != task.lang
        assert set(twin.gold) == set(task.gold)
        assert set(task.gold) <= set(data.catalogue_slice)
        assert 5 <= len(task.text.split()) <= 30, task.id
    two_gold = [task for task in english if len(task.gold) == 2]
    assert two_gold and len(two_gold) <= 0.2 * len(english)
    assert all(1 <= len(task.gold) <= 2 for task in data.tasks)
    for lang in ("en", "fr"):
        assert sum(task.lang == lang for task in data.off_domain) >= 10
    rules = [name for name in data.catalogue_slice if name.startswith("rules.")]
    skills = [name for name in data.catalogue_slice if name.startswith("skills.")]
    assert 40 <= len(rules) <= 60
    assert len(skills) == 12
    # Every skill is asked for by some task.
    assert set(skills) <= {name for task in data.tasks for name in task.gold}


def test_no_task_repeats_one_of_the_calibration_tasks() -> None:
    calibration = _benchmark("talent_calibration")
    written = {text.lower() for text, _ in calibration.CODING_TASKS}
    written |= {text.lower() for text in calibration.OFF_DOMAIN_TASKS}
    data = talent_tasks.load_talent_tasks(TASKS)
    assert not [t.id for t in (*data.tasks, *data.off_domain) if t.text.lower() in written]


@pytest.mark.skipif(not DATA.exists(), reason=f"evaluation data not found at {DATA}")
def test_the_slice_lies_in_the_real_coding_catalogue() -> None:
    calibration = _benchmark("talent_calibration")
    catalogue = {talent.id for talent in calibration.coding_catalogue(DATA)}
    data = talent_tasks.load_talent_tasks(TASKS)
    assert set(data.catalogue_slice) <= catalogue
    assert {name for name in catalogue if name.startswith("skills.")} <= set(data.catalogue_slice)
    gold = {name for task in data.tasks for name in task.gold}
    assert gold <= catalogue


def _write(tmp_path: Path, tasks: list[dict[str, object]]) -> Path:
    path = tmp_path / "tasks.json"
    document = {"catalogue_slice": ["rules.go", "rules.docker"], "tasks": tasks, "off_domain": []}
    path.write_text(json.dumps(document))
    return path


def _pair(
    gold_fr: list[str], lang_fr: str = "fr", twin_fr: str = "a-en"
) -> list[dict[str, object]]:
    return [
        {
            "id": "a-en",
            "twin": "a-fr",
            "lang": "en",
            "text": "Wrap Go errors",
            "gold": ["rules.go"],
        },
        {"id": "a-fr", "twin": twin_fr, "lang": lang_fr, "text": "Erreurs Go", "gold": gold_fr},
    ]


def test_the_loader_accepts_a_well_formed_pair(tmp_path: Path) -> None:
    data = talent_tasks.load_talent_tasks(_write(tmp_path, _pair(["rules.go"])))
    assert [task.id for task in data.in_language("fr")] == ["a-fr"]


@pytest.mark.parametrize(
    ("tasks", "message"),
    [
        (_pair(["rules.rust"]), "not in catalogue_slice"),
        (_pair(["rules.docker"]), "other gold talents"),
        (_pair(["rules.go"], lang_fr="en"), "also in en"),
        (_pair(["rules.go"], twin_fr="b-en"), "names b-en as its twin"),
        (_pair(["rules.go"])[:1], "twin a-fr is missing"),
        (_pair([]), "at least one gold talent"),
        (_pair(["rules.go"], lang_fr="de"), "is not one of"),
    ],
)
def test_the_loader_names_what_is_wrong(
    tmp_path: Path, tasks: list[dict[str, object]], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        talent_tasks.load_talent_tasks(_write(tmp_path, tasks))
