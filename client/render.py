"""Prompt blocks: a context packet's `<satchel_memory>` block, a talent selection's compiled
`<satchel_talents>` block. Nothing to say renders as the empty string, so a caller can always
write `prompt = render_packet(packet) + task`.
"""

from __future__ import annotations

from satchel.v1 import context_pb2, talent_pb2


def render_packet(packet: context_pb2.ContextPacket) -> str:
    """The packet's `<satchel_memory>` block for a prompt: the server renders it
    (`ContextPacket.block`: facts, episodes and notes, one per line) and, by default, keeps its
    tokens within the budget; "" when the packet serves nothing."""
    return packet.block


def render_talents(selection: talent_pb2.TalentSelection) -> str:
    """The compiled `<satchel_talents>` block of a selection; "" when nothing was selected."""
    if not selection.selected:
        return ""
    return selection.compiled.strip()
