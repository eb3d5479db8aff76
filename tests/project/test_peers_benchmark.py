"""benchmarks/peers/run.py in the project's own environment (the peers' libraries are not
installed here): the references run under satchel's rules, each peer is reported as not
installed, and a satchel evaluation report becomes the first row."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

RUN = ROOT / "benchmarks" / "peers" / "run.py"


@pytest.mark.parametrize(
    ("server", "where"),
    [("127.0.0.1:50123", "server process"), ("in-process", "server in the harness process")],
)
def test_the_peer_comparison_runs_its_references_and_reports_missing_peers(
    tmp_path: Path, server: str, where: str
) -> None:
    report = {
        "run": {"timings_s": {"load_s": 1.5}},
        "settings": {"server": server},
        "evidence": {
            "original": {
                "satchel": {
                    "overall": {"evidence_recall": 0.81, "all_evidence_covered": 0.83,
                                "latency_p50_ms": 25.0},
                    "adversarial": {"evidence_recall": 0.94},
                }
            }
        },
    }  # fmt: skip
    satchel_json = tmp_path / "satchel.json"
    satchel_json.write_text(json.dumps(report))
    args = ["--conversations", "conv-30", "--limit-questions", "5", "--satchel", str(satchel_json)]
    done = subprocess.run(
        [sys.executable, str(RUN), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    systems = json.loads(done.stdout)["systems"]
    assert (
        next(iter(systems)) == "satchel"
        and systems["satchel"]["overall"]["evidence_recall"] == 0.81
    )
    for reference in ("vector", "bm25"):
        assert systems[reference]["status"] == "ok"
        assert 0 < systems[reference]["overall"]["evidence_recall"] <= 1
        assert systems[reference]["overall"]["mean_tokens"] <= 900
    for peer in ("langchain", "langchain-stemmed", "txtai", "mem0"):
        assert systems[peer]["status"].startswith("not installed"), systems[peer]
    table = subprocess.run(
        [sys.executable, str(RUN), *args], capture_output=True, text=True, timeout=300, cwd=ROOT
    ).stdout
    row = f"| satchel (AssembleContext over gRPC, defaults; {where}) | 81.0 % | 83.0 % | 94.0 % |"
    assert row in table
