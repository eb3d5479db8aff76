"""The README's Python examples run, as written, against the real server."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
README_ADDRESS = "127.0.0.1:50051"


def readme_python_block(containing: str) -> str:
    """The README's Python block that mentions `containing`."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
    (block,) = [b for b in blocks if containing in b]
    return block


async def _run(block: str, address: str, project_id: str) -> tuple[dict[str, Any], list[str]]:
    """Execute a block (its blocking client in a thread: the server shares this event loop)
    in a project of its own; its globals and the lines it printed."""
    code = block.replace(README_ADDRESS, address).replace('"demo"', f'"{project_id}"')
    printed: list[str] = []

    def capture(*values: object) -> None:
        printed.extend(" ".join(map(str, values)).splitlines())

    namespace: dict[str, Any] = {"__name__": "readme_example", "print": capture}
    await asyncio.to_thread(exec, compile(code, "README.md", "exec"), namespace)
    return namespace, printed


async def test_conversation_walkthrough_lists_the_scope_now_and_as_of_before(
    address: str, project_id: str
) -> None:
    namespace, printed = await _run(readme_python_block("resolve_conflict"), address, project_id)
    assert namespace["now"] == ["home city: Porto"]
    assert namespace["then"] == ["home city: Lisbon", "home city: Porto"]
    assert printed == [str(namespace["now"]), str(namespace["then"])]


async def test_sdk_example_streams_decisions_then_the_packet(address: str, project_id: str) -> None:
    namespace, printed = await _run(readme_python_block("stream_context"), address, project_id)
    packet_starts = printed.index("<satchel_memory>")
    decisions = printed[:packet_starts]  # outcome (1 included, 2 excluded, 3 blocked), reason
    assert decisions and all(line.split()[0] in {"1", "2", "3"} for line in decisions)
    assert any("Porto" in line for line in printed[packet_starts:])

    prompt = await namespace["prompt_for"]("Where does Maya live?")
    assert "<satchel_memory>" in prompt and "Porto" in prompt
    assert prompt.endswith("Where does Maya live?")
