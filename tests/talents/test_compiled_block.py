"""The compiled talent block: one heading per talent, the body's own title not repeated."""

from __future__ import annotations

from satchel.server.talents.domain.selection import ScorableTalent
from satchel.server.talents.service import render_compiled


def talent(name: str, body: str) -> ScorableTalent:
    return ScorableTalent(
        id=name.lower(), name=name, text=name, stems=frozenset(), tokens=9, body=body
    )


def test_a_body_titled_with_the_talent_name_is_headed_once() -> None:
    block = render_compiled(
        [
            talent("PDF Processing", "# PDF processing\n\nUse pypdf to merge files."),
            talent("Hexagonal", "## Hexagonal architecture\nKeep the domain pure."),
        ],
        out_of_domain=False,
    )
    assert block.splitlines() == [
        "<satchel_talents>",
        "## PDF Processing",
        "Use pypdf to merge files.",
        "",
        "## Hexagonal",
        "## Hexagonal architecture",  # another title: the body's own, kept
        "Keep the domain pure.",
        "</satchel_talents>",
    ]
