"""The distributions a user installs (scripts/dist): satchel's sdist and wheel and the light
satchel-client's, with the contract's .proto files and the licence; the client wheel installed
alone into a fresh virtual environment makes real calls to the test server."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import tarfile
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from helpers.paths import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

PROTOS = sorted(p.name for p in (ROOT / "proto" / "satchel" / "v1").glob("*.proto"))
CLIENT_DEPS = {
    "grpcio",
    "grpcio-status",
    "grpcio-health-checking",
    "protobuf",
    "googleapis-common-protos",
}
"""satchel-client's dependencies; grpcio itself brings typing-extensions, and nothing else."""
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"
"""apache.org's LICENSE-2.0.txt, as googleapis-common-protos, onnx and ml_dtypes ship it."""


def _name(requirement: str) -> str:
    return canonicalize_name(Requirement(requirement).name)


def _tar_names(path: Path) -> set[str]:
    with tarfile.open(path) as archive:
        return set(archive.getnames())


def _wheel_files(path: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(path) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run(
        ["bash", "scripts/dist", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = {
        "sdist": out / "satchel-0.1.0.tar.gz",
        "wheel": out / "satchel-0.1.0-py3-none-any.whl",
        "client_sdist": out / "satchel_client-0.1.0.tar.gz",
        "client_wheel": out / "satchel_client-0.1.0-py3-none-any.whl",
    }
    assert all(path.is_file() for path in found.values()), sorted(p.name for p in out.iterdir())
    return found


def test_the_licence_is_apache_2() -> None:
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == APACHE_2_SHA256
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"


def test_both_projects_have_one_version() -> None:
    server = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    client = tomllib.loads((ROOT / "packaging" / "client" / "pyproject.toml").read_text())
    assert client["project"]["version"] == server["version"]
    assert f'__version__ = "{server["version"]}"' in (ROOT / "satchel" / "__init__.py").read_text()
    declared = {_name(text) for text in client["project"]["dependencies"]}
    assert declared == CLIENT_DEPS


def test_sdists_and_wheels_ship_the_protos_and_the_licence(dists: dict[str, Path]) -> None:
    sdist = _tar_names(dists["sdist"])
    assert {f"satchel-0.1.0/proto/satchel/v1/{name}" for name in PROTOS} <= sdist
    assert {"satchel-0.1.0/LICENSE", "satchel-0.1.0/setup.py"} <= sdist
    client_sdist = _tar_names(dists["client_sdist"])
    assert {f"satchel_client-0.1.0/src/satchel/v1/{name}" for name in PROTOS} <= client_sdist
    assert "satchel_client-0.1.0/LICENSE" in client_sdist

    wheel_files = _wheel_files(dists["wheel"])
    wheel = set(wheel_files)
    assert {f"satchel/v1/{name}" for name in PROTOS} <= wheel
    # the descriptor set with comments, which server reflection serves
    descriptor_set = (ROOT / "proto" / "satchel.binpb").read_bytes()
    assert wheel_files["satchel/v1/satchel.binpb"] == descriptor_set
    assert "satchel-0.1.0/satchel/v1/satchel.binpb" in sdist
    assert "satchel-0.1.0.dist-info/licenses/LICENSE" in wheel
    # every server module and its data ship (a subpackage missing from pyproject.toml would not)
    server = ROOT / "server"
    shipped = {"*.py", "talents/unrelated_tasks.json"}
    for pattern in shipped:
        for path in server.rglob(pattern):
            if "__pycache__" not in path.parts:
                assert f"satchel/server/{path.relative_to(server)}" in wheel, path

    client = _wheel_files(dists["client_wheel"])
    names = set(client)
    assert {f"satchel/v1/{name}" for name in PROTOS} <= names
    assert "satchel_client-0.1.0.dist-info/licenses/LICENSE" in names
    modules = {n for n in names if not n.startswith("satchel_client-0.1.0.dist-info/")}
    assert {n.split("/")[1] for n in modules} == {"client", "v1"}  # no server, no satchel/__init__
    sdk = {f"satchel/client/{p.name}" for p in (ROOT / "client").glob("*.py")}
    assert sdk | {"satchel/client/py.typed", "satchel/v1/py.typed"} <= names
    # both wheels hold the same SDK, byte for byte: installed together, either may win
    for name in modules & wheel:
        assert client[name] == wheel_files[name], name
    metadata = client["satchel_client-0.1.0.dist-info/METADATA"].decode()
    lines = metadata.splitlines()
    requires = {_name(line[14:]) for line in lines if line.startswith("Requires-Dist:")}
    assert requires == CLIENT_DEPS


def _run(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    command = [str(a) for a in args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=300)


CALLS = """
import asyncio, json, sys
import satchel
from satchel.client import AsyncSatchelClient, SatchelClient, render_packet, service_config

address, project = sys.argv[1], sys.argv[2]
with SatchelClient(address, timeout=30) as client:
    health = client.health()
    client.assert_fact(project, "ana", "home_city", "Oslo", statement="Ana lives in Oslo")
    reply = client.assemble_context(project, "ana", "Where does Ana live?")
    block = render_packet(reply.packet)

async def main():
    async with AsyncSatchelClient(address) as client:
        facts = await client.list_facts(project, "ana")
        return await client.health("satchel.v1.ContextService"), len(facts.facts)

async_health, count = asyncio.run(main())
print(json.dumps({
    "health": health, "async_health": async_health, "facts": count,
    "served": [f.statement for f in reply.packet.facts], "block": "Ana lives in Oslo" in block,
    "trace": bool(reply.trace_id), "reads": len(service_config()["methodConfig"][0]["name"]),
    "namespace": getattr(satchel, "__file__", None),
}))
"""


async def test_the_client_wheel_alone_in_a_fresh_venv_calls_the_server(
    dists: dict[str, Path], address: str, project_id: str, tmp_path: Path
) -> None:
    env = tmp_path / "venv"
    await asyncio.to_thread(venv.create, env, with_pip=True)
    python = env / "bin" / "python"
    pip = (python, "-m", "pip", "--disable-pip-version-check")
    installed = await asyncio.to_thread(
        _run, *pip, "install", "--quiet", "-c", "constraints.txt", dists["client_wheel"]
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    listed = await asyncio.to_thread(_run, *pip, "list", "--format=json")
    names = {canonicalize_name(d["name"]) for d in json.loads(listed.stdout)}
    assert names - {"pip", "setuptools"} == {"satchel-client", "typing-extensions", *CLIENT_DEPS}

    # the server runs in this process's event loop: the subprocess must not block it
    calls = await asyncio.create_subprocess_exec(
        str(python),
        "-c",
        CALLS,
        address,
        project_id,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=tmp_path,
    )
    out, err = await asyncio.wait_for(calls.communicate(), 120)
    assert calls.returncode == 0, err.decode()
    seen = json.loads(out)
    assert seen["health"] == "SERVING" and seen["async_health"] == "SERVING"
    assert seen["facts"] == 1 and seen["served"] == ["Ana lives in Oslo"] and seen["block"]
    assert seen["trace"] and seen["reads"] == 9
    assert seen["namespace"] is None  # alone, `satchel` is a namespace package

    # beside it, the server's wheel (its own dependencies left out: only the files matter)
    both = await asyncio.to_thread(_run, *pip, "install", "--quiet", "--no-deps", dists["wheel"])
    assert both.returncode == 0, both.stdout + both.stderr
    check = await asyncio.to_thread(
        _run,
        python,
        "-c",
        "import satchel, satchel.client, satchel.v1.context_pb2_grpc; print(satchel.__version__)",
        cwd=tmp_path,  # not the repository, whose satchel/ would be imported
    )
    assert check.returncode == 0 and check.stdout.strip() == "0.1.0", check.stderr


def test_the_sdk_passes_mypy_strict_in_the_test_command() -> None:
    assert "scripts/typecheck" in (ROOT / "scripts" / "test").read_text()
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mypy"]
    assert config["strict"] is True
    result = _run("bash", "scripts/typecheck")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
