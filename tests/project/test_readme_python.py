"""Every Python example of the README and of docs/ runs, as written, against the real server, in
a new project of its own, and serves what it promises: the five-minute tour's (README.md) and
the conversation walkthrough (docs/memory.md), and any block added later.

A ```python block is run unless the line right before its fence says why not:
`<!-- not run: REASON -->` (for fragments; keep them rare). A block that is run needs a check of
what it printed or returned (EXPECTED below): a new example without one fails here.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers.paths import ROOT

README_ADDRESS = "127.0.0.1:50051"
README_PROJECT = '"demo"'
NOT_RUN = re.compile(r"<!-- not run: (?P<reason>\S.*?) -->")
MAX_NOT_RUN = 2
MEMORY_OPEN, MEMORY_CLOSE = "<satchel_memory>", "</satchel_memory>"


@dataclass(frozen=True)
class Block:
    """A fenced code block of a page."""

    page: Path
    line: int  # the line of its opening fence, 1-based
    info: str  # the fence's info string: python, sh, …
    code: str
    before: str  # the line right before the fence

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def not_run(self) -> str | None:
        """Why the block is not run, when the line before its fence says so."""
        marked = NOT_RUN.fullmatch(self.before.strip())
        return marked["reason"] if marked else None


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def fenced_blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order."""
    blocks: list[Block] = []
    lines = page.read_text().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            code = "\n".join(lines[i + 1 : end]) + "\n"
            before = lines[i - 1] if i else ""
            blocks.append(Block(page, i + 1, lines[i][3:].strip(), code, before))
            i = end
        i += 1
    return blocks


def python_blocks() -> list[Block]:
    return [b for page in pages() for b in fenced_blocks(page) if b.info == "python"]


RUN = [b for b in python_blocks() if b.not_run is None]


def test_python_fences_say_python() -> None:
    """A block spelt ```py, ```python3 or ```pycon would escape the run below."""
    odd = [
        b.name
        for page in pages()
        for b in fenced_blocks(page)
        if b.info != "python" and re.match(r"py|.*python", b.info)
    ]
    assert not odd, odd


def test_blocks_not_run_are_marked_and_rare() -> None:
    skipped = [b for b in python_blocks() if b.not_run is not None]
    assert len(skipped) <= MAX_NOT_RUN, [b.name for b in skipped]
    markers = [
        (page.relative_to(ROOT), number)
        for page in pages()
        for number, line in enumerate(page.read_text().splitlines(), 1)
        if NOT_RUN.search(line)
    ]
    assert len(markers) == len(skipped), f"a marker not right before a ```python fence: {markers}"
    assert len(RUN) >= 2, [b.name for b in RUN]  # the README's and docs/memory.md's at least


def test_each_example_is_written_once() -> None:
    """A copy elsewhere would go untested: each example lives in one page only."""
    for containing in ("resolve_conflict", "stream_context"):
        holding = [b.name for b in python_blocks() if containing in b.code]
        assert len(holding) == 1, (containing, holding)


async def _run(code: str, address: str, project_id: str) -> tuple[dict[str, Any], list[str]]:
    """Execute a block (in a thread: the server shares this event loop) in a project of its
    own; its globals and the lines it printed."""
    code = code.replace(README_ADDRESS, address).replace(README_PROJECT, f'"{project_id}"')
    printed: list[str] = []

    def capture(*values: object) -> None:
        printed.extend(" ".join(map(str, values)).splitlines())

    namespace: dict[str, Any] = {"__name__": "readme_example", "print": capture}
    await asyncio.to_thread(exec, compile(code, "example", "exec"), namespace)
    return namespace, printed


def memory_blocks(printed: list[str]) -> list[list[str]]:
    """The `<satchel_memory>` blocks among printed lines, each as its lines."""
    blocks, current = [], None
    for line in printed:
        if line == MEMORY_OPEN:
            current = []
        elif line == MEMORY_CLOSE and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


SECTION_ENDS = ("Relevant past episodes:", "Notes:", MEMORY_CLOSE)


def served_facts(block: list[str]) -> list[str]:
    """The fact lines of a memory block, without their "- ", their notes in parentheses and
    the day headers above them."""
    if "Known facts:" not in block:
        return []
    facts = block[block.index("Known facts:") + 1 :]
    facts = facts[: next((i for i, f in enumerate(facts) if f in SECTION_ENDS), len(facts))]
    return [re.sub(r" \(.*\)$", "", f.removeprefix("- ")) for f in facts if f.startswith("- ")]


def check_sdk_tour(code: str, namespace: dict[str, Any], printed: list[str]) -> None:
    """README: the decisions, the block that serves the fact written, then the prompt."""
    wrote = "Maya lives in Porto"
    assert f'statement = "{wrote}"' in code
    first = printed.index(MEMORY_OPEN)
    decisions = printed[:first]
    assert decisions and all(line.startswith("DECISION_OUTCOME_") for line in decisions), printed
    assert f"DECISION_OUTCOME_INCLUDED relevance {wrote}" in decisions, decisions
    streamed, prompted = memory_blocks(printed)
    assert served_facts(streamed) == [wrote], streamed
    assert served_facts(prompted) == [wrote], prompted
    assert printed[-1] == "Where does Maya live?"  # the prompt ends with the task
    assert "prompt_for" in namespace


def check_conversation(code: str, namespace: dict[str, Any], printed: list[str]) -> None:
    """docs/memory.md: the scope now, as of before the resolution, and what is served."""
    assert namespace["now"] == ["Maya lives in Porto"]
    assert namespace["then"] == ["Maya lives in Lisbon", "Maya lives in Porto"]
    served = [fact.statement for fact in namespace["served"].facts]
    assert served == ["Maya lives in Porto"]
    assert printed == [str(namespace["now"]), str(namespace["then"]), str(served)]
    for line in printed:  # the comments beside the prints show what they print
        assert f"# {line}" in code, line


Check = Callable[[str, dict[str, Any], list[str]], None]
EXPECTED: dict[tuple[str, str], Check] = {
    ("README.md", "stream_context"): check_sdk_tour,
    ("docs/memory.md", "resolve_conflict"): check_conversation,
}
"""What each example must print or return, by its page and a word of its code."""


def check_of(block: Block) -> Check:
    checks = [
        check
        for (page, word), check in EXPECTED.items()
        if block.page == ROOT / page and word in block.code
    ]
    assert len(checks) == 1, f"{block.name}: add a check of what it serves to EXPECTED"
    return checks[0]


@pytest.mark.parametrize("block", RUN, ids=[b.name for b in RUN])
async def test_python_example_runs_and_serves_what_it_wrote(
    block: Block, address: str, project_id: str
) -> None:
    check = check_of(block)
    if "Client(" in block.code:  # it must talk to the test server, never to one on 50051
        assert README_ADDRESS in block.code and README_PROJECT in block.code, block.name
    namespace, printed = await _run(block.code, address, project_id)
    check(block.code, namespace, printed)
