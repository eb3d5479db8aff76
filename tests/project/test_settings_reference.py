"""The settings reference and the pages that name settings: docs/settings.md is what
scripts/settings-reference writes from server/platform/config.py, every variable satchel reads
is described there, the README and docs/ name no SATCHEL_* variable satchel does not read, and
their relative links reach a file (and the heading they name)."""

from __future__ import annotations

import re
import subprocess
import sys
from functools import cache
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType

from helpers.paths import ROOT

from satchel.server.platform.config import known_variables

GENERATOR = ROOT / "scripts" / "settings-reference"
PAGE = ROOT / "docs" / "settings.md"
NOT_SETTINGS = {
    "SATCHEL_TEST_DATABASE_URL": "read by the test suite (tests/conftest.py), not by satchel",
    "SATCHEL_WIEGHT_RECENCY": "the misspelling the unknown-variable warning is shown with",
}
"""SATCHEL_* names the pages may mention although satchel does not read them, and why."""

VARIABLE = re.compile(r"SATCHEL_[A-Z0-9_]*[A-Z0-9]")
SHORTHAND = re.compile(r"`(_[A-Z0-9_]*[A-Z0-9])`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", flags=re.S | re.M)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@cache
def generator() -> ModuleType:
    """scripts/settings-reference as a module (it has no .py suffix)."""
    loader = SourceFileLoader("settings_reference", str(GENERATOR))
    spec = spec_from_loader(loader.name, loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_page_is_the_generator_output() -> None:
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--stdout"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert PAGE.read_text() == result.stdout, (
        "docs/settings.md is stale: run scripts/settings-reference"
    )


def test_every_variable_is_described_and_listed() -> None:
    descriptions = generator().descriptions()
    assert set(descriptions) == known_variables()
    undocumented = sorted(name for name, text in descriptions.items() if not text.strip())
    assert not undocumented, f"no `#:` comment in server/platform/config.py: {undocumented}"
    listed = re.findall(
        r"^\| `(SATCHEL_[A-Z0-9_]+)` \| .+ \| .+ \| (.+) \|$", PAGE.read_text(), re.M
    )
    assert sorted(name for name, _ in listed) == sorted(known_variables())
    assert all(meaning.strip() for _, meaning in listed)


def test_the_pages_name_only_variables_satchel_reads() -> None:
    """A typo, a removed setting or a shorthand (`SATCHEL_WEIGHT_*`, `_TEXT_RANK`) fails: write
    each name out in full so that this check can read it."""
    known = known_variables()
    wrong = []
    for page in pages():
        text = page.read_text()
        where = page.relative_to(ROOT)
        wrong += [
            (where, n) for n in VARIABLE.findall(text) if n not in known | NOT_SETTINGS.keys()
        ]
        wrong += [
            (where, short)
            for short in SHORTHAND.findall(text)
            if any(name.endswith(short) for name in known)
        ]
    assert not wrong, sorted(set(wrong))


def test_a_misspelt_variable_would_be_caught() -> None:
    assert "SATCHEL_WEIGHT" not in known_variables()
    assert VARIABLE.findall("`SATCHEL_WEIGHT_*`") == ["SATCHEL_WEIGHT"]
    assert SHORTHAND.findall("`SATCHEL_WEIGHT_SIMILARITY` / `_TEXT_RANK`") == ["_TEXT_RANK"]


def headings(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings (a repeated one gets -1, -2, ...)."""
    anchors: set[str] = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        if line.startswith("#"):
            anchor = generator().slug(line.lstrip("#"))
            count = 0
            while (anchor if not count else f"{anchor}-{count}") in anchors:
                count += 1
            anchors.add(anchor if not count else f"{anchor}-{count}")
    return anchors


def test_relative_links_reach_their_file_and_heading() -> None:
    broken = []
    for page in pages():
        for target in LINK.findall(FENCE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append((page.relative_to(ROOT), target, "no such file"))
            elif anchor and linked.suffix == ".md" and anchor not in headings(linked):
                broken.append((page.relative_to(ROOT), target, "no such heading"))
    assert not broken, broken
