"""The Go module (clients/go): its path is <repository path>/clients/go (a placeholder prefix
until a release sets it), its committed stubs are current, and the example built by
clients/go/build (Debian's Go in GOPATH mode, nothing downloaded) runs against the real server;
clients/go/set-module-path gives the module another path that builds as well.

clients/go/build --install installs Go and Debian's Go packages with apt-get when they are
missing; the tests that need them are skipped only when that cannot be done on this machine.
"""

from __future__ import annotations

import asyncio
import filecmp
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.paths import ROOT

GO = ROOT / "clients" / "go"
BIN = Path(sys.executable).parent
STUBS = GO / "satchel" / "v1"
PLACEHOLDER = "example.com/"


def _module_path(folder: Path = GO) -> str:
    (path,) = re.findall(r"^module (\S+)$", (folder / "go.mod").read_text(), re.M)
    return path


def _build(folder: Path, gocache: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(folder / "build"), "--install"],
        env={**os.environ, "GOCACHE": str(gocache)},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="session")
def gocache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One build cache for the builds of a session (grpc-go compiles once)."""
    return tmp_path_factory.mktemp("gocache")


@pytest.fixture(scope="session")
async def go_example(gocache: Path) -> Path:
    """clients/go/build's example binary (skipped only where Go cannot be installed)."""
    result = await asyncio.to_thread(_build, GO, gocache)
    if result.returncode == 2:
        pytest.skip(f"no Go toolchain on this machine: {result.stderr.strip()}")
    assert result.returncode == 0, f"clients/go/build:\n{result.stdout}\n{result.stderr}"
    return GO / "bin" / "satchel-go-example"


def test_go_module_path_is_where_the_module_lives() -> None:
    """`go get` finds a module in a subdirectory by <repository path>/<subdirectory>: the path
    ends in /clients/go, and the generator options and the imports follow go.mod."""
    module = _module_path()
    assert module.endswith("/clients/go") and re.fullmatch(
        r"[a-z0-9.-]+\.[a-z]+(/[\w.~-]+)+", module
    )
    if module.startswith(PLACEHOLDER):  # not yet set: it must say so where a reader looks
        assert "set-module-path" in (GO / "go.mod").read_text()
        assert "placeholder" in (GO / "README.md").read_text()
    template = (GO / "buf.gen.yaml").read_text()
    assert re.findall(r"- module=(\S+)", template) == [module, module]
    mapped = re.findall(r"- Msatchel/v1/(\w+)\.proto=(\S+)", template)
    protos = sorted(p.stem for p in (ROOT / "proto" / "satchel" / "v1").glob("*.proto"))
    assert sorted(mapped) == sorted([(p, f"{module}/satchel/v1;satchelv1") for p in protos] * 2)
    assert sorted(p.name for p in STUBS.glob("*.go")) == sorted(
        f"{p}{suffix}" for p in protos for suffix in (".pb.go", "_grpc.pb.go")
    ), "the stubs are committed, so that `go get` needs no generator"
    imports = set()
    for source in GO.rglob("*.go"):
        imports |= set(re.findall(r'"([^"]+/satchel/v1)"', source.read_text()))
    assert imports == {f"{module}/satchel/v1"}


async def test_go_stubs_are_reproducible_from_proto(go_example: Path, tmp_path: Path) -> None:
    for plugin in ("protoc-gen-go", "protoc-gen-go-grpc"):
        assert shutil.which(plugin), f"clients/go/build --install installs {plugin}"
    await asyncio.to_thread(
        subprocess.run,
        [str(BIN / "buf"), "generate", "--template", "clients/go/buf.gen.yaml", "-o", tmp_path],
        cwd=ROOT,
        check=True,
        timeout=300,
    )
    fresh = tmp_path / "clients" / "go" / "satchel" / "v1"
    names = sorted(p.name for p in fresh.glob("*.go"))
    assert names == sorted(p.name for p in STUBS.glob("*.go"))
    _, mismatch, errors = filecmp.cmpfiles(fresh, STUBS, names, shallow=False)
    assert not mismatch and not errors, f"stale Go stubs: buf generate --template … ({mismatch})"


async def test_go_example_runs_against_the_server(
    go_example: Path, address: str, project_id: str
) -> None:
    result = await asyncio.to_thread(
        subprocess.run,
        [str(go_example), "-address", address, "-project", project_id],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert "open conflicts: 1" in lines
    packet = next(line for line in lines if line.startswith("packet: "))
    assert re.match(r"packet: PACKET_STATUS_\w+, [1-9]\d* fact\(s\)", packet), packet
    assert any(line.startswith("  fact: ") for line in lines)
    decisions = [
        re.fullmatch(r"  decision \d+: (DECISION_OUTCOME_\w+) (REASON_CODE_\w+) \(\w+\)", line)
        for line in lines
        if line.startswith("  decision ")
    ]
    assert decisions and all(decisions), lines
    # The two home cities in open conflict are held back; the job is served.
    assert sorted(d.groups() for d in decisions if d) == [
        ("DECISION_OUTCOME_BLOCKED", "REASON_CODE_CONFLICT_OPEN"),
        ("DECISION_OUTCOME_BLOCKED", "REASON_CODE_CONFLICT_OPEN"),
        ("DECISION_OUTCOME_INCLUDED", "REASON_CODE_RELEVANCE"),
    ]


async def test_set_module_path_gives_a_module_that_builds(
    go_example: Path, gocache: Path, tmp_path: Path
) -> None:
    """Setting the repository's path before a release: every mention follows, and it builds."""
    copy = tmp_path / "go"
    shutil.copytree(GO, copy, ignore=shutil.ignore_patterns("bin"))
    old, new = _module_path(), "github.com/acme/satchel-fork/clients/go"
    await asyncio.to_thread(
        subprocess.run, [str(copy / "set-module-path"), new], check=True, timeout=60
    )
    assert _module_path(copy) == new
    for file in (copy / "go.mod", copy / "buf.gen.yaml", copy / "README.md", *copy.rglob("*.go")):
        assert old not in file.read_text(), file
    assert (
        f'satchelv1 "{new}/satchel/v1"'
        in (copy / "cmd" / "satchel-go-example" / "main.go").read_text()
    )
    result = await asyncio.to_thread(_build, copy, gocache)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    assert (copy / "bin" / "satchel-go-example").is_file()
