"""The context statements as plain SQL (server/context/storage/rendered/, scripts/render-sql)
are what the code renders: a change to a statement or to the score shows there as a diff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from helpers.paths import ROOT

RENDERED = ROOT / "server" / "context" / "storage" / "rendered"


def test_the_committed_statements_are_what_the_code_renders(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "render-sql"), "--output", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    fresh = {p.name: p.read_text() for p in tmp_path.glob("*.sql")}
    committed = {p.name: p.read_text() for p in RENDERED.glob("*.sql")}
    assert len(fresh) == 30, sorted(fresh)
    assert sorted(committed) == sorted(fresh), "run scripts/render-sql"
    stale = [name for name in fresh if committed[name] != fresh[name]]
    assert not stale, f"run scripts/render-sql: {stale} changed"
