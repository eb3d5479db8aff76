"""The Python examples of the README and of docs/ run, as written, against the real server:
the five-minute tour's (README.md) and the conversation walkthrough (docs/memory.md)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from helpers.paths import ROOT

README_ADDRESS = "127.0.0.1:50051"


def python_block(page: str, containing: str) -> str:
    """The Python block of a page (relative to the repository) that mentions `containing`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


def test_each_example_is_written_once() -> None:
    """A copy elsewhere would go untested: each example lives in one page only."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    for containing in ("resolve_conflict", "stream_context"):
        holding = [
            page.relative_to(ROOT)
            for page in pages
            for block in re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
            if containing in block
        ]
        assert len(holding) == 1, (containing, holding)


async def _run(block: str, address: str, project_id: str) -> tuple[dict[str, Any], list[str]]:
    """Execute a block (its blocking client in a thread: the server shares this event loop)
    in a project of its own; its globals and the lines it printed."""
    code = block.replace(README_ADDRESS, address).replace('"demo"', f'"{project_id}"')
    printed: list[str] = []

    def capture(*values: object) -> None:
        printed.extend(" ".join(map(str, values)).splitlines())

    namespace: dict[str, Any] = {"__name__": "readme_example", "print": capture}
    await asyncio.to_thread(exec, compile(code, "example", "exec"), namespace)
    return namespace, printed


async def test_conversation_walkthrough_lists_the_scope_now_and_as_of_before(
    address: str, project_id: str
) -> None:
    block = python_block("docs/memory.md", "resolve_conflict")
    namespace, printed = await _run(block, address, project_id)
    assert namespace["now"] == ["home city: Porto"]
    assert namespace["then"] == ["home city: Lisbon", "home city: Porto"]
    assert printed == [str(namespace["now"]), str(namespace["then"])]


async def test_sdk_example_streams_decisions_then_the_packet(address: str, project_id: str) -> None:
    block = python_block("README.md", "stream_context")
    namespace, printed = await _run(block, address, project_id)
    packet_starts = printed.index("<satchel_memory>")
    decisions = printed[:packet_starts]  # outcome (1 included, 2 excluded, 3 blocked), reason
    assert decisions and all(line.split()[0] in {"1", "2", "3"} for line in decisions)
    assert any("Porto" in line for line in printed[packet_starts:])

    prompt = await namespace["prompt_for"]("Where does Maya live?")
    assert "<satchel_memory>" in prompt and "Porto" in prompt
    assert prompt.endswith("Where does Maya live?")
