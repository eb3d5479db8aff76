"""The prompt blocks of the SDK: `render_packet` and `render_talents` (pure)."""

from __future__ import annotations

from datetime import UTC, datetime

from google.protobuf import timestamp_pb2

from satchel.client import render_packet, render_talents
from satchel.v1 import context_pb2, talent_pb2


def ts(text: str) -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(datetime.fromisoformat(text).replace(tzinfo=UTC))
    return stamp


def test_the_packet_block_is_what_the_server_rendered() -> None:
    block = "<satchel_memory>\nKnown facts:\n- Sky is blue\n</satchel_memory>"
    assert render_packet(context_pb2.ContextPacket(block=block)) == block
    assert render_packet(context_pb2.ContextPacket()) == ""


def test_talent_block_is_the_compiled_selection_or_empty() -> None:
    compiled = "<satchel_talents>\n## Docker rules\nPin base images.\n</satchel_talents>"
    selection = talent_pb2.TalentSelection(
        selected=[talent_pb2.SelectedTalent(talent_id="rules.docker", name="Docker rules")],
        compiled=compiled + "\n",
    )
    assert render_talents(selection) == compiled
    assert render_talents(talent_pb2.TalentSelection()) == ""
    out_of_domain = talent_pb2.TalentSelection(
        out_of_domain=True,
        compiled="<satchel_talents>\nNo specific talent for this task.\n</satchel_talents>",
    )
    assert render_talents(out_of_domain) == ""
