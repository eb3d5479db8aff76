"""A bad configuration stops `satchel serve` with one clear line naming the variable (the real
CLI, as a subprocess); a mistyped SATCHEL_* variable is a warning naming the closest setting."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

SATCHEL = str(Path(sys.executable).parent / "satchel")


def serve(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    return subprocess.run(
        [SATCHEL, "serve"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, "SATCHEL_DATA_DIR": str(tmp_path), **env},
    )


def test_a_bad_value_is_one_line_naming_the_variable(tmp_path: Path) -> None:
    for name, raw in (
        ("SATCHEL_LISTEN", "127.0.0.1:99999"),
        ("SATCHEL_LISTEN", ":51110"),
        ("SATCHEL_LOG_LEVEL", "loud"),
        ("SATCHEL_WEIGHT_SIMILARITY", "nan"),
    ):
        result = serve(tmp_path, **{name: raw})
        assert result.returncode == 2, (name, raw, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and name in lines[0], result.stderr


def test_a_port_in_use_is_one_line_not_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = serve(tmp_path, SATCHEL_LISTEN=f"127.0.0.1:{port}", SATCHEL_WIEGHT_RECENCY="0")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    events = [json.loads(line) for line in result.stderr.splitlines()]
    failed = [e for e in events if e["event"] == "startup_failed"]
    assert len(failed) == 1
    assert f"SATCHEL_LISTEN 127.0.0.1:{port}: cannot listen there" in failed[0]["error"]
    (unknown,) = [e for e in events if e["event"] == "unknown_setting"]
    assert unknown["variable"] == "SATCHEL_WIEGHT_RECENCY"
    assert unknown["did_you_mean"] == "SATCHEL_WEIGHT_RECENCY"
